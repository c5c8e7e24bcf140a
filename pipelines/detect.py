"""The detect role: Faust agents that turn telemetry into anomalies.

Three agents, one per telemetry topic:

* ``detect-metrics`` reads one :class:`MetricBatch` (one scrape of one entity) at a time. Rule detectors
  that consume metric batches run on it with the entity's state, and the entity's feature vector is
  computed. Per-entity state (rule states and feature state) lives in the ``detect-entity-state``
  table, which Faust co-partitions with the metrics topic and backs with a changelog, so a restarted or
  rebalanced worker resumes where the last one stopped. Feature vectors are buffered and scored by the
  learned detectors in micro-batches (a model call costs ~10 ms whatever its size), when the buffer is
  full or its oldest vector has waited ``max_wait_s``.
* ``detect-logs`` takes micro-batches of :class:`LogRecord` for the log-template detector.
* ``detect-events`` feeds :class:`KubeEvent` to the Kubernetes event rules.

The learned detectors' and the log miner's state is worker-local: their models come from the
``detector_models`` table and their short windows refill from the stream after a restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipelines.app import Pipeline
from pipelines.detectors.base import Detector
from pipelines.features import FeatureState, FeatureVector, extract
from services.core.events import Anomaly, KubeEvent, LogRecord, MetricBatch
from services.core.settings import Settings
from services.store.detector_models import StoredModel

log = logging.getLogger(__name__)

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

    Args:
        detectors: the worker's detectors.
        checkpoint_every: scrapes between saved states of one entity (1 saves every scrape).
    """

    def __init__(self, detectors: DetectorSet, checkpoint_every: int = 4) -> None:
        self.detectors = detectors
        self.checkpoint_every = max(1, checkpoint_every)
        self.live: dict[str, tuple[dict[str, Any], FeatureState]] = {}
        self._since_checkpoint: dict[str, int] = {}

    def forget(self) -> None:
        """Drop the in-memory states (after a rebalance the table is the truth)."""
        self.live.clear()
        self._since_checkpoint.clear()

    def on_batch(
        self, batch: MetricBatch, saved: dict[str, Any] | None
    ) -> tuple[dict[str, Any] | None, FeatureVector | None, list[Anomaly]]:
        """Return the state to save (None: nothing to save this time), the feature vector and the anomalies.

        ``saved`` is read only when the entity has no live state in this worker.
        """
        entity = batch.entity
        if entity not in self.live:
            self.live[entity] = self._restore(saved or {})
        states, features = self.live[entity]
        anomalies: list[Anomaly] = []
        for detector in self.detectors.metric:
            states[detector.name], found = detector.detect([batch], states[detector.name])
            anomalies.extend(found)
        features, vector = extract(batch, features)
        self.live[entity] = (states, features)
        count = self._since_checkpoint.get(entity, 0) + 1
        if anomalies or count >= self.checkpoint_every:
            self._since_checkpoint[entity] = 0
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
    """Buffers feature vectors and scores them with the learned detectors in micro-batches."""

    def __init__(self, detectors: Sequence[Detector], max_batch: int = 512, max_wait_s: float = 0.5) -> None:
        self.detectors = list(detectors)
        self.states: dict[str, Any] = {d.name: d.initial_state() for d in self.detectors}
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.buffer: list[FeatureVector] = []
        self._oldest = 0.0

    def add(self, vector: FeatureVector, now: float) -> None:
        """Queue one vector."""
        if not self.buffer:
            self._oldest = now
        self.buffer.append(vector)

    def due(self, now: float) -> bool:
        """Whether the buffer should be scored now."""
        return bool(self.buffer) and (len(self.buffer) >= self.max_batch or now - self._oldest >= self.max_wait_s)

    def flush(self) -> list[Anomaly]:
        """Score everything buffered: one call per detector (and entity class inside it)."""
        batch, self.buffer = self.buffer, []
        anomalies: list[Anomaly] = []
        if not batch:
            return anomalies
        for detector in self.detectors:
            self.states[detector.name], found = detector.detect(batch, self.states[detector.name])
            anomalies.extend(found)
        return anomalies


