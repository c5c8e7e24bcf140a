"""Keep the report of a resolved incident: rendered once per incident version, stored, indexed back.

What the report task (:mod:`services.reports.tasks`) does when an incident resolves, without Celery so
that it is tested directly:

1. read the incident's facts; the stored incident must have caught up with the event that asked
   (:class:`~services.reports.errors.NotCaughtUp` otherwise: the task retries);
2. if a report of this incident version (``incidents.updated_at``) is stored, that is the answer: a
   redelivered task renders nothing, an incident that resolves again after reopening gets a new one;
3. else build the report (facts, telemetry, plots) and store its Markdown, HTML and summary in
   ``reports`` (migration 0010), one row per (incident, version), ``ON CONFLICT DO NOTHING``;
4. index it into the knowledge base as a document of kind ``report`` under the root cause its
   remediation followed (:func:`services.diagnostician.documents.report_document`), so the
   diagnostician retrieves it for a similar incident and cites it. One document per incident: a later
   version replaces it. An incident nobody diagnosed has no root cause to file it under and is not
   indexed (the stored row says so: ``kb_doc_id`` NULL).

The same stored version renders to the same bytes (docs/reports.md), so a task that died between two
steps and runs again stores and indexes the same thing.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg.types.json import Jsonb

from services.core.errors import StoreError
from services.core.settings import Settings
from services.diagnostician.embedder import Embedder
from services.notify.render.slack import escape
from services.reports.build import Report, deciding_diagnosis
from services.reports.document import Bullets
from services.reports.errors import NotCaughtUp
from services.reports.facts import load_facts
from services.reports.render import to_html, to_markdown
from services.reports.telemetry import MetricSource

log = logging.getLogger(__name__)

SUMMARY_MAX_CHARS = 2500
"""A Slack section holds 3000 characters; the link and the heading take the rest."""
_BOLD = re.compile(r"\*\*(.+?)\*\*")


@dataclass(frozen=True)
class StoredReport:
    """One stored report (a ``reports`` row).

    Attributes:
        incident_id: the incident.
        version: the incident's ``updated_at`` the report was built from.
        title: the report's title.
        summary: the summary section as Markdown lines (what Slack shows).
        root_cause: the cause it is indexed under; None when nobody diagnosed the incident.
        kb_doc_id: its knowledge-base document; None when not indexed.
        posted: Slack channel (as configured) -> the ``ts`` of the summary posted there.
        created: whether this call rendered and stored it (False: it was stored already).
    """

    incident_id: str
    version: datetime
    title: str
    summary: str
    root_cause: str | None
    kb_doc_id: str | None
    posted: dict[str, str] = field(default_factory=dict)
    created: bool = False


def report_url(external_url: str, incident_id: str) -> str:
    """The API's HTML rendering of the report (``GET /api/v1/incidents/{id}/report``); '' without a base URL."""
    if not external_url:
        return ""
    return f"{external_url.rstrip('/')}/api/v1/incidents/{quote(incident_id, safe='')}/report?format=html"


def summary_lines(report: Report) -> list[str]:
    """The report's Summary section, one line per bullet (Markdown)."""
    assert report.document is not None
    for section in report.document.sections:
        if section.title == "Summary":
            return [item for block in section.blocks if isinstance(block, Bullets) for item in block.items]
    return []


def slack_summary(stored: StoredReport, url: str) -> tuple[str, list[dict[str, Any]]]:
    """The Slack message of a stored report: fallback text and one section within Block Kit's limits."""
    lines = [_BOLD.sub(r"*\1*", escape(line)) for line in stored.summary.splitlines() if line]
    body = "\n".join(f"• {line}" for line in lines)
    if len(body) > SUMMARY_MAX_CHARS:
        body = body[: SUMMARY_MAX_CHARS - 1].rstrip() + "…"
    title = escape(stored.title).replace("|", "/")  # '|' would end a link's label
    heading = f"*Post-incident report*: <{url}|{title}>" if url else f"*Post-incident report*: {title}"
    where = "" if url else f"\n_Read it with_ `medic report {stored.incident_id}`"
    text = f"Post-incident report: {stored.title}" + (f" {url}" if url else "")
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": f"{heading}\n{body}{where}"[:3000]}}
    ]
    return text[:3000], blocks


