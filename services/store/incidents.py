"""Incidents and their linked alerts in PostgreSQL (parametrised SQL only).

The correlate agent upserts every :class:`IncidentEvent` it emits: the incident row by
``incident_id`` and one ``alerts`` row per linked alert by ``(incident_id, fingerprint)``. Upserts
are idempotent and never go back in time: a row is only overwritten by an event at least as recent
as the one that wrote it (``updated_at`` / ``last_seen_at``), so a replay after a restarted worker,
which re-sends older versions of an incident, changes nothing.

Column meanings for alerts: ``starts_at`` is the alert's start, ``last_seen_at`` the time of the
incident version that last carried it, ``ends_at`` the time of the first version in which it was resolved
(a later version that still carries it resolved keeps that time; one in which it fires again clears it).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Literal

import psycopg
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ConfigDict

from services.core.events import IncidentEvent
from services.core.settings import Settings
from services.store.db import connect

IncidentStatus = Literal["opened", "updated", "mitigated", "resolved"]
STATUSES: tuple[str, ...] = ("opened", "updated", "mitigated", "resolved")

_UPSERT_INCIDENT = """
INSERT INTO incidents (incident_id, group_key, title, status, severity, labels, opened_at, updated_at,
                       mitigated_at, resolved_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (incident_id) DO UPDATE SET
    group_key = EXCLUDED.group_key,
    title = EXCLUDED.title,
    status = EXCLUDED.status,
    severity = EXCLUDED.severity,
    labels = EXCLUDED.labels,
    updated_at = EXCLUDED.updated_at,
    mitigated_at = COALESCE(incidents.mitigated_at, EXCLUDED.mitigated_at),
    resolved_at = EXCLUDED.resolved_at
WHERE incidents.updated_at <= EXCLUDED.updated_at
"""

_UPSERT_ALERT = """
INSERT INTO alerts (fingerprint, incident_id, entity, signal, detector, severity, status, labels, evidence,
                    starts_at, last_seen_at, ends_at, provenance)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (incident_id, fingerprint) DO UPDATE SET
    entity = EXCLUDED.entity,
    signal = EXCLUDED.signal,
    detector = EXCLUDED.detector,
    severity = EXCLUDED.severity,
    status = EXCLUDED.status,
    labels = EXCLUDED.labels,
    evidence = EXCLUDED.evidence,
    provenance = EXCLUDED.provenance,
    starts_at = EXCLUDED.starts_at,
    last_seen_at = EXCLUDED.last_seen_at,
    -- a later version that still carries the resolved alert keeps the time it resolved at
    ends_at = CASE WHEN EXCLUDED.ends_at IS NULL THEN NULL ELSE COALESCE(alerts.ends_at, EXCLUDED.ends_at) END
WHERE alerts.last_seen_at <= EXCLUDED.last_seen_at
"""

_INCIDENT_COLUMNS = (
    "incident_id, group_key, title, status, severity, labels, opened_at, updated_at, mitigated_at, resolved_at"
)
_ALERT_COLUMNS = (
    "fingerprint, incident_id, entity, signal, detector, severity, status, labels, evidence, starts_at,"
    " last_seen_at, ends_at"
)


class AlertRow(BaseModel):
    """One alert linked to an incident."""

    model_config = ConfigDict(frozen=True)

    fingerprint: str
    incident_id: str
    entity: str
    signal: str
    detector: str
    severity: str
    status: str
    labels: dict[str, str]
    evidence: dict[str, Any]
    starts_at: datetime
    last_seen_at: datetime
    ends_at: datetime | None


class IncidentRow(BaseModel):
    """One incident, with its linked alerts when read with :func:`get_incident`."""

    model_config = ConfigDict(frozen=True)

    incident_id: str
    group_key: str
    title: str
    status: IncidentStatus
    severity: str
    labels: dict[str, str]
    opened_at: datetime
    updated_at: datetime
    mitigated_at: datetime | None
    resolved_at: datetime | None
    alerts: tuple[AlertRow, ...] = ()


def _at(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC)


def incident_status(event: IncidentEvent) -> IncidentStatus:
    """The row status an event leaves: its kind, except that a mitigated or resolved state wins."""
    state = event.labels.get("state", "")
    if event.kind == "resolved" or state == "resolved":
        return "resolved"
    if event.kind == "mitigated" or state == "mitigated":
        return "mitigated"
    return event.kind


def upsert_incident_events(conn: psycopg.Connection, events: Sequence[IncidentEvent]) -> None:
    """Upsert incident events and their alerts, in order, in one transaction."""
    if not events:
        return
    incident_rows = []
    alert_rows = []
    for event in events:
        status = incident_status(event)
        at = _at(event.ts)
        incident_rows.append(
            (
                event.incident_id,
                event.group_key,
                event.title,
                status,
                event.severity,
                Jsonb(event.labels),
                _at(event.opened_at),
                at,
                at if status == "mitigated" else None,
                at if status == "resolved" else None,
            )
        )
        for alert in event.alerts:
            alert_rows.append(
                (
                    alert.fingerprint,
                    event.incident_id,
                    alert.entity,
                    alert.signal,
                    alert.detector,
                    alert.severity,
                    alert.status,
                    Jsonb(alert.labels),
                    Jsonb(alert.evidence),
                    _at(alert.starts_at),
                    at,
                    at if alert.status == "resolved" else None,
                    # the trust model reads it back (docs/security.md): a re-diagnosis believes what the first did
                    Jsonb(alert.provenance.model_dump(mode="json")),
                )
            )
    with conn.transaction(), conn.cursor() as cur:
        cur.executemany(_UPSERT_INCIDENT, incident_rows)
        if alert_rows:
            cur.executemany(_UPSERT_ALERT, alert_rows)
    if not conn.autocommit:
        conn.commit()


def save_incident_events(settings: Settings, events: Sequence[IncidentEvent]) -> None:
    """Open a connection and :func:`upsert_incident_events`."""
    with connect(settings) as conn:
        upsert_incident_events(conn, events)


def _incident(row: Sequence[Any], alerts: tuple[AlertRow, ...] = ()) -> IncidentRow:
    names = [c.strip() for c in _INCIDENT_COLUMNS.split(",")]
    return IncidentRow(**dict(zip(names, row, strict=True)), alerts=alerts)


def _alert(row: Sequence[Any]) -> AlertRow:
    names = [c.strip() for c in _ALERT_COLUMNS.split(",")]
    return AlertRow(**dict(zip(names, row, strict=True)))


def list_incidents(conn: psycopg.Connection, *, status: str | None = None, limit: int = 100) -> list[IncidentRow]:
    """Incidents, most recently changed first, optionally only those with ``status``."""
    if status is None:
        rows = conn.execute(
            f"SELECT {_INCIDENT_COLUMNS} FROM incidents ORDER BY updated_at DESC, incident_id LIMIT %s", (limit,)
        ).fetchall()
    else:
        rows = conn.execute(
            f"SELECT {_INCIDENT_COLUMNS} FROM incidents WHERE status = %s"
            " ORDER BY updated_at DESC, incident_id LIMIT %s",
            (status, limit),
        ).fetchall()
    return [_incident(r) for r in rows]


def get_incident(conn: psycopg.Connection, incident_id: str) -> IncidentRow | None:
    """One incident with its linked alerts (oldest start first), or None."""
    row = conn.execute(f"SELECT {_INCIDENT_COLUMNS} FROM incidents WHERE incident_id = %s", (incident_id,)).fetchone()
    if row is None:
        return None
    alerts = conn.execute(
        f"SELECT {_ALERT_COLUMNS} FROM alerts WHERE incident_id = %s ORDER BY starts_at, fingerprint", (incident_id,)
    ).fetchall()
    return _incident(row, tuple(_alert(a) for a in alerts))


def latest_alerts(conn: psycopg.Connection, *, firing_only: bool = False, limit: int = 10000) -> list[AlertRow]:
    """Each alert's latest row (by ``last_seen_at``) across the incidents that link it, oldest start
    first, at most ``limit``; with ``firing_only``, only those whose latest row fires.

    An alert linked to several incidents has one row per incident; the most recent one says what it is
    now (the Alertmanager API lists alerts, not links). The firing filter runs before the limit, so
    resolved history never crowds out what fires.
    """
    where = "WHERE status = 'firing' AND ends_at IS NULL" if firing_only else ""
    rows = conn.execute(
        f"SELECT {_ALERT_COLUMNS} FROM ("
        f" SELECT DISTINCT ON (fingerprint) {_ALERT_COLUMNS} FROM alerts"
        "  ORDER BY fingerprint, last_seen_at DESC, incident_id DESC"
        f") latest {where} ORDER BY starts_at, fingerprint LIMIT %s",
        (limit,),
    ).fetchall()
    if not conn.autocommit:
        conn.commit()
    return [_alert(r) for r in rows]
