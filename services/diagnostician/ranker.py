"""The offline evidence ranker: root-cause hypotheses from signal matches, retrieval and history.

Every runbook is a hypothesis. Its score adds, per kind of evidence, how well the incident's evidence
matches the runbook's front-matter ``signals``:

========== ====== =============================================================================
feature    weight match
========== ====== =============================================================================
anomalies  1.0    alert signal names vs ``signals.anomalies``
xid        2.0    XID codes vs ``signals.xid`` (decisive: an XID code names the failure)
logs       0.8    log lines and templates vs ``signals.logs`` (drain templates, ``<*>`` wildcards)
events     0.6    Kubernetes event reasons vs ``signals.events``
metrics    0.3    metric names in alert evidence vs ``signals.metrics``
scope      0.4    the alerts' blast radius (one pod, one deployment across nodes, several
                  deployments on one node) is one ``signals.scope`` lists
========== ====== =============================================================================

Within a kind the match is the cosine between the two binary vectors, each feature weighted by its
inverse document frequency over the runbooks (``gpu_xid`` is listed by 15 runbooks and says little on
its own; ``node_flapping`` by 2). Cosine rewards a runbook whose signals are all present over one
that lists many more: precision and recall in one number. A kind the incident has no evidence of
adds nothing, so runbooks are not penalised for listing metrics the detectors never report.

Retrieval then adds up to 0.5 (the runbook's hybrid-search score over the best hit's) and similar
past incidents or post-mortems up to 0.4 to the runbook with their root cause. An XID with no runbook
of its own becomes a hypothesis from the XID catalog's remediation in the alert evidence.

Confidence is a softmax of the scores (temperature 0.5) that includes a constant "none of these"
score of 0.5, so one weak match does not read as certainty and a decisive XID match does.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from services.core.errors import ConfigError
from services.core.events import FACT_TOPOLOGY, AlertRef, Citation, Hypothesis, IncidentEvent
from services.diagnostician.documents import default_knowledge_dir
from services.diagnostician.evidence import (
    ANOMALIES_TOOL,
    GPU_FAULT_SIGNALS,
    Evidence,
    anomalies_result,
    condense,
    deployment_of_pod,
    topology_of,
)
from services.diagnostician.kb import SearchHit
from services.diagnostician.runbooks import PLAYBOOK_DEFAULT_LEVELS, Runbook, load_runbooks
from services.remediation.catalog import playbook_catalog

WEIGHTS: dict[str, float] = {"anomalies": 1.0, "xid": 2.0, "logs": 0.8, "events": 0.6, "metrics": 0.3, "scope": 0.4}
# Signals of the learned detectors and log novelty say "something is odd", not what: every runbook
# could list them, so the few that do must not win on them.
GENERIC_SIGNALS = frozenset({"metric_outlier", "sequence_anomaly", "log_new_template", "log_template_burst"})
GENERIC_FACTOR = 0.25
RETRIEVAL_WEIGHT = 0.5
SIMILAR_WEIGHT = 0.4
XID_CATALOG_SCORE = 1.5
# An XID failure mode always logs its XID: without any XID in the evidence, its runbook is unlikely.
NO_XID_FACTOR = 0.3
NONE_OF_THESE = 0.5
TEMPERATURE = 0.5
MAX_HYPOTHESES = 5
_TOKEN = re.compile(r"[A-Za-z0-9_.:/-]+")
_PLACEHOLDER = re.compile(r"<[^<>\s]*>")

# Which target parameters each playbook takes (filled from the incident's topology labels), from the
# playbook classes themselves (services.remediation.catalog).
PLAYBOOK_PARAMS: dict[str, tuple[str, ...]] = {name: info.targets for name, info in playbook_catalog().items()}


@dataclass(frozen=True)
class LogPattern:
    """A runbook log template compiled for matching lines and other templates."""

    template: str
    regex: re.Pattern[str]
    tokens: frozenset[str]

    @classmethod
    def of(cls, template: str) -> LogPattern:
        parts = [re.escape(part.strip()) for part in template.split("<*>")]
        regex = re.compile(r".*?".join(p for p in parts if p), re.IGNORECASE)
        tokens = frozenset(t.lower() for t in _TOKEN.findall(template.replace("<*>", " ")) if len(t) > 2)
        return cls(template, regex, tokens)

    def matches(self, line: str) -> bool:
        """True when the line (or a drain template) fits the pattern, by regex or by 70% of its words."""
        if self.regex.search(line):
            return True
        if not self.tokens:
            return False
        words = {t.lower() for t in _TOKEN.findall(_PLACEHOLDER.sub(" ", line))}
        return len(self.tokens & words) / len(self.tokens) >= 0.7


@dataclass
class RunbookIndex:
    """Runbooks with the per-feature IDF weights and compiled log patterns the ranker needs."""

    runbooks: tuple[Runbook, ...]
    features: dict[str, dict[str, frozenset[Any]]] = field(default_factory=dict)
    idf: dict[str, dict[Any, float]] = field(default_factory=dict)
    patterns: dict[str, tuple[LogPattern, ...]] = field(default_factory=dict)
    by_root_cause: dict[str, Runbook] = field(default_factory=dict)

    @classmethod
    def build(cls, runbooks: Sequence[Runbook]) -> RunbookIndex:
        """Precompute feature sets, IDF weights and log patterns."""
        index = cls(tuple(runbooks))
        n = len(runbooks)
        for rb in runbooks:
            s = rb.signals
            index.features[rb.id] = {
                "anomalies": frozenset(s.anomalies),
                "xid": frozenset(s.xid),
                "events": frozenset(s.events),
                "metrics": frozenset(s.metrics),
                "logs": frozenset(range(len(s.logs))),
            }
            index.patterns[rb.id] = tuple(LogPattern.of(t) for t in s.logs)
            index.by_root_cause[rb.root_cause] = rb
        for kind in ("anomalies", "xid", "events", "metrics"):
            df: dict[Any, int] = {}
            for feats in index.features.values():
                for f in feats[kind]:
                    df[f] = df.get(f, 0) + 1
            index.idf[kind] = {f: math.log(1.0 + n / count) for f, count in df.items()}
        for signal in GENERIC_SIGNALS & set(index.idf["anomalies"]):
            index.idf["anomalies"][signal] *= GENERIC_FACTOR
        return index

    def weight(self, kind: str, feature: Any) -> float:
        """IDF weight of a feature (log templates are all equally specific)."""
        if kind == "logs":
            return 1.0
        return self.idf[kind].get(feature, 0.0)


_INDEX_CACHE: dict[Path, RunbookIndex] = {}
_INDEX_LOCK = threading.Lock()


def runbook_index(root: Path | None = None) -> RunbookIndex:
    """The runbook index for ``root/runbooks`` (default the repository's knowledge), built once per process."""
    folder = (root or default_knowledge_dir()).resolve() / "runbooks"
    with _INDEX_LOCK:
        if folder not in _INDEX_CACHE:
            runbooks = load_runbooks(folder)
            check_playbook_params(runbooks)
            _INDEX_CACHE[folder] = RunbookIndex.build(runbooks)
        return _INDEX_CACHE[folder]


def check_playbook_params(runbooks: Iterable[Runbook]) -> None:
    """Fail when a runbook gives a playbook a parameter it does not take.

    A runbook's ``params`` are merged into what a diagnosis proposes (:func:`review_action`); a key
    the playbook does not know would be refused at execution, every time, long after the runbook was
    written.

    Raises:
        ConfigError: one line per runbook file, playbook and unknown key.
    """
    catalog = playbook_catalog()
    problems = []
    for rb in runbooks:
        for ref in rb.playbooks:
            info = catalog.get(ref.name)
            if info is None or info.playbook is None or not ref.params:
                continue
            known = set(info.playbook.Params.model_fields)
            problems += [
                f"{rb.path}: playbook {ref.name} has no parameter {key!r} (it takes: {', '.join(sorted(known))})"
                for key in sorted(set(ref.params) - known)
            ]
    if problems:
        raise ConfigError("\n".join(problems))


@dataclass
class Scored:
    """A hypothesis being scored."""

    cause: str
    score: float = 0.0
    runbook: Runbook | None = None
    evidence: list[str] = field(default_factory=list)
    citations: list[Citation] = field(default_factory=list)
    playbook: str | None = None
    level: int | None = None
    summary: str = ""
    parts: dict[str, float] = field(default_factory=dict)


def _cosine(matched: Iterable[Any], rb_feats: Iterable[Any], ev_feats: Iterable[Any], w: Any) -> float:
    top = sum(w(f) ** 2 for f in matched)
    if top == 0:
        return 0.0
    rb_norm = math.sqrt(sum(w(f) ** 2 for f in rb_feats))
    ev_norm = math.sqrt(sum(w(f) ** 2 for f in ev_feats))
    return top / (rb_norm * ev_norm) if rb_norm and ev_norm else 0.0


def _coverage(matched: Iterable[Any], ev_feats: Iterable[Any], w: Any) -> float:
    total = sum(w(f) for f in ev_feats)
    return sum(w(f) for f in matched) / total if total else 0.0


def signal_scores(evidence: Evidence, index: RunbookIndex) -> dict[str, Scored]:
    """Score every runbook by how its front-matter signals match the evidence (no retrieval)."""
    kinds = ("anomalies", "xid", "events", "metrics")
    known = {kind: set().union(*(f[kind] for f in index.features.values())) for kind in kinds}
    ev_sets: dict[str, set[Any]] = {
        "anomalies": evidence.signals & known["anomalies"],
        "xid": evidence.xids & known["xid"],
        "events": evidence.event_reasons & known["events"],
        "metrics": evidence.metrics & known["metrics"],
    }
    out: dict[str, Scored] = {}
    for rb in index.runbooks:
        feats = index.features[rb.id]
        scored = Scored(cause=rb.root_cause, runbook=rb)
        specific = False  # matched on more than the learned detectors' "something is odd"
        for kind in ("anomalies", "xid", "events", "metrics"):
            if not ev_sets[kind]:
                continue
            matched = feats[kind] & ev_sets[kind]
            weight = partial(index.weight, kind)
            if kind == "metrics":
                # runbooks list every metric worth a look, detectors report a few: score the share of the
                # evidence's metrics the runbook explains, without penalising the runbook's other metrics
                value = _coverage(matched, ev_sets[kind], weight)
            else:
                value = _cosine(matched, feats[kind], ev_sets[kind], weight)
            if value:
                scored.parts[kind] = WEIGHTS[kind] * value
                scored.evidence.extend(_describe(kind, sorted(matched, key=str)))
                specific = specific or kind != "anomalies" or bool(matched - GENERIC_SIGNALS)
        if evidence.log_lines and index.patterns[rb.id]:
            hits = [p for p in index.patterns[rb.id] if any(p.matches(line) for line in evidence.log_lines)]
            if hits:
                # share of the runbook's templates seen, softened: one distinctive line is strong evidence
                scored.parts["logs"] = WEIGHTS["logs"] * math.sqrt(len(hits) / len(index.patterns[rb.id]))
                scored.evidence.extend(f"log line matches '{p.template}'" for p in hits)
                specific = True
        scope = evidence.scope & set(rb.signals.scope)
        if scope and specific:
            # the blast radius tells apart causes whose own signals match; alone it proves nothing
            scored.parts["scope"] = WEIGHTS["scope"]
            scored.evidence.extend(f"blast radius: {s}" for s in sorted(scope))
        scored.score = sum(scored.parts.values())
        if feats["xid"] and not evidence.xids:
            scored.score *= NO_XID_FACTOR
        out[rb.root_cause] = scored
    return out


def _describe(kind: str, matched: Sequence[Any]) -> list[str]:
    if kind == "anomalies":
        return [f"anomaly signal {m}" for m in matched]
    if kind == "xid":
        return [f"XID {m}" for m in matched]
    if kind == "events":
        return [f"Kubernetes event {m}" for m in matched]
    return [f"metric {m}" for m in matched]


def rank(
    evidence: Evidence,
    index: RunbookIndex,
    hits: Sequence[SearchHit] = (),
    *,
    max_hypotheses: int = MAX_HYPOTHESES,
) -> list[Hypothesis]:
    """Rank root-cause hypotheses for the evidence, best first, with normalised confidence.

    Args:
        evidence: what the tools found.
        index: the runbooks.
        hits: hybrid-search results for a query built from the evidence (runbooks, post-mortems,
            past incidents), best first; empty when retrieval is unavailable.
        max_hypotheses: how many to return.
    """
    scored = signal_scores(evidence, index)
    _add_retrieval(scored, hits)
    _add_xid_catalog(scored, evidence, index)
    ranked = sorted((s for s in scored.values() if s.score > 0), key=lambda s: (-s.score, s.cause))
    top = ranked[:max_hypotheses]
    # softmax over every scored hypothesis plus a "none of these" score
    total = sum(math.exp(s.score / TEMPERATURE) for s in ranked) + math.exp(NONE_OF_THESE / TEMPERATURE)
    facts = evidence.facts
    out: list[Hypothesis] = []
    for s in top:
        if s.runbook is not None:
            # the runbook's first playbook whose `when` the firing signals meet; when it needs a target
            # the incident's own telemetry cannot fill, its next one that can be filled (a page is
            # chosen only where the runbook puts it first)
            allowed = [p for p in s.runbook.playbooks if p.applies(evidence.signals)]
            first = allowed[0] if allowed else None
            if first is not None and PLAYBOOK_PARAMS.get(first.name) and not fillable(first.name, evidence):
                first = next((p for p in allowed[1:] if fillable(p.name, evidence)), first)
            s.playbook, s.level = (first.name, first.level) if first is not None else (None, None)
            s.summary = s.summary or s.runbook.title
            if not any(c.doc_id == s.runbook.id for c in s.citations):
                s.citations.insert(0, Citation(doc_id=s.runbook.id, title=s.runbook.title, score=round(s.score, 4)))
        cited = list(dict.fromkeys(s.evidence))
        cited.extend(f for f in facts[:3] if f not in cited)
        out.append(
            Hypothesis(
                cause=s.cause,
                confidence=round(min(1.0, math.exp(s.score / TEMPERATURE) / total), 4),
                summary=s.summary,
                evidence=tuple(cited[:12]),
                citations=tuple(s.citations[:5]),
                playbook=s.playbook,
                level=s.level,
            )
        )
    return out


def _add_retrieval(scored: dict[str, Scored], hits: Sequence[SearchHit]) -> None:
    runbook_hits = [h for h in hits if h.kind == "runbook"]
    similar = [h for h in hits if h.kind in ("incident", "postmortem", "report")]
    if runbook_hits:
        best = runbook_hits[0].score
        for hit in runbook_hits:
            s = scored.get(hit.root_cause)
            if s is None or best <= 0:
                continue
            s.parts["retrieval"] = RETRIEVAL_WEIGHT * hit.score / best
            s.score += s.parts["retrieval"]
            s.citations.append(Citation(doc_id=hit.doc_id, title=hit.title, excerpt=hit.excerpt, score=hit.score))
    if similar:
        best = similar[0].score
        for hit in similar:
            s = scored.get(hit.root_cause)
            if s is None or best <= 0:
                continue
            bonus = SIMILAR_WEIGHT * hit.score / best
            if bonus > s.parts.get("similar", 0.0):
                s.score += bonus - s.parts.get("similar", 0.0)
                s.parts["similar"] = bonus
            s.citations.append(Citation(doc_id=hit.doc_id, title=hit.title, excerpt=hit.excerpt, score=hit.score))
            s.evidence.append(f"similar to {hit.kind} {hit.doc_id}")


def _add_xid_catalog(scored: dict[str, Scored], evidence: Evidence, index: RunbookIndex) -> None:
    covered = set().union(*(f["xid"] for f in index.features.values()))
    for code in sorted(evidence.xids - covered):
        remediation = _catalog_remediation(evidence, code)
        playbook = remediation if remediation in PLAYBOOK_DEFAULT_LEVELS else "page_oncall"
        scored[f"gpu_xid_{code}"] = Scored(
            cause=f"gpu_xid_{code}",
            score=XID_CATALOG_SCORE,
            evidence=[f"XID {code} (NVIDIA XID catalog; no runbook for this code)"],
            playbook=playbook,
            level=PLAYBOOK_DEFAULT_LEVELS[playbook],
            summary=f"GPU XID {code}: follow the catalog's resolution",
        )


def _catalog_remediation(evidence: Evidence, code: int) -> str:
    for alert in evidence.incident.alerts:
        if alert.evidence.get("xid") == code and isinstance(alert.evidence.get("remediation"), str):
            return str(alert.evidence["remediation"])
    return ""


def own_alerts(incident: IncidentEvent) -> list[AlertRef]:
    """The incident's alerts from telemetry ClusterMedic collected itself (trusted for topology), firing first.

    Only these may name an action's target or corroborate an alert pushed by webhook.
    """
    own = [a for a in incident.alerts if a.provenance.trusts(FACT_TOPOLOGY)]
    return sorted(own, key=lambda a: a.status != "firing")


def playbook_params(playbook: str | None, evidence: Evidence) -> dict[str, Any]:
    """Parameters for the proposed playbook, from the topology labels of the incident's own alerts.

    The first alert (firing before resolved) wins. Only alerts from telemetry ClusterMedic collected
    count (:func:`own_alerts`): a webhook alert's labels, the incident's group labels (which such an
    alert can set) and free text never name a target.
    """
    if not playbook:
        return {}
    wanted = PLAYBOOK_PARAMS.get(playbook, ())
    params: dict[str, Any] = {}
    pods: list[str] = []
    for alert in own_alerts(evidence.incident):
        topo = topology_of(alert.labels)
        # a playbook's gpu is a UUID; DCGM's "gpu" label is the device index
        uuid = alert.labels.get("UUID") or alert.labels.get("gpu_uuid") or ""
        if not uuid and alert.entity.startswith("GPU-"):
            uuid = alert.entity
        if uuid:
            topo["gpu"] = uuid
        else:
            topo.pop("gpu", None)
        for key in wanted:
            if key in topo and key not in params:
                params[key] = topo[key]
        if topo.get("pod"):
            pods.append(topo["pod"])
    named = [d for d in map(deployment_of_pod, pods) if d]
    if "deployment" in wanted and "deployment" not in params and named:
        # vLLM pods carry no deployment label; a Deployment's pod name does (<deployment>-<hash>-<suffix>)
        params["deployment"] = named[0]
    if params.get("node"):
        params.pop("gpu", None)  # the node names the target; its GPU would only be looked up again
    info = playbook_catalog().get(playbook)
    if info is not None and params:
        params.update(info.proposed)
    return params


def fillable(playbook: str, evidence: Evidence, params: dict[str, Any] | None = None) -> bool:
    """Whether the playbook acts on a target and its parameters (default :func:`playbook_params`) do."""
    info = playbook_catalog().get(playbook)
    if info is None or not info.targets:
        return False
    params = playbook_params(playbook, evidence) if params is None else params
    return info.names_target(params) and not info.params_error(params)


NOT_CORROBORATED_NOTE = (
    "alert from the Alertmanager webhook not corroborated by telemetry ClusterMedic collected; no automatic action"
)
"""Why a diagnosis resting on a webhook alert proposes no playbook."""
UNKNOWN_NOT_CORROBORATED_NOTE = (
    "alert of unknown provenance not corroborated by telemetry ClusterMedic collected; no automatic action"
)
UNTRUSTED_TEXT_NOTE = "the diagnosis rests on evidence from an untrusted source; no automatic action"
NO_GPU_SOURCE_NOTE = (
    "a GPU fault not reported by a trusted GPU source (DCGM, NVML, the node's kernel log); no node or GPU action"
)
NO_TARGET_NOTE = "no target for {playbook} in telemetry ClusterMedic collected; no automatic action"
UNFILLED_PARAMS_NOTE = "cannot propose {problem}; no automatic action"
# Playbooks acting on a node or a GPU (derived from the parameters they take).
NODE_GPU_PLAYBOOKS = frozenset(name for name, keys in PLAYBOOK_PARAMS.items() if {"node", "gpu"} & set(keys))


@dataclass(frozen=True)
class ActionReview:
    """What the trust model allows of the top hypothesis's playbook.

    Attributes:
        params: the playbook's parameters, from the incident's own alerts (empty when withheld).
        withheld: whether no playbook may be proposed at all.
        notes: why, for humans (:attr:`Diagnosis.notes`), with the untrusted claims the evidence made.
    """

    params: dict[str, Any]
    withheld: bool
    notes: tuple[str, ...]


def review_action(top: Hypothesis | None, evidence: Evidence, index: RunbookIndex) -> ActionReview:
    """Apply the trust model (docs/security.md) to the playbook the top hypothesis proposes.

    The playbook is withheld when:

    * the incident holds alerts ClusterMedic did not collect (a webhook's), or untrusted claims (an XID
      quoted in an application log), and the incident's own alerts alone do not lead to the same top
      hypothesis on their signals (corroboration: retrieval or a webhook label cannot carry it);
    * it acts on a node or GPU for a GPU fault no trusted GPU source reported;
    * it needs a target and no alert of ClusterMedic's own telemetry names one.

    ``page_oncall`` acts on nothing and is never withheld.
    """
    notes = list(evidence.untrusted)
    playbook = top.playbook if top is not None else None
    reasons: list[str] = []
    incident = evidence.incident
    foreign = [a for a in incident.alerts if not a.provenance.trusts(FACT_TOPOLOGY) and a.status == "firing"]
    if (foreign or evidence.untrusted) and not _corroborated(top, evidence, index):
        if any(a.provenance.source == "alertmanager_webhook" for a in foreign):
            reasons.append(NOT_CORROBORATED_NOTE)
        elif foreign:
            reasons.append(UNKNOWN_NOT_CORROBORATED_NOTE)
        elif playbook is not None:
            reasons.append(UNTRUSTED_TEXT_NOTE)
    if top is None or playbook is None or playbook == "page_oncall":
        # nothing acts: the notes still say what was not believed
        notes.extend(r for r in reasons if r not in notes)
        return ActionReview(playbook_params(playbook, evidence), False, tuple(notes))
    if playbook in NODE_GPU_PLAYBOOKS and _gpu_fault_cause(top.cause, index) and not _trusted_gpu_fact(evidence):
        reasons.append(NO_GPU_SOURCE_NOTE)
    params = {**playbook_params(playbook, evidence), **_runbook_params(top, index)}
    info = playbook_catalog().get(playbook)
    if info is not None and not info.names_target(params):
        reasons.append(NO_TARGET_NOTE.format(playbook=playbook))
    elif info is not None and (problem := info.params_error(params)):
        reasons.append(UNFILLED_PARAMS_NOTE.format(problem=problem))
    for reason in reasons:
        if reason not in notes:
            notes.append(reason)
    return ActionReview({} if reasons else params, bool(reasons), tuple(notes))


def _runbook_params(top: Hypothesis, index: RunbookIndex) -> dict[str, Any]:
    """The parameters the top hypothesis's runbook gives its playbook (they win over the telemetry's)."""
    runbook = index.by_root_cause.get(top.cause)
    ref = next((p for p in runbook.playbooks if p.name == top.playbook), None) if runbook else None
    return dict(ref.params) if ref is not None else {}


def _corroborated(top: Hypothesis | None, evidence: Evidence, index: RunbookIndex) -> bool:
    """Whether the incident's own firing alerts alone, on their signals (no retrieval), rank ``top`` first."""
    if top is None:
        return False
    own = tuple(a for a in own_alerts(evidence.incident) if a.status == "firing")
    if not own:
        return False
    # the own alerts alone: the incident_anomalies result restated for them (the other results as they are)
    results = {**evidence.results, ANOMALIES_TOOL: anomalies_result(own)}
    mine = condense(evidence.incident.model_copy(update={"alerts": own}), results)
    alone = rank(mine, index, max_hypotheses=1)
    return bool(alone) and alone[0].cause == top.cause


def _gpu_fault_cause(cause: str, index: RunbookIndex) -> bool:
    """Whether a root cause is a GPU fault: an XID's, or a runbook listing XIDs or GPU-fault signals."""
    if cause.startswith("gpu_xid_"):
        return True
    runbook = index.by_root_cause.get(cause)
    return runbook is not None and bool(runbook.signals.xid or GPU_FAULT_SIGNALS & set(runbook.signals.anomalies))


def _trusted_gpu_fact(evidence: Evidence) -> bool:
    # condense admits XIDs and GPU-fault signals only from alerts trusted for GPU faults
    return bool(evidence.xids or evidence.signals & GPU_FAULT_SIGNALS)


def supported_level(evidence: Evidence, index: RunbookIndex) -> int:
    """The highest playbook level any runbook whose signals match the evidence asks for (1 if none match).

    The LLM diagnostician may not propose a playbook above this: evidence of a KV-cache problem does
    not justify rebooting a node, whatever a log line says.
    """
    level = 1
    for s in signal_scores(evidence, index).values():
        if s.score > 0 and s.runbook is not None:
            level = max(level, *(p.level for p in s.runbook.playbooks))
    return level


def matching_playbooks(evidence: Evidence, index: RunbookIndex) -> dict[str, int]:
    """Playbooks of the runbooks whose signals match the evidence, each with the highest level they ask for."""
    levels: dict[str, int] = {}
    for s in signal_scores(evidence, index).values():
        if s.score > 0 and s.runbook is not None:
            for p in s.runbook.playbooks:
                levels[p.name] = max(levels.get(p.name, 0), p.level)
    return levels


# The hypotheses whose runbooks bound what the LLM may propose: the ranker's best, plus up to
# ALLOWED_TOP_K - 1 more that the evidence makes at least ALLOWED_MIN_CONFIDENCE likely and at least
# ALLOWED_RELATIVE of the best. A cause the evidence barely mentions (0.03 next to an XID at 0.84) must
# not lend its reboot_node to a model that a log line talked into it.
ALLOWED_TOP_K = 3
ALLOWED_MIN_CONFIDENCE = 0.10
ALLOWED_RELATIVE = 0.5
ALWAYS_ALLOWED: dict[str, int] = {"page_oncall": 3}
"""Paging a human is always allowed (level 3: nothing acts)."""


def allowed_actions(hypotheses: Sequence[Hypothesis], index: RunbookIndex) -> dict[str, int]:
    """The playbooks the offline evidence supports, each with the lowest level it may run at.

    Args:
        hypotheses: the ranker's own hypotheses for the evidence (:func:`rank`), best first.
        index: the runbooks.

    Returns:
        Playbook name -> minimum level: every playbook of the runbook of each supported hypothesis at
        the most cautious level those runbooks and the registry give it, a runbook-less hypothesis's own
        playbook (the XID catalog's) at its level, and ``page_oncall`` at 3. A hypothesis whose playbook
        the ranker withheld (``playbook`` None) supports nothing.
    """
    allowed = dict(ALWAYS_ALLOWED)
    if not hypotheses:
        return allowed
    best = max(h.confidence for h in hypotheses)
    supported = [hypotheses[0]] + [
        h for h in hypotheses[1:] if h.confidence >= ALLOWED_MIN_CONFIDENCE and h.confidence >= ALLOWED_RELATIVE * best
    ]
    for h in supported[:ALLOWED_TOP_K]:
        if h.playbook is None:
            continue
        runbook = index.by_root_cause.get(h.cause)
        levels = {p.name: p.level for p in runbook.playbooks} if runbook else {h.playbook: h.level or 1}
        for name, level in levels.items():
            # a level the ranker raised on the hypothesis (trust rules) holds for its own playbook
            raised = (h.level or 1) if name == h.playbook else 1
            floor = max(level, PLAYBOOK_DEFAULT_LEVELS.get(name, 3), raised)
            allowed[name] = max(allowed.get(name, 0), floor)
    return allowed
