"""The anomaly history in PostgreSQL: every anomaly the correlate role consumed (parametrised SQL only).

One writer, the correlate role (``pipelines/correlate/agent.py``), calls :func:`write_anomalies` once
per micro-batch and :func:`prune_anomalies` as its event-time clock passes the retention
(``anomaly_retention_s``). The diagnostician's evidence tools read the table
(``services/diagnostician/tools.py``): the history of an alert's fingerprint, anomalies on a
neighbour node, rollouts near an incident.

A row is keyed by ``(fingerprint, ts)``: the alert's fingerprint (the identity the incident's
``AlertRef.fingerprint`` carries, so the tools find an alert's history) and the anomaly's own time.
Writing the same anomaly again (a redelivery, a replay after a restart) updates the row to the same
values, so a write is idempotent. Evidence is bounded per row (``anomaly_evidence_max_bytes``): when
its JSON is larger, the smallest fields are kept (the scalars the tools read: ``reason``, ``xid``,
scores) and ``_dropped`` names the others.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from pydantic import BaseModel, ConfigDict

from services.core.events import Anomaly

log = logging.getLogger(__name__)

DEFAULT_EVIDENCE_MAX_BYTES = 8192
DROPPED_KEY = "_dropped"
_DROPPED_NAMES_MAX = 20  # a dropped field is named, at most this many, each cut to 64 characters

_COLUMNS = (
    "fingerprint, entity, entity_kind, signal, detector, score, threshold, severity, status, labels,"
    " evidence, provenance, ts"
)
# One statement per batch, so one round trip whatever its size: the rows travel as one array per column.
_UPSERT_BATCH = f"""
INSERT INTO anomalies ({_COLUMNS})
SELECT f, e, k, s, d, sc, th, sev, st, l::jsonb, ev::jsonb, p::jsonb, t
FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::float8[], %s::float8[],
            %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::timestamptz[])
     AS u(f, e, k, s, d, sc, th, sev, st, l, ev, p, t)
ON CONFLICT (fingerprint, ts) DO UPDATE SET
    entity = EXCLUDED.entity,
    entity_kind = EXCLUDED.entity_kind,
    signal = EXCLUDED.signal,
    detector = EXCLUDED.detector,
    score = EXCLUDED.score,
    threshold = EXCLUDED.threshold,
    severity = EXCLUDED.severity,
    status = EXCLUDED.status,
    labels = EXCLUDED.labels,
    evidence = EXCLUDED.evidence,
    provenance = EXCLUDED.provenance
