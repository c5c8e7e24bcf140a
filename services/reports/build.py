"""Stored facts in, a post-incident report out: summary, detection, timeline, root cause, actions,
impact, follow-ups and plots (docs/reports.md).

Nothing here invents: every sentence is a stored fact, a difference of two stored times, or a sum over
stored telemetry, and a section with no data says so with a :class:`~services.reports.document.Note`.
Every timeline entry names the row it comes from (:class:`Source`), so a reader (and a test) can trace it.

Time zero (``T0``) is the first anomalous sample: the earliest stored anomaly of the incident's alerts
(a detector stamps an anomaly with the time of the sample it judged), or the earliest alert start when the
history holds none. Every duration in the report is measured from it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from services.core.events import Hypothesis
from services.diagnostician.runbooks import Runbook
from services.remediation.store import StepRow
from services.reports.document import Bullets, Document, Figure, Note, Para, Section, Table
from services.reports.facts import DiagnosisFact, IncidentFacts, RunFacts
from services.reports.telemetry import Telemetry, TelemetryScope, counter_ratio, histogram_quantile

PRE_INCIDENT_S = 600.0
"""The plots and the "before" figures start this long before T0."""
POST_INCIDENT_S = 300.0
"""The plots go on this long after the incident resolved (or its last fact)."""
MAX_TIMELINE = 400
"""Most timeline entries listed; the report says how many more there were."""
MAX_EVIDENCE = 8
"""Evidence lines listed per hypothesis."""
ROUTER_METRIC = "router_requests_total"
FAILED_CODES = frozenset({"429", "499", "500", "502", "503", "504"})
TTFT = "vllm:time_to_first_token_seconds"
GPU_LABELS = ("UUID", "gpu_uuid")
MODEL_LABELS = ("model", "deployment", "app")
NODE_LABELS = ("node", "Hostname", "hostname")


@dataclass(frozen=True)
class Source:
    """The stored row a fact comes from: its table and its key there."""

    table: str
    key: str

    def __str__(self) -> str:
        return f"{self.table}:{self.key}"


@dataclass(frozen=True)
class Entry:
    """One timeline entry."""

    at: float
    kind: str
    text: str
    source: Source
    actor: str = ""


@dataclass(frozen=True)
class Mark:
    """A vertical mark on the plots (an action, the mitigation, the resolution)."""

    at: float
    kind: str  # action | rollback | other (another incident's action) | mitigated | resolved
    label: str


@dataclass
class Report:
    """A built report: the typed facts the plots and tests use, and the document the renderers print.

    Attributes:
        version: the incident's ``updated_at``: the same stored incident always gives the same report.
        t0: the first anomalous sample (UNIX seconds).
        window: the plotted time range.
        timeline: every entry, in time order (at most :data:`MAX_TIMELINE`).
        marks: actions, mitigation and resolution, for the plots.
        telemetry: what the metric source returned.
        missing: one line per thing the report could not say (also shown in its section).
    """

    incident_id: str
    title: str
    version: float
    t0: float
    window: tuple[float, float]
    timeline: list[Entry] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    telemetry: Telemetry | None = None
    missing: list[str] = field(default_factory=list)
    document: Document | None = None


# ----------------------------------------------------------------------------------------- format


def iso(ts: float | None) -> str:
    """UTC date and time to the second, or an em dash."""
    if ts is None:
        return "—"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def clock(ts: float) -> str:
    """UTC time of day to the second."""
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S")


def duration(seconds: float | None) -> str:
    """``4 min 37 s``, ``1 h 02 min``; an em dash for None."""
    if seconds is None:
        return "—"
    s = round(seconds)
    sign = "-" if s < 0 else ""
    s = abs(s)
    if s < 60:
        return f"{sign}{s} s"
    if s < 3600:
        return f"{sign}{s // 60} min {s % 60:02d} s"
    return f"{sign}{s // 3600} h {(s % 3600) // 60:02d} min"


def offset(ts: float, t0: float) -> str:
    """``T0+4:37`` (minutes:seconds from the first anomalous sample)."""
    d = round(ts - t0)
    sign = "+" if d >= 0 else "-"
    d = abs(d)
    if d >= 3600:
        return f"T0{sign}{d // 3600}:{(d % 3600) // 60:02d}:{d % 60:02d}"
    return f"T0{sign}{d // 60}:{d % 60:02d}"


def short(entity: str) -> str:
    """A GPU UUID cut to its first group (``GPU-03b2d42c``); other names unchanged."""
    return entity[:12] if entity.startswith("GPU-") and len(entity) > 12 else entity


def _ts(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _cell(text: object) -> str:
    return str(text).replace("\n", " ").strip()


# ------------------------------------------------------------------------------------------ build


def build_report(
    facts: IncidentFacts,
    *,
    telemetry: Telemetry | None,
    runbooks: Sequence[Runbook] = (),
    plots: PlotSet | None = None,
) -> Report:
    """Build the report of one incident.

    Args:
        facts: what the stores hold (services/reports/facts.py).
        telemetry: what the metric source returned for :func:`scope_of` and :func:`window_of`
            (None: no source was asked).
        runbooks: the knowledge base's runbooks (root cause titles, prevention, remedies not run).
        plots: the plots, already drawn (services/reports/plots.py), and what their telemetry lacked;
            None: no plots section.
    """
    inc = facts.incident
    t0 = first_sample(facts)
    report = Report(
        incident_id=inc.incident_id,
        title=inc.title,
        version=inc.updated_at.timestamp(),
        t0=t0,
        window=window_of(facts),
        telemetry=telemetry,
    )
    by_cause = {rb.root_cause: rb for rb in runbooks}
    by_id = {rb.id: rb for rb in runbooks}
    report.timeline = timeline(facts)
    report.marks = marks(facts)
    deciding = deciding_diagnosis(facts)
    sections = [
        _summary(facts, t0, deciding),
        _detection(facts, t0),
        _timeline_section(report, facts),
        _root_cause(facts, deciding, by_id, by_cause, report.missing),
        _actions(facts, t0, report.missing),
        _impact(facts, t0, telemetry, report.missing),
        _follow_ups(facts, deciding, by_cause),
    ]
    if plots is not None:
        sections.append(_plots(plots, telemetry, report))
    if facts.truncated:
        sections.append(Section("Limits", tuple(Note(f"Only part of the {t} was read.") for t in facts.truncated)))
    report.document = Document(
        title=f"Post-incident report: {inc.title}",
        subtitle=f"Incident {inc.incident_id} · {inc.severity} · {inc.status} · as stored at {iso(report.version)}",
        sections=tuple(sections),
    )
    return report


def first_sample(facts: IncidentFacts) -> float:
    """T0: the earliest firing anomaly of the incident's alerts, else the earliest alert start, else opened_at."""
    times = [a.ts.timestamp() for a in facts.anomalies if a.status == "firing"]
    times += [a.starts_at.timestamp() for a in facts.alerts]
    return min(times, default=facts.incident.opened_at.timestamp())


