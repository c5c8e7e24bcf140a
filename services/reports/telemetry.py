"""The telemetry behind a report's plots: metric batches of the incident's entities over its window.

A report's facts come from PostgreSQL; the series it plots come from a :class:`MetricSource`. The
shipped one, :class:`KafkaMetricSource`, reads ``telemetry.metrics.v1``, where every metric reaches
ClusterMedic whatever its origin (scrape, remote_write, Prometheus pull, the simulator), by record
timestamp, as ``medic detect train --from-kafka`` does. A source never raises: a broker that is down,
a topic whose retention dropped the window, or a window it could not read in time comes back as a
:class:`Telemetry` whose ``problem`` says so, and the report prints it where the plots would be.

Which batches are read: those keyed by one of the incident's entities (GPU UUIDs, pods), by a pod of one
of its deployments (``<deployment>-...``), and those carrying one of the service-level metrics (the
router's request counts), whatever their key. Only those are parsed, so a busy topic costs the bytes
read, not a parse of every batch.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from services.core.errors import ClusterMedicError
from services.core.events import MetricBatch
from services.core.settings import Settings

log = logging.getLogger(__name__)

SERVICE_METRICS: tuple[str, ...] = ("router_requests_total",)
"""Service-level metrics read whatever the batch's key: requests by HTTP status code at the router."""


@dataclass(frozen=True)
class TelemetryScope:
    """Which batches a report wants.

    Attributes:
        entities: exact batch keys (GPU UUIDs, pod names, nodes).
        prefixes: key prefixes (``<deployment>-`` for the pods of a deployment, whatever their hash).
        metrics: metric names whose batches are wanted whatever their key.
    """

    entities: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()
    metrics: tuple[str, ...] = SERVICE_METRICS

    def wants_key(self, key: str) -> bool:
        """Whether a batch with this key is one of the incident's entities."""
        return key in self.entities or any(key.startswith(p) for p in self.prefixes)

    def wants_value(self, value: bytes) -> bool:
        """Whether the raw batch carries a service-level metric (checked on the bytes, before any parse)."""
        return any(f'"name":"{name}"'.encode() in value for name in self.metrics)


@dataclass
class Telemetry:
    """What a source returned for a window.

    Attributes:
        source: where it came from, for the report (``telemetry.metrics.v1 on 127.0.0.1:19092``).
        batches: the wanted batches, in the order read.
        problem: why there is nothing or only part (empty: the window was read to its end).
        scanned: records looked at.
    """

    source: str
    batches: list[MetricBatch] = field(default_factory=list)
    problem: str = ""
    scanned: int = 0


class MetricSource(Protocol):
    """Where a report's series come from. ``fetch`` never raises: a failure is ``Telemetry.problem``."""

    def fetch(self, scope: TelemetryScope, start: float, end: float) -> Telemetry:
        """The wanted batches with samples between ``start`` and ``end`` (UNIX seconds)."""
        ...


