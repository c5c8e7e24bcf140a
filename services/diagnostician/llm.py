"""The LLM diagnostician: any OpenAI-compatible chat endpoint, guarded, with the ranker as fallback.

How it keeps a model (or a log line talking to the model) from choosing an action:

1. Telemetry (alert evidence, log lines, event messages) goes into the prompt only inside a fence
   whose marker is random per request and stripped from the data, under a system instruction that
   fenced text is data quoted from the cluster and never instructions.
2. The answer must be JSON matching :data:`ANSWER_SCHEMA` (``response_format`` ``json_schema``,
   strict), and is validated again with pydantic; anything else falls back to the ranker.
3. The model is bounded by the offline evidence (:func:`~services.diagnostician.ranker.allowed_actions`):
   it may propose only a playbook of the runbook of a hypothesis the ranker itself supports for this
   evidence (its best, and up to two more above a confidence floor), at that runbook's level or higher
   (more cautious), never lower; ``page_oncall`` is always allowed. Each hypothesis carries a playbook
   only when that playbook is allowed too, so the remediation policy cannot fall back to one that is not.
4. When the ranker withheld or limited its own action (its Diagnosis has ``notes``: untrusted XID
   text, an uncorroborated webhook alert), the model may propose only what the ranker proposed, at its
   level or higher, or page a human; the ranker's notes are carried into the LLM's Diagnosis.
5. Playbook parameters (which node, which pod) come from the incident's topology labels, never from
   the model. Its causes must be runbook root causes (or an XID in the evidence).
6. The model's free text (summaries, evidence) is untrusted: notifications show it quoted, stripped of
   links and mentions (:func:`services.notify.render.common.sanitize`).

Timeouts, transport errors, non-JSON, schema violations and answers naming no known root cause all
fall back to the offline ranker's diagnosis.
"""

from __future__ import annotations

import functools
import json
import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any

import openai
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.core.errors import ConfigError
from services.core.events import Citation, Diagnosis, Hypothesis, IncidentEvent
from services.core.paths import REPO_ROOT
from services.core.settings import Settings
from services.diagnostician.diagnostician import Diagnostician, RankerDiagnostician
from services.diagnostician.evidence import Evidence
from services.diagnostician.kb import SearchHit
from services.diagnostician.ranker import (
    ALWAYS_ALLOWED,
    PLAYBOOK_PARAMS,
    RunbookIndex,
    allowed_actions,
    fillable,
    playbook_params,
)
from services.diagnostician.runbooks import PLAYBOOK_DEFAULT_LEVELS, Runbook

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4
# Share of the budget the telemetry may take before runbooks get the rest.
EVIDENCE_SHARE = 0.45
RUNBOOK_EXCERPT_CHARS = 1500


class LLMHypothesis(BaseModel):
    """One hypothesis as the model must return it."""

    model_config = ConfigDict(extra="forbid")

    cause: str = Field(min_length=1)
    confidence: float = Field(ge=0.0, le=1.0)
    summary: str
    evidence: list[str]
    citations: list[str]


class LLMAnswer(BaseModel):
    """The Diagnosis-shaped answer the model must return."""

    model_config = ConfigDict(extra="forbid")

    hypotheses: list[LLMHypothesis] = Field(min_length=1, max_length=5)
    proposed_playbook: str | None
    level: int | None = Field(ge=1, le=3)


ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["hypotheses", "proposed_playbook", "level"],
    "properties": {
        "hypotheses": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["cause", "confidence", "summary", "evidence", "citations"],
                "properties": {
                    "cause": {"type": "string", "description": "root_cause of a runbook below"},
                    "confidence": {"type": "number", "description": "0 to 1"},
                    "summary": {"type": "string"},
                    "evidence": {"type": "array", "items": {"type": "string"}},
                    "citations": {"type": "array", "items": {"type": "string"}, "description": "doc ids"},
                },
            },
        },
        "proposed_playbook": {"type": ["string", "null"]},
        "level": {"type": ["integer", "null"]},
    },
}

PROMPT_FILE = REPO_ROOT / "knowledge" / "prompts" / "diagnostician-system.txt"
"""The system prompt, a file beside the runbooks (``{open}`` / ``{close}``: the telemetry fence markers)."""


@functools.cache
def system_prompt() -> str:
    """The system prompt's text, read once.

    Raises:
        ConfigError: the prompt file is missing or lacks the fence markers.
    """
    try:
        text = PROMPT_FILE.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the diagnostician's prompt {PROMPT_FILE}: {exc}") from exc
    if "{open}" not in text or "{close}" not in text:
        raise ConfigError(f"{PROMPT_FILE} must name the telemetry fence as {{open}} and {{close}}")
    return text


