"""Event contracts: one pydantic model per Kafka topic.

Every model is frozen, ignores unknown fields (so an older consumer reads a newer producer's
messages), names its topic in ``topic`` and carries ``schema_version``. Values are JSON; the Kafka key
of a message is :meth:`Event.key`, chosen so every message about one entity lands on one partition.

Timestamps are UNIX seconds (float, UTC).
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.core.errors import DecodeError, SchemaError
from services.core.fingerprint import fingerprint as hash_parts

Severity = Literal["info", "warning", "critical"]
EntityKind = Literal["gpu", "node", "pod", "model", "service", "other"]
SEVERITY_RANK: dict[str, int] = {"info": 0, "warning": 1, "critical": 2}

E = TypeVar("E", bound="Event")


class Event(BaseModel):
    """Base of every message on a ClusterMedic topic."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    topic: ClassVar[str] = ""
    schema_version: int = 1

    def key(self) -> str:
        """Kafka message key: the entity every message about the same thing shares."""
        raise NotImplementedError

    def to_bytes(self) -> bytes:
        """Serialise to the JSON bytes written to Kafka."""
        return self.model_dump_json().encode()

    @classmethod
    def from_bytes(cls: type[E], raw: bytes | str) -> E:
        """Parse Kafka bytes into this model.

        Raises:
            DecodeError: the bytes are not UTF-8 JSON.
            SchemaError: the JSON does not validate.
        """
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
            raise DecodeError(f"{cls.__name__}: not UTF-8 JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise SchemaError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
        try:
            event = cls.model_validate(data)
        except ValidationError as exc:
            raise SchemaError(f"{cls.__name__}: {_short(exc)}") from exc
        if _may_not_serialise(raw):
            # every consumer writes what it read again (Kafka, Postgres, a dead letter): refuse here what
            # would fail there, far from where it came in, or would not read back (pydantic writes a
            # NaN, an infinity or 1e400 as null)
            try:
                json.dumps(event.model_dump(), allow_nan=False)  # the validated values: 1e400 is inf by now
                event.to_bytes()
            except (ValueError, RecursionError) as exc:  # pydantic's serialisation error is a ValueError
                raise SchemaError(f"{cls.__name__}: parses but cannot be serialised again: {exc}") from exc
        return event


# What JSON parses but cannot be written again: a lone surrogate (a \ud800-\udfff escape, or its bytes,
# which json.loads decodes with "surrogatepass"), a number no float holds (NaN, Infinity, 1e400, 400
# digits), and nesting deeper than pydantic serialises (~255).
_MAY_NOT_SERIALISE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]|NaN|Infinity|[eE]\+?\d{3}|\d{300}")
_NESTING_CHECKED_ABOVE = 128


def _may_not_serialise(raw: bytes | str) -> bool:
    """Whether a message might not serialise again (cheap, C-speed scans; rarely true)."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if data.count(b"[") + data.count(b"{") > _NESTING_CHECKED_ABOVE:
        return True
    return _MAY_NOT_SERIALISE.search(data) is not None


def _short(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        parts.append(f"{loc}: {err['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


# --------------------------------------------------------------------------------------- telemetry


class Sample(BaseModel):
    """One metric sample, as Prometheus would store it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    value: float
    ts: float


class MetricBatch(Event):
    """Samples about one entity (a GPU UUID, a pod, a node) gathered in one scrape or write."""

    topic: ClassVar[str] = "telemetry.metrics.v1"
    entity: str = Field(min_length=1, description="GPU UUID, pod or node the samples describe")
    source: str = Field(default="unknown", description="who produced it: simulator, remote_write, scrape...")
    samples: tuple[Sample, ...]

    def key(self) -> str:
        return self.entity


class LogRecord(Event):
    """One log line with its Loki-style stream labels."""

    topic: ClassVar[str] = "telemetry.logs.v1"
    stream: dict[str, str] = Field(default_factory=dict, description="Loki stream labels")
    line: str
    ts: float
    entity: str = Field(default="", description="pod, node or GPU the line is about; defaults to the stream")

    def key(self) -> str:
        if self.entity:
            return self.entity
        for label in ("pod", "node", "Hostname", "hostname", "job"):
            if label in self.stream:
                return self.stream[label]
        return json.dumps(self.stream, sort_keys=True)


