"""The detect role: Faust agents that turn telemetry into anomalies.

Three agents, one per telemetry topic:

* ``detect-metrics`` takes micro-batches of :class:`MetricBatch` messages (each one scrape of one
  entity; up to ``metric_batch`` messages or ``max_wait_s``) and runs them in partition order, so the
  scrapes of one entity (one key, one partition) are seen in the order they were written. Rule
  detectors that consume metric batches run on each with the entity's state, and the entity's feature
  vector is computed. Per-entity state (rule states and feature state) lives in the
  ``detect-entity-state`` table, which Faust co-partitions with the metrics topic and backs with a
  changelog, so a restarted or rebalanced worker resumes where the last one stopped. The states to save
  and the anomalies found are written once per micro-batch, and its offsets are committed only after
  that (Faust acks a ``take_events`` batch when the loop body returns). Feature vectors are buffered and
  scored by the learned detectors in micro-batches (a model call costs ~10 ms whatever its size), when
  the buffer is full or its oldest vector has waited ``max_wait_s``.
* ``detect-logs`` takes micro-batches of :class:`LogRecord` for the log-template detector. A record
  that makes a detector raise is dead-lettered on its own and the rest of the micro-batch is
  processed (:func:`detect_each_guarded`); it used to end the agent.
* ``detect-events`` feeds :class:`KubeEvent` to the Kubernetes event rules.

The learned detectors' and the log miner's state is worker-local: their models come from the
``detector_models`` table and their short windows refill from the stream after a restart.

Every anomaly leaves with its :class:`~services.core.events.Provenance` (docs/security.md): a metric
detector's from the batch it read (:func:`metric_provenance`: DCGM and NVML metrics are trusted for GPU
faults), the learned detectors' as ``detector``, the Kubernetes rules' as ``kube_api``; the log
detector stamps its own, line by line, from each line's stream.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from faust.types import EventT, TableT
from pydantic import ValidationError

from pipelines.app import Pipeline, PipelinePorts
from pipelines.detectors.base import Detector
from pipelines.features import FeatureState, FeatureVector, extract
from services.core.events import (
    FACT_GPU_FAULT,
    FACT_TOPOLOGY,
    Anomaly,
    Event,
    KubeEvent,
    LogRecord,
    MetricBatch,
    Provenance,
)
from services.core.settings import Settings
from services.store.detector_models import StoredModel

log = logging.getLogger(__name__)

E = TypeVar("E", bound=Event)

FEATURES_KEY = "_features"


@dataclass
class DetectorSet:
    """The detectors of one worker, split by the input they consume."""

    metric: list[Detector] = field(default_factory=list)
    feature: list[Detector] = field(default_factory=list)
    log: list[Detector] = field(default_factory=list)
    event: list[Detector] = field(default_factory=list)
    versions: dict[str, dict[str, int]] = field(default_factory=dict)  # learned model versions in use

    @classmethod
    def of(cls, detectors: Iterable[Detector]) -> DetectorSet:
        """Sort detectors by their ``consumes`` type."""
        out = cls()
        for detector in detectors:
            slot = {MetricBatch: out.metric, FeatureVector: out.feature, LogRecord: out.log, KubeEvent: out.event}
            try:
                slot[detector.consumes].append(detector)
            except KeyError:
                raise TypeError(
                    f"detector {detector.name} consumes {detector.consumes}, which no agent feeds"
                ) from None
        return out


GPU_METRIC_PREFIX = "DCGM_FI_"
LEARNED_PROVENANCE = Provenance(source="detector", stream="features", trusted=(FACT_TOPOLOGY,))
"""The learned detectors judge features of metrics ClusterMedic scraped: a target, never a GPU fault."""
KUBE_PROVENANCE = Provenance(source="kube_api", stream="events", trusted=(FACT_TOPOLOGY,))
"""Kubernetes events come from the API server's watch: they name real objects, not GPU faults."""


