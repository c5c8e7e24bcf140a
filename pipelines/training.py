"""Training the learned detectors on a baseline judged normal, once or on a schedule.

The baseline comes from a fault-free simulator run (``medic detect train``) or from a time range of the
metrics topic (``medic detect train --from-kafka --since ... --until ...``: the range is on the Kafka
record timestamps, located with ``offsets_for_times``). Every scrape becomes a feature vector
(pipelines.features); the isolation forest learns the vectors of each entity class, the LSTM each
entity's sequence. Models are stored as new versions in ``detector_models`` with what they were trained
on; running detect workers pick them up without a restart (``detect_model_refresh_s``).

Scheduled retraining (:func:`retrain_once`, looped by ``medic detect retrain``) trains on the recent
past of the metrics topic, judged normal: the scrapes are cut into fixed windows per entity, and every
window that overlapped an anomaly (``anomalies.v1``) or an incident (``incidents.v1``) about the entity,
its pod or its node, widened by a margin, is left out. Series are split where windows were left out, so
the LSTM never learns a jump across a gap.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import numpy as np

from pipelines.detectors import iforest, lstm
from pipelines.features import FeatureState, FeatureVector, extract
from services.core.errors import ConfigError, EventError, InfraError
from services.core.events import Anomaly, Event, IncidentEvent, MetricBatch
from services.core.settings import Settings

log = logging.getLogger(__name__)

E = TypeVar("E", bound=Event)


@dataclass
class Baseline:
    """Feature rows per entity class and series (an entity's run of kept scrapes), in scrape order.

    Attributes:
        series: class -> series key -> rows; the key is the entity, with ``#n`` appended for the n-th
            run after a left-out window.
        scrapes: feature vectors kept.
        samples: metric samples in the batches read (kept or not).
        excluded_vectors: feature vectors left out because their window overlapped an anomaly.
        excluded_windows: distinct (entity, window) pairs left out.
    """

    series: dict[str, dict[str, list[list[float]]]] = field(default_factory=dict)
    scrapes: int = 0
    samples: int = 0
    excluded_vectors: int = 0
    excluded_windows: int = 0

    def add(self, vector: FeatureVector, series_key: str | None = None) -> None:
        """Append one vector to its series (by default, its entity's)."""
        key = series_key or vector.entity
        self.series.setdefault(vector.entity_class, {}).setdefault(key, []).append(vector.as_row())
        self.scrapes += 1

    def rows(self, entity_class: str) -> np.ndarray:
        """All rows of a class stacked."""
        return np.array([r for s in self.series.get(entity_class, {}).values() for r in s], dtype=np.float64)

    def entities(self, entity_class: str) -> int:
        """Distinct entities of a class (series of one entity split by gaps count once)."""
        return len({key.partition("#")[0] for key in self.series.get(entity_class, {})})


@dataclass(frozen=True)
class Exclusions:
    """Time intervals, per entity name, whose scrapes are not judged normal.

    Args:
        intervals: entity, pod or node name -> ``(start, end)`` intervals in sample time (UNIX seconds),
            already widened by the margin.
        window_s: scrapes are judged in windows of this length; a window that overlaps an interval of
            any name the vector carries (its entity, its pod, its node) is left out whole.
    """

    intervals: Mapping[str, Sequence[tuple[float, float]]]
    window_s: float = 300.0

    def window_of(self, ts: float) -> tuple[float, float]:
        """The window a sample time falls in."""
        start = math.floor(ts / self.window_s) * self.window_s
        return start, start + self.window_s

    def excludes(self, vector: FeatureVector) -> bool:
        """Whether the vector's window overlapped an anomaly or incident about something it names."""
        start, end = self.window_of(vector.ts)
        labels = vector.labels
        names = {vector.entity, labels.get("pod"), labels.get("Hostname"), labels.get("hostname"), labels.get("node")}
        for name in names:
            for low, high in self.intervals.get(name or "", ()):
                if low < end and high >= start:
                    return True
        return False


def vectors_from_batches(batches: Iterable[MetricBatch], exclusions: Exclusions | None = None) -> Baseline:
    """Turn metric batches (any order of entities, each entity in time order) into a baseline.

    With ``exclusions``, vectors whose window is not judged normal are left out and the entity's series
    restarts after them.
    """
    states: dict[str, FeatureState] = {}
    baseline = Baseline()
    runs: dict[str, int] = {}  # entity -> series number, bumped after a left-out stretch
    in_gap: set[str] = set()
    left_out: set[tuple[str, float]] = set()
    for batch in batches:
        baseline.samples += len(batch.samples)
        states[batch.entity], vector = extract(batch, states.get(batch.entity, FeatureState()))
        if vector is None or not vector.serving:
            continue
        if exclusions is not None and exclusions.excludes(vector):
            baseline.excluded_vectors += 1
            left_out.add((vector.entity, exclusions.window_of(vector.ts)[0]))
            in_gap.add(vector.entity)
            continue
        if vector.entity in in_gap:
            in_gap.discard(vector.entity)
            runs[vector.entity] = runs.get(vector.entity, 0) + 1
        run = runs.get(vector.entity, 0)
        baseline.add(vector, vector.entity if run == 0 else f"{vector.entity}#{run}")
    baseline.excluded_windows = len(left_out)
    return baseline


def simulator_baseline(seeds: Iterable[int], duration_s: float, scenario: str = "baseline") -> Baseline:
    """Run the simulator without faults once per seed (each seed draws another cluster and load)."""
    from services.simulator.scenario import load_scenario
    from services.simulator.simulator import Simulator

    batches: list[MetricBatch] = []
    for seed in seeds:
        sim = Simulator(load_scenario(scenario), seed=seed)
        try:
            while sim.t < duration_s:
                # entity names embed the seed's random suffixes, so series of different seeds never mix
                batches.extend(e for e in sim.step() if isinstance(e, MetricBatch))
        finally:
            sim.close()
    return vectors_from_batches(batches)


def parse_instant(text: str, now: float) -> float:
    """A point in time from the command line, in UNIX seconds.

    Accepts ``now``, a duration ago (``2h``, ``30m``, ``1d``: Prometheus durations), UNIX seconds
    (``1764000000``) or ISO 8601 (``2026-11-29T21:00:00``; without a zone it is UTC).

    Raises:
        ConfigError: none of these forms.
    """
    from services.alerting.durations import parse_duration

    text = text.strip()
    if text == "now":
        return now
    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"not a time: {text!r}; use now, a duration ago (2h), UNIX seconds or ISO 8601 (2026-11-29T21:00:00)"
        ) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


@dataclass(frozen=True)
class TimeRange:
    """A half-open range ``[since, until)`` of Kafka record timestamps, in UNIX seconds."""

    since: float
    until: float

    def __post_init__(self) -> None:
        if not self.since < self.until:
            raise ConfigError(f"empty time range: since {self.since} is not before until {self.until}")

    def describe(self) -> dict[str, Any]:
        """JSON-safe form for the training metadata: UNIX seconds and ISO 8601 (UTC)."""
        return {
            "since": self.since,
            "until": self.until,
            "since_iso": datetime.fromtimestamp(self.since, UTC).isoformat(timespec="seconds"),
            "until_iso": datetime.fromtimestamp(self.until, UTC).isoformat(timespec="seconds"),
        }


def read_time_range(
    settings: Settings, base_topic: str, span: TimeRange, *, stall_timeout_s: float = 30.0
) -> Iterator[bytes | None]:
    """Yield the values of every record of a topic written in ``span``, partition by partition in order.

    Each partition is read from the first offset at or after ``since`` (``offsets_for_times``) up to the
    first at or after ``until`` (or its end), so keyed order holds: one entity's scrapes come in the
    order they were written.

    Raises:
        InfraError: the broker is unreachable, the topic does not exist, or reading stalled for
            ``stall_timeout_s`` before the end of the range.
    """
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import KafkaError

    topic = settings.topic(base_topic)
    try:
        consumer = KafkaConsumer(bootstrap_servers=settings.bootstrap_servers, group_id=None, enable_auto_commit=False)
    except KafkaError as exc:
        raise InfraError(f"no Kafka broker at {settings.bootstrap_servers}: {exc}") from exc
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise InfraError(f"topic {topic} does not exist")
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        starts = consumer.offsets_for_times({tp: math.ceil(span.since * 1000) for tp in tps})
        stops = consumer.offsets_for_times({tp: math.ceil(span.until * 1000) for tp in tps})
        log_ends = consumer.end_offsets(tps)
        bounds: dict[Any, tuple[int, int]] = {}
        for tp in tps:
            start = starts.get(tp)
            stop = stops.get(tp)
            end = stop.offset if stop is not None else log_ends[tp]
            if start is not None and start.offset < end:
                bounds[tp] = (start.offset, end)
        for tp, (start_offset, end) in bounds.items():
            # one partition at a time: simple, and each partition's order is what matters
            consumer.assign([tp])
            consumer.seek(tp, start_offset)
            last_progress = time.monotonic()
            while consumer.position(tp) < end:
                polled = consumer.poll(timeout_ms=500, max_records=2000)
                records = polled.get(tp, [])
                if records:
                    last_progress = time.monotonic()
                elif time.monotonic() - last_progress > stall_timeout_s:
                    raise InfraError(f"reading {tp.topic}[{tp.partition}] stalled before offset {end}")
                for record in records:
                    if record.offset >= end:
                        break
                    yield record.value
    except KafkaError as exc:
        raise InfraError(f"cannot read {topic}: {exc}") from exc
    finally:
        consumer.close()


@dataclass
class RangeStats:
    """What reading a time range of the metrics topic found besides the batches."""

    messages: int = 0
    undecodable: int = 0


def metric_batches(settings: Settings, span: TimeRange, stats: RangeStats | None = None) -> Iterator[MetricBatch]:
    """The metric batches written to ``telemetry.metrics.v1`` in ``span``.

    Undecodable messages are counted in ``stats`` and skipped: the detect workers already dead-lettered
    them when they were live, and training must not dead-letter them twice.
    """
    stats = stats if stats is not None else RangeStats()
    for value in read_time_range(settings, MetricBatch.topic, span):
        stats.messages += 1
        try:
            if value is None:
                raise EventError("empty message (tombstone)")
            yield MetricBatch.from_bytes(value)
        except EventError as exc:
            stats.undecodable += 1
            log.debug("skipped an undecodable metrics message: %s", exc)


def kafka_baseline(
    settings: Settings, span: TimeRange, exclusions: Exclusions | None = None
) -> tuple[Baseline, RangeStats]:
    """A baseline from the metric batches of a time range of the metrics topic."""
    stats = RangeStats()
    baseline = vectors_from_batches(metric_batches(settings, span, stats), exclusions)
    return baseline, stats


def anomaly_exclusions(settings: Settings, span: TimeRange, *, margin_s: float, window_s: float) -> Exclusions:
    """Intervals not judged normal, from the anomalies and incidents written in ``span``.

    Undecodable messages on those topics are skipped (their consumers dead-letter them).
    """

    def decoded(cls: type[E], topic: str) -> Iterator[E]:
        for value in read_time_range(settings, topic, span):
            try:
                yield cls.from_bytes(value or b"")
            except EventError:
                continue

    return exclusions_from(
        decoded(Anomaly, Anomaly.topic),
        decoded(IncidentEvent, IncidentEvent.topic),
        margin_s=margin_s,
        window_s=window_s,
    )


def exclusions_from(
    anomalies: Iterable[Anomaly], incidents: Iterable[IncidentEvent], *, margin_s: float, window_s: float
) -> Exclusions:
    """The intervals anomalies and incidents cover, each widened by ``margin_s`` on both sides.

    An anomaly covers its ``ts`` for its entity and for the GPU and pod its labels name; a firing anomaly
    that a resolved one with the same fingerprint follows covers the whole stretch between. An incident
    covers ``opened_at`` to its event's ``ts`` for each alert's entity.
    """
    intervals: dict[str, list[tuple[float, float]]] = {}
    firing_since: dict[str, float] = {}

    def cover(names: Iterable[str | None], low: float, high: float) -> None:
        for name in dict.fromkeys(names):  # each name once, in order
            if name:
                intervals.setdefault(name, []).append((low - margin_s, high + margin_s))

    for anomaly in anomalies:
        start = anomaly.ts
        if anomaly.fingerprint:
            if anomaly.status == "firing":
                firing_since.setdefault(anomaly.fingerprint, anomaly.ts)
            else:
                start = min(firing_since.pop(anomaly.fingerprint, anomaly.ts), anomaly.ts)
        cover((anomaly.entity, anomaly.labels.get("gpu"), anomaly.labels.get("pod")), start, anomaly.ts)
    for incident in incidents:
        cover((alert.entity for alert in incident.alerts), incident.opened_at, incident.ts)
    return Exclusions(intervals, window_s=window_s)


@dataclass(frozen=True)
class TrainingReport:
    """What one training run stored."""

    versions: dict[str, int]
    scrapes: int
    seconds: float


def train_and_store(
    settings: Settings,
    baseline: Baseline,
    *,
    source: str,
    metadata: Mapping[str, Any] | None = None,
    detectors: Sequence[str] = ("iforest", "lstm"),
    contamination: float = 0.005,
    lstm_window: int = 12,
    lstm_epochs: int = 8,
    lstm_max_series: int = 24,
) -> TrainingReport:
    """Train the learned detectors for every entity class in the baseline and store new versions.

    Args:
        source: what the baseline is, stored as ``training.source``.
        metadata: more training facts to store with each model (time range, exclusions...).
        detectors: which learned detectors to train (``iforest``, ``lstm``).

    Raises:
        ConfigError: the baseline holds no feature vector, or an unknown detector is named.
    """
    from services.store.detector_models import save_model

    unknown = set(detectors) - {"iforest", "lstm"}
    if unknown:
        raise ConfigError(f"cannot train {', '.join(sorted(unknown))}: only iforest and lstm are learned")
    if not baseline.scrapes:
        raise ConfigError(f"no feature vectors to train on from {source} (no serving entity scraped twice?)")
    start = time.monotonic()
    versions: dict[str, int] = {}
    for cls, per_series in baseline.series.items():
        rows = baseline.rows(cls)
        meta = {
            **(metadata or {}),
            "source": source,
            "rows": len(rows),
            "entities": baseline.entities(cls),
            "samples": baseline.samples,
            "scrapes": baseline.scrapes,
            "excluded_windows": baseline.excluded_windows,
            "excluded_scrapes": baseline.excluded_vectors,
            "contamination": contamination,
        }
        if "iforest" in detectors:
            log.info("training iforest for %s on %d rows", cls, len(rows))
            forest = iforest.train(cls, rows, contamination=contamination)
            versions[f"iforest/{cls}"] = save_model(
                settings,
                detector="iforest",
                entity_class=cls,
                model=forest.to_bytes(),
                training=meta,
                threshold=forest.threshold,
            )
        series = [np.array(s, dtype=np.float64) for s in per_series.values() if len(s) >= lstm_window + 10]
        # the LSTM learns dynamics, not the fleet: a bounded, evenly spread subset keeps training short
        series = series[:: max(1, len(series) // max(1, lstm_max_series))][:lstm_max_series]
        if series and "lstm" in detectors:
            log.info("training lstm for %s on %d series", cls, len(series))
            seq = lstm.train(cls, series, window=lstm_window, epochs=lstm_epochs, contamination=contamination)
            versions[f"lstm/{cls}"] = save_model(
                settings,
                detector="lstm",
                entity_class=cls,
                model=seq.to_bytes(),
                training={**meta, "window": lstm_window, "epochs": lstm_epochs},
                threshold=seq.threshold,
            )
    return TrainingReport(versions, baseline.scrapes, time.monotonic() - start)


def train_from_kafka(
    settings: Settings,
    span: TimeRange,
    *,
    exclusions: Exclusions | None = None,
    source: str = "kafka",
    metadata: Mapping[str, Any] | None = None,
    **training: Any,
) -> TrainingReport | None:
    """Train on the metric batches written to the metrics topic in ``span`` and store new versions.

    The stored metadata names the topic, the range, the samples read and what was left out.
    ``training`` goes to :func:`train_and_store` (``detectors``, ``contamination``, LSTM sizes).
    With ``min_scrapes`` in ``training``, fewer feature vectors than that store nothing and return None;
    without it an empty range raises :class:`ConfigError`.
    """
    min_scrapes = int(training.pop("min_scrapes", 0))
    baseline, stats = kafka_baseline(settings, span, exclusions)
    if baseline.scrapes < min_scrapes:
        log.warning(
            "training skipped: %d scrapes judged normal in %s (%d windows left out), fewer than %d",
            baseline.scrapes,
            span.describe(),
            baseline.excluded_windows,
            min_scrapes,
        )
        return None
    facts = {
        "topic": MetricBatch.topic,
        **span.describe(),
        "messages": stats.messages,
        "undecodable": stats.undecodable,
        **(metadata or {}),
    }
    return train_and_store(settings, baseline, source=source, metadata=facts, **training)


def retrain_once(
    settings: Settings,
    *,
    now: float | None = None,
    lookback_s: float,
    margin_s: float,
    window_s: float,
    min_scrapes: int,
    **training: Any,
) -> TrainingReport | None:
    """One scheduled retraining: the last ``lookback_s`` of metrics judged normal, stored as new versions.

    Windows that overlapped anomalies or incidents (widened by ``margin_s``) are left out. Returns None,
    storing nothing, when fewer than ``min_scrapes`` feature vectors remain: a quiet or troubled period
    must not replace a good model with a thin one.
    """
    until = time.time() if now is None else now
    span = TimeRange(until - lookback_s, until)
    # anomalies about the earliest scrapes may have been written a margin before the range starts
    exclusions = anomaly_exclusions(
        settings, TimeRange(span.since - margin_s, until), margin_s=margin_s, window_s=window_s
    )
    return train_from_kafka(
        settings,
        span,
        exclusions=exclusions,
        source="retrain",
        metadata={"lookback_s": lookback_s, "margin_s": margin_s, "window_s": window_s},
        min_scrapes=min_scrapes,
        **training,
    )