def last_fact(facts: IncidentFacts) -> float:
    """The latest stored time about the incident (its resolution, a run's end, its last update)."""
    inc = facts.incident
    times = [inc.updated_at.timestamp(), inc.opened_at.timestamp()]
    times += [t for t in (_ts(inc.mitigated_at), _ts(inc.resolved_at)) if t is not None]
    for rf in facts.runs:
        times += [t for t in (rf.run.created_at, rf.run.started_at, rf.run.finished_at) if t is not None]
        times += [t for s in rf.steps for t in (s.started_at, s.finished_at) if t is not None]
    times += [a.ts.timestamp() for a in facts.anomalies]
    return max(times)


def window_of(facts: IncidentFacts) -> tuple[float, float]:
    """The time range the plots and the telemetry figures cover."""
    return first_sample(facts) - PRE_INCIDENT_S, last_fact(facts) + POST_INCIDENT_S


def affected(facts: IncidentFacts) -> dict[str, list[str]]:
    """GPUs, nodes, pods and models named by the incident's alerts (entities and labels), in first-seen order."""
    out: dict[str, dict[str, None]] = {"gpus": {}, "nodes": {}, "pods": {}, "models": {}}
    for a in facts.alerts:
        labels = a.labels
        kind = labels.get("entity_kind", "")
        if kind == "gpu" or a.entity.startswith("GPU-"):
            out["gpus"][a.entity] = None
        for name in GPU_LABELS:
            if labels.get(name):
                out["gpus"][labels[name]] = None
        for name in NODE_LABELS:
            if labels.get(name):
                out["nodes"][labels[name]] = None
                break
        if kind == "node":
            out["nodes"][a.entity] = None
        if labels.get("pod"):
            out["pods"][labels["pod"]] = None
        elif kind == "pod":
            out["pods"][a.entity] = None
        for name in MODEL_LABELS:
            if labels.get(name):
                out["models"][labels[name]] = None
                break
    # the incident's own labels join what its members name with commas ("pod-a,pod-b")
    inc = facts.incident.labels
    for label, bucket in (("model", "models"), ("gpu", "gpus"), ("node", "nodes"), ("pod", "pods")):
        for name in inc.get(label, "").split(","):
            if name:
                out[bucket][name] = None
    return {k: list(v) for k, v in out.items()}


def scope_of(facts: IncidentFacts) -> TelemetryScope:
    """The batches the report's plots need: its GPUs and pods, and every pod of its deployments."""
    names = affected(facts)
    models = names["models"] or sorted({_deployment(p) for p in names["pods"] if _deployment(p)})
    return TelemetryScope(
        entities=frozenset(names["gpus"] + names["pods"] + names["nodes"]),
        prefixes=tuple(f"{m}-" for m in models),
    )


_POD_SUFFIX = re.compile(r"-[a-z0-9]{5,10}-[a-z0-9]{5}$")


def _deployment(pod: str) -> str:
    """The Deployment of a pod named ``<deployment>-<replicaset hash>-<suffix>`` (empty when not so named)."""
    return _POD_SUFFIX.sub("", pod) if _POD_SUFFIX.search(pod) else ""


