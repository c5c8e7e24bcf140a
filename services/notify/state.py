"""What the notifier remembers about each incident: its latest event, diagnosis and remediation.

Diagnoses and remediation events name only their incident; the labels that select a route are on
the incident's alerts (``incidents.v1``). The notifier keeps, per incident, the latest of each, the
receivers it notified (so that the incident's ``resolved`` reaches every receiver it paged), and the
events that arrived before the incident did (three topics: nothing orders one against another).
The delivery task reads the same record to render a correlate notification with the incident's
diagnosis and remediation.

The Redis store is the real one (it outlives a restart and is shared with the Celery workers); the
in-memory one is for unit tests.
"""

from __future__ import annotations

import threading
from typing import Protocol

import redis
from pydantic import BaseModel, ConfigDict

from services.core.events import Diagnosis, IncidentEvent, RemediationEvent

MAX_PENDING = 50
"""Events kept while their incident is unknown; older ones are dropped first (a limit for what grows)."""


class IncidentState(BaseModel):
    """The notifier's record of one incident.

    Attributes:
        incident_id: the incident.
        incident: its latest ``incidents.v1`` event, once one arrived.
        diagnosis: its latest diagnosis.
        remediation: its latest remediation event.
        diagnosis_digest: what the last diagnosis notified said (:func:`~services.notify.service.diagnosis_digest`).
        receivers: receivers the notifier sent something about this incident, in first-sent order.
        pending: ``(topic, JSON)`` of diagnoses and remediation events that arrived before the incident.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    incident_id: str
    incident: IncidentEvent | None = None
    diagnosis: Diagnosis | None = None
    remediation: RemediationEvent | None = None
    diagnosis_digest: str = ""
    receivers: tuple[str, ...] = ()
    pending: tuple[tuple[str, str], ...] = ()


class IncidentStore(Protocol):
    """Keeps one :class:`IncidentState` per incident id."""

    def get(self, incident_id: str) -> IncidentState | None:
        """The incident's record, if any."""
        ...

    def put(self, state: IncidentState) -> None:
        """Store (replace) the incident's record."""
        ...


class RedisIncidentStore:
    """Incident records in Redis, one JSON string each, expiring ``ttl_s`` after their last write.

    Args:
        client: a redis-py client.
        ttl_s: seconds a record is kept after its last write.
        prefix: key prefix (notify's).
    """

    def __init__(self, client: redis.Redis, ttl_s: int, prefix: str = "clustermedic:notify:") -> None:
        self._redis = client
        self._ttl = ttl_s
        self._prefix = prefix

    def _key(self, incident_id: str) -> str:
        return f"{self._prefix}incident:{incident_id}"

    def get(self, incident_id: str) -> IncidentState | None:
        """The incident's record, if any."""
        raw = self._redis.get(self._key(incident_id))
        return IncidentState.model_validate_json(raw) if raw else None

    def put(self, state: IncidentState) -> None:
        """Store the record and refresh its expiry."""
        self._redis.set(self._key(state.incident_id), state.model_dump_json(), ex=self._ttl)


class MemoryIncidentStore:
    """Incident records in a dict (unit tests, one-off tools)."""

    def __init__(self) -> None:
        self._records: dict[str, IncidentState] = {}
        self._lock = threading.Lock()

    def get(self, incident_id: str) -> IncidentState | None:
        """The incident's record, if any."""
        with self._lock:
            return self._records.get(incident_id)

    def put(self, state: IncidentState) -> None:
        """Store the record."""
        with self._lock:
            self._records[state.incident_id] = state
