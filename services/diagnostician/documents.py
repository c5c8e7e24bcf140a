"""Knowledge documents (runbooks, post-mortems, incident summaries) and their chunking.

A document is split by markdown ``##`` section. Every chunk starts with the document title and a
compact line of its front-matter signals (root cause, metrics, event reasons, XID codes, anomaly
signals), so a chunk retrieved alone still says what it is about and full-text search on a metric
name or an event reason finds every section of the runbook that owns it. Chunk 0 is an overview:
title, symptoms and signals, which is what a query describing symptoms most often matches.

Labels (stored as ``kb_chunks.labels`` jsonb, filtered with ``@>``) come from front matter: ``kind``,
``area``, ``root_cause`` and, when present, ``hardware``, ``cluster`` and ``model``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from services.core.errors import ConfigError
from services.core.events import IncidentEvent
from services.core.paths import REPO_ROOT
from services.diagnostician.runbooks import Runbook, load_runbooks, split_front_matter

DocKind = Literal["runbook", "postmortem", "report", "incident"]

# Bump when chunking changes, so `medic kb index` re-chunks every document once.
CHUNKER_VERSION = "2"
# A section longer than this is split at paragraph boundaries (MiniLM reads ~256 word pieces).
MAX_CHUNK_CHARS = 1200
_LABEL_KEYS = ("area", "root_cause", "hardware", "cluster", "model")


@dataclass(frozen=True)
class Chunk:
    """One retrievable passage of a document."""

    position: int
    content: str
    labels: dict[str, Any]


@dataclass(frozen=True)
class KbDocument:
    """A document ready to index: identity, hash of its source, metadata and chunks."""

    doc_id: str
    kind: DocKind
    title: str
    path: str
    content_hash: str
    metadata: dict[str, Any]
    chunks: tuple[Chunk, ...] = field(default_factory=tuple)


def default_knowledge_dir() -> Path:
    """The repository's ``knowledge/`` folder."""
    return REPO_ROOT / "knowledge"


def content_hash(text: str, salt: str = "") -> str:
    """Hash of a document's source plus the chunker version and ``salt`` (the embedder name)."""
    return hashlib.sha256(f"{CHUNKER_VERSION}\0{salt}\0{text}".encode()).hexdigest()


def split_sections(body: str) -> list[tuple[str, str]]:
    """Split markdown into ``(heading, text)`` at ``## `` headings; text before the first is ``("", ...)``.

    Headings inside fenced code blocks are not headings.
    """
    sections: list[tuple[str, list[str]]] = [("", [])]
    fenced = False
    for line in body.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            sections.append((line[3:].strip(), []))
        else:
            sections[-1][1].append(line)
    return [(heading, "\n".join(lines).strip()) for heading, lines in sections if heading or "\n".join(lines).strip()]


def split_long(text: str, limit: int = MAX_CHUNK_CHARS) -> list[str]:
    """Split text at blank lines into pieces of at most ``limit`` characters (a longer paragraph stays whole)."""
    if len(text) <= limit:
        return [text]
    pieces: list[str] = []
    current = ""
    for paragraph in re.split(r"\n\s*\n", text):
        candidate = f"{current}\n\n{paragraph}" if current else paragraph
        if len(candidate) > limit and current:
            pieces.append(current)
            current = paragraph
        else:
            current = candidate
    if current:
        pieces.append(current)
    return pieces


def signal_line(runbook: Runbook) -> str:
    """A compact, searchable line of the runbook's front-matter signals."""
    s = runbook.signals
    parts = [f"root cause {runbook.root_cause}", f"area {runbook.area}"]
    if s.anomalies:
        parts.append("anomalies " + " ".join(s.anomalies))
    if s.xid:
        parts.append("XID " + " ".join(str(code) for code in s.xid))
    if s.events:
        parts.append("events " + " ".join(s.events))
    parts.append("metrics " + " ".join(s.metrics))
    return "Signals: " + "; ".join(parts)


def _chunks(title: str, header: str, overview: str, body: str, labels: dict[str, Any]) -> tuple[Chunk, ...]:
    out = [Chunk(0, f"{title}\n{header}\n\n{overview}".strip(), labels)]
    for heading, text in split_sections(body):
        for piece in split_long(text):
            section = f"## {heading}\n{piece}" if heading else piece
            out.append(Chunk(len(out), f"{title}\n{header}\n\n{section}", labels))
    return tuple(out)


