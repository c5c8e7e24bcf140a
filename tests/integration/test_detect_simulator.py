"""A seeded simulator fault through the real broker and the detect role: the anomaly lands on the right GPU."""

from __future__ import annotations

import asyncio
import time

import pytest

from pipelines.app import create_pipeline
from pipelines.detect import DetectorSet, register_detect
from pipelines.detectors.registry import DETECTORS
from services.core.bus import ensure_topics, read_raw
from services.core.events import Anomaly
from services.simulator.scenario import load_scenario
from services.simulator.simulator import Simulator
from services.simulator.sinks import KafkaSink

pytestmark = pytest.mark.integration

RULES = ["xid_rules", "gpu_rules", "serving_rules", "kube_events", "log_templates"]


def test_xid79_from_the_simulator_reaches_anomalies_on_the_faulty_gpu_within_a_minute(kafka_ready, settings):
    ensure_topics(settings)
    sim = Simulator(load_scenario("xid79"), seed=5)
    sink = KafkaSink(settings)
    sim.sinks.append(sink)
    try:
        while sim.t < 420:  # onset at 300 s
            sim.step()
    finally:
        sink.close()
    fault = next(f for f in sim.fault_list() if f.type == "xid")
    assert fault.started_at is not None
    onset_ts = sim.telemetry.epoch + fault.started_at

    detectors = DetectorSet.of([DETECTORS.load(name)() for name in RULES])
    hits: list[Anomaly] = []

    async def run() -> None:
        pipeline = create_pipeline(settings)
        register_detect(pipeline, detectors, max_wait_s=0.2)
        await pipeline.app.start()
        try:
            deadline = time.monotonic() + 90
            while not hits and time.monotonic() < deadline:
                found = await asyncio.to_thread(
                    lambda: [
                        Anomaly.from_bytes(v)
                        for _, _, v in read_raw(settings, [Anomaly.topic], max_messages=500, timeout_s=3)
                    ]
                )
                # the DCGM XID counter (metrics path) and the kernel line (logs path) must both report it
                hits[:] = [a for a in found if a.signal == "gpu_xid" and a.entity == fault.entity]
                if {a.detector for a in hits} < {"xid_rules", "log_templates"}:
                    hits.clear()
        finally:
            await pipeline.app.stop()

    asyncio.run(run())

    assert hits, f"no gpu_xid anomaly on {fault.entity}"
    assert {a.detector for a in hits} == {"xid_rules", "log_templates"}
    first = min((a for a in hits if a.detector == "xid_rules"), key=lambda a: a.ts)
    assert 0 <= first.ts - onset_ts <= 60
    assert first.severity == "critical"
    assert first.labels.get("node") and first.evidence.get("xid") == 79