def register_detect(
    pipeline: Pipeline,
    detectors: DetectorSet,
    *,
    max_batch: int = 512,
    max_wait_s: float = 0.5,
    log_batch: int = 500,
    model_refresh_s: float | None = None,
    on_batch: Callable[[MetricBatch], None] | None = None,
) -> FeatureScorer:
    """Register the three detect agents, the entity-state table and the scoring timer on ``pipeline``.

    With ``model_refresh_s`` a timer also looks for newer stored models and hot-swaps them;
    ``on_batch`` is told of every metric batch processed (progress counters, benchmarks).
    """
    app, topics = pipeline.app, pipeline.topics
    table = app.Table(
        "detect-entity-state",
        default=None,
        partitions=pipeline.settings.kafka_partitions,
        key_type=str,  # values use the app's default JSON serializer
    )
    entity = EntityDetection(detectors)

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # mode types handlers narrower than it calls them
    def forget_live_states(sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        # partitions may come back after another worker advanced their states: re-read the table
        entity.forget()

    scorer = FeatureScorer(detectors.feature, max_batch=max_batch, max_wait_s=max_wait_s)
    log_states = {d.name: d.initial_state() for d in detectors.log}
    event_states = {d.name: d.initial_state() for d in detectors.event}

    async def publish(anomalies: Sequence[Anomaly]) -> None:
        for anomaly in anomalies:
            await topics.anomalies.send(key=anomaly.key().encode(), value=anomaly.to_bytes())

    @app.agent(topics.metrics, name="detect-metrics")
    async def detect_metrics(stream):  # type: ignore[no-untyped-def]
        async for item in stream.events():
            batch = await pipeline.decode(MetricBatch, item.value, item.key, consumer="detect-metrics")
            if batch is None:
                continue
            try:
                saved, vector, anomalies = entity.on_batch(batch, table.get(batch.entity))
            except Exception as exc:  # a detector bug must not stop the stream: keep the input, go on
                log.exception("detectors failed on a batch for %s", batch.entity)
                await pipeline.dead_letter(
                    raw=item.value, key=item.key, source_topic=MetricBatch.topic, error=exc, consumer="detect-metrics"
                )
                continue
            if saved is not None:
                table[batch.entity] = saved
            if on_batch is not None:
                on_batch(batch)
            await publish(anomalies)
            now = time.monotonic()
            if vector is not None and vector.serving and scorer.detectors:
                scorer.add(vector, now)
            if scorer.due(now):
                await publish(scorer.flush())

    @app.timer(interval=max_wait_s)
    async def flush_idle_scores() -> None:
        # scrapes arrive in bursts; without this the tail of a burst would wait for the next one
        if scorer.due(time.monotonic()):
            await publish(scorer.flush())

    if model_refresh_s:

        @app.timer(interval=model_refresh_s)
        async def hot_swap_models() -> None:
            changed = await asyncio.to_thread(refresh_models, pipeline.settings, detectors)
            if changed:
                log.info("hot-swapped newer models for %s", ", ".join(changed))

    @app.agent(topics.logs, name="detect-logs")
    async def detect_logs(stream):  # type: ignore[no-untyped-def]
        async for values in stream.take(log_batch, within=max_wait_s):
            records = []
            for raw in values:
                record = await pipeline.decode(LogRecord, raw, None, consumer="detect-logs")
                if record is not None:
                    records.append(record)
            for detector in detectors.log:
                log_states[detector.name], found = detector.detect(records, log_states[detector.name])
                await publish(found)

    @app.agent(topics.events, name="detect-events")
    async def detect_events(stream):  # type: ignore[no-untyped-def]
        async for item in stream.events():
            event = await pipeline.decode(KubeEvent, item.value, item.key, consumer="detect-events")
            if event is None:
                continue
            for detector in detectors.event:
                event_states[detector.name], found = detector.detect([event], event_states[detector.name])
                await publish(found)

    return scorer


def build_detectors(settings: Settings, names: Sequence[str] | None = None) -> DetectorSet:
    """Instantiate the named detectors (default: every registered one), warm-starting learned models.

    The learned detectors get the newest stored model of each entity class; without one the isolation
    forest uses its robust-statistics fallback and the LSTM stays silent.
    """
    from pipelines.detectors.registry import DETECTORS

    chosen = list(names) if names else DETECTORS.names()
    stored = stored_versions(settings)
    instances: list[Detector] = []
    for name in chosen:
        cls = DETECTORS.load(name)
        instances.append(cls(_load(name, stored[name])) if name in stored else cls())
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
    """Swap in newer stored model versions without stopping the stream; return the detectors changed."""
    stored = stored_versions(settings)
    changed = []
    for detector in detectors.feature:
        rows = stored.get(detector.name, {})
        versions = {cls: row.version for cls, row in rows.items()}
        if rows and versions != detectors.versions.get(detector.name):
            detector.models = _load(detector.name, rows)  # type: ignore[attr-defined]
            detectors.versions[detector.name] = versions
            changed.append(detector.name)
    return changed


def _iforest(raw: bytes) -> Any:
    from pipelines.detectors.iforest import TrainedIForest

    return TrainedIForest.from_bytes(raw)


def _lstm(raw: bytes) -> Any:
    from pipelines.detectors.lstm import TrainedLSTM

    return TrainedLSTM.from_bytes(raw)


LEARNED: dict[str, Callable[[bytes], Any]] = {"iforest": _iforest, "lstm": _lstm}
