"""The detect agents against the real broker: telemetry in, anomalies out, bad input dead-lettered."""

from __future__ import annotations

import asyncio
import time

import pytest

from pipelines.app import create_pipeline
from pipelines.detect import DetectorSet, register_detect
from pipelines.detectors.logtemplates import LogTemplateDetector
from services.core.bus import KafkaPublisher, ensure_topics, read_raw
from services.core.events import Anomaly, DeadLetter, LogRecord

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
    node = {"job": "kernel", "node": "gpu-node-1"}
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
