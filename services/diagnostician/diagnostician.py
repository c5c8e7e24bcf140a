"""The Diagnostician interface, the offline ranker behind it, and ``diagnose_incident``.

A diagnostician consumes an :class:`IncidentEvent` and returns a :class:`Diagnosis`. Two implement
the interface: :class:`RankerDiagnostician` (offline, the default) and
:class:`services.diagnostician.llm.LLMDiagnostician`, which falls back to the ranker. Storing the
diagnosis (``diagnoses`` table) and publishing it (``diagnoses.v1``) are separate steps so a test
or the CLI can diagnose without side effects.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from services.core.bus import KafkaPublisher
from services.core.errors import ClusterMedicError, ConfigError, StoreError
from services.core.events import Diagnosis, IncidentEvent
from services.core.settings import Settings
from services.diagnostician.embedder import CachingEmbedder, Embedder, make_embedder
from services.diagnostician.evidence import Evidence
from services.diagnostician.kb import SearchHit, configure_session, search
from services.diagnostician.ranker import RunbookIndex, rank, review_action, runbook_index
from services.diagnostician.tools import ChangeLog, gather_evidence
from services.store.db import connect

log = logging.getLogger(__name__)


class Diagnostician(ABC):
    """Turns an incident into a ranked diagnosis.

    Contract: :meth:`diagnose` returns a valid :class:`Diagnosis` for any incident (an empty
    hypothesis list when nothing matches) and raises only :class:`ClusterMedicError` subclasses for
    infrastructure it cannot do without; a missing knowledge base or database degrades the diagnosis,
    it does not fail it.
    """

    name: str = "diagnostician"

    @abstractmethod
    def diagnose(self, incident: IncidentEvent) -> Diagnosis:
        """Diagnose one incident."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


class RankerDiagnostician(Diagnostician):
    """The offline evidence ranker (see :mod:`services.diagnostician.ranker`).

    Args:
        settings: database, knowledge folder and retrieval size.
        embedder: embeds the retrieval query; None disables retrieval (signal matching only).
        index: the runbook index (default: built once from the knowledge folder).
        use_database: read the anomalies table and the knowledge base; False for pure unit use.

    Attributes:
        change_log: the cluster's Deployment changes (rollouts), when a source of Kubernetes events feeds
            one; None leaves the ``recent_changes`` tool to the alerts and the anomalies table.
    """

    name = "ranker"

    def __init__(
        self,
        settings: Settings,
        *,
        embedder: Embedder | None = None,
        index: RunbookIndex | None = None,
        use_database: bool = True,
    ) -> None:
        self.settings = settings
        self.embedder = embedder
        self.index = index or runbook_index(settings.kb_dir)
        self.use_database = use_database
        self._conn: psycopg.Connection | None = None
        self._lock = threading.Lock()
        self.change_log: ChangeLog | None = None

    def connection(self) -> psycopg.Connection | None:
        """The diagnostician's connection, opened on first use (None when disabled or unreachable)."""
        if not self.use_database:
            return None
        if self._conn is None or self._conn.closed:
            try:
                # autocommit: every read is one round trip, with no transaction to end afterwards
                self._conn = connect(self.settings, autocommit=True)
                configure_session(self._conn)
            except ClusterMedicError as exc:
                log.warning("diagnosing without the database: %s", exc)
                return None
        return self._conn

    def evidence(self, incident: IncidentEvent) -> Evidence:
        """Run the evidence tools."""
        return gather_evidence(incident, self.connection(), changes=self.change_log)

    def retrieve(self, evidence: Evidence, k: int | None = None) -> list[SearchHit]:
        """Hybrid search for the evidence's query over all document kinds (one round trip); [] on failure."""
        conn = self.connection()
        if conn is None or self.embedder is None:
            return []
        query = evidence.query_text()
        try:
            vector = self.embedder.embed_one(query)
            return search(conn, vector, query, k=k or max(self.settings.kb_top_k, 12))
        except ClusterMedicError as exc:
            log.warning("retrieval failed, ranking on signals only: %s", exc)
            return []

    def diagnose(self, incident: IncidentEvent) -> Diagnosis:
        with self._lock:
            started = time.perf_counter()
            evidence = self.evidence(incident)
            hits = self.retrieve(evidence)
            return self.from_evidence(incident, evidence, hits, started)

    def from_evidence(
        self, incident: IncidentEvent, evidence: Evidence, hits: list[SearchHit], started: float
    ) -> Diagnosis:
        """Rank and build the Diagnosis (shared with the LLM diagnostician's fallback).

        The trust model (:func:`~services.diagnostician.ranker.review_action`) may withhold the top
        hypothesis's playbook: then no hypothesis proposes one (policy would fall back to the next) and
        ``notes`` says why. The notes also list every claim not believed (an XID quoted in an app log).
        """
        hypotheses = rank(evidence, self.index, hits)
        top = hypotheses[0] if hypotheses else None
        review = review_action(top, evidence, self.index)
        if review.withheld:
            hypotheses = [h.model_copy(update={"playbook": None, "level": None}) for h in hypotheses]
            top = hypotheses[0]
        return Diagnosis(
            incident_id=incident.incident_id,
            diagnostician=self.name,
            hypotheses=tuple(hypotheses),
            proposed_playbook=top.playbook if top else None,
            proposed_params=review.params,
            level=top.level if top else None,
            notes=review.notes,
            latency_ms=round((time.perf_counter() - started) * 1000, 3),
            ts=incident.ts,  # event time: the incident event's (latency_ms alone is wall-measured)
        )

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def make_diagnostician(settings: Settings, *, embedder: Embedder | None = None) -> Diagnostician:
    """Build the diagnostician the settings ask for ('ranker' or 'llm').

    Raises:
        ConfigError: unknown diagnostician, or 'llm' without ``llm_base_url``.
    """
    # queries repeat (updated incidents re-diagnosed): cache their vectors
    embedder = embedder if embedder is not None else CachingEmbedder(make_embedder(settings), capacity=2000)
    ranker = RankerDiagnostician(settings, embedder=embedder)
    if settings.diagnostician == "ranker":
        return ranker
    if settings.diagnostician == "llm":
        from services.diagnostician.llm import LLMDiagnostician

        return LLMDiagnostician(settings, ranker=ranker)
    raise ConfigError(f"unknown diagnostician {settings.diagnostician!r}; use 'ranker' or 'llm'")