# --------------------------------------------------------------------------------------- timeline


_KIND_ORDER = {
    "anomaly": 0,
    "alert": 1,
    "incident": 8,  # a state change follows what caused it at the same second (a run's end mitigates)
    "diagnosis": 3,
    "decision": 4,
    "approval": 5,
    # a run's steps at the same second keep the order they were recorded in (the sort is stable)
    "precheck": 6,
    "action": 6,
    "verification": 6,
    "rollback": 6,
    "run": 7,
    "other incident": 7,
}


def timeline(facts: IncidentFacts) -> list[Entry]:
    """Every alert, anomaly occurrence, state change, diagnosis, decision, approval, step and run end."""
    inc = facts.incident
    iid = inc.incident_id
    out: list[Entry] = []
    for a in facts.alerts:
        key = f"{iid}/{a.fingerprint}"
        what = f"{a.signal} on {short(a.entity)} ({a.detector}, {a.severity})"
        out.append(Entry(a.starts_at.timestamp(), "alert", f"Alert fired: {what}", Source("alerts", key)))
        if a.ends_at is not None:
            out.append(Entry(a.ends_at.timestamp(), "alert", f"Alert resolved: {what}", Source("alerts", key)))
    starts = {a.fingerprint: a.starts_at.timestamp() for a in facts.alerts}
    ends = {a.fingerprint: _ts(a.ends_at) for a in facts.alerts}
    for an in facts.anomalies:
        at = an.ts.timestamp()
        if at in (starts.get(an.fingerprint), ends.get(an.fingerprint)):
            continue  # the alert's own start or end, listed above
        verb = "fired again" if an.status == "firing" else "resolved"
        out.append(
            Entry(
                at,
                "anomaly",
                f"Anomaly {verb}: {an.signal} on {short(an.entity)} ({an.detector}, score {an.score:g}"
                f" against threshold {an.threshold:g})",
                Source("anomalies", f"{an.fingerprint}@{an.ts.isoformat()}"),
            )
        )
    out.append(
        Entry(inc.opened_at.timestamp(), "incident", f"Incident opened ({inc.severity})", Source("incidents", iid))
    )
    if inc.mitigated_at is not None:
        out.append(Entry(inc.mitigated_at.timestamp(), "incident", "Incident mitigated", Source("incidents", iid)))
    if inc.resolved_at is not None:
        out.append(Entry(inc.resolved_at.timestamp(), "incident", "Incident resolved", Source("incidents", iid)))
    for d in facts.diagnoses:
        top = d.hypotheses[0] if d.hypotheses else None
        text = (
            f"Diagnosis ({d.diagnostician}): {top.cause} at confidence {top.confidence:.2f}"
            if top
            else f"Diagnosis ({d.diagnostician}): no hypothesis"
        )
        if d.proposed_playbook:
            text += f"; proposes {d.proposed_playbook} at level {d.level}"
        if not d.event_time:
            text += " (time recorded by the database, not the incident's clock)"
        out.append(Entry(d.at, "diagnosis", text, Source("diagnoses", str(d.id)), actor=d.diagnostician))
    for rf in facts.runs:
        out.extend(_run_entries(rf))
    for rf in related_runs(facts):
        for step in rf.steps:
            if step.kind in ("action", "rollback") and step.status != "skipped" and step.started_at is not None:
                out.append(
                    Entry(
                        step.started_at,
                        "other incident",
                        f"Another incident's remediation ({rf.run.incident_id}, {rf.run.playbook}):"
                        f" {step.kind} {step.name}: {step.status}",
                        Source("remediation_steps", step.step_id),
                    )
                )
    out.sort(key=lambda e: (e.at, _KIND_ORDER.get(e.kind, 99)))
    return out


def _run_entries(rf: RunFacts) -> list[Entry]:
    run = rf.run
    src = Source("remediation_runs", run.run_id)
    how = "automatically" if run.automatic else "for approval"
    reasons = f": {'; '.join(run.reasons)}" if run.reasons else ""
    out = [
        Entry(
            run.created_at,
            "decision",
            f"Remediation {run.playbook} (level {run.level}) decided {how} by {run.decided_by}{reasons}",
            src,
            actor=run.decided_by,
        )
    ]
    ap = rf.approval
    if ap is not None:
        asrc = Source("approvals", run.run_id)
        out.append(Entry(ap.requested_at, "approval", f"Approval of {run.playbook} requested", asrc))
        if ap.decided_at is not None:
            if ap.status in ("approved", "rejected"):
                who = ap.approver or "an unnamed approver"
                via = f" via {ap.channel}" if ap.channel else ""
                note = f": {ap.comment}" if ap.comment else ""
                out.append(
                    Entry(ap.decided_at, "approval", f"{run.playbook} {ap.status} by {who}{via}{note}", asrc, who)
                )
            else:
                out.append(Entry(ap.decided_at, "approval", f"Approval of {run.playbook} {ap.status}", asrc))
    for step in rf.steps:
        out.extend(_step_entries(run.playbook, step))
    if run.finished_at is not None:
        detail = f": {run.detail}" if run.detail else ""
        out.append(Entry(run.finished_at, "run", f"Remediation {run.playbook} ended {run.status}{detail}", src))
    return out