def metric_provenance(batch: MetricBatch) -> Provenance:
    """The provenance of anomalies found in one metric batch.

    A batch from the NVML reader, or one holding DCGM exporter fields (``DCGM_FI_*``), is a trusted GPU
    source; any other batch (vLLM, kube-state-metrics) names real targets but no GPU fault.
    """
    if batch.source == "nvml":
        return Provenance(source="nvml", stream=batch.source, trusted=(FACT_GPU_FAULT, FACT_TOPOLOGY))
    if any(sample.name.startswith(GPU_METRIC_PREFIX) for sample in batch.samples):
        return Provenance(source="dcgm", stream=batch.source[:500], trusted=(FACT_GPU_FAULT, FACT_TOPOLOGY))
    return Provenance(source="prometheus", stream=batch.source[:500], trusted=(FACT_TOPOLOGY,))


def stamped(anomalies: Iterable[Anomaly], provenance: Provenance) -> list[Anomaly]:
    """The anomalies with ``provenance`` where their detector set none (a detector's own stamp wins)."""
    return [
        a if a.provenance.source != "unknown" else a.model_copy(update={"provenance": provenance}) for a in anomalies
    ]


def state_to_dict(state: Any) -> Any:
    """JSON-safe form of a detector state (dataclass states provide ``to_dict``)."""
    return state.to_dict() if hasattr(state, "to_dict") else state


def state_from_dict(detector: Detector, data: Any) -> Any:
    """Inverse of :func:`state_to_dict`, using the type of the detector's initial state."""
    initial = detector.initial_state()
    return type(initial).from_dict(data) if hasattr(initial, "from_dict") else data


class EntityDetection:
    """Runs metric-batch detectors and feature extraction for one entity's scrape (no I/O).

    Live state objects stay in memory between scrapes; the JSON form for the changelog-backed table is
    produced only every ``checkpoint_every`` scrapes of an entity, and whenever a scrape raised an
    anomaly (so a firing condition is never forgotten). Serialising every scrape cost more than the
    detectors themselves; a worker that dies loses at most ``checkpoint_every - 1`` scrapes of rule
    history per entity, which only delays, never duplicates, an anomaly.

    When the caller passes the time of processing (``now``), an entity is also saved at most once every
    ``checkpoint_min_s``: a worker catching up on a backlog sees one entity's scrapes many times a
    second, and saving every fourth of them was half its work. Scrapes arriving at their usual interval
    (15 s) are unaffected; a dying worker then loses at most ``checkpoint_min_s`` of catching up.

    Args:
        detectors: the worker's detectors.
        checkpoint_every: scrapes between saved states of one entity (1 saves every scrape).
        checkpoint_min_s: least processing time between saved states of one entity, when ``now`` is given.
    """

    def __init__(self, detectors: DetectorSet, checkpoint_every: int = 4, checkpoint_min_s: float = 0.0) -> None:
        self.detectors = detectors
        self.checkpoint_every = max(1, checkpoint_every)
        self.checkpoint_min_s = checkpoint_min_s
        self.live: dict[str, tuple[dict[str, Any], FeatureState]] = {}
        self._since_checkpoint: dict[str, int] = {}
        self._last_checkpoint: dict[str, float] = {}

    def forget(self) -> None:
        """Drop the in-memory states (after a rebalance the table is the truth)."""
        self.live.clear()
        self._since_checkpoint.clear()
        self._last_checkpoint.clear()

    def on_batch(
        self, batch: MetricBatch, saved: dict[str, Any] | None, now: float | None = None
    ) -> tuple[dict[str, Any] | None, FeatureVector | None, list[Anomaly]]:
        """Return the state to save (None: nothing to save this time), the feature vector and the anomalies.

        ``saved`` is read only when the entity has no live state in this worker; ``now`` (a monotonic
        clock reading of the caller's) enables the ``checkpoint_min_s`` spacing.
        """
        entity = batch.entity
        if entity not in self.live:
            self.live[entity] = self._restore(saved or {})
        states, features = self.live[entity]
        anomalies: list[Anomaly] = []
        for detector in self.detectors.metric:
            states[detector.name], found = detector.detect([batch], states[detector.name])
            anomalies.extend(found)
        if anomalies:
            anomalies = stamped(anomalies, metric_provenance(batch))
        features, vector = extract(batch, features)
        self.live[entity] = (states, features)
        count = self._since_checkpoint.get(entity, 0) + 1
        due = count >= self.checkpoint_every and (
            now is None or now - self._last_checkpoint.get(entity, -math.inf) >= self.checkpoint_min_s
        )
        if anomalies or due:
            self._since_checkpoint[entity] = 0
            if now is not None:
                self._last_checkpoint[entity] = now
            return self.snapshot(entity), vector, anomalies
        self._since_checkpoint[entity] = count
        return None, vector, anomalies

    def snapshot(self, entity: str) -> dict[str, Any]:
        """The JSON-safe saved form of an entity's live state."""
        states, features = self.live[entity]
        out = {name: state_to_dict(state) for name, state in states.items()}
        out[FEATURES_KEY] = features.to_dict()
        return out

    def _restore(self, saved: dict[str, Any]) -> tuple[dict[str, Any], FeatureState]:
        states = {}
        for detector in self.detectors.metric:
            raw = saved.get(detector.name)
            states[detector.name] = detector.initial_state() if raw is None else state_from_dict(detector, raw)
        raw_features = saved.get(FEATURES_KEY)
        features = FeatureState() if raw_features is None else FeatureState.from_dict(raw_features)
        return states, features


