"""The engine's records: alerts, aggregation groups, notification log entries and incidents, and
what the engine returns (:data:`Action`: incident events and :class:`~services.alerting.notification.Notification`
decisions).

Records are plain dataclasses holding only JSON-safe values, so the whole engine state round-trips
through ``json.dumps`` (a restarted worker resumes exactly where the last one stopped).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, TypeVar

from services.alerting.notification import Notification
from services.core.events import AlertRef, IncidentEvent, Provenance

R = TypeVar("R", bound="Record")

IncidentState = Literal["open", "mitigated", "resolved"]


class Record:
    """Base of the dataclass records: ``to_dict`` / ``from_dict`` through JSON-safe fields."""

    def to_dict(self) -> dict[str, Any]:
        """A deep, JSON-safe copy."""
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        """Inverse of :meth:`to_dict`; unknown keys are ignored, missing ones take their defaults."""
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        # Deep copy: the engine mutates its records, and must not mutate the caller's state dict.
        return cls(**{k: copy.deepcopy(v) for k, v in data.items() if k in names})


@dataclass
class Alert(Record):
    """One deduplicated alert: every anomaly with the same fingerprint updates it.

    ``status`` is what the pipeline acts on; ``raw_status`` is what the last anomaly (or the resolve
    timeout) said. They differ only while the alert flaps: then it is held firing.
    """

    fingerprint: str
    labels: dict[str, str]
    entity: str
    entity_kind: str
    signal: str
    detector: str
    severity: str
    starts_at: float
    status: str = "resolved"
    raw_status: str = ""
    ends_at: float | None = None
    raw_ends_at: float | None = None
    first_seen: float = 0.0
    last_seen: float = 0.0
    resolved_at: float | None = None
    timeout_at: float | None = None
    score: float = 0.0
    threshold: float = 0.0
    evidence: dict[str, Any] = field(default_factory=dict)
    routes: list[str] = field(default_factory=list)
    active_routes: list[str] = field(default_factory=list)
    activated_at: float | None = None
    occurrences: list[float] = field(default_factory=list)
    changes: list[float] = field(default_factory=list)
    flapping: bool = False
    incident_id: str | None = None
    provenance: dict[str, Any] = field(default_factory=dict)  # the latest anomaly's, JSON (Provenance)

    def ref(self) -> AlertRef:
        """The alert as linked to incidents and notifications, with its own evidence.

        While the alert flaps, its evidence also says so (``flapping``, ``state_changes``).
        """
        evidence = dict(self.evidence)
        if self.flapping:
            evidence.update(flapping=True, state_changes=len(self.changes))
        return AlertRef(
            fingerprint=self.fingerprint,
            entity=self.entity,
            signal=self.signal,
            detector=self.detector,
            severity=self.severity,  # type: ignore[arg-type]
            status=self.status,  # type: ignore[arg-type]
            starts_at=self.starts_at,
            labels=self.labels,
            evidence=evidence,
            # an alert stored before provenance existed reads as trusted for nothing
            provenance=Provenance.model_validate(self.provenance),
        )


@dataclass
class AggrGroup(Record):
    """Alertmanager's aggregation group: the alerts of one route with equal ``group_by`` labels."""

    key: str
    route_id: str
    labels: dict[str, str]
    receiver: str
    created_at: float
    next_flush: float
    has_flushed: bool = False
    fingerprints: list[str] = field(default_factory=list)


@dataclass
class NotifyEntry(Record):
    """What was last notified for a group (Alertmanager's notification log entry)."""

    group_key: str
    firing: list[str]
    resolved: list[str]
    ts: float


@dataclass
class Incident(Record):
    """Alerts that belong together; each stays linked with its own evidence, none is merged away."""

    id: str
    group_key: str
    opened_at: float
    severity: str
    members: list[str] = field(default_factory=list)
    state: str = "open"
    updated_at: float = 0.0
    mitigated_at: float | None = None
    resolved_at: float | None = None
    escalation: str = ""
    # Announcing (see Engine._changed): whether the opened event went out, whether a change waits
    # to be announced, and when the next announcement may go. An incident restored from a state
    # written before announcing existed was announced already.
    announced: bool = True
    pending: bool = False
    announce_at: float | None = None
    # remediation runs acting on the incident now (run id -> engine time the run began): while any
    # is, the incident does not resolve (correlation.incidents.hold_while_acting)
    acting: dict[str, float] = field(default_factory=dict)


def incident_id(group_key: str, first_fingerprint: str, opened_at: float) -> str:
    """A deterministic incident id: the first alert's group and fingerprint and the opening time.

    A replay of the same input (same config, same ``now`` values) produces the same ids.
    """
    digest = hashlib.sha256(f"{group_key}\x00{first_fingerprint}\x00{opened_at!r}".encode()).hexdigest()
    return f"inc-{digest[:20]}"


Action = IncidentEvent | Notification
"""What the engine returns: incident lifecycle events and notification decisions."""