def _step_entries(playbook: str, step: StepRow) -> list[Entry]:
    src = Source("remediation_steps", step.step_id)
    out = step.output or {}
    message = str(out.get("message") or out.get("detail") or out.get("reason") or out.get("error") or "")
    said = f" — {message}" if message else ""
    if step.kind == "verify":
        at = step.finished_at if step.finished_at is not None else step.started_at
        tries = f" after {step.attempts} checks" if step.attempts > 1 else ""
        return [Entry(at or 0.0, "verification", f"Verified {step.name}: {step.status}{tries}{said}", src)]
    if step.kind == "precheck":
        return [Entry(step.started_at or 0.0, "precheck", f"{playbook} precheck: {step.status}{said}", src)]
    kind = "rollback" if step.kind == "rollback" else "action"
    label = "Rollback" if kind == "rollback" else "Action"
    return [Entry(step.started_at or 0.0, kind, f"{label} {step.name}: {step.status}{said}", src)]


def related_runs(facts: IncidentFacts) -> list[RunFacts]:
    """Other incidents' runs that acted on what this incident names: one of its nodes, pods or GPUs, or a pod or
    the Deployment of one of its models. Their actions show in this incident's telemetry (a replica drained by
    another incident's run is a dip in this model's pods), so the report lists them apart from its own."""
    names = affected(facts)
    nodes, pods, gpus = set(names["nodes"]), set(names["pods"]), set(names["gpus"])
    models = names["models"]
    out: list[RunFacts] = []
    for rf in facts.nearby:
        t = rf.run.targets
        touches = (
            nodes & set(t.nodes)
            or pods & set(t.pods)
            or gpus & set(t.gpus)
            or (t.deployment and t.deployment in models)
            or any(p.startswith(f"{m}-") for p in t.pods for m in models)
        )
        if touches and any(s.kind in ("action", "rollback") and s.status != "skipped" for s in rf.steps):
            out.append(rf)
    return out


def marks(facts: IncidentFacts) -> list[Mark]:
    """The actions carried out, the mitigation and the resolution, for the plots' vertical lines."""
    out: list[Mark] = []
    for rf in facts.runs:
        for s in rf.steps:
            if s.kind in ("action", "rollback") and s.status not in ("skipped",) and s.started_at is not None:
                out.append(Mark(s.started_at, "rollback" if s.kind == "rollback" else "action", s.name))
    for rf in related_runs(facts):
        for s in rf.steps:
            if s.kind in ("action", "rollback") and s.status != "skipped" and s.started_at is not None:
                out.append(Mark(s.started_at, "other", f"{s.name} (other incident)"))
    inc = facts.incident
    if inc.mitigated_at is not None:
        out.append(Mark(inc.mitigated_at.timestamp(), "mitigated", "mitigated"))
    if inc.resolved_at is not None:
        out.append(Mark(inc.resolved_at.timestamp(), "resolved", "resolved"))
    return sorted(out, key=lambda m: m.at)


# --------------------------------------------------------------------------------------- sections


def deciding_diagnosis(facts: IncidentFacts) -> DiagnosisFact | None:
    """The diagnosis the acting run followed (the latest one proposing its playbook before it was decided),
    else the latest diagnosis."""
    acted = [rf.run for rf in facts.runs if any(s.kind == "action" for s in rf.steps)]
    if acted:
        run = acted[0]
        before = [d for d in facts.diagnoses if d.proposed_playbook == run.playbook and d.at <= run.created_at + 1]
        if before:
            return before[-1]
    return facts.diagnoses[-1] if facts.diagnoses else None


def _summary(facts: IncidentFacts, t0: float, deciding: DiagnosisFact | None) -> Section:
    inc = facts.incident
    names = affected(facts)
    where = (
        "; ".join(f"{k} {', '.join(short(v) for v in vs)}" for k, vs in names.items() if vs) or "not named by any alert"
    )
    end = _ts(inc.resolved_at)
    lines = [
        f"**What**: {inc.title}.",
        f"**Where**: {where}.",
        f"**Severity**: {inc.severity}.",
        f"**Started**: {iso(t0)} (first anomalous sample, T0).",
    ]
    if end is not None:
        lines.append(f"**Resolved**: yes, at {iso(end)}; the incident lasted {duration(end - t0)} from T0.")
    else:
        lines.append(f"**Resolved**: no; the incident is {inc.status} as of {iso(inc.updated_at.timestamp())}.")
    if inc.mitigated_at is not None:
        lines.append(
            f"**Mitigated**: at {iso(inc.mitigated_at.timestamp())},"
            f" {duration(inc.mitigated_at.timestamp() - t0)} after T0."
        )
    top = deciding.hypotheses[0] if deciding and deciding.hypotheses else None
    if top is not None:
        lines.append(
            f"**Root cause** (diagnosed): {top.summary or top.cause} (`{top.cause}`, confidence {top.confidence:.2f})."
        )
    acted = [rf.run for rf in facts.runs if any(s.kind == "action" for s in rf.steps)]
    if acted:
        lines.append("**Actions**: " + "; ".join(f"{r.playbook} ({r.status})" for r in acted) + ".")
    return Section("Summary", (Bullets(tuple(lines)),))