class ObjectRef(BaseModel):
    """The Kubernetes object an event is about."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    kind: str
    name: str
    namespace: str = ""
    uid: str = ""


class KubeEvent(Event):
    """A Kubernetes event (core/v1 or events.k8s.io/v1), normalised."""

    topic: ClassVar[str] = "telemetry.events.v1"
    reason: str
    type: Literal["Normal", "Warning"] = "Normal"
    involved_object: ObjectRef
    message: str = ""
    count: int = Field(default=1, ge=1)
    ts: float
    node: str = Field(default="", description="node the object runs on, when known")
    source_component: str = ""

    def key(self) -> str:
        obj = self.involved_object
        return f"{obj.kind}/{obj.namespace}/{obj.name}" if obj.namespace else f"{obj.kind}/{obj.name}"


# ------------------------------------------------------------------------------------- provenance

FACT_GPU_FAULT = "gpu_fault"
"""Fact kind: a GPU fault (XID, ECC, NVLink, fell off the bus) happened on the named GPU or node."""
FACT_TOPOLOGY = "topology"
"""Fact kind: the named pod, node or GPU exists, seen in telemetry ClusterMedic collected itself."""


class Provenance(BaseModel):
    """Where a signal came from, and which kinds of fact that source is believed for.

    The trust model (docs/security.md): a GPU fault counts only from a source trusted for
    :data:`FACT_GPU_FAULT` (a DCGM or NVML metric, the node's own kernel log); an action's target and a
    webhook alert's corroboration come only from sources trusted for :data:`FACT_TOPOLOGY` (telemetry
    ClusterMedic collected itself). The default, which every message written before provenance existed
    gets, is trusted for nothing: a missing provenance can only take trust away, never add it.

    Attributes:
        source: ``kernel_log``, ``app_log``, ``dcgm``, ``nvml``, ``prometheus`` (other metrics),
            ``kube_api``, ``detector`` (learned detectors over metric features), ``alertmanager_webhook``
            or ``unknown``. A plain string, so an older consumer reads a newer source name.
        stream: which stream, exporter or receiver: Loki stream labels, a metric batch's source.
        trusted: the fact kinds this source is believed for.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    source: str = "unknown"
    stream: str = Field(default="", max_length=500)
    trusted: tuple[str, ...] = ()

    def trusts(self, fact: str) -> bool:
        """Whether this source is believed for ``fact`` (:data:`FACT_GPU_FAULT`, :data:`FACT_TOPOLOGY`)."""
        return fact in self.trusted


# ------------------------------------------------------------------------------------- detection


class Anomaly(Event):
    """Something a detector (or an external Alertmanager) judged abnormal about one entity.

    Two keys, each with one job. ``fingerprint`` is the alert's identity: the same for its firing
    and its resolution, and for every later occurrence, so a resolved anomaly finds the alert it
    resolves and the history of an alert is one fingerprint. ``dedup_key`` is the delivery's: every
    redelivery of one alert state carries it, and a new state (resolved, fired again) does not, so a
    redelivery can be skipped without losing a state change (:meth:`delivery_key`).
    """

    topic: ClassVar[str] = "anomalies.v1"
    entity: str = Field(min_length=1)
    entity_kind: EntityKind = "other"
    signal: str = Field(min_length=1, description="what is abnormal, e.g. gpu_xid, vram_leak, ttft_slo_burn")
    detector: str = Field(min_length=1, description="registry name of the detector, or 'alertmanager'")
    score: float
    threshold: float
    severity: Severity = "warning"
    status: Literal["firing", "resolved"] = "firing"
    ts: float
    labels: dict[str, str] = Field(default_factory=dict, description="topology and routing labels")
    evidence: dict[str, Any] = Field(default_factory=dict, description="features, template, event...")
    fingerprint: str = Field(
        default="",
        description="the alert's identity, the same for its firing and its resolution; set by the producer "
        "(empty: the correlator uses the fingerprint of the alert labels)",
    )
    dedup_key: str = Field(
        default="",
        description="the delivery's idempotency key: the same for every redelivery of one alert state; "
        "empty: derived from fingerprint, status and ts (delivery_key)",
    )
    provenance: Provenance = Field(default_factory=Provenance, description="source and what it is trusted for")

    def key(self) -> str:
        return self.entity

    def delivery_key(self) -> str:
        """The key a redelivery of this alert state shares and nothing else does: ``dedup_key`` when the
        producer set one, else a hash of the identity (``fingerprint``, or detector, signal and entity
        when it is empty), ``status`` and ``ts``."""
        if self.dedup_key:
            return self.dedup_key
        identity = (self.fingerprint,) if self.fingerprint else (self.detector, self.signal, self.entity)
        return hash_parts("delivery", *identity, self.status, repr(self.ts))


# ----------------------------------------------------------------------------------- incidents


class AlertRef(BaseModel):
    """One alert linked to an incident; linked, never merged away."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    fingerprint: str
    entity: str
    signal: str
    detector: str
    severity: Severity
    status: Literal["firing", "resolved"] = "firing"
    starts_at: float
    labels: dict[str, str] = Field(default_factory=dict)
    evidence: dict[str, Any] = Field(default_factory=dict)
    provenance: Provenance = Field(default_factory=Provenance, description="the anomaly's provenance")


class IncidentEvent(Event):
    """A change in an incident's life: opened, updated, mitigated or resolved."""

    topic: ClassVar[str] = "incidents.v1"
    incident_id: str = Field(min_length=1)
    kind: Literal["opened", "updated", "mitigated", "resolved"]
    severity: Severity
    title: str
    group_key: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    alerts: tuple[AlertRef, ...] = ()
    opened_at: float
    ts: float

    def key(self) -> str:
        return self.incident_id