def runbook_document(runbook: Runbook, salt: str = "") -> KbDocument:
    """Chunk one runbook."""
    labels: dict[str, Any] = {"kind": "runbook", "area": runbook.area, "root_cause": runbook.root_cause}
    symptoms = "\n".join(f"- {symptom}" for symptom in runbook.symptoms)
    logs = "\n".join(f"- {template}" for template in runbook.signals.logs)
    overview = f"Symptoms:\n{symptoms}" + (f"\n\nLog lines:\n{logs}" if logs else "")
    metadata: dict[str, Any] = {
        "area": runbook.area,
        "root_cause": runbook.root_cause,
        "severity": runbook.severity,
        "signals": runbook.signals.model_dump(mode="json"),
        "playbooks": [p.model_dump(mode="json") for p in runbook.playbooks],
    }
    source = runbook.path.read_text(encoding="utf-8")
    return KbDocument(
        doc_id=runbook.id,
        kind="runbook",
        title=runbook.title,
        path=_relative(runbook.path),
        content_hash=content_hash(source, salt),
        metadata=metadata,
        chunks=_chunks(runbook.title, signal_line(runbook), overview, runbook.body, labels),
    )


_KEBAB = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_SNAKE = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$")


class PlaybookRun(BaseModel):
    """One remediation a post-mortem says was run (``playbooks_run`` in its front matter)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    level: int = Field(ge=1, le=3)
    status: str = Field(min_length=1)
    approver: str | None = None


class PostmortemFrontMatter(BaseModel):
    """The front matter of a post-mortem (``knowledge/postmortems/*.md``), the one schema for all of them.

    Unknown keys are refused, as in a runbook: in a hand-written file an unknown key is a typo, and a
    misspelt ``root_cause`` would make the post-mortem one the diagnostician never cites.

    Attributes:
        id: unique kebab-case id (the document id in the knowledge base).
        title: one line for humans.
        root_cause: the snake_case root-cause category (a runbook's ``root_cause``), what a diagnosis of a
            similar incident is matched and cited under.
        date: the day of the incident.
        severity: ``info``, ``warning`` or ``critical``.
        services: the models and pools affected.
        playbooks_run: what was run, in order.
        duration_minutes: how long it lasted.
        area, hardware, cluster, model: retrieval labels (optional).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    title: str = Field(min_length=1)
    root_cause: str
    date: dt.date | None = None
    severity: Literal["info", "warning", "critical"] | None = None
    services: tuple[str, ...] = ()
    playbooks_run: tuple[PlaybookRun, ...] = ()
    duration_minutes: float | None = Field(default=None, ge=0)
    area: str | None = None
    hardware: str | None = None
    cluster: str | None = None
    model: str | None = None

    @field_validator("id")
    @classmethod
    def _kebab(cls, value: str) -> str:
        if not _KEBAB.match(value):
            raise ValueError(f"{value!r} is not kebab-case (lower-case words joined by '-')")
        return value

    @field_validator("root_cause")
    @classmethod
    def _snake(cls, value: str) -> str:
        if not _SNAKE.match(value):
            raise ValueError(f"{value!r} is not a snake_case root-cause category")
        return value


def parse_postmortem(source: str, path: Path) -> tuple[PostmortemFrontMatter, str]:
    """Split a post-mortem into its validated front matter and its body.

    Raises:
        ConfigError: no front matter, not YAML, or a key missing, unknown or of the wrong type; the
            message names the file and every offending key.
    """
    data, body = split_front_matter(source, path)
    try:
        meta = PostmortemFrontMatter.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"]) or "front matter"
            problems.append(f"{where}: {error['msg']}")
        raise ConfigError(f"{path}: invalid post-mortem front matter: {'; '.join(problems)}") from None
    if not body.strip():
        raise ConfigError(f"{path}: the post-mortem has front matter but no text after it")
    return meta, body


def postmortem_document(path: Path, salt: str = "") -> KbDocument:
    """Chunk one post-mortem (front matter as :class:`PostmortemFrontMatter`).

    Raises:
        ConfigError: the file cannot be read or its front matter is invalid.
    """
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read post-mortem: {exc}") from exc
    meta, body = parse_postmortem(source, path)
    data = meta.model_dump(mode="json", exclude_none=True)
    labels: dict[str, Any] = {"kind": "postmortem"}
    labels.update({key: str(data[key]) for key in _LABEL_KEYS if data.get(key)})
    played = [p.name for p in meta.playbooks_run]
    header = (
        f"Post-mortem; root cause {meta.root_cause}; services {' '.join(meta.services)}; playbooks {' '.join(played)}"
    )
    metadata: dict[str, Any] = {key: value for key, value in data.items() if key not in ("id", "title")}
    summary, rest = _first_section(body)
    return KbDocument(
        doc_id=meta.id,
        kind="postmortem",
        title=meta.title,
        path=_relative(path),
        content_hash=content_hash(source, salt),
        metadata=metadata,
        chunks=_chunks(meta.title, header, summary, rest, labels),
    )


def report_doc_id(incident_id: str) -> str:
    """The knowledge-base id of an incident's generated report: one document per incident, its latest version."""
    return f"report-{incident_id}"


def report_document(
    incident_id: str,
    title: str,
    root_cause: str,
    markdown: str,
    *,
    labels: dict[str, str] | None = None,
    metadata: dict[str, Any] | None = None,
    salt: str = "",
) -> KbDocument:
    """A generated post-incident report (services/reports) as a knowledge document of kind ``report``.

    Chunked like a post-mortem: the overview chunk is the report's first section (its summary), each
    other ``##`` section a chunk of its own, every chunk headed by the title and a ``Post-mortem;`` line
    naming the root cause, so the diagnostician matches a new incident against it and cites it under
    that cause (:func:`services.diagnostician.ranker.rank`). Only a report whose root cause was diagnosed
    is indexed: a document without one could never be cited.

    Args:
        incident_id: the reported incident.
        title: the report's title.
        root_cause: the cause of the diagnosis the report's remediation followed.
        markdown: the report as Markdown (services.reports.render.to_markdown).
        labels: retrieval labels from the incident (``cluster``, ``model``...; others are ignored).
        metadata: extra metadata stored with the document (incident version, playbooks).
        salt: the embedder name, mixed into the content hash.
    """
    # from the first section on: the title is every chunk's first line already, the subtitle says nothing
    lines = markdown.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("## ")), len(lines))
    body = "\n".join(lines[start:])
    summary, rest = _first_section(body)
    chunk_labels: dict[str, Any] = {"kind": "report", "root_cause": root_cause}
    chunk_labels.update({key: str((labels or {})[key]) for key in _LABEL_KEYS if (labels or {}).get(key)})
    header = f"Post-mortem; generated report of incident {incident_id}; root cause {root_cause}"
    return KbDocument(
        doc_id=report_doc_id(incident_id),
        kind="report",
        title=title,
        path="",
        content_hash=content_hash(f"{root_cause}\n{markdown}", salt),
        metadata={**(metadata or {}), "root_cause": root_cause, "incident_id": incident_id},
        chunks=_chunks(title, header, summary, rest, chunk_labels),
    )


def _first_section(body: str) -> tuple[str, str]:
    sections = split_sections(body)
    if not sections:
        return "", ""
    heading, text = sections[0]
    first = f"## {heading}\n{text}" if heading else text
    rest = "\n\n".join(f"## {h}\n{t}" if h else t for h, t in sections[1:])
    return first, rest


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def load_documents(root: Path | None = None, salt: str = "") -> list[KbDocument]:
    """Load and chunk every runbook (``root/runbooks``) and post-mortem (``root/postmortems``).

    Args:
        root: the knowledge folder; default the repository's ``knowledge/``.
        salt: mixed into each content hash (the embedder name), so switching embedders re-indexes.

    Raises:
        ConfigError: a file is invalid, or two documents share an id.
    """
    root = root or default_knowledge_dir()
    docs = [runbook_document(rb, salt) for rb in load_runbooks(root / "runbooks")]
    pm_dir = root / "postmortems"
    if pm_dir.is_dir():
        docs.extend(postmortem_document(path, salt) for path in sorted(pm_dir.glob("*.md")))
    seen: dict[str, str] = {}
    for doc in docs:
        if doc.doc_id in seen:
            raise ConfigError(f"{doc.path}: document id {doc.doc_id!r} is already used by {seen[doc.doc_id]}")
        seen[doc.doc_id] = doc.path
    return docs


def incident_document(incident: IncidentEvent, root_cause: str, summary: str = "", salt: str = "") -> KbDocument:
    """A past incident as a knowledge document, so later incidents can be matched against it.

    Index incidents once their root cause is known (resolved, or confirmed by a human): indexing the
    diagnostician's own unconfirmed guesses would let it reinforce its mistakes.

    Args:
        incident: the incident with its alerts.
        root_cause: the confirmed root-cause category (a runbook's ``root_cause``).
        summary: what happened and what fixed it, if known.
        salt: the embedder name, mixed into the content hash.
    """
    lines = [f"- {a.signal} on {a.entity} ({a.detector})" for a in incident.alerts]
    for alert in incident.alerts:
        for key in ("xid", "reason", "template", "example"):
            value = alert.evidence.get(key)
            if isinstance(value, (str, int)) and not isinstance(value, bool) and value != "":
                lines.append(f"- {key}: {str(value)[:300]}")
    signals = " ".join(sorted({a.signal for a in incident.alerts}))
    header = f"Incident; root cause {root_cause}; signals {signals}"
    body = "## Evidence\n" + "\n".join(dict.fromkeys(lines)) + (f"\n\n## Summary\n{summary}" if summary else "")
    labels: dict[str, Any] = {"kind": "incident", "root_cause": root_cause}
    labels.update({key: incident.labels[key] for key in _LABEL_KEYS if incident.labels.get(key)})
    return KbDocument(
        doc_id=incident.incident_id,
        kind="incident",
        title=incident.title,
        path="",
        content_hash=content_hash(f"{root_cause}\n{body}", salt),
        metadata={"root_cause": root_cause, "opened_at": incident.opened_at, "labels": dict(incident.labels)},
        chunks=_chunks(incident.title, header, body, "", labels),
    )