def _detection(facts: IncidentFacts, t0: float) -> Section:
    inc = facts.incident
    opened = inc.opened_at.timestamp()
    firsts: dict[tuple[str, str, str], float] = {}
    for a in facts.alerts:
        key = (a.detector, a.signal, a.entity)
        firsts[key] = min(firsts.get(key, a.starts_at.timestamp()), a.starts_at.timestamp())
    for an in facts.anomalies:
        key = (an.detector, an.signal, an.entity)
        if an.status == "firing" and key in firsts:
            firsts[key] = min(firsts[key], an.ts.timestamp())
    blocks: list[Any] = []
    if not firsts:
        blocks.append(Note("No alert is linked to this incident, so nothing says how it was detected."))
        return Section("Detection", tuple(blocks))
    mttd = max(0.0, opened - t0)
    diag = facts.diagnoses[0].at if facts.diagnoses and facts.diagnoses[0].event_time else None
    lines = [
        f"First anomalous sample: {iso(t0)}.",
        f"Incident opened: {iso(opened)}. **MTTD {duration(mttd)}** (first anomalous sample to incident).",
    ]
    if diag is not None:
        lines.append(f"First diagnosis: {iso(diag)}, {duration(diag - t0)} after T0.")
    blocks.append(Bullets(tuple(lines)))
    ordered = sorted(firsts.items(), key=lambda kv: (kv[1], kv[0]))
    first_at = ordered[0][1]
    earliest = [k for k, at in ordered if at - first_at <= 1.0]
    blocks.append(
        Para(
            "Fired first: "
            + ", ".join(f"**{d}** ({s} on {short(e)})" for d, s, e in earliest)
            + (", within a second of each other" if len(earliest) > 1 else "")
            + "."
        )
    )
    rows = tuple((offset(at, t0), clock(at), det, sig, short(ent)) for (det, sig, ent), at in ordered)
    blocks.append(Table(("after T0", "time (UTC)", "detector", "signal", "entity"), rows))
    return Section("Detection", tuple(blocks))


def _timeline_section(report: Report, facts: IncidentFacts) -> Section:
    entries = report.timeline
    shown = entries[:MAX_TIMELINE]
    rows = tuple((clock(e.at), offset(e.at, report.t0), e.kind, _cell(e.text), str(e.source)) for e in shown)
    blocks: list[Any] = [
        Para(
            "Every stored alert, anomaly occurrence, state change, diagnosis, decision, approval, remediation step"
            " and verification, on the incident's clock. *Source* names the stored row."
        ),
        Table(("time (UTC)", "after T0", "what", "entry", "source"), rows),
    ]
    if len(entries) > MAX_TIMELINE:
        blocks.append(Note(f"{len(entries) - MAX_TIMELINE} later entries are not listed."))
    if not facts.diagnoses:
        blocks.append(Note("No diagnosis is stored for this incident."))
    if not facts.runs:
        blocks.append(Note("No remediation run is stored for this incident."))
    return Section("Timeline", tuple(blocks))


def _cited(h: Hypothesis, by_id: dict[str, Runbook], by_cause: dict[str, Runbook]) -> list[str]:
    out: list[str] = []
    for c in h.citations:
        rb = by_id.get(c.doc_id)
        title = c.title or (rb.title if rb else "")
        where = f" (`{rb.area}/{rb.id}.md`)" if rb else ""
        out.append(f"{title or c.doc_id}{where}")
    if not out and h.cause in by_cause:
        rb = by_cause[h.cause]
        out.append(f"{rb.title} (`{rb.area}/{rb.id}.md`, the runbook of this cause; not cited)")
    return out