def get_report(conn: psycopg.Connection, incident_id: str, version: datetime | None = None) -> StoredReport | None:
    """The stored report of that incident version (default: its latest), or None."""
    query = (
        "SELECT incident_id, version, title, summary, root_cause, kb_doc_id, posted FROM reports"
        " WHERE incident_id = %s" + (" AND version = %s" if version is not None else "") + " ORDER BY version DESC"
    )
    args: tuple[Any, ...] = (incident_id, version) if version is not None else (incident_id,)
    row = conn.execute(query, args).fetchone()
    if not conn.autocommit:
        conn.rollback()
    if row is None:
        return None
    return StoredReport(
        incident_id=row[0],
        version=row[1],
        title=row[2],
        summary=row[3],
        root_cause=row[4],
        kb_doc_id=row[5],
        posted=dict(row[6] or {}),
    )


def mark_posted(settings: Settings, stored: StoredReport, channel: str, ts: str) -> None:
    """Record that the summary was posted to ``channel`` (as configured), so a retry does not post it again."""
    from services.store.db import connect

    with connect(settings) as conn:
        conn.execute(
            "UPDATE reports SET posted = posted || %s WHERE incident_id = %s AND version = %s",
            (Jsonb({channel: ts}), stored.incident_id, stored.version),
        )
        conn.commit()


def archive_report(
    settings: Settings,
    incident_id: str,
    *,
    embedder: Embedder,
    telemetry: MetricSource | None = None,
    not_before: float | None = None,
) -> StoredReport:
    """Render, store and index the report of the incident's current version, once (module docstring).

    Args:
        settings: the database, the broker (telemetry) and the knowledge folder.
        incident_id: a stored incident.
        embedder: embeds the report's chunks for the knowledge base.
        telemetry: where the plotted series come from (default ``telemetry.metrics.v1``).
        not_before: the time of the event that asked (a resolved event's ``ts``): a stored incident
            older than that has not caught up with it yet.

    Raises:
        IncidentNotFound: no such incident is stored.
        NotCaughtUp: the stored incident is older than ``not_before``.
        InfraNotReady, StoreError: PostgreSQL is unreachable or refused a write.
    """
    from services.diagnostician.documents import report_document
    from services.diagnostician.kb import embedder_salt, index_report
    from services.reports.service import build_incident_report
    from services.store.db import connect

    facts = load_facts(settings, incident_id)
    version = facts.incident.updated_at
    if not_before is not None and version.timestamp() < not_before - 0.001:
        raise NotCaughtUp(
            f"incident {incident_id} is stored as of {version.isoformat()}, older than the event at"
            f" {datetime.fromtimestamp(not_before, UTC).isoformat()}"
        )
    with connect(settings) as conn:
        stored = get_report(conn, incident_id, version)
    if stored is not None and (stored.kb_doc_id is not None or stored.root_cause is None):
        return stored
    deciding = deciding_diagnosis(facts)
    top = max(deciding.hypotheses, key=lambda h: h.confidence) if deciding and deciding.hypotheses else None
    root_cause = top.cause if top is not None else None
    report = build_incident_report(settings, incident_id, telemetry=telemetry)
    assert report.document is not None
    if report.version != version.timestamp():
        # the incident moved on between the two reads: report the version the document was built from
        version = datetime.fromtimestamp(report.version, UTC)
    markdown = to_markdown(report.document)
    summary = "\n".join(summary_lines(report))
    html = to_html(report.document)
    created = False
    try:
        with connect(settings) as conn:
            if stored is None:
                row = conn.execute(
                    "INSERT INTO reports (incident_id, version, title, body_md, body_html, summary, root_cause)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (incident_id, version) DO NOTHING"
                    " RETURNING incident_id",
                    (
                        incident_id,
                        version,
                        report.document.title,
                        markdown,
                        html,
                        summary,
                        root_cause,
                    ),
                ).fetchone()
                conn.commit()
                created = row is not None
            doc_id = None
            if root_cause is not None:
                labels = {k: str(v) for k, v in facts.incident.labels.items()}
                playbooks = sorted({rf.run.playbook for rf in facts.runs})
                document = report_document(
                    incident_id,
                    report.document.title,
                    root_cause,
                    markdown,
                    labels=labels,
                    metadata={"version": version.isoformat(), "playbooks": playbooks},
                    salt=embedder_salt(embedder),
                )
                index_report(conn, embedder, document)
                doc_id = document.doc_id
                conn.execute(
                    "UPDATE reports SET kb_doc_id = %s WHERE incident_id = %s AND version = %s",
                    (doc_id, incident_id, version),
                )
                conn.commit()
            kept = get_report(conn, incident_id, version)
    except psycopg.Error as exc:
        raise StoreError(f"storing the report of {incident_id} failed: {exc}") from exc
    assert kept is not None
    log.info(
        "report of %s (version %s): %s, %s",
        incident_id,
        version.isoformat(),
        "stored" if created else "already stored",
        f"indexed as {doc_id}" if doc_id else "not indexed (no diagnosed root cause)",
    )
    return dataclasses.replace(kept, created=created)