"""


class AnomalyRow(BaseModel):
    """One stored anomaly, as :func:`list_anomalies` reads it back."""

    model_config = ConfigDict(frozen=True)

    fingerprint: str
    entity: str
    entity_kind: str
    signal: str
    detector: str
    score: float
    threshold: float
    severity: str
    status: str
    labels: dict[str, str]
    evidence: dict[str, Any]
    provenance: dict[str, Any]
    ts: datetime


Row = tuple[str, str, str, str, str, float, float, str, str, str, str, str, datetime]


def _clean(value: Any) -> Any:
    """A JSON-safe copy PostgreSQL accepts: no NUL in strings (text and jsonb refuse it), no NaN/inf."""
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {_clean(str(k)): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return _clean(str(value))


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def bounded_evidence(evidence: Mapping[str, Any], max_bytes: int = DEFAULT_EVIDENCE_MAX_BYTES) -> dict[str, Any]:
    """``evidence`` cleaned (see :func:`_clean`) and cut to at most ``max_bytes`` of JSON.

    Fields are kept smallest first, so the scalars survive a long window or log line; the names of
    the dropped fields are listed under ``_dropped``.
    """
    clean: dict[str, Any] = _clean(dict(evidence))
    if len(_dumps(clean).encode()) <= max_bytes:
        return clean
    sized = sorted((len(_dumps({k: v}).encode()) - 1, k) for k, v in clean.items())  # "k":v plus a comma
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    budget = max_bytes - 2
    for size, key in sized:
        if size <= budget:
            kept[key] = clean[key]
            budget -= size
        else:
            dropped.append(key)
    out = {**kept, DROPPED_KEY: _names(dropped)}
    # the list of dropped names takes room too: give up the largest kept fields until it fits
    while len(_dumps(out).encode()) > max_bytes and kept:
        largest = max(kept, key=lambda k: len(_dumps({k: kept[k]})))
        del kept[largest]
        dropped.append(largest)
        out = {**kept, DROPPED_KEY: _names(dropped)}
    return out


def _names(keys: list[str]) -> list[str]:
    return [name[:64] for name in sorted(keys)[:_DROPPED_NAMES_MAX]]


def anomaly_row(anomaly: Anomaly, max_evidence_bytes: int = DEFAULT_EVIDENCE_MAX_BYTES) -> Row:
    """The column values of one anomaly.

    Raises:
        ValueError: the anomaly has no fingerprint, or its time is not a representable instant.
    """
    if not anomaly.fingerprint:
        raise ValueError("an anomaly is stored under its alert's fingerprint, and this one has none")
    if not math.isfinite(anomaly.ts):
        raise ValueError(f"anomaly time {anomaly.ts!r} is not a finite number")
    try:
        at = datetime.fromtimestamp(anomaly.ts, UTC)
    except (OverflowError, OSError, ValueError) as exc:
        raise ValueError(f"anomaly time {anomaly.ts!r} is out of range: {exc}") from exc
    return (
        _clean(anomaly.fingerprint),
        _clean(anomaly.entity),
        anomaly.entity_kind,
        _clean(anomaly.signal),
        _clean(anomaly.detector),
        anomaly.score,
        anomaly.threshold,
        anomaly.severity,
        anomaly.status,
        _dumps(_clean(anomaly.labels)),
        _dumps(bounded_evidence(anomaly.evidence, max_evidence_bytes)),
        _dumps(_clean(anomaly.provenance.model_dump(mode="json"))),
        at,
    )


def write_anomalies(
    conn: psycopg.Connection,
    batch: Sequence[Anomaly],
    *,
    max_evidence_bytes: int = DEFAULT_EVIDENCE_MAX_BYTES,
) -> list[tuple[Anomaly, str]]:
    """Upsert a micro-batch of anomalies by ``(fingerprint, ts)`` in one statement, and commit.

    Each anomaly's ``fingerprint`` must be its alert's (the correlate role sets it). Within a batch the
    last anomaly with a given key wins. An anomaly that cannot be stored is left out and returned with
    the reason, so that the caller can dead-letter it: no fingerprint, a time out of range, or a row
    PostgreSQL refuses (then the batch is written again row by row, each in its own transaction).

    Raises:
        psycopg.OperationalError: the server is unreachable; nothing was written (retry the batch).

    Returns:
        The anomalies not stored, each with the reason; empty when every one was.
    """
    rejected: list[tuple[Anomaly, str]] = []
    rows: dict[tuple[str, datetime], tuple[Anomaly, Row]] = {}
    for anomaly in batch:
        try:
            row = anomaly_row(anomaly, max_evidence_bytes)
        except ValueError as exc:
            rejected.append((anomaly, str(exc)))
            continue
        rows[(row[0], row[-1])] = (anomaly, row)
    if not rows:
        return rejected
    try:
        with conn.transaction():
            conn.execute(_UPSERT_BATCH, _columns([row for _, row in rows.values()]))
    except psycopg.OperationalError:
        raise
    except psycopg.Error as exc:  # one row PostgreSQL refuses must not cost the batch: find it
        log.warning("an anomaly batch was refused (%s); writing its %d rows one by one", exc, len(rows))
        for anomaly, row in rows.values():
            try:
                with conn.transaction():
                    conn.execute(_UPSERT_BATCH, _columns([row]))
            except psycopg.OperationalError:
                raise
            except psycopg.Error as row_exc:
                rejected.append((anomaly, f"refused by PostgreSQL: {row_exc}"))
    if not conn.autocommit:
        conn.commit()
    return rejected


def _columns(rows: Sequence[Row]) -> list[list[Any]]:
    return [list(column) for column in zip(*rows, strict=True)]


def prune_anomalies(conn: psycopg.Connection, older_than: float) -> int:
    """Delete the anomalies whose time is before ``older_than`` (epoch seconds); return how many."""
    with conn.transaction():
        cur = conn.execute("DELETE FROM anomalies WHERE ts < %s", (datetime.fromtimestamp(older_than, UTC),))
        deleted = cur.rowcount
    if not conn.autocommit:
        conn.commit()
    return deleted


def list_anomalies(
    conn: psycopg.Connection, *, fingerprint: str | None = None, entity: str | None = None, limit: int = 100
) -> list[AnomalyRow]:
    """Stored anomalies, newest first, optionally of one fingerprint or entity."""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM anomalies"
        " WHERE (%(fp)s::text IS NULL OR fingerprint = %(fp)s) AND (%(entity)s::text IS NULL OR entity = %(entity)s)"
        " ORDER BY ts DESC, fingerprint LIMIT %(limit)s",
        {"fp": fingerprint, "entity": entity, "limit": limit},
    ).fetchall()
    if not conn.autocommit:
        conn.rollback()
    names = [c.strip() for c in _COLUMNS.split(",")]
    return [AnomalyRow(**dict(zip(names, row, strict=True))) for row in rows]