def _root_cause(
    facts: IncidentFacts,
    deciding: DiagnosisFact | None,
    by_id: dict[str, Runbook],
    by_cause: dict[str, Runbook],
    missing: list[str],
) -> Section:
    if deciding is None:
        text = (
            "No diagnosis is stored for this incident: the diagnostician did not diagnose it (it was down, or the"
            " incident never reached it), so no root cause is known from the store."
        )
        missing.append(text)
        return Section("Root cause", (Note(text),))
    if not deciding.hypotheses:
        text = f"Diagnosis {deciding.id} holds no hypothesis: the diagnostician found nothing it could rank."
        missing.append(text)
        return Section("Root cause", (Note(text),))
    blocks: list[Any] = [
        Para(
            f"From diagnosis {deciding.id} ({deciding.diagnostician}, {iso(deciding.at)})"
            f"{', the one the remediation followed' if facts.runs else ''};"
            f" {len(facts.diagnoses)} diagnos{'is' if len(facts.diagnoses) == 1 else 'es'} stored in all."
        )
    ]
    rows = tuple(
        (
            str(i),
            f"`{h.cause}`",
            f"{h.confidence:.2f}",
            _cell(h.summary),
            "; ".join(_cited(h, by_id, by_cause)) or "none",
            f"{h.playbook} (level {h.level})" if h.playbook else "—",
        )
        for i, h in enumerate(deciding.hypotheses, 1)
    )
    blocks.append(Table(("rank", "cause", "confidence", "what", "runbooks cited", "remedy"), rows))
    top = deciding.hypotheses[0]
    blocks.append(Para(f"**Evidence for `{top.cause}`** ({len(top.evidence)} items):"))
    if top.evidence:
        more = len(top.evidence) - MAX_EVIDENCE
        items = [_cell(e) for e in top.evidence[:MAX_EVIDENCE]] + ([f"… and {more} more"] if more > 0 else [])
        blocks.append(Bullets(tuple(items)))
    else:
        blocks.append(Note("The diagnosis lists no evidence for it."))
    ruled: list[str] = []
    for h in deciding.hypotheses[1:]:
        gap = top.confidence - h.confidence
        ev = f"; its evidence: {'; '.join(_cell(e) for e in h.evidence[:3])}" if h.evidence else "; no evidence listed"
        ruled.append(f"`{h.cause}` at {h.confidence:.2f}, {gap:.2f} below the chosen cause{ev}.")
    chosen = {h.cause for h in deciding.hypotheses}
    dropped: dict[str, tuple[int, float]] = {}
    for d in facts.diagnoses:
        for h in d.hypotheses:
            if h.cause not in chosen and h.cause not in dropped:
                dropped[h.cause] = (d.id, h.confidence)
    for cause, (did, conf) in dropped.items():
        ruled.append(f"`{cause}` (confidence {conf:.2f} in diagnosis {did}) is absent from the final ranking.")
    blocks.append(Para("**Ruled out**:"))
    if ruled:
        blocks.append(Bullets(tuple(ruled)))
        blocks.append(
            Note(
                "The diagnostician stores a ranking, not a reason for each rejection: a cause is ruled out by its"
                " lower confidence on the same evidence."
            )
        )
    else:
        blocks.append(Note("Only one hypothesis was ranked; none was ruled out."))
    if deciding.notes:
        blocks.append(Para("**Notes of the diagnosis** (why an action was withheld or limited):"))
        blocks.append(Bullets(tuple(_cell(n) for n in deciding.notes)))
    return Section("Root cause", tuple(blocks))


def _step_row(step: StepRow) -> tuple[str, ...]:
    out = step.output or {}
    said = out.get("message") or out.get("detail") or out.get("reason") or out.get("error") or ""
    took = (
        duration(step.finished_at - step.started_at)
        if step.finished_at is not None and step.started_at is not None
        else "—"
    )
    return (
        clock(step.started_at) if step.started_at is not None else "—",
        step.kind,
        _cell(step.name),
        step.status,
        str(step.attempts),
        took,
        _cell(said)[:160],
    )


def _actions(facts: IncidentFacts, t0: float, missing: list[str]) -> Section:
    inc = facts.incident
    blocks: list[Any] = []
    mit = _ts(inc.mitigated_at)
    res = _ts(inc.resolved_at)
    blocks.append(
        Bullets(
            (
                f"**Time to mitigate**: {duration(mit - t0) if mit is not None else 'not mitigated'}"
                + (f" (at {iso(mit)})" if mit is not None else ""),
                f"**Time to resolve**: {duration(res - t0) if res is not None else 'not resolved'}"
                + (f" (at {iso(res)})" if res is not None else ""),
            )
        )
    )
    if not facts.runs:
        text = "No remediation run is stored for this incident: nothing was decided or carried out by ClusterMedic."
        missing.append(text)
        blocks.append(Note(text))
        return Section("Actions", tuple(blocks))
    for rf in facts.runs:
        run = rf.run
        head = (
            f"**{run.playbook}** `{run.run_id}`, level {run.level},"
            f" {'automatic' if run.automatic else 'approved by a human'}"
            f" decision by {run.decided_by}: **{run.status}**"
        )
        if run.started_at is not None and run.finished_at is not None:
            took = duration(run.finished_at - run.started_at)
            head += f", ran {took} ({clock(run.started_at)} to {clock(run.finished_at)})"
        if run.dry_run:
            head += " (dry run: nothing changed)"
        blocks.append(Para(head + "."))
        targets = run.targets
        named = [
            *targets.nodes,
            *targets.pods,
            *(short(g) for g in targets.gpus),
            *([targets.deployment] if targets.deployment else []),
        ]
        details = [f"Targets: {', '.join(named) or 'none named'}."]
        if run.reasons:
            details.append(f"Policy: {'; '.join(run.reasons)}.")
        if rf.approval is not None:
            ap = rf.approval
            who = f" by {ap.approver}" if ap.approver else ""
            details.append(f"Approval: {ap.status}{who}{' via ' + ap.channel if ap.channel else ''}.")
        if run.detail:
            details.append(f"Outcome: {run.detail}.")
        rollback = [s for s in rf.steps if s.kind == "rollback"]
        if rollback or run.rollback_state:
            state = {"pending": "pending (not complete)", "done": "done"}.get(run.rollback_state, "none needed")
            details.append(f"Rollback: {len(rollback)} step(s), {state}.")
        else:
            details.append("Rollback: none.")
        blocks.append(Bullets(tuple(details)))
        if rf.steps:
            blocks.append(
                Table(
                    ("started", "kind", "step", "status", "tries", "took", "said"),
                    tuple(_step_row(s) for s in rf.steps),
                )
            )
        else:
            blocks.append(Note("No step of this run is stored (it never started)."))
    blocks.extend(_related(facts))
    return Section("Actions", tuple(blocks))