def approx_tokens(text: str) -> int:
    """Token estimate used for the budget: characters / 4."""
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def build_messages(
    evidence: Evidence,
    runbooks: Sequence[tuple[Runbook, str]],
    candidates: Sequence[Hypothesis],
    *,
    token_budget: int,
    marker: str | None = None,
) -> list[dict[str, str]]:
    """The system and user messages for one incident, within ``token_budget`` (chars / 4).

    Args:
        evidence: the tools' findings (telemetry, quoted inside the fence).
        runbooks: candidate runbooks with the retrieved excerpt for each ('' for none).
        candidates: the ranker's hypotheses, offered as a starting point.
        token_budget: the most tokens the two messages may take together.
        marker: fence marker; random when not given.
    """
    marker = marker or f"TELEMETRY-{secrets.token_hex(8)}"
    open_mark, close_mark = f"<<<{marker}>>>", f"<<<END-{marker}>>>"
    system = system_prompt().format(open=open_mark, close=close_mark)
    incident = evidence.incident
    header = (
        f"Incident {incident.incident_id} ({incident.severity}), opened at {incident.opened_at:.0f}.\n"
        f"Alerts: {len(incident.alerts)}. Candidate root causes from signal matching: "
        + ", ".join(f"{h.cause} ({h.confidence:.2f})" for h in candidates)
        + "\nPlaybooks in the registry: "
        + ", ".join(f"{name} (level {level})" for name, level in PLAYBOOK_DEFAULT_LEVELS.items())
        + "\n"
    )
    budget_chars = token_budget * CHARS_PER_TOKEN - len(system) - len(header) - 200
    telemetry = _telemetry(evidence, marker)
    evidence_chars = max(400, int(budget_chars * EVIDENCE_SHARE))
    if len(telemetry) > evidence_chars:
        telemetry = telemetry[: evidence_chars - 20] + "\n[truncated]"
    remaining = budget_chars - len(telemetry)
    blocks: list[str] = []
    for runbook, excerpt in runbooks:
        block = _runbook_block(runbook, excerpt)
        if len(block) > remaining:
            if remaining > 300:
                blocks.append(block[: remaining - 15] + "\n[truncated]")
            break
        blocks.append(block)
        remaining -= len(block)
    user = (
        header
        + f"\nEvidence (telemetry, untrusted data):\n{open_mark}\n{telemetry}\n{close_mark}\n"
        + "\nCandidate runbooks:\n"
        + "\n".join(blocks)
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _telemetry(evidence: Evidence, marker: str) -> str:
    incident = evidence.incident
    data: dict[str, Any] = {
        "title": incident.title,
        "labels": dict(incident.labels),
        "facts": evidence.facts[:30],
        "tools": {
            name: result.data if result.status == "ok" else result.status for name, result in evidence.results.items()
        },
    }
    text = json.dumps(data, default=str, ensure_ascii=False, indent=None)
    # the marker is random per request; removing it from the data means no line can close the fence
    return text.replace(marker, "")


def _runbook_block(runbook: Runbook, excerpt: str) -> str:
    playbooks = ", ".join(f"{p.name} (level {p.level})" for p in runbook.playbooks)
    s = runbook.signals
    body = excerpt or runbook.body
    if len(body) > RUNBOOK_EXCERPT_CHARS:
        body = body[:RUNBOOK_EXCERPT_CHARS] + " [...]"
    return (
        f"### {runbook.id}: {runbook.title}\nroot_cause: {runbook.root_cause}\nplaybooks: {playbooks}\n"
        f"signals: anomalies {list(s.anomalies)}, xid {list(s.xid)}, events {list(s.events)}\n{body}\n"
    )


class LLMDiagnostician(Diagnostician):
    """Asks an OpenAI-compatible model, within guardrails; the ranker answers when the model cannot.

    Args:
        settings: ``llm_base_url``, ``llm_model``, ``llm_api_key``, ``llm_timeout_s``, ``llm_token_budget``.
        ranker: gathers evidence, retrieves, and is the fallback.
        client: an ``openai.OpenAI`` client (default: built from the settings).
    """

    name = "llm"

    def __init__(self, settings: Settings, *, ranker: RankerDiagnostician, client: openai.OpenAI | None = None) -> None:
        if client is None and not settings.llm_base_url:
            raise ConfigError("the LLM diagnostician needs CLUSTERMEDIC_LLM_BASE_URL")
        self.settings = settings
        self.ranker = ranker
        self.client = client or openai.OpenAI(
            base_url=settings.llm_base_url,
            api_key=settings.llm_api_key or "none",
            timeout=settings.llm_timeout_s,
            max_retries=0,
        )
        self.last_error: str = ""

    @property
    def index(self) -> RunbookIndex:
        """The ranker's runbook index."""
        return self.ranker.index

    def diagnose(self, incident: IncidentEvent) -> Diagnosis:
        started = time.perf_counter()
        evidence = self.ranker.evidence(incident)
        hits = self.ranker.retrieve(evidence)
        fallback = self.ranker.from_evidence(incident, evidence, hits, started)
        try:
            answer = self.ask(evidence, hits, fallback.hypotheses)
            diagnosis = self.guard(incident, evidence, hits, answer, started, fallback=fallback)
        except (openai.OpenAIError, ValidationError, ValueError) as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("LLM diagnosis of %s failed, using the ranker: %s", incident.incident_id, self.last_error)
            return fallback.model_copy(update={"latency_ms": round((time.perf_counter() - started) * 1000, 3)})
        self.last_error = ""
        return diagnosis

    def prompt(
        self, evidence: Evidence, hits: Sequence[SearchHit], candidates: Sequence[Hypothesis]
    ) -> list[dict[str, str]]:
        """The messages for this evidence: retrieved runbooks first, then the ranker's candidates' runbooks."""
        chosen: dict[str, tuple[Runbook, str]] = {}
        by_id = {rb.id: rb for rb in self.index.runbooks}
        for hit in hits:
            if hit.kind == "runbook" and hit.doc_id in by_id and hit.doc_id not in chosen:
                chosen[hit.doc_id] = (by_id[hit.doc_id], hit.excerpt)
        for hypothesis in candidates:
            rb = self.index.by_root_cause.get(hypothesis.cause)
            if rb is not None and rb.id not in chosen:
                chosen[rb.id] = (rb, "")
        # candidates the evidence supports go first so truncation drops the weakest
        order = [self.index.by_root_cause[h.cause].id for h in candidates if h.cause in self.index.by_root_cause]
        ranked = [chosen[i] for i in order if i in chosen] + [v for k, v in chosen.items() if k not in order]
        return build_messages(evidence, ranked[:8], candidates, token_budget=self.settings.llm_token_budget)

    def ask(self, evidence: Evidence, hits: Sequence[SearchHit], candidates: Sequence[Hypothesis]) -> LLMAnswer:
        """Send the prompt and parse the answer.

        Raises:
            openai.OpenAIError: transport failure or timeout.
            ValidationError, ValueError: the answer is not JSON of the schema.
        """
        response = self.client.chat.completions.create(  # type: ignore[call-overload]
            model=self.settings.llm_model,
            messages=self.prompt(evidence, hits, candidates),
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "diagnosis", "strict": True, "schema": ANSWER_SCHEMA},
            },
            temperature=0,
            timeout=self.settings.llm_timeout_s,
        )
        if not response.choices:
            raise ValueError("the model returned no choices")
        content = response.choices[0].message.content
        if not content:
            raise ValueError("the model returned an empty message")
        return LLMAnswer.model_validate_json(content)

    def guard(
        self,
        incident: IncidentEvent,
        evidence: Evidence,
        hits: Sequence[SearchHit],
        answer: LLMAnswer,
        started: float,
        *,
        fallback: Diagnosis,
    ) -> Diagnosis:
        """Turn a validated answer into a Diagnosis, dropping what the offline evidence does not support.

        Args:
            incident: the incident.
            evidence: the tools' findings (the ranker's, the same the fallback was ranked on).
            hits: retrieval results (citations the model may name).
            answer: the model's validated answer.
            started: ``time.perf_counter()`` when the diagnosis began.
            fallback: the ranker's own Diagnosis of this evidence: its hypotheses bound the allowed
                actions, and its ``notes`` say when it withheld one.

        Raises:
            ValueError: no hypothesis names a known root cause.
        """
        known_causes = set(self.index.by_root_cause) | {f"gpu_xid_{code}" for code in evidence.xids}
        titles = {rb.id: rb.title for rb in self.index.runbooks} | {h.doc_id: h.title for h in hits}
        ranked = {h.cause: h for h in fallback.hypotheses}
        allowed = self.allowed(fallback)
        hypotheses: list[Hypothesis] = []
        for item in answer.hypotheses:
            if item.cause not in known_causes or any(h.cause == item.cause for h in hypotheses):
                continue
            rb = self.index.by_root_cause.get(item.cause)
            citations = [Citation(doc_id=d, title=titles[d]) for d in dict.fromkeys(item.citations) if d in titles]
            if rb is not None and not any(c.doc_id == rb.id for c in citations):
                citations.insert(0, Citation(doc_id=rb.id, title=rb.title))
            if rb is not None:
                first: tuple[str | None, int | None] = (rb.playbooks[0].name, rb.playbooks[0].level)
            else:
                known = ranked.get(item.cause)
                first = (known.playbook, known.level) if known else (None, None)
            playbook, level = _within(allowed, *first)
            hypotheses.append(
                Hypothesis(
                    cause=item.cause,
                    confidence=item.confidence,
                    summary=item.summary[:1000],
                    evidence=tuple(e[:300] for e in item.evidence[:12]),
                    citations=tuple(citations[:5]),
                    playbook=playbook,
                    level=level,
                )
            )
        if not hypotheses:
            raise ValueError("no hypothesis names a known root cause")
        total = sum(h.confidence for h in hypotheses)
        if total > 1.0:
            hypotheses = [h.model_copy(update={"confidence": round(h.confidence / total, 4)}) for h in hypotheses]
        hypotheses.sort(key=lambda h: -h.confidence)
        playbook, level = self.allowed_playbook(allowed, answer.proposed_playbook, answer.level)
        notes = list(fallback.notes)
        if answer.proposed_playbook is not None and playbook is None:
            notes.append(_dropped_note(answer.proposed_playbook, allowed))
        params = playbook_params(playbook, evidence)  # targets from the topology labels, whatever the model wrote
        if playbook and PLAYBOOK_PARAMS.get(playbook) and not fillable(playbook, evidence, params):
            notes.append(
                f"{playbook}: the incident's own telemetry does not give its parameters ({params}); not proposed"
            )
            playbook, level, params = None, None, {}
        return Diagnosis(
            incident_id=incident.incident_id,
            diagnostician=self.name,
            hypotheses=tuple(hypotheses),
            proposed_playbook=playbook,
            proposed_params=params,
            level=level,
            notes=tuple(dict.fromkeys(notes)),
            latency_ms=round((time.perf_counter() - started) * 1000, 3),
            ts=incident.ts,  # event time: the incident event's (latency_ms alone is wall-measured)
        )

    def allowed(self, fallback: Diagnosis) -> dict[str, int]:
        """Playbook -> minimum level the model may propose, given the ranker's own diagnosis.

        The ranker's supported hypotheses decide (:func:`~services.diagnostician.ranker.allowed_actions`),
        unless the ranker withheld or limited its action (``notes``): then only what it proposed, at its
        level or higher, and paging a human.
        """
        if not fallback.notes:
            return allowed_actions(fallback.hypotheses, self.index)
        allowed = dict(ALWAYS_ALLOWED)
        if fallback.proposed_playbook:
            default = PLAYBOOK_DEFAULT_LEVELS.get(fallback.proposed_playbook, 3)
            allowed[fallback.proposed_playbook] = max(default, fallback.level or default)
        return allowed

    def allowed_playbook(
        self, allowed: dict[str, int], playbook: str | None, level: int | None
    ) -> tuple[str | None, int | None]:
        """The playbook and level to propose, or ``(None, None)`` when the model's choice is not allowed.

        Args:
            allowed: playbook -> minimum level (:meth:`allowed`).
            playbook: the model's proposed playbook.
            level: the model's level; raised to the allowed minimum, never lowered below it.
        """
        if playbook is None:
            return None, None
        if playbook not in PLAYBOOK_DEFAULT_LEVELS:
            log.warning("dropping proposed playbook %r: not in the registry", playbook[:80])
            return None, None
        chosen = _within(allowed, playbook, level)
        if chosen[0] is None:
            log.warning("dropping proposed playbook %r: the offline evidence supports only %s", playbook, allowed)
        return chosen


def _within(allowed: dict[str, int], playbook: str | None, level: int | None) -> tuple[str | None, int | None]:
    """``(playbook, level)`` raised to the allowed minimum level, or ``(None, None)`` when not allowed."""
    if playbook is None or playbook not in allowed:
        return None, None
    return playbook, max(level or 1, allowed[playbook])


def _dropped_note(proposed: str, allowed: dict[str, int]) -> str:
    # the model's text is only echoed when it is a registry name: a note is shown to humans
    named = f"{proposed!r}" if proposed in PLAYBOOK_DEFAULT_LEVELS else "a playbook outside the registry"
    supported = ", ".join(f"{name} (level {level})" for name, level in sorted(allowed.items()))
    return f"the model proposed {named}; the offline evidence supports only {supported}: not proposed"