class NoMetricSource:
    """No telemetry at all, with the reason the report prints (``--no-telemetry``, a unit test)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def fetch(self, scope: TelemetryScope, start: float, end: float) -> Telemetry:
        return Telemetry(source="none", problem=self.reason)


class MemoryMetricSource:
    """Batches held in memory (the bench, unit tests, a replay): filtered as the Kafka source filters."""

    def __init__(self, batches: Iterable[MetricBatch], *, name: str = "memory") -> None:
        self._batches = list(batches)
        self.name = name

    def fetch(self, scope: TelemetryScope, start: float, end: float) -> Telemetry:
        out = [
            b
            for b in self._batches
            if (scope.wants_key(b.entity) or any(s.name in scope.metrics for s in b.samples))
            and any(start <= s.ts <= end for s in b.samples)
        ]
        return Telemetry(source=self.name, batches=out, scanned=len(self._batches))


class KafkaMetricSource:
    """``telemetry.metrics.v1`` between two record timestamps.

    Args:
        settings: the broker and topic prefix.
        max_records: stop after looking at this many records (the report says the window was cut).
        max_seconds: stop after reading this long (wall time).
        margin_s: read records stamped this long around the window too (a scrape published late).
    """

    def __init__(
        self, settings: Settings, *, max_records: int = 500_000, max_seconds: float = 20.0, margin_s: float = 60.0
    ) -> None:
        self.settings = settings
        self.max_records = max_records
        self.max_seconds = max_seconds
        self.margin_s = margin_s

    @property
    def name(self) -> str:
        """The topic and broker, as the report names its source."""
        return f"{self.settings.topic(MetricBatch.topic)} on {self.settings.bootstrap_servers}"

    def fetch(self, scope: TelemetryScope, start: float, end: float) -> Telemetry:
        out = Telemetry(source=self.name)
        try:
            self._read(scope, start - self.margin_s, end + self.margin_s, out)
        except ClusterMedicError as exc:
            out.problem = str(exc)
        except Exception as exc:  # kafka-python raises its own errors, and OSError when the broker vanishes
            log.warning("reading telemetry for a report failed: %s", exc)
            out.problem = f"cannot read {self.name}: {exc or type(exc).__name__}"
        return out

    def _read(self, scope: TelemetryScope, since: float, until: float, out: Telemetry) -> None:
        from kafka import KafkaConsumer, TopicPartition

        topic = self.settings.topic(MetricBatch.topic)
        consumer = KafkaConsumer(
            bootstrap_servers=self.settings.bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            request_timeout_ms=10_000,
            # kafka-python checks CRC32C in pure Python (~4 MB/s): a report's window is tens of MB of batches
            # the broker already checked on write, so the check would cost seconds and protect nothing
            check_crcs=False,
            fetch_max_wait_ms=100,
            fetch_max_bytes=32 * 1024 * 1024,
            max_partition_fetch_bytes=8 * 1024 * 1024,
        )
        try:
            partitions = consumer.partitions_for_topic(topic)
            if not partitions:
                out.problem = f"topic {topic} does not exist on {self.settings.bootstrap_servers}"
                return
            tps = [TopicPartition(topic, p) for p in sorted(partitions)]
            starts = consumer.offsets_for_times({tp: max(0, math.floor(since * 1000)) for tp in tps})
            stops = consumer.offsets_for_times({tp: math.ceil(until * 1000) for tp in tps})
            ends = consumer.end_offsets(tps)
            begins = consumer.beginning_offsets(tps)
            bounds = {}
            for tp in tps:
                first = starts.get(tp)
                stop = stops.get(tp)
                last = stop.offset if stop is not None else ends[tp]
                if first is not None and first.offset < last:
                    bounds[tp] = (first.offset, last)
            if not bounds:
                oldest = "empty" if all(begins[tp] >= ends[tp] for tp in tps) else "no record in the window"
                out.problem = f"{topic} holds no record between {_iso(since)} and {_iso(until)} ({oldest})"
                return
            deadline = time.monotonic() + self.max_seconds
            consumer.assign(list(bounds))
            for tp, (first_offset, _) in bounds.items():
                consumer.seek(tp, first_offset)
            remaining = dict(bounds)
            while remaining:
                if time.monotonic() > deadline:
                    out.problem = f"reading {topic} took longer than {self.max_seconds:.0f} s; the plots stop early"
                    return
                polled = consumer.poll(timeout_ms=500, max_records=5000)
                for tp, records in polled.items():
                    if tp not in remaining:
                        continue
                    stop_at = remaining[tp][1]
                    for record in records:
                        if record.offset >= stop_at:
                            break
                        out.scanned += 1
                        self._keep(scope, record.key, record.value, out)
                    if consumer.position(tp) >= stop_at:
                        del remaining[tp]
                        consumer.pause(tp)
                if out.scanned >= self.max_records:
                    out.problem = f"read the first {self.max_records} records of {topic} only; the plots stop early"
                    return
        finally:
            consumer.close()

    @staticmethod
    def _keep(scope: TelemetryScope, key: bytes | None, value: bytes | None, out: Telemetry) -> None:
        if not value:
            return
        wanted = (key is not None and scope.wants_key(key.decode("utf-8", "replace"))) or scope.wants_value(value)
        if not wanted:
            return
        try:
            out.batches.append(MetricBatch.from_bytes(value))
        except ClusterMedicError:
            pass  # the detect role dead-lettered it when it was live; a report only skips it


def _iso(ts: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# ------------------------------------------------------------------------------------------- series


@dataclass(frozen=True)
class Series:
    """One plotted line: sample times and values, in time order."""

    label: str
    ts: tuple[float, ...]
    values: tuple[float, ...]


def gauge(batches: Sequence[MetricBatch], entity: str, metric: str) -> Series:
    """The samples of ``metric`` about ``entity`` (its first series when it has several label sets)."""
    points: dict[float, float] = {}
    for batch in batches:
        if batch.entity != entity:
            continue
        for s in batch.samples:
            if s.name == metric and s.ts not in points:
                points[s.ts] = s.value
    ts = sorted(points)
    return Series(entity, tuple(ts), tuple(points[t] for t in ts))


def histogram_quantile(
    batches: Sequence[MetricBatch], entities: Collection[str], metric: str, q: float, label: str
) -> Series:
    """The ``q`` quantile of a histogram over each scrape interval, summed over ``entities`` (pods).

    From the increase of each ``le`` bucket between two scrapes of a pod (a counter reset, a new pod, counts
    from zero), summed across pods per scrape time, interpolated linearly inside the bucket as
    Prometheus' ``histogram_quantile`` does. A scrape interval with no request has no point.
    """
    bucket = f"{metric}_bucket"
    per_pod: dict[str, dict[float, dict[float, float]]] = {}
    for batch in batches:
        if batch.entity not in entities:
            continue
        for s in batch.samples:
            if s.name != bucket:
                continue
            le = _le(s.labels.get("le", ""))
            if le is None:
                continue
            per_pod.setdefault(batch.entity, {}).setdefault(s.ts, {})[le] = s.value
    increases: dict[float, dict[float, float]] = {}
    for scrapes in per_pod.values():
        times = sorted(scrapes)
        for before, after in itertools.pairwise(times):
            for le, value in scrapes[after].items():
                prev = scrapes[before].get(le, 0.0)
                inc = value - prev if value >= prev else value
                acc = increases.setdefault(after, {})
                acc[le] = acc.get(le, 0.0) + inc
    ts: list[float] = []
    values: list[float] = []
    for t in sorted(increases):
        found = _quantile(q, increases[t])
        if found is not None:
            ts.append(t)
            values.append(found)
    return Series(label, tuple(ts), tuple(values))


def _le(text: str) -> float | None:
    try:
        return float("inf") if text in ("+Inf", "Inf", "inf") else float(text)
    except ValueError:
        return None


def _quantile(q: float, buckets: dict[float, float]) -> float | None:
    edges = sorted(buckets)
    if not edges or edges[-1] != float("inf"):
        return None
    total = buckets[edges[-1]]
    if total <= 0:
        return None
    rank = q * total
    lower_edge, lower_count = 0.0, 0.0
    for edge in edges:
        count = buckets[edge]
        if count >= rank:
            if edge == float("inf"):
                return lower_edge  # beyond the last finite bucket: its edge, as Prometheus answers
            if count == lower_count:
                return edge
            return lower_edge + (edge - lower_edge) * (rank - lower_count) / (count - lower_count)
        lower_edge, lower_count = edge, count
    return lower_edge


def counter_ratio(
    batches: Sequence[MetricBatch], metric: str, label: str, bad: Collection[str], name: str
) -> tuple[Series, float, float]:
    """Per scrape interval, the share of a counter's increase whose ``label`` is in ``bad``.

    Summed over every series of ``metric`` (all routers, all codes). Returns the series and the total
    increase of the bad and of all series over the whole window.
    """
    per_series: dict[tuple[str, str], tuple[bool, dict[float, float]]] = {}
    for batch in batches:
        for s in batch.samples:
            if s.name == metric:
                key = (batch.entity, "|".join(f"{k}={v}" for k, v in sorted(s.labels.items())))
                entry = per_series.setdefault(key, (s.labels.get(label, "") in bad, {}))
                entry[1][s.ts] = s.value
    bad_inc: dict[float, float] = {}
    all_inc: dict[float, float] = {}
    bad_total = all_total = 0.0
    for is_bad, points in per_series.values():
        times = sorted(points)
        for before, after in itertools.pairwise(times):
            inc = points[after] - points[before]
            inc = inc if inc >= 0 else points[after]  # a counter reset counts from zero
            all_inc[after] = all_inc.get(after, 0.0) + inc
            all_total += inc
            if is_bad:
                bad_inc[after] = bad_inc.get(after, 0.0) + inc
                bad_total += inc
    ts = [t for t in sorted(all_inc) if all_inc[t] > 0]
    return Series(name, tuple(ts), tuple(bad_inc.get(t, 0.0) / all_inc[t] for t in ts)), bad_total, all_total


def coverage(batches: Sequence[MetricBatch], entity: str) -> tuple[float, ...]:
    """The scrape times of ``entity``, in order (what a gap is measured against)."""
    return tuple(sorted({s.ts for b in batches if b.entity == entity for s in b.samples[:1]}))