def _related(facts: IncidentFacts) -> list[Any]:
    others = related_runs(facts)
    if not others:
        return []
    items = []
    for rf in others:
        run = rf.run
        acted = [s for s in rf.steps if s.kind in ("action", "rollback") and s.status != "skipped"]
        named = ", ".join([*run.targets.nodes, *run.targets.pods, *(short(g) for g in run.targets.gpus)]) or "—"
        when = f"{clock(acted[0].started_at)}" if acted and acted[0].started_at is not None else "—"
        items.append(
            f"{run.playbook} on {named} for incident `{run.incident_id}`, from {when}: {run.status}"
            f" ({', '.join(dict.fromkeys(s.name for s in acted))})."
        )
    return [
        Para(
            "**Other incidents' remediation** on the same nodes, pods or models while this one was open"
            " (grey on the plots; not this incident's actions):"
        ),
        Bullets(tuple(items)),
    ]


def _impact(facts: IncidentFacts, t0: float, telemetry: Telemetry | None, missing: list[str]) -> Section:
    names = affected(facts)
    blocks: list[Any] = []
    rows = tuple((kind, ", ".join(vs)) for kind, vs in names.items() if vs)
    if rows:
        blocks.append(Table(("affected", "from the alerts' entities and labels"), rows))
    else:
        blocks.append(Note("No alert names a model, pod, node or GPU."))
    slo = [a for a in facts.alerts if a.detector == "slo_burn" or a.signal.endswith("_slo_burn")]
    if slo:
        items = []
        for a in slo:
            ev = a.evidence
            objective = ev.get("objective")
            windows = ev.get("windows") or []
            worst = max(windows, key=lambda w: float(w.get("long_burn_rate", 0.0)), default=None)
            line = f"{a.signal} on {a.entity}: SLI {ev.get('sli', '?')}"
            if ev.get("target_s") is not None:
                line += f" under {ev['target_s']} s"
            if objective is not None:
                line += f", objective {float(objective):.3%}"
            if worst is not None:
                burn = float(worst.get("long_burn_rate", 0.0))
                long_s = float(worst.get("long_s", worst.get("window_s", 0.0)) or 0.0)
                line += f"; burn rate {burn:.1f} over {duration(long_s)}" if long_s else f"; burn rate {burn:.1f}"
                if long_s:
                    line += f", about {burn * long_s / (30 * 86400):.1%} of a 30-day error budget"
            items.append(line + ".")
        blocks.append(Para("**SLO error budget** (from the stored SLO burn-rate alerts):"))
        blocks.append(Bullets(tuple(items)))
    else:
        text = (
            "No SLO burn-rate alert is linked to this incident: the store does not say how much error budget it spent."
        )
        missing.append(text)
        blocks.append(Note(text))
    if telemetry is None or (telemetry.problem and not telemetry.batches):
        why = telemetry.problem if telemetry is not None else "no telemetry source was asked"
        text = f"Failed and slowed requests are not known: telemetry unavailable ({why})."
        missing.append(text)
        blocks.append(Note(text))
        return Section("Impact", tuple(blocks))
    end = _ts(facts.incident.resolved_at) or last_fact(facts)
    during = [b for b in telemetry.batches if any(t0 <= s.ts <= end for s in b.samples[:1])]
    _, failed, total = counter_ratio(during, ROUTER_METRIC, "code", FAILED_CODES, "failed")
    if total > 0:
        blocks.append(
            Para(
                f"**Requests** at the router from T0 to"
                f" {'resolution' if facts.incident.resolved_at else 'the last fact'}: {failed:,.0f} failed of"
                f" {total:,.0f} ({failed / total:.2%}; status {', '.join(sorted(FAILED_CODES))})."
            )
        )
    else:
        text = f"No router request counts ({ROUTER_METRIC}) in the telemetry: failed requests are not known."
        missing.append(text)
        blocks.append(Note(text))
    scope = scope_of(facts)
    before = [b for b in telemetry.batches if any(t0 - PRE_INCIDENT_S <= s.ts < t0 for s in b.samples[:1])]
    ttft_rows = []
    for model in names["models"] or [""]:
        pods = {b.entity for b in telemetry.batches if b.entity.startswith(f"{model}-") or b.entity in scope.entities}
        pre = histogram_quantile(before, pods, TTFT, 0.95, model)
        mid = histogram_quantile(during, pods, TTFT, 0.95, model)
        if pre.values or mid.values:
            ttft_rows.append(
                (
                    model or "all pods",
                    f"{max(pre.values):.2f} s" if pre.values else "—",
                    f"{max(mid.values):.2f} s" if mid.values else "—",
                )
            )
    if ttft_rows:
        blocks.append(Para("**Slowed requests**: time to first token, worst p95 of a scrape interval:"))
        blocks.append(
            Table(("model", f"{duration(PRE_INCIDENT_S)} before T0", "during the incident"), tuple(ttft_rows))
        )
    else:
        text = f"No TTFT histogram ({TTFT}) of the affected models in the telemetry: slowed requests are not known."
        missing.append(text)
        blocks.append(Note(text))
    return Section("Impact", tuple(blocks))