class FeatureScorer:
    """Buffers feature vectors and scores them with the learned detectors in micro-batches.

    :meth:`take` and :meth:`score` split :meth:`flush` so the agent can score one taken batch in a worker
    thread (the model libraries release the GIL) while the stream goes on filling the next one. The
    caller runs at most one :meth:`score` at a time: the detectors' states are not shared between calls.
    """

    def __init__(self, detectors: Sequence[Detector], max_batch: int = 512, max_wait_s: float = 0.5) -> None:
        self.detectors = list(detectors)
        self.states: dict[str, Any] = {d.name: d.initial_state() for d in self.detectors}
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.buffer: list[FeatureVector] = []
        self._oldest = 0.0
        self.recent_learned: dict[str, tuple[float, str]] = {}  # entity -> (ts, detector) of its last learned anomaly

    def add(self, vector: FeatureVector, now: float) -> None:
        """Queue one vector."""
        if not self.buffer:
            self._oldest = now
        self.buffer.append(vector)

    def due(self, now: float) -> bool:
        """Whether the buffer should be scored now."""
        return bool(self.buffer) and (len(self.buffer) >= self.max_batch or now - self._oldest >= self.max_wait_s)

    def take(self) -> list[FeatureVector]:
        """Empty the buffer and return what it held."""
        batch, self.buffer = self.buffer, []
        return batch

    def score(self, batch: Sequence[FeatureVector]) -> list[Anomaly]:
        """Score ``batch``: one call per detector (and entity class inside it)."""
        anomalies: list[Anomaly] = []
        if not batch:
            return anomalies
        for detector in self.detectors:
            self.states[detector.name], found = detector.detect(batch, self.states[detector.name])
            anomalies.extend(stamped(found, LEARNED_PROVENANCE))
        return merge_learned(anomalies, self.recent_learned)

    def flush(self) -> list[Anomaly]:
        """Score everything buffered, in the calling thread."""
        return self.score(self.take())


LEARNED_MERGE_S = 60.0
"""How soon after one learned detector's anomaly on an entity the other's is the same episode."""