def store_diagnosis(conn: psycopg.Connection, incident: IncidentEvent, diagnosis: Diagnosis) -> int:
    """Insert the diagnosis (and the incident row, if correlate has not written it yet); return its id.

    Raises:
        StoreError: the insert failed.
    """
    try:
        with conn.transaction():
            conn.execute(
                "INSERT INTO incidents (incident_id, group_key, title, status, severity, labels, opened_at, updated_at)"
                " VALUES (%s, %s, %s, %s, %s, %s, to_timestamp(%s), to_timestamp(%s))"
                " ON CONFLICT (incident_id) DO NOTHING",
                (
                    incident.incident_id,
                    incident.group_key,
                    incident.title,
                    incident.kind,
                    incident.severity,
                    Jsonb(dict(incident.labels)),
                    incident.opened_at,
                    incident.ts,
                ),
            )
            row = conn.execute(
                "INSERT INTO diagnoses (incident_id, diagnostician, hypotheses, proposed_playbook, proposed_params,"
                " level, latency_ms, notes, diagnosed_at)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, to_timestamp(%s)) RETURNING id",
                (
                    diagnosis.incident_id,
                    diagnosis.diagnostician,
                    Jsonb([h.model_dump(mode="json") for h in diagnosis.hypotheses]),
                    diagnosis.proposed_playbook,
                    Jsonb(diagnosis.proposed_params),
                    diagnosis.level,
                    diagnosis.latency_ms,
                    list(diagnosis.notes),
                    # event time, for the report's timeline (created_at is the database's wall time)
                    diagnosis.ts,
                ),
            ).fetchone()
        if not conn.autocommit:
            conn.commit()
    except psycopg.Error as exc:
        if not conn.autocommit:
            conn.rollback()
        raise StoreError(f"cannot store the diagnosis of {incident.incident_id}: {exc}") from exc
    return int(row[0]) if row else 0


def load_incident(conn: psycopg.Connection, incident_id: str) -> IncidentEvent | None:
    """Rebuild the latest IncidentEvent of a stored incident (with its alerts), or None if unknown."""
    row = conn.execute(
        "SELECT incident_id, group_key, title, status, severity, labels, extract(epoch FROM opened_at),"
        " extract(epoch FROM updated_at) FROM incidents WHERE incident_id = %s",
        (incident_id,),
    ).fetchone()
    if row is None:
        if not conn.autocommit:
            conn.rollback()
        return None
    alerts = conn.execute(
        "SELECT fingerprint, entity, signal, detector, severity, status, extract(epoch FROM starts_at), labels,"
        " evidence, provenance FROM alerts WHERE incident_id = %s ORDER BY starts_at",
        (incident_id,),
    ).fetchall()
    if not conn.autocommit:
        conn.rollback()
    data: dict[str, Any] = {
        "incident_id": row[0],
        "group_key": row[1],
        "title": row[2],
        "kind": row[3],
        "severity": row[4],
        "labels": row[5] or {},
        "opened_at": float(row[6]),
        "ts": float(row[7]),
        "alerts": [
            {
                "fingerprint": a[0],
                "entity": a[1],
                "signal": a[2],
                "detector": a[3],
                "severity": a[4],
                "status": a[5],
                "starts_at": float(a[6]),
                "labels": a[7] or {},
                "evidence": a[8] or {},
                "provenance": a[9] or {},
            }
            for a in alerts
        ],
    }
    return IncidentEvent.model_validate(data)


_SHARED: dict[tuple[str, str], Diagnostician] = {}
_SHARED_LOCK = threading.Lock()


def shared_diagnostician(settings: Settings) -> Diagnostician:
    """One diagnostician per (kind, database) in the process, so the model and index load once."""
    key = (settings.diagnostician, settings.database_url or "")
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = make_diagnostician(settings)
        return _SHARED[key]


def diagnose_incident(
    incident: IncidentEvent,
    settings: Settings,
    *,
    diagnostician: Diagnostician | None = None,
    store: bool = True,
    publisher: KafkaPublisher | None = None,
) -> Diagnosis:
    """Diagnose an incident, store the diagnosis and (given a publisher) publish it on ``diagnoses.v1``.

    Args:
        incident: the incident event (opened or updated).
        settings: selects the diagnostician and the database.
        diagnostician: use this one instead of the process-wide one the settings name.
        store: write the ``diagnoses`` row.
        publisher: when given, the diagnosis is published (the caller flushes).
    """
    doctor = diagnostician or shared_diagnostician(settings)
    diagnosis = doctor.diagnose(incident)
    if store:
        with connect(settings) as conn:
            store_diagnosis(conn, incident, diagnosis)
    if publisher is not None:
        publisher.publish(diagnosis)
    return diagnosis