def _prevention(rb: Runbook) -> str:
    lines = rb.body.splitlines()
    out: list[str] = []
    inside = False
    for line in lines:
        if line.startswith("## "):
            if inside:
                break
            inside = line[3:].strip().lower().startswith("prevention")
            continue
        if inside:
            out.append(line)
    return " ".join(" ".join(out).split())


def _follow_ups(facts: IncidentFacts, deciding: DiagnosisFact | None, by_cause: dict[str, Runbook]) -> Section:
    items: list[str] = []
    top = deciding.hypotheses[0] if deciding and deciding.hypotheses else None
    rb = by_cause.get(top.cause) if top else None
    if rb is not None:
        prevention = _prevention(rb)
        if prevention:
            items.append(f"Prevention ({rb.title}, `{rb.area}/{rb.id}.md`): {prevention}")
        ran = {rf.run.playbook for rf in facts.runs if rf.run.status == "succeeded"}
        not_run = [f"{p.name} (level {p.level})" for p in rb.playbooks if p.name not in ran and p.name != "page_oncall"]
        if not_run and ran & {p.name for p in rb.playbooks}:
            items.append(
                f"The runbook's further remedies were not run: {', '.join(not_run)}. Check whether the fault itself"
                " is repaired (the remedy that ran may only have moved the workload)."
            )
    for rf in facts.runs:
        run = rf.run
        if run.status in ("failed", "rolled_back"):
            items.append(
                f"Remediation {run.playbook} `{run.run_id}` ended {run.status}: {run.detail or 'no detail stored'}."
            )
        if run.rollback_state == "pending":
            items.append(
                f"The rollback of {run.playbook} `{run.run_id}` did not complete: a human must check its targets."
            )
        if run.status == "blocked":
            items.append(f"Remediation {run.playbook} was blocked by a guardrail: {run.detail or 'no detail stored'}.")
        for s in rf.steps:
            if s.status == "failed":
                said = (
                    (s.output or {}).get("error")
                    or (s.output or {}).get("detail")
                    or (s.output or {}).get("reason")
                    or ""
                )
                items.append(f"Step {s.kind} {s.name} of {run.playbook} failed{': ' + str(said) if said else ''}.")
        ap = rf.approval
        if ap is not None and ap.status in ("expired", "rejected"):
            items.append(
                f"The approval of {run.playbook} was {ap.status}{' by ' + ap.approver if ap.approver else ''}."
            )
    if facts.incident.resolved_at is None:
        items.append(f"The incident is still {facts.incident.status}: follow it up before closing this report.")
    if deciding is None:
        items.append("No diagnosis was stored: check that the diagnostician was running and consuming incidents.v1.")
    blocks: list[Any] = (
        [Bullets(tuple(items))]
        if items
        else [Note("No runbook prevention section and nothing failed: no follow-up is stored.")]
    )
    if top is not None and rb is None:
        blocks.append(Note(f"No runbook has the root cause `{top.cause}`, so no prevention advice is known."))
    return Section("Follow-ups", tuple(blocks))


def _plots(plots: PlotSet, telemetry: Telemetry | None, report: Report) -> Section:
    blocks: list[Any] = []
    lo, hi = report.window
    source = telemetry.source if telemetry is not None else "no source"
    blocks.append(Para(f"Telemetry from {source}, {clock(lo)} to {clock(hi)} UTC; every plot shares this time axis."))
    if telemetry is not None and telemetry.problem:
        text = f"Telemetry: {telemetry.problem}."
        report.missing.append(text)
        blocks.append(Note(text))
    for text in plots.notes:
        report.missing.append(text)
        blocks.append(Note(text))
    blocks.extend(plots.figures)
    return Section("Plots", tuple(blocks))


@dataclass(frozen=True)
class PlotSet:
    """The figures drawn for a report and what their telemetry lacked (a series that stops, an absent one)."""

    figures: tuple[Figure, ...] = ()
    notes: tuple[str, ...] = ()
