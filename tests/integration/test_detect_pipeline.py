"""The detect agents against the real broker: telemetry in, anomalies out, bad input dead-lettered, state kept."""

from __future__ import annotations

import asyncio
import time

import pytest

from pipelines.app import create_pipeline
from pipelines.detect import DetectorSet, register_detect
from pipelines.detectors.logtemplates import LogTemplateDetector
from pipelines.detectors.rules_xid import XidDetector
from services.core.bus import KafkaPublisher, ensure_topics, read_raw
from services.core.events import Anomaly, DeadLetter, LogRecord, MetricBatch, Sample

pytestmark = pytest.mark.integration


def _run_pipeline_until(settings, detectors: DetectorSet, want: int, timeout_s: float = 60.0) -> list[Anomaly]:
    """Run the detect role in-process until ``want`` anomalies are on anomalies.v1 (or the deadline)."""
    found: list[Anomaly] = []

    async def run() -> None:
        pipeline = create_pipeline(settings)
        register_detect(pipeline, detectors, max_wait_s=0.2)
        await pipeline.app.start()
        try:
            deadline = time.monotonic() + timeout_s
            while len(found) < want and time.monotonic() < deadline:
                batch = await asyncio.to_thread(
                    lambda: list(read_raw(settings, [Anomaly.topic], max_messages=want, timeout_s=2))
                )
                found[:] = [Anomaly.from_bytes(v) for _, _, v in batch]
        finally:
            await pipeline.app.stop()

    asyncio.run(run())
    return found


def test_an_xid_kernel_line_becomes_a_gpu_anomaly_and_garbage_is_dead_lettered(kafka_ready, settings):
    ensure_topics(settings)
    node = {"job": "node-journal", "unit": "kernel", "node": "gpu-node-1"}  # the node's kernel stream
    with KafkaPublisher(settings) as publisher:
        publisher.send_raw(LogRecord.topic, b"gpu-node-1", b"{broken")
        for i in range(5):
            publisher.publish(LogRecord(line=f"kernel: eth0 link up {i}", ts=1000.0 + i, stream=node))
        publisher.publish(
            LogRecord(
                line="NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", ts=1010.0, stream=node
            )
        )

    anomalies = _run_pipeline_until(settings, DetectorSet.of([LogTemplateDetector()]), want=1)

    xid = [a for a in anomalies if a.signal == "gpu_xid"]
    assert len(xid) == 1
    assert xid[0].severity == "critical" and xid[0].evidence["xid"] == 79
    letters = [
        DeadLetter.from_bytes(v) for _, _, v in read_raw(settings, [DeadLetter.topic], max_messages=1, timeout_s=10)
    ]
    assert letters and letters[0].raw == b"{broken" and letters[0].consumer == "detect-logs"


def _gpu_scrape(uuid: str, ts: float, xid: float) -> MetricBatch:
    labels = {"UUID": uuid, "Hostname": "gpu-node-1", "gpu": "0", "pod": f"pod-{uuid}"}
    return MetricBatch(
        entity=uuid,
        source="test",
        samples=(
            Sample(name="DCGM_FI_DEV_XID_ERRORS", labels=labels, value=xid, ts=ts),
            Sample(name="DCGM_FI_DEV_GPU_UTIL", labels=labels, value=50, ts=ts),
        ),
    )


def _run_metrics_until(settings, predicate, timeout_s: float = 60.0) -> list[Anomaly]:
    """Run a detect worker (XID rules) until the anomalies on the topic satisfy ``predicate``."""
    found: list[Anomaly] = []

    async def run() -> None:
        pipeline = create_pipeline(settings)
        register_detect(pipeline, DetectorSet.of([XidDetector()]), max_wait_s=0.2)
        await pipeline.app.start()
        try:
            deadline = time.monotonic() + timeout_s
            while not predicate(found) and time.monotonic() < deadline:
                values = await asyncio.to_thread(
                    lambda: [v for _, _, v in read_raw(settings, [Anomaly.topic], max_messages=100, timeout_s=2)]
                )
                found[:] = [Anomaly.from_bytes(v) for v in values]
        finally:
            await pipeline.app.stop()

    asyncio.run(run())
    return found


def test_metric_micro_batches_survive_a_worker_restart_without_paging_twice(kafka_ready, settings):
    ensure_topics(settings)
    gpus = [f"GPU-{i}" for i in range(6)]  # spread over the partitions
    with KafkaPublisher(settings) as publisher:
        publisher.send_raw(MetricBatch.topic, b"GPU-0", b"not json")
        publisher.send_raw(MetricBatch.topic, b"GPU-0", b'{"entity": "GPU-0", "samples": "nope"}')
        for step in range(6):  # XID 79 from the fourth scrape on, on every GPU
            for gpu in gpus:
                publisher.publish(_gpu_scrape(gpu, 1000.0 + 15 * step, 79 if step >= 3 else 0))

    first = _run_metrics_until(settings, lambda found: len(found) >= len(gpus))
    assert sorted(a.entity for a in first) == gpus and all(a.signal == "gpu_xid" for a in first)
    letters = [
        DeadLetter.from_bytes(v) for _, _, v in read_raw(settings, [DeadLetter.topic], max_messages=2, timeout_s=10)
    ]
    assert sorted(letter.raw for letter in letters) == sorted([b"not json", b'{"entity": "GPU-0", "samples": "nope"}'])
    assert {letter.consumer for letter in letters} == {"detect-metrics"}

    # a new worker of the same group: the XID is still set on every GPU, and one GPU shows a new one
    with KafkaPublisher(settings) as publisher:
        for step in range(6, 9):
            for gpu in gpus:
                publisher.publish(_gpu_scrape(gpu, 1000.0 + 15 * step, 79))
        publisher.publish(_gpu_scrape("GPU-new", 1000.0, 0))
        publisher.publish(_gpu_scrape("GPU-new", 1015.0, 48))

    second = _run_metrics_until(settings, lambda found: any(a.entity == "GPU-new" for a in found))
    assert any(a.entity == "GPU-new" for a in second), "the restarted worker did not process new scrapes"
    per_gpu = {gpu: sum(a.entity == gpu for a in second) for gpu in gpus}
    assert per_gpu == dict.fromkeys(gpus, 1), "a restarted worker paged the same XID again"

    # each entity's state went to the changelog partition of its own metrics partition
    source = _partitions_by_key(settings.topic(MetricBatch.topic))
    changelog = _partitions_by_key(f"{settings.topic_prefix}{settings.faust_app_id}-detect-entity-state-changelog")
    assert changelog and all(source[key.strip(b'"')] == partitions for key, partitions in changelog.items())


def _partitions_by_key(topic: str) -> dict[bytes, set[int]]:
    """key -> the partitions its records are on, for a whole topic."""
    from kafka import KafkaConsumer

    from services.core.settings import Settings

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=Settings().bootstrap_servers,
        auto_offset_reset="earliest",
        group_id=None,
        consumer_timeout_ms=3000,
    )
    out: dict[bytes, set[int]] = {}
    try:
        for record in consumer:
            if record.key is not None:
                out.setdefault(record.key, set()).add(record.partition)
    finally:
        consumer.close()
    return out