def merge_learned(
    anomalies: Sequence[Anomaly], recent: dict[str, tuple[float, str]] | None = None, merge_s: float = LEARNED_MERGE_S
) -> list[Anomaly]:
    """One anomaly per episode of an entity from the learned detectors, the others' verdicts as evidence.

    The isolation forest and the LSTM read the same feature vectors; when both flag the same scrape they
    saw one thing, which is one anomaly (the first, in detector order) ``corroborated_by`` the other.
    With ``recent`` (entity -> time and detector of its last learned anomaly, updated here) an anomaly
    from the other learned detector within ``merge_s`` after a published one is dropped: the forest
    judges a scrape, the LSTM a window ending in it, and they often see one episode a scrape or two
    apart. Other detectors' anomalies pass through unchanged.
    """
    out: list[Anomaly] = []
    first: dict[tuple[str, float], int] = {}
    for anomaly in anomalies:
        key = (anomaly.entity, anomaly.ts)
        if anomaly.detector not in LEARNED or anomaly.status != "firing":
            out.append(anomaly)
            continue
        before = recent.get(anomaly.entity) if recent is not None else None
        if key not in first and before is not None and before[1] != anomaly.detector:
            if 0.0 <= anomaly.ts - before[0] <= merge_s:
                log.debug(
                    "%s on %s joins the %s anomaly of %.0f s before",
                    anomaly.detector,
                    anomaly.entity,
                    before[1],
                    anomaly.ts - before[0],
                )
                continue
        if key not in first:
            if recent is not None and (before is None or anomaly.ts >= before[0]):
                # the merge clock only moves forward: a late anomaly must not reopen a window passed
                recent[anomaly.entity] = (anomaly.ts, anomaly.detector)
            first[key] = len(out)
            out.append(anomaly)
        else:
            kept = out[first[key]]
            also = [*kept.evidence.get("corroborated_by", []), _verdict(anomaly)]
            out[first[key]] = kept.model_copy(update={"evidence": {**kept.evidence, "corroborated_by": also}})
    return out


def _verdict(anomaly: Anomaly) -> dict[str, Any]:
    return {
        "detector": anomaly.detector,
        "signal": anomaly.signal,
        "score": anomaly.score,
        "threshold": anomaly.threshold,
        **{k: v for k, v in anomaly.evidence.items() if k != "features"},
    }


class DetectPorts(Protocol):
    """What the detect role needs of Kafka and of the entity-state table."""

    async def publish(self, anomalies: Sequence[Anomaly]) -> None:
        """Send anomalies to ``anomalies.v1``."""

    async def decode(self, cls: type[E], raw: bytes | None, key: bytes | None, *, consumer: str) -> E | None:
        """Decode a message, or dead-letter it and return None."""

    async def dead_letter(
        self, *, raw: bytes, key: bytes | None, source_topic: str, error: BaseException | str, consumer: str
    ) -> None:
        """Send a message that could not be accepted to ``deadletter.v1`` with the reason."""

    def saved_state(self, entity: str) -> dict[str, Any] | None:
        """An entity's state as last saved."""

    def save_state(self, partition: int, entity: str, state: dict[str, Any]) -> None:
        """Save an entity's state to the changelog partition of the message it came from."""

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        """Run ``work`` beside the stream."""