# ---------------------------------------------------------------------------------- diagnosis


class Citation(BaseModel):
    """A knowledge-base passage or past incident a hypothesis relies on."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    doc_id: str
    title: str = ""
    excerpt: str = ""
    score: float = 0.0


class Hypothesis(BaseModel):
    """One candidate root cause with its confidence and evidence."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    cause: str = Field(min_length=1, description="root-cause category, e.g. gpu_xid_79_fallen_off_bus")
    confidence: float = Field(ge=0.0, le=1.0)
    summary: str = ""
    evidence: tuple[str, ...] = ()
    citations: tuple[Citation, ...] = ()
    playbook: str | None = None
    level: int | None = Field(default=None, ge=1, le=3)


class Diagnosis(Event):
    """Ranked root-cause hypotheses for an incident, with the proposed remediation."""

    topic: ClassVar[str] = "diagnoses.v1"
    incident_id: str = Field(min_length=1)
    diagnostician: str = Field(description="'ranker' (offline) or 'llm'")
    hypotheses: tuple[Hypothesis, ...]
    proposed_playbook: str | None = None
    proposed_params: dict[str, Any] = Field(default_factory=dict)
    level: int | None = Field(default=None, ge=1, le=3)
    notes: tuple[str, ...] = Field(
        default=(),
        description="why an action was withheld or limited (untrusted evidence, no corroboration); shown to humans",
    )
    latency_ms: float = 0.0
    ts: float

    def key(self) -> str:
        return self.incident_id


# -------------------------------------------------------------------------------- remediation

RemediationStatus = Literal[
    "proposed",
    "awaiting_approval",
    "approved",
    "rejected",
    "expired",
    "blocked",
    "running",
    "succeeded",
    "failed",
    "rolled_back",
    "paged",
    "dry_run",  # a dry run ended: decision and plan recorded, nothing changed
]


class RemediationEvent(Event):
    """Progress of a remediation run or one of its steps."""

    topic: ClassVar[str] = "remediations.v1"
    incident_id: str = Field(min_length=1)
    run_id: str = Field(min_length=1)
    playbook: str
    step: str = Field(default="", description="step name; empty for run-level events")
    status: RemediationStatus
    level: int = Field(ge=1, le=3)
    approver: str = ""
    detail: str = ""
    dry_run: bool = Field(default=False, description="the run is a dry run: it changes nothing")
    ts: float

    def key(self) -> str:
        return self.incident_id


# -------------------------------------------------------------------------------- dead letters


class DeadLetter(Event):
    """A message a consumer or receiver could not accept, kept with the reason."""

    topic: ClassVar[str] = "deadletter.v1"
    source_topic: str = Field(description="topic (or receiver endpoint) the input came from")
    source_key: str = ""
    raw_b64: str = Field(description="the input bytes, base64")
    error: str
    error_type: str = ""
    consumer: str = Field(default="", description="who rejected it")
    ts: float

    @classmethod
    def of(
        cls,
        *,
        raw: bytes,
        source_topic: str,
        error: BaseException | str,
        consumer: str,
        ts: float,
        source_key: bytes | str | None = None,
    ) -> DeadLetter:
        """Build a dead letter from the rejected bytes and the reason.

        The reason and the key may quote the rejected input, which may hold a lone surrogate: both are
        made encodable (backslash escapes), so that a dead letter can always be written.
        """
        if isinstance(source_key, bytes):
            source_key = source_key.decode("utf-8", "replace")
        return cls(
            source_topic=_encodable(source_topic),
            source_key=_encodable(source_key or ""),
            raw_b64=base64.b64encode(raw).decode(),
            error=_encodable(str(error)),
            error_type=type(error).__name__ if isinstance(error, BaseException) else "",
            consumer=consumer,
            ts=ts,
        )

    @property
    def raw(self) -> bytes:
        """The rejected bytes."""
        return base64.b64decode(self.raw_b64)

    def key(self) -> str:
        return self.source_key or self.source_topic


def _encodable(text: str) -> str:
    """``text`` with any lone surrogate written as a backslash escape (UTF-8 can carry the result)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


ALL_EVENTS: tuple[type[Event], ...] = (
    MetricBatch,
    LogRecord,
    KubeEvent,
    Anomaly,
    IncidentEvent,
    Diagnosis,
    RemediationEvent,
    DeadLetter,
)
EVENTS_BY_TOPIC: dict[str, type[Event]] = {cls.topic: cls for cls in ALL_EVENTS}
