"""The learned detectors' lifecycle against the real broker and Postgres.

Train from a Kafka time range (the stored metadata names the range and the samples read), retrain from
recent data judged normal (windows next to an anomaly are left out) into version N+1, and a running
detect worker hot-swaps that version without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

from pipelines.app import create_pipeline
from pipelines.detect import build_detectors, register_detect
from pipelines.training import TimeRange, retrain_once, train_from_kafka
from services.core.bus import KafkaPublisher, ensure_topics
from services.core.events import Anomaly, MetricBatch
from services.core.settings import Settings
from services.simulator.scenario import load_scenario
from services.simulator.simulator import Simulator
from services.store.db import migrate
from services.store.detector_models import latest_models

pytestmark = pytest.mark.integration

# iforest only: the LSTM trains for minutes on a shared CPU and goes through the same store and swap
TRAINING: dict[str, Any] = {"detectors": ("iforest",), "contamination": 0.01}


def _baseline(seed: int, seconds: float = 600) -> list[MetricBatch]:
    sim = Simulator(load_scenario("baseline"), seed=seed)
    try:
        batches: list[MetricBatch] = []
        while sim.t < seconds:
            batches.extend(e for e in sim.step() if isinstance(e, MetricBatch))
        return batches
    finally:
        sim.close()


def _publish(settings: Settings, batches: list[MetricBatch], *garbage: bytes) -> None:
    with KafkaPublisher(settings) as publisher:
        for raw in garbage:
            publisher.send_raw(MetricBatch.topic, b"junk", raw)
        for batch in batches:
            publisher.publish(batch)


@pytest.fixture
def lifecycle_settings(kafka_ready: None, fresh_database: Settings, settings: Settings) -> Settings:
    """Fresh topics and a fresh, migrated database."""
    both = fresh_database.model_copy(update={"topic_prefix": settings.topic_prefix})
    ensure_topics(both)
    migrate(both)
    return both


def test_training_from_a_kafka_time_range_stores_what_it_read(lifecycle_settings: Settings) -> None:
    settings = lifecycle_settings
    before = _baseline(seed=1)
    _publish(settings, before)
    since = time.time()  # everything of `before` was acknowledged: written earlier
    inside = _baseline(seed=2)
    _publish(settings, inside, b"{broken")
    until = time.time()
    _publish(settings, _baseline(seed=3, seconds=120))  # after the range

    report = train_from_kafka(settings, TimeRange(since, until), **TRAINING)

    assert report is not None and report.versions == {"iforest/gpu": 1, "iforest/pod": 1}
    stored = latest_models(settings, "iforest")
    meta = stored["gpu"].training
    assert meta["source"] == "kafka" and meta["topic"] == MetricBatch.topic
    assert (meta["since"], meta["until"]) == (since, until)
    assert meta["samples"] == sum(len(b.samples) for b in inside)
    assert meta["messages"] == len(inside) + 1 and meta["undecodable"] == 1
    assert meta["excluded_windows"] == 0


def test_retraining_leaves_out_anomalous_windows_and_a_running_worker_swaps_in_the_new_version(
    lifecycle_settings: Settings,
) -> None:
    settings = lifecycle_settings
    start = time.time()
    batches = _baseline(seed=4)
    _publish(settings, batches)
    first = train_from_kafka(settings, TimeRange(start, time.time()), **TRAINING)
    assert first is not None and first.versions["iforest/gpu"] == 1
    first_rows = latest_models(settings, "iforest")["gpu"].training["rows"]

    detectors = build_detectors(settings, ["iforest"])
    assert detectors.versions["iforest"] == {"gpu": 1, "pod": 1}
    # an anomaly on one GPU in the middle of the data: its windows are not "normal"
    gpu = next(b for b in batches if b.entity.startswith("GPU-") and any(s.labels.get("pod") for s in b.samples))
    middle = batches[len(batches) // 2].samples[0].ts
    anomaly = Anomaly(entity=gpu.entity, signal="gpu_thermal", detector="gpu_rules", score=1, threshold=1, ts=middle)

    swapped: dict[str, int] = {}

    async def run() -> None:
        fully_swapped = asyncio.Event()

        def on_swap(changed: list[str]) -> None:
            if detectors.versions["iforest"] == {"gpu": 2, "pod": 2}:
                fully_swapped.set()

        pipeline = create_pipeline(settings)
        register_detect(pipeline, detectors, max_wait_s=0.2, model_refresh_s=0.3, on_models_swapped=on_swap)
        await pipeline.app.start()
        try:
            with KafkaPublisher(settings) as publisher:
                publisher.publish(anomaly)
            report = await asyncio.to_thread(
                retrain_once,
                settings,
                lookback_s=time.time() - start + 1,
                margin_s=0,
                window_s=300,
                min_scrapes=10,
                **TRAINING,
            )
            assert report is not None and report.versions["iforest/gpu"] == 2
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fully_swapped.wait(), timeout=30)
            swapped.update(detectors.versions["iforest"])
        finally:
            await pipeline.app.stop()

    asyncio.run(run())

    assert swapped == {"gpu": 2, "pod": 2}, "the running worker did not hot-swap the retrained version"
    meta = latest_models(settings, "iforest")["gpu"].training
    assert meta["source"] == "retrain"
    assert meta["excluded_windows"] >= 1 and meta["excluded_scrapes"] >= 1
    assert meta["rows"] < first_rows  # the GPU's anomalous window (and its pod's) was not learned
