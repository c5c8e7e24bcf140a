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

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

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


def postmortem_document(path: Path, salt: str = "") -> KbDocument:
    """Chunk one post-mortem (``id``, ``title`` and ``root_cause`` front matter required).

    Raises:
        ConfigError: the file cannot be read or lacks those keys.
    """
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read post-mortem: {exc}") from exc
    data, body = split_front_matter(source, path)
    missing = [key for key in ("id", "title", "root_cause") if not data.get(key)]
    if missing:
        raise ConfigError(f"{path}: post-mortem front matter lacks {', '.join(missing)}")
    labels: dict[str, Any] = {"kind": "postmortem"}
    labels.update({key: str(data[key]) for key in _LABEL_KEYS if data.get(key)})
    played = [p.get("name", "") for p in data.get("playbooks_run", []) or [] if isinstance(p, dict)]
    services = [str(s) for s in data.get("services", []) or []]
    header = (
        f"Post-mortem; root cause {data['root_cause']}; services {' '.join(services)}; playbooks {' '.join(played)}"
    )
    metadata: dict[str, Any] = {
        key: value for key, value in data.items() if key not in ("id", "title") and _jsonable(value)
    }
    metadata["root_cause"] = str(data["root_cause"])
    summary, rest = _first_section(body)
    return KbDocument(
        doc_id=str(data["id"]),
        kind="postmortem",
        title=str(data["title"]),
        path=_relative(path),
        content_hash=content_hash(source, salt),
        metadata=metadata,
        chunks=_chunks(str(data["title"]), header, summary, rest, labels),
    )


def _first_section(body: str) -> tuple[str, str]:
    sections = split_sections(body)
    if not sections:
        return "", ""
    heading, text = sections[0]
    first = f"## {heading}\n{text}" if heading else text
    rest = "\n\n".join(f"## {h}\n{t}" if h else t for h, t in sections[1:])
    return first, rest


def _jsonable(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool, list, dict)) or value is None


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