class DetectRole:
    """The detect role's steps; the Faust agents and timers only loop over them (module docstring).

    Args:
        detectors: this worker's detectors.
        ports: Kafka and the entity-state table.
        settings: where stored models are (model refresh).
        max_batch: feature vectors per learned-detector call.
        max_wait_s: longest a feature vector waits to be scored.
        checkpoint_min_s: least time between two saved states of one entity while it catches up.
        on_batch: told of every metric batch processed (progress counters, benchmarks).
        on_models_swapped: told which detectors' models were hot-swapped.
    """

    def __init__(
        self,
        detectors: DetectorSet,
        ports: DetectPorts,
        settings: Settings,
        *,
        max_batch: int = 512,
        max_wait_s: float = 0.5,
        checkpoint_min_s: float = 1.0,
        on_batch: Callable[[MetricBatch], None] | None = None,
        on_models_swapped: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.detectors = detectors
        self.ports = ports
        self.settings = settings
        self.entity = EntityDetection(detectors, checkpoint_min_s=checkpoint_min_s)
        self.scorer = FeatureScorer(detectors.feature, max_batch=max_batch, max_wait_s=max_wait_s)
        self.backlog = 8 * max_batch
        self.log_states = {d.name: d.initial_state() for d in detectors.log}
        self.event_states = {d.name: d.initial_state() for d in detectors.event}
        self.running: list[asyncio.Future[None]] = []  # the scoring call in progress, if any
        self.on_batch = on_batch
        self.on_models_swapped = on_models_swapped

    async def metrics(self, events: Sequence[EventT]) -> None:
        """Run one micro-batch of metric messages, in partition order, then write states and anomalies once."""
        anomalies: list[Anomaly] = []
        to_save: dict[str, tuple[int, dict[str, Any]]] = {}  # entity -> (source partition, saved state)
        now = time.monotonic()
        for event in events:
            batch = decode_metric_batch(event.value)
            if batch is None:  # the slow path names the error and dead-letters what really is bad
                batch = await self.ports.decode(MetricBatch, event.value, event.key, consumer="detect-metrics")
                if batch is None:
                    continue
            try:
                saved = None if batch.entity in self.entity.live else self.ports.saved_state(batch.entity)
                state, vector, found = self.entity.on_batch(batch, saved, now)
            except Exception as exc:  # a detector bug must not stop the stream: keep the input, go on
                log.exception("detectors failed on a batch for %s", batch.entity)
                await self.ports.dead_letter(
                    raw=event.value, key=event.key, source_topic=MetricBatch.topic, error=exc, consumer="detect-metrics"
                )
                continue
            if state is not None:
                to_save[batch.entity] = (event.message.partition, state)
            anomalies.extend(found)
            if vector is not None and vector.serving and self.scorer.detectors:
                self.scorer.add(vector, now)
            if self.on_batch is not None:
                self.on_batch(batch)
        for key, (partition, state) in to_save.items():
            self.ports.save_state(partition, key, state)
        await self.ports.publish(anomalies)
        await self.score_if_due()

    async def logs(self, values: Sequence[bytes]) -> None:
        """One micro-batch of log records through the log detectors; a record that makes one raise is
        dead-lettered alone and the rest are processed."""
        records: list[LogRecord] = []
        raws: list[bytes] = []
        for raw in values:
            record = await self.ports.decode(LogRecord, raw, None, consumer="detect-logs")
            if record is not None:
                records.append(record)
                raws.append(raw)
        for detector in self.detectors.log:
            self.log_states[detector.name], found, failed = detect_each_guarded(
                detector, records, self.log_states[detector.name]
            )
            for index, exc in failed:
                await self.ports.dead_letter(
                    raw=raws[index],
                    key=None,
                    source_topic=LogRecord.topic,
                    error=exc,
                    consumer=f"detect-logs:{detector.name}",
                )
            await self.ports.publish(found)

    async def kube_event(self, item: Any) -> None:
        """One Kubernetes event through the event rules."""
        event = await self.ports.decode(KubeEvent, item.value, item.key, consumer="detect-events")
        if event is None:
            return
        for detector in self.detectors.event:
            self.event_states[detector.name], found = detector.detect([event], self.event_states[detector.name])
            await self.ports.publish(stamped(found, KUBE_PROVENANCE))

    async def score_if_due(self) -> None:
        """Start scoring the buffer in a worker thread when it is due and no other scoring call runs.

        The stream is not held up by a model call (one at a time keeps the detectors' states and the
        order of each entity's vectors); vectors queue up behind it into a larger batch. Only when the
        stream fills the buffer to ``backlog`` faster than the models score does it wait (bounded memory).
        """
        while self.running and not self.running[0].done():
            if len(self.scorer.buffer) < self.backlog:
                return
            await asyncio.wait([self.running[0]])
        if self.scorer.due(time.monotonic()):
            self.running[:] = [self.ports.spawn(self._score(self.scorer.take()))]

    async def _score(self, batch: list[FeatureVector]) -> None:
        try:
            found = await asyncio.to_thread(self.scorer.score, batch)
        except Exception:  # a model bug must not stop the stream; the rule detectors go on
            log.exception("learned detectors failed on %d feature vectors", len(batch))
            return
        await self.ports.publish(found)

    async def refresh_models(self) -> None:
        """Hot-swap newer stored models."""
        changed = await asyncio.to_thread(refresh_models, self.settings, self.detectors)
        if changed:
            log.info("hot-swapped newer models for %s", ", ".join(changed))
            if self.on_models_swapped is not None:
                self.on_models_swapped(changed)

    def revoked(self) -> None:
        """Partitions may come back after another worker advanced their states: re-read the table."""
        self.entity.forget()


class FaustDetectPorts(PipelinePorts):
    """:class:`DetectPorts` on the Faust app and its entity-state table."""

    def __init__(self, pipeline: Pipeline, table: TableT) -> None:
        super().__init__(pipeline)
        self.table = table

    async def publish(self, anomalies: Sequence[Anomaly]) -> None:
        for anomaly in anomalies:
            await self.pipeline.topics.anomalies.send(key=anomaly.key().encode(), value=anomaly.to_bytes())

    def saved_state(self, entity: str) -> dict[str, Any] | None:
        saved: dict[str, Any] | None = self.table.get(entity)
        return saved

    def save_state(self, partition: int, entity: str, state: dict[str, Any]) -> None:
        save_entity_state(self.table, partition, entity, state)

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        future: asyncio.Future[None] = self.pipeline.app.add_future(work)
        return future


def register_detect(
    pipeline: Pipeline,
    detectors: DetectorSet,
    *,
    max_batch: int = 512,
    max_wait_s: float = 0.5,
    log_batch: int = 500,
    metric_batch: int = 1000,
    checkpoint_min_s: float = 1.0,
    model_refresh_s: float | None = None,
    on_batch: Callable[[MetricBatch], None] | None = None,
    on_models_swapped: Callable[[list[str]], None] | None = None,
) -> FeatureScorer:
    """Register the three detect agents, the entity-state table and the scoring timer on ``pipeline``.

    ``metric_batch`` bounds the metric messages handled per micro-batch (``max_wait_s`` its wait);
    ``checkpoint_min_s`` spaces an entity's saved states when it catches up (see :class:`EntityDetection`).
    With ``model_refresh_s`` a timer also looks for newer stored models and hot-swaps them, telling
    ``on_models_swapped`` which detectors changed; ``on_batch`` is told of every metric batch processed
    (progress counters, benchmarks). Each agent and timer is a loop over one :class:`DetectRole` method.
    """
    app, topics = pipeline.app, pipeline.topics
    table = app.Table(
        "detect-entity-state",
        default=None,
        partitions=pipeline.settings.kafka_partitions,
        key_type=str,  # values use the app's default JSON serializer
    )
    role = DetectRole(
        detectors,
        FaustDetectPorts(pipeline, table),
        pipeline.settings,
        max_batch=max_batch,
        max_wait_s=max_wait_s,
        checkpoint_min_s=checkpoint_min_s,
        on_batch=on_batch,
        on_models_swapped=on_models_swapped,
    )

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # mode types handlers narrower than it calls them
    def forget_live_states(sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        role.revoked()

    @app.agent(topics.metrics, name="detect-metrics")
    async def detect_metrics(stream):  # type: ignore[no-untyped-def]
        # take_events acks (and so lets Faust commit) a micro-batch only after this loop body returns
        async for events in stream.take_events(metric_batch, within=max_wait_s):
            await role.metrics(events)

    @app.timer(interval=max_wait_s)
    async def flush_idle_scores() -> None:
        # scrapes arrive in bursts; without this the tail of a burst would wait for the next one
        await role.score_if_due()

    if model_refresh_s:

        @app.timer(interval=model_refresh_s)
        async def hot_swap_models() -> None:
            await role.refresh_models()

    @app.agent(topics.logs, name="detect-logs")
    async def detect_logs(stream):  # type: ignore[no-untyped-def]
        async for values in stream.take(log_batch, within=max_wait_s):
            await role.logs(values)

    @app.agent(topics.events, name="detect-events")
    async def detect_events(stream):  # type: ignore[no-untyped-def]
        async for item in stream.events():
            await role.kube_event(item)

    return role.scorer


def detect_each_guarded(
    detector: Detector, batch: Sequence[Any], state: Any
) -> tuple[Any, list[Anomaly], list[tuple[int, Exception]]]:
    """``detector.detect(batch, state)``, with a record that makes it raise set aside, not the batch.

    A detector bug that one record triggers (a 5,000-digit number, say) used to end the agent and lose
    the rest of its micro-batch. When the batch raises, it is run again one record at a time, so the
    neighbours are processed and the poison is known: the caller dead-letters it. On that path the
    records before the poison have been seen twice (the state is updated in place), a small error in
    a rare path, and better than losing them.

    Returns:
        The new state, the anomalies, and ``(index in batch, error)`` of each record that raised.
    """
    try:
        state, found = detector.detect(batch, state)
    except Exception:
        log.exception("%s failed on a batch of %d records: retrying them one at a time", detector.name, len(batch))
    else:
        return state, found, []
    found, failed = [], []
    for index, record in enumerate(batch):
        try:
            state, more = detector.detect([record], state)
        except Exception as exc:
            failed.append((index, exc))
            continue
        found.extend(more)
    return state, found, failed


def decode_metric_batch(raw: bytes | None) -> MetricBatch | None:
    """The fast path of decoding: pydantic parses and validates the JSON bytes in one pass.

    Returns None when that fails; the caller then takes :meth:`Pipeline.decode`, which gives the error its
    project type and dead-letters the message (or accepts it, where only the fast parser was stricter).
    """
    if raw is None:
        return None
    try:
        return MetricBatch.model_validate_json(raw)
    except ValidationError:
        return None


def save_entity_state(table: TableT, partition: int, key: str, state: dict[str, Any]) -> None:
    """Write an entity's state to the table and to the changelog partition of the message it came from.

    ``table[key] = state`` would take the partition from Faust's current-event context, which a
    ``take_events`` micro-batch does not set; the changelog partition must be the source message's so a
    worker that takes the partition over after a rebalance recovers exactly its entities' states.
    """
    table.send_changelog(partition, key, state)
    table.data[key] = state


def build_detectors(settings: Settings, names: Sequence[str] | None = None) -> DetectorSet:
    """Instantiate the named detectors (default: every registered one), warm-starting learned models.

    The learned detectors get the newest stored model of each entity class; without one the isolation
    forest uses its robust-statistics fallback and the LSTM stays silent. With the LSTM, torch is held to
    ``settings.detect_torch_threads`` threads: its intra-op pool spins for work, and on a busy machine
    two threads cost ten times the CPU of one for the small batches a worker scores.
    """
    from pipelines.detectors.registry import DETECTORS

    chosen = list(names) if names else DETECTORS.names()
    if "lstm" in chosen and settings.detect_torch_threads > 0:
        import torch

        torch.set_num_threads(settings.detect_torch_threads)
    stored = stored_versions(settings)
    instances: list[Detector] = []
    for name in chosen:
        cls = DETECTORS.load(name)
        if name in stored:
            instances.append(cls(_load(name, stored[name])))
        elif hasattr(cls, "from_settings"):  # a detector with settings of its own (the kernel-stream selector)
            instances.append(cls.from_settings(settings))
        else:
            instances.append(cls())
    detectors = DetectorSet.of(instances)
    detectors.versions = {name: {c: row.version for c, row in rows.items()} for name, rows in stored.items()}
    return detectors


def stored_versions(settings: Settings) -> dict[str, dict[str, StoredModel]]:
    """Newest stored model per entity class for each learned detector (``iforest``, ``lstm``)."""
    from services.store.detector_models import latest_models

    return {name: latest_models(settings, name) for name in LEARNED}


def _load(name: str, rows: dict[str, StoredModel]) -> dict[str, Any]:
    return {cls: LEARNED[name](row.model) for cls, row in rows.items()}


def refresh_models(settings: Settings, detectors: DetectorSet) -> list[str]:
    """Swap in newer stored model versions without stopping the stream; return the detectors changed.

    Only version numbers are read each time; model bytes are loaded only for a detector with a new one.
    """
    from services.store.detector_models import latest_models, latest_versions

    changed = []
    for detector in detectors.feature:
        if detector.name not in LEARNED:
            continue
        versions = latest_versions(settings, detector.name)
        if not versions or versions == detectors.versions.get(detector.name):
            continue
        rows = latest_models(settings, detector.name)
        detector.models = _load(detector.name, rows)  # type: ignore[attr-defined]
        detectors.versions[detector.name] = {cls: row.version for cls, row in rows.items()}
        changed.append(detector.name)
    return changed


def _iforest(raw: bytes) -> Any:
    from pipelines.detectors.iforest import TrainedIForest

    return TrainedIForest.from_bytes(raw)


def _lstm(raw: bytes) -> Any:
    from pipelines.detectors.lstm import TrainedLSTM

    return TrainedLSTM.from_bytes(raw)


LEARNED: dict[str, Callable[[bytes], Any]] = {"iforest": _iforest, "lstm": _lstm}
