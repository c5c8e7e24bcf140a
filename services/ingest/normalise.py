"""From what Prometheus, Loki, Alertmanager and Kubernetes send to ClusterMedic's telemetry events.

Every function here is pure (no I/O, no clock unless a ``now`` is passed) and raises
:class:`~services.ingest.errors.RejectedInput` for input it cannot accept, with a message that says
what is wrong. Given a :class:`~services.ingest.timebounds.TimeCheck`, each leaves out (and the check
counts) the entries stamped outside the event-time window, keeping their valid neighbours. Given
:class:`Limits` (the ``ingest_max_*`` settings), each refuses with 413 a payload holding more records,
a longer line or larger labels than they allow, and bounds what a body becomes in memory before it is
decoded. No input raises anything else (tests/unit/test_parsers_total.py).

Labels and values are kept as received: counters stay cumulative and histograms stay
``_bucket``/``_sum``/``_count`` series, so detectors compute rates downstream without losing anything.

Entity keys decide the Kafka partition, so every signal about one thing lands on one partition:

- a ``DCGM_FI_*`` series with a ``UUID`` label: the GPU UUID;
- else the ``pod`` label; else the node: ``node``, ``Hostname`` (DCGM exporter), ``hostname``
  (newer DCGM exporter), ``instance``; else ``model_name``/``model``; else ``job``.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import math
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import cramjam
from google.protobuf.message import DecodeError as ProtobufDecodeError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.core.events import (
    Anomaly,
    KubeEvent,
    LogRecord,
    MetricBatch,
    ObjectRef,
    Provenance,
    Sample,
    Severity,
)
from services.core.fingerprint import fingerprint as hash_parts
from services.core.fingerprint import label_fingerprint
from services.core.settings import Settings
from services.ingest.errors import RejectedInput
from services.ingest.protowire import PUSH_REQUEST_SCHEMA, PushRequest, WriteRequest, message_count_at_most
from services.ingest.timebounds import TimeCheck

if TYPE_CHECKING:
    from services.ingest.fastwrite import SeriesCache

EntityKind = Literal["gpu", "node", "pod", "model", "service", "other"]

NODE_LABELS = ("node", "Hostname", "hostname", "instance")
_MODEL_LABELS = ("model_name", "model")


def entity_of(labels: Mapping[str, str], name: str = "") -> tuple[str, EntityKind]:
    """Return the entity a series (or stream, or alert) is about, and its kind.

    Args:
        labels: the series labels (``__name__`` may be among them).
        name: the metric name, when it is not in ``labels``.
    """
    name = name or labels.get("__name__", "")
    uuid = labels.get("UUID")
    if uuid and name.startswith("DCGM_FI_"):
        return uuid, "gpu"
    pod = labels.get("pod")
    if pod:
        return pod, "pod"
    for label in NODE_LABELS:
        value = labels.get(label)
        if value:
            return value, "node"
    for label in _MODEL_LABELS:
        value = labels.get(label)
        if value:
            return value, "model"
    job = labels.get("job")
    if job:
        return job, "service"
    return "unknown", "other"


# ----------------------------------------------------------------------------------- limits


def _default(name: str) -> int:
    value: int = Settings.model_fields[name].default
    return value


MESSAGES_PER_RECORD = 16
"""Protobuf messages (series, labels, streams, entries) or JSON values a push may hold per record allowed."""


@dataclass(frozen=True)
class Limits:
    """What one payload may hold (the ``ingest_max_*`` settings); a payload over one is refused whole (413).

    A receiver must bound what a body becomes in memory, not only its size on the wire: a 197 KB
    snappy body of empty Loki entries once became 2.1 million records (+1.47 GB, 17 s). Each limit
    names its setting in the refusal, so the sender's operator knows what to change.
    """

    max_records: int = _default("ingest_max_records_per_request")
    max_line_bytes: int = _default("ingest_max_line_bytes")
    max_label_bytes: int = _default("ingest_max_label_bytes")
    max_message_bytes: int = _default("ingest_max_message_bytes")

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        """The limits ``settings`` set."""
        return cls(
            max_records=settings.ingest_max_records_per_request,
            max_line_bytes=settings.ingest_max_line_bytes,
            max_label_bytes=settings.ingest_max_label_bytes,
            max_message_bytes=settings.ingest_max_message_bytes,
        )

    @property
    def max_messages(self) -> int:
        """Most protobuf messages (or JSON values) a body may hold, checked before it is decoded."""
        return MESSAGES_PER_RECORD * self.max_records

    def check_records(self, count: int, what: str) -> None:
        """Refuse a payload of more than ``max_records`` records.

        Raises:
            RejectedInput: 413, naming the limit.
        """
        if count > self.max_records:
            raise RejectedInput(
                f"payload holds more than {self.max_records} {what}, the limit per request"
                " (CLUSTERMEDIC_INGEST_MAX_RECORDS_PER_REQUEST): send smaller batches",
                status=413,
                reason="too_many_records",
            )

    def check_messages(self, fits: bool, what: str) -> None:
        """Refuse a body that holds more than :attr:`max_messages` messages (``fits`` is the count's verdict).

        Raises:
            RejectedInput: 413, naming the limit.
        """
        if not fits:
            raise RejectedInput(
                f"body holds more than {self.max_messages} {what} ({MESSAGES_PER_RECORD} per record of"
                f" CLUSTERMEDIC_INGEST_MAX_RECORDS_PER_REQUEST={self.max_records}): send smaller batches",
                status=413,
                reason="too_many_records",
            )

    def check_line(self, line: str, where: str) -> None:
        """Refuse a log line longer than ``max_line_bytes`` (UTF-8).

        Raises:
            RejectedInput: 413, naming the limit.
        """
        if len(line) * 4 > self.max_line_bytes and (size := _utf8_len(line)) > self.max_line_bytes:
            raise RejectedInput(
                f"{where}: line of {size} bytes is over the {self.max_line_bytes}-byte limit"
                " (CLUSTERMEDIC_INGEST_MAX_LINE_BYTES)",
                status=413,
                reason="line_too_long",
            )

    def check_labels(self, size: int, where: str) -> None:
        """Refuse a label set of more than ``max_label_bytes`` (names and values together).

        Raises:
            RejectedInput: 413, naming the limit.
        """
        if size > self.max_label_bytes:
            raise RejectedInput(
                f"{where}: labels of {size} bytes are over the {self.max_label_bytes}-byte limit"
                " (CLUSTERMEDIC_INGEST_MAX_LABEL_BYTES)",
                status=413,
                reason="labels_too_large",
            )

    def check_label_dict(self, labels: Mapping[str, str], where: str) -> None:
        """:meth:`check_labels` on a dict of labels."""
        chars = sum(len(k) + len(v) for k, v in labels.items())
        if chars * 4 > self.max_label_bytes:
            self.check_labels(sum(_utf8_len(k) + _utf8_len(v) for k, v in labels.items()), where)


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


# a JSON string, unrolled so that it never backtracks: "...", with any escapes
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def json_values_at_most(raw: bytes, limit: int) -> bool:
    """Whether the JSON text ``raw`` holds at most about ``limit`` values (keys counted too).

    ``json.loads`` turns each value into a Python object of ~50-70 bytes, so 64 MiB of ``["1",""],``
    would take more than a gigabyte. Every value but the first is preceded by a ``,``, ``:``, ``[``
    or ``{``, so their count bounds the values: one C-speed pass decides for any ordinary body; only
    a larger one has its strings (whose commas do not count) blanked and is counted again.
    """

    def structural(text: bytes) -> int:
        return text.count(b",") + text.count(b":") + text.count(b"[") + text.count(b"{")

    if structural(raw) <= limit:
        return True
    return structural(_JSON_STRING.sub(b'""', raw)) <= limit


# ------------------------------------------------------------------------------ compression


def snappy_block(body: bytes, max_bytes: int) -> bytes:
    """Decompress a snappy block-format body, refusing one that would exceed ``max_bytes``.

    The block format starts with the uncompressed length as a varint, so the size is checked before
    any memory is spent on it.
    """
    length, shift = 0, 0
    for i, byte in enumerate(body[:10]):
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
        if i == 9:
            raise RejectedInput("body is not snappy block format: bad length header", reason="snappy")
    else:
        raise RejectedInput("body is not snappy block format: empty or truncated", reason="snappy")
    if length > max_bytes:
        raise RejectedInput(
            f"decompressed body would be {length} bytes, over the {max_bytes}-byte limit",
            status=413,
            reason="too_large",
        )
    try:
        return bytes(cramjam.snappy.decompress_raw(body))
    except Exception as exc:  # cramjam raises its own DecompressionError (not exported with a stable name)
        raise RejectedInput(f"body is not snappy block format: {exc}", reason="snappy") from exc


def inflate(body: bytes, encoding: str, max_bytes: int) -> bytes:
    """Undo a ``Content-Encoding`` of ``gzip``, ``deflate`` or none, bounded by ``max_bytes``."""
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise RejectedInput(f"unsupported Content-Encoding {encoding!r}", status=415, reason="encoding")
    wbits = 16 + zlib.MAX_WBITS if encoding != "deflate" else zlib.MAX_WBITS
    decomp = zlib.decompressobj(wbits)
    try:
        out = decomp.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise RejectedInput(f"body is not valid {encoding}: {exc}", reason="encoding") from exc
    if len(out) > max_bytes or decomp.unconsumed_tail:
        raise RejectedInput(f"decompressed body is over the {max_bytes}-byte limit", status=413, reason="too_large")
    if not decomp.eof:
        raise RejectedInput(f"body is truncated {encoding}", reason="encoding")
    return out


def gzip_json(payload: object) -> bytes:
    """Gzip a JSON document (for tests and clients that push compressed JSON)."""
    return gzip.compress(json.dumps(payload).encode())


# ---------------------------------------------------------------------------- remote_write


def metric_batches(
    series: Iterable[tuple[dict[str, str], Sequence[tuple[float, float]]]],
    *,
    source: str,
    max_samples: int,
    check: TimeCheck | None = None,
) -> tuple[list[MetricBatch], int]:
    """Group samples into one :class:`MetricBatch` per entity (split at ``max_samples``).

    Args:
        series: ``(labels with __name__, [(value, ts seconds), ...])`` per series.
        source: recorded in each batch (``remote_write``, ``scrape``, ``query_range``).
        max_samples: most samples per batch, so one message stays well under Kafka's 1 MB.
        check: the event-time window; samples outside it are left out and counted there.

    Returns:
        The batches and how many samples were dropped because their value or timestamp is not
        finite (NaN staleness markers, infinities: JSON has no number for them).
    """
    by_entity: dict[str, list[dict[str, Any]]] = {}
    dropped = 0
    for labels, samples in series:
        name = labels.pop("__name__")
        entity = entity_of(labels, name)[0]
        bucket = by_entity.setdefault(entity, [])
        for value, ts in samples:
            if not math.isfinite(value) or not math.isfinite(ts):  # JSON has no number for either
                dropped += 1
                continue
            if check is not None and not check.admit(ts, {"name": name, "labels": labels}):
                continue
            bucket.append({"name": name, "labels": labels, "value": value, "ts": ts})
    batches = []
    for entity, samples_ in by_entity.items():
        for start in range(0, len(samples_), max_samples):
            batch, refused = _metric_batch(entity, source, samples_[start : start + max_samples])
            dropped += refused
            if batch is not None:
                batches.append(batch)
    return batches, dropped


def _metric_batch(entity: str, source: str, samples: list[dict[str, Any]]) -> tuple[MetricBatch | None, int]:
    """One batch of ``samples``, leaving out (and counting) those the contract refuses.

    A name or label holding a lone surrogate (a ``\\ud800`` escape in a pulled JSON answer) is not a
    valid string to pydantic: one such sample must not fail its batch, its scrape or its pull page.
    """
    try:
        return MetricBatch.model_validate({"entity": entity, "source": source, "samples": samples}), 0
    except ValidationError:
        pass
    kept = [sample for sample in samples if _valid_sample(sample)]
    try:
        batch = MetricBatch.model_validate({"entity": entity, "source": source, "samples": kept}) if kept else None
    except ValidationError:  # the entity itself is refused
        return None, len(samples)
    return batch, len(samples) - len(kept)


def _valid_sample(sample: dict[str, Any]) -> bool:
    try:
        Sample.model_validate(sample)
    except ValidationError:
        return False
    return True


def remote_write(
    body: bytes,
    *,
    max_decompressed: int,
    max_samples: int,
    cache: SeriesCache | None = None,
    check: TimeCheck | None = None,
    limits: Limits | None = None,
) -> tuple[list[MetricBatch], int, int]:
    """Decode a remote_write 1.0 body (snappy block of a ``prometheus.WriteRequest``).

    Every series must have a non-empty ``__name__`` and unique, non-empty label names; a request
    with one bad series is rejected whole (400), as Prometheus does not retry 4xx answers.

    Samples stamped outside ``check``'s window are left out and counted there (not in the returned
    figures).

    Returns:
        ``(batches, samples accepted, samples dropped as non-finite)``.

    Raises:
        RejectedInput: not snappy, not a WriteRequest, too large, a series is invalid, or (413) over
            one of ``limits``.
    """
    from services.ingest.fastwrite import SeriesCache, walk_write_request

    limits = limits or Limits()
    raw = snappy_block(body, max_decompressed)
    # the walk checks the body with upb (C) unless every series is one upb accepted before
    cache = cache if cache is not None else SeriesCache(max_label_bytes=limits.max_label_bytes)
    batches, accepted, dropped = walk_write_request(raw, cache, max_samples=max_samples, check=check, limits=limits)
    return list(batches), accepted, dropped


def encode_remote_write(series: Iterable[tuple[Mapping[str, str], Sequence[tuple[float, int]]]]) -> bytes:
    """Encode ``(labels, [(value, ts ms)])`` as a snappy-compressed WriteRequest (tests, bench)."""
    request = WriteRequest()
    for labels, samples in series:
        ts = request.timeseries.add()
        for name in sorted(labels):
            ts.labels.add(name=name, value=labels[name])
        for value, ms in samples:
            ts.samples.add(value=value, timestamp=ms)
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


# ------------------------------------------------------------------------------------ Loki

_LABEL_PAIR = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_.]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|\})', re.S)
_UNESCAPE = {"\\": "\\", '"': '"', "n": "\n", "t": "\t"}


def parse_stream_labels(text: str) -> dict[str, str]:
    """Parse a Loki stream selector ``{app="api", env="prod"}`` into a dict.

    Raises:
        RejectedInput: the text is not a ``{name="value", ...}`` selector.
    """
    text = text.strip()
    if not text.startswith("{"):
        raise RejectedInput(f"stream labels {text[:80]!r} do not start with '{{'", reason="labels")
    labels: dict[str, str] = {}
    pos = 1
    if text[1:].strip() == "}":
        return labels
    while True:
        match = _LABEL_PAIR.match(text, pos)
        if not match:
            raise RejectedInput(f"cannot parse stream labels {text[:80]!r} at offset {pos}", reason="labels")
        name, raw_value, sep = match.groups()
        labels[name] = re.sub(r"\\(.)", lambda m: _UNESCAPE.get(m.group(1), m.group(1)), raw_value)
        pos = match.end()
        if sep == "}":
            break
    if text[pos:].strip():
        raise RejectedInput(f"trailing text after stream labels {text[:80]!r}", reason="labels")
    return labels


def _log_record(stream: dict[str, str], line: str, ts: float) -> LogRecord:
    entity, kind = entity_of(stream)
    return LogRecord(stream=stream, line=line, ts=ts, entity=entity if kind != "other" else "")


def _check_stream(index: int, stream: dict[str, str]) -> None:
    if not stream:
        raise RejectedInput(f"stream {index}: at least one label pair is required", reason="labels")


def loki_json(raw: bytes, check: TimeCheck | None = None, limits: Limits | None = None) -> list[LogRecord]:
    """Decode a Loki JSON push body ``{"streams": [{"stream": {...}, "values": [["<ns>", "line"]]}]}``.

    A third element of a value (structured metadata) is accepted and not kept: LogRecord has no field
    for it. Entries stamped outside ``check``'s window are left out and counted there.

    Raises:
        RejectedInput: not JSON, not the documented shape, or over one of ``limits`` (413).
    """
    limits = limits or Limits()
    limits.check_messages(json_values_at_most(raw, limits.max_messages), "JSON values")
    try:
        payload = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise RejectedInput(f"body is not JSON: {exc}", reason="json") from exc
    if not isinstance(payload, dict) or not isinstance(payload.get("streams"), list):
        raise RejectedInput('body must be an object with a "streams" list', reason="schema")
    limits.check_records(
        sum(
            len(item["values"])
            for item in payload["streams"]
            if isinstance(item, dict) and isinstance(item.get("values"), list)
        ),
        "log entries",
    )
    records: list[LogRecord] = []
    for i, item in enumerate(payload["streams"]):
        if not isinstance(item, dict):
            raise RejectedInput(f"streams[{i}] is not an object", reason="schema")
        stream = item.get("stream", {})
        values = item.get("values")
        if not isinstance(stream, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in stream.items()
        ):
            raise RejectedInput(f"streams[{i}].stream must map label names to strings", reason="schema")
        _check_stream(i, stream)
        limits.check_label_dict(stream, f"streams[{i}].stream")
        if not isinstance(values, list):
            raise RejectedInput(f"streams[{i}].values must be a list", reason="schema")
        for j, value in enumerate(values):
            if (
                not isinstance(value, list)
                or len(value) not in (2, 3)
                or not isinstance(value[0], str)
                or not isinstance(value[1], str)
                or (len(value) == 3 and not isinstance(value[2], dict))
            ):
                raise RejectedInput(
                    f'streams[{i}].values[{j}] must be ["<unix ns>", "<line>"] or with a metadata object',
                    reason="schema",
                )
            if not value[0].isdigit() or not value[0].isascii() or len(value[0]) > 20:
                raise RejectedInput(
                    f"streams[{i}].values[{j}]: timestamp {value[0][:30]!r} is not unix nanoseconds",
                    reason="timestamp",
                )
            limits.check_line(value[1], f"streams[{i}].values[{j}]")
            ts = int(value[0]) / 1e9
            if check is not None and not check.admit(ts, {"stream": stream, "line": value[1][:200]}):
                continue
            records.append(_log_record(dict(stream), value[1], ts))
    return records


def loki_protobuf(
    body: bytes, *, max_decompressed: int, check: TimeCheck | None = None, limits: Limits | None = None
) -> list[LogRecord]:
    """Decode a Loki protobuf push body (snappy block of a ``logproto.PushRequest``).

    Entries stamped outside ``check``'s window are left out and counted there.

    Raises:
        RejectedInput: not snappy, not a PushRequest, stream labels that do not parse, or over one of
            ``limits`` (413).
    """
    limits = limits or Limits()
    raw = snappy_block(body, max_decompressed)
    limits.check_messages(message_count_at_most(raw, PUSH_REQUEST_SCHEMA, limits.max_messages), "protobuf messages")
    try:
        request = PushRequest.FromString(raw)
    except ProtobufDecodeError as exc:
        raise RejectedInput(f"body is not a logproto.PushRequest: {exc}", reason="protobuf") from exc
    limits.check_records(sum(len(stream.entries) for stream in request.streams), "log entries")
    records: list[LogRecord] = []
    for i, stream in enumerate(request.streams):
        limits.check_labels(_utf8_len(stream.labels), f"streams[{i}].labels")
        labels = parse_stream_labels(stream.labels)
        _check_stream(i, labels)
        for j, entry in enumerate(stream.entries):
            limits.check_line(entry.line, f"streams[{i}].entries[{j}]")
            ts = entry.timestamp.seconds + entry.timestamp.nanos / 1e9
            if check is not None and not check.admit(ts, {"stream": labels, "line": entry.line[:200]}):
                continue
            records.append(_log_record(dict(labels), entry.line, ts))
    return records


def encode_loki_protobuf(streams: Iterable[tuple[str, Sequence[tuple[int, str]]]]) -> bytes:
    """Encode ``(label selector, [(unix ns, line)])`` as a snappy PushRequest (tests, bench)."""
    request = PushRequest()
    for labels, entries in streams:
        stream = request.streams.add(labels=labels)
        for ns, line in entries:
            entry = stream.entries.add(line=line)
            entry.timestamp.seconds, entry.timestamp.nanos = divmod(ns, 1_000_000_000)
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


# ---------------------------------------------------------------------------- Alertmanager

_RFC3339 = re.compile(r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(Z|z|[+-]\d{2}:\d{2})$")


def parse_rfc3339(text: str) -> float:
    """Parse an RFC 3339 time with up to nanosecond precision (as Go writes it) to UNIX seconds.

    Raises:
        ValueError: not RFC 3339.
    """
    match = _RFC3339.match(text)
    if not match:
        raise ValueError(f"{text!r} is not an RFC 3339 time")
    year, month, day, hour, minute, second, frac, zone = match.groups()
    tz = dt.UTC
    if zone not in ("Z", "z"):
        sign = 1 if zone[0] == "+" else -1
        tz = dt.timezone(sign * dt.timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))
    try:
        moment = dt.datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), tzinfo=tz)
        seconds = moment.timestamp()
    except OverflowError as exc:  # a zone offset can carry year 1 or 9999 out of datetime's range
        raise ValueError(f"{text!r} is out of range: {exc}") from exc
    return seconds + (float(f"0.{frac[:9]}") if frac else 0.0)


class WebhookAlert(BaseModel):
    """One alert of an Alertmanager webhook v4 payload."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: str
    endsAt: str = ""
    generatorURL: str = ""
    fingerprint: str = ""


class WebhookPayload(BaseModel):
    """Alertmanager's webhook v4 body (https://prometheus.io/docs/alerting/latest/configuration/#webhook_config)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    version: Literal["4"]
    groupKey: str
    truncatedAlerts: int = 0
    status: Literal["firing", "resolved"]
    receiver: str = ""
    groupLabels: dict[str, str] = Field(default_factory=dict)
    commonLabels: dict[str, str] = Field(default_factory=dict)
    commonAnnotations: dict[str, str] = Field(default_factory=dict)
    externalURL: str = ""
    alerts: list[WebhookAlert]


_SEVERITY: dict[str, Severity] = {
    "critical": "critical",
    "page": "critical",
    "error": "critical",
    "high": "critical",
    "major": "critical",
    "warning": "warning",
    "warn": "warning",
    "medium": "warning",
    "minor": "warning",
    "info": "info",
    "informational": "info",
    "low": "info",
    "none": "info",
}


def severity_of(labels: Mapping[str, str]) -> Severity:
    """Map an alert's ``severity`` label to ClusterMedic's three levels (unknown: warning)."""
    return _SEVERITY.get(labels.get("severity", "").strip().lower(), "warning")


WEBHOOK_PROVENANCE = Provenance(source="alertmanager_webhook", stream="/api/v1/alertmanager/webhook", trusted=())
"""Alerts pushed by webhook: whoever can POST can write any label, so they are believed for nothing
until telemetry ClusterMedic collected corroborates them (docs/security.md)."""


def alertmanager_webhook(raw: bytes, check: TimeCheck | None = None, limits: Limits | None = None) -> list[Anomaly]:
    """Turn an Alertmanager webhook v4 body into one :class:`Anomaly` per alert.

    Each anomaly carries :data:`WEBHOOK_PROVENANCE`: trusted for nothing, so it can open an incident
    but never, alone, support a GPU runbook or name an action's target.

    With ``check``, an alert whose state time is outside the window is left out and counted there:
    startsAt for a firing alert, endsAt for a resolved one (the time the anomaly carries), and a
    startsAt in the future for either. A firing alert's endsAt is not checked: Alertmanager sends the
    zero time (0001-01-01) or a resolve timeout ahead for it.

    Returns:
        One anomaly per alert kept. Its ``fingerprint``, the alert's identity, is ``alertmanager:`` +
        Alertmanager's fingerprint (of the labels, when the sender omitted it): the same for the
        alert's firing and its resolution, so the resolved form resolves the alert it belongs to. Its
        ``dedup_key`` is a hash of group key + fingerprint + status + startsAt: Alertmanager delivers
        at least once (HA peers, repeat_interval), and a redelivery of one alert state carries the
        same four values, while its resolution or a new firing does not.

    Raises:
        RejectedInput: not JSON or not a webhook v4 payload, or more alerts than ``limits`` allow (413).
    """
    limits = limits or Limits()
    limits.check_messages(json_values_at_most(raw, limits.max_messages), "JSON values")
    try:
        payload = WebhookPayload.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "<root>"
        why = "json" if first["type"] == "json_invalid" else "schema"
        raise RejectedInput(
            f"not an Alertmanager webhook v4 payload: {where}: {first['msg']} ({exc.error_count()} errors)",
            reason=why,
        ) from exc
    limits.check_records(len(payload.alerts), "alerts")
    out: list[Anomaly] = []
    for i, alert in enumerate(payload.alerts):
        limits.check_label_dict(alert.labels, f"alerts[{i}].labels")
        try:
            starts = parse_rfc3339(alert.startsAt)
            ends = parse_rfc3339(alert.endsAt) if alert.endsAt else 0.0
        except ValueError as exc:
            raise RejectedInput(f"alerts[{i}]: {exc}", reason="timestamp") from exc
        signal = alert.labels.get("alertname", "")
        if not signal:
            raise RejectedInput(f"alerts[{i}]: no alertname label", reason="labels")
        resolved = alert.status == "resolved"
        ts = ends if resolved and ends > 0 else starts
        if check is not None:
            shown = {"alert": i, "labels": alert.labels, "startsAt": alert.startsAt, "endsAt": alert.endsAt}
            if starts > check.latest:  # a resolved alert must not have started in the future either
                check.refuse("too_new", starts, shown)
                continue
            if not check.admit(ts, shown):
                continue
        kind: EntityKind
        entity, kind = entity_of(alert.labels)
        if alert.labels.get("UUID"):  # a GPU alert (DCGM rules keep the UUID label): the GPU's partition
            entity, kind = alert.labels["UUID"], "gpu"
        elif kind == "other":
            entity = signal
        # only for senders that omit the fingerprint; Alertmanager always sends one
        fingerprint = alert.fingerprint or label_fingerprint(alert.labels)
        anomaly = Anomaly(
            entity=entity,
            entity_kind=kind,
            signal=signal,
            detector="alertmanager",
            score=0.0 if resolved else 1.0,
            threshold=1.0,
            severity=severity_of(alert.labels),
            status=alert.status,
            ts=ts,
            labels=alert.labels,
            evidence={
                "annotations": alert.annotations,
                "starts_at": alert.startsAt,
                "ends_at": alert.endsAt,
                "generator_url": alert.generatorURL,
                "alertmanager_fingerprint": fingerprint,
                "group_key": payload.groupKey,
                "receiver": payload.receiver,
                "external_url": payload.externalURL,
            },
            fingerprint=f"alertmanager:{fingerprint}",
            dedup_key="alertmanager:" + hash_parts(payload.groupKey, fingerprint, alert.status, alert.startsAt),
            # Pushed, not collected: evidence for humans, trusted for no fact (no GPU fault, no target).
            provenance=WEBHOOK_PROVENANCE,
        )
        out.append(anomaly)
    return out


# ------------------------------------------------------------------------------ Kubernetes


def kube_event(obj: Mapping[str, Any], check: TimeCheck | None = None) -> KubeEvent:
    """Normalise a core/v1 ``Event`` or an events.k8s.io/v1 ``Event`` (camelCase JSON) to a KubeEvent.

    Args:
        obj: the event object.
        check: the event-time window; an event stamped outside it is refused.

    Raises:
        RejectedInput: the object is not an event object, has no involved/regarding object or no
            reason, or (reason ``out_of_bounds``) its time is outside ``check``'s window.
    """
    if not isinstance(obj, Mapping):
        raise RejectedInput(f"event is a JSON {type(obj).__name__}, not an object", reason="schema")
    regarding = obj.get("regarding") or obj.get("involvedObject") or {}
    if not isinstance(regarding, Mapping) or not regarding.get("kind") or not regarding.get("name"):
        raise RejectedInput("event has no involvedObject/regarding kind and name", reason="schema")
    reason = obj.get("reason") or ""
    if not isinstance(reason, str) or not reason:
        raise RejectedInput("event has no reason", reason="schema")
    series = obj.get("series") or {}
    count = obj.get("count") or (series.get("count") if isinstance(series, Mapping) else None)
    count = count or obj.get("deprecatedCount") or 1
    stamp = (
        (series.get("lastObservedTime") if isinstance(series, Mapping) else None)
        or obj.get("lastTimestamp")
        or obj.get("deprecatedLastTimestamp")
        or obj.get("eventTime")
        or obj.get("firstTimestamp")
        or obj.get("deprecatedFirstTimestamp")
        or _mapping(obj.get("metadata")).get("creationTimestamp")
    )
    try:
        ts = parse_rfc3339(stamp) if isinstance(stamp, str) else 0.0
    except ValueError as exc:
        raise RejectedInput(f"event time: {exc}", reason="timestamp") from exc
    if check is not None and not check.admit(ts, {"reason": reason, "involvedObject": dict(regarding)}):
        raise RejectedInput(check.message(1, "events"), reason="out_of_bounds")
    source = obj.get("source") or obj.get("deprecatedSource") or {}
    host = source.get("host", "") if isinstance(source, Mapping) else ""
    kind = str(regarding["kind"])
    node = str(regarding["name"]) if kind == "Node" else str(host or "")
    component = obj.get("reportingController") or (source.get("component") if isinstance(source, Mapping) else "")
    event_type: Literal["Normal", "Warning"] = "Warning" if obj.get("type") == "Warning" else "Normal"
    try:
        event = KubeEvent(
            reason=reason,
            type=event_type,
            involved_object=ObjectRef(
                kind=kind,
                name=str(regarding["name"]),
                namespace=str(regarding.get("namespace") or ""),
                uid=str(regarding.get("uid") or ""),
            ),
            message=str(obj.get("note") or obj.get("message") or ""),
            count=max(1, min(int(count), 2**31 - 1)),  # an int32 in the API
            ts=ts,
            node=node,
            source_component=str(component or ""),
        )
    except (ValidationError, TypeError, ValueError, OverflowError) as exc:  # OverflowError: int(1e400)
        raise RejectedInput(f"event does not normalise: {exc}", reason="schema") from exc
    try:
        # the watcher's publisher writes it next: a lone surrogate (a \ud800 escape) fails there, and the
        # watcher would relist and fail again forever
        event.to_bytes()
    except ValueError as exc:
        raise RejectedInput(f"event holds text UTF-8 cannot carry: {exc}", reason="schema") from exc
    return event


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
