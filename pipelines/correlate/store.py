"""Where the correlate role keeps what outlives a worker besides Kafka: PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from services.alerting.silences import Silence
from services.core.events import Anomaly, IncidentEvent
from services.core.settings import Settings

T = TypeVar("T")


class CorrelateStore(Protocol):
    """What the agent persists and reads besides Kafka: incidents and the anomaly history out, silences in.

    Every method blocks (the agent calls them in its own database thread) and raises when the store
    is unreachable (the agent retries the same call).
    """

    def save_incidents(self, events: Sequence[IncidentEvent]) -> None:
        """Upsert incident events (and their linked alerts), idempotently, in order."""

    def save_anomalies(self, anomalies: Sequence[Anomaly]) -> list[tuple[Anomaly, str]]:
        """Upsert one batch of anomalies into the history; return those it cannot store, with why."""

    def prune_anomalies(self, older_than: float) -> int:
        """Delete stored anomalies older than ``older_than`` (event time); return how many."""

    def silences(self) -> list[Silence]:
        """Every silence the engines should know: pending, active and recently expired."""

    def close(self) -> None:
        """Release connections."""


class PostgresCorrelateStore:
    """:class:`CorrelateStore` on PostgreSQL with one connection, reopened after a failure."""

    def __init__(self, settings: Settings, *, silence_retention_s: float = 3600.0) -> None:
        self.settings = settings
        self.silence_retention_s = silence_retention_s
        self._conn: Any = None

    def _connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            from services.store.db import connect

            self._conn = connect(self.settings)
        return self._conn

    def _run(self, work: Callable[[Any], T]) -> T:
        import psycopg

        try:
            return work(self._connection())
        except psycopg.Error:
            self.close()  # a broken connection is replaced on the next call
            raise

    def save_incidents(self, events: Sequence[IncidentEvent]) -> None:
        from services.store.incidents import upsert_incident_events

        self._run(lambda conn: upsert_incident_events(conn, events))

    def save_anomalies(self, anomalies: Sequence[Anomaly]) -> list[tuple[Anomaly, str]]:
        from services.store.anomalies import write_anomalies

        limit = self.settings.anomaly_evidence_max_bytes
        return self._run(lambda conn: write_anomalies(conn, anomalies, max_evidence_bytes=limit))

    def prune_anomalies(self, older_than: float) -> int:
        from services.store.anomalies import prune_anomalies

        return self._run(lambda conn: prune_anomalies(conn, older_than))

    def silences(self) -> list[Silence]:
        from services.store.silences import engine_silences

        return self._run(lambda conn: engine_silences(conn, now=time.time(), retention_s=self.silence_retention_s))

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
