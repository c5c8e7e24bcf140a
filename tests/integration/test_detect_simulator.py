"""Seeded simulator faults through the real broker and the detect role: anomalies land on the right entity.

One test per simulator fault type runs its scenario past onset through Kafka and a detect worker with
every registered detector (no stored models: the fresh-install configuration) and waits for an anomaly
on the fault's entity stamped within a minute of onset (a bad rollout's onset is its first Ready pod of
the new revision, and its entity that revision's pods: see evals.detect); the XID 79 test also
checks both paths (metrics and kernel log) report it.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from evals.detect import matches, scenario_per_fault_type, symptom_onset
from pipelines.app import create_pipeline
from pipelines.detect import DetectorSet, register_detect
from pipelines.detectors.registry import DETECTORS
from services.core.bus import ensure_topics, read_raw
from services.core.events import Anomaly
from services.core.settings import Settings
from services.simulator.faults import FAULT_TYPES, Fault
from services.simulator.scenario import load_scenario
from services.simulator.simulator import Simulator
from services.simulator.sinks import KafkaSink

pytestmark = pytest.mark.integration

RULES = ["xid_rules", "gpu_rules", "serving_rules", "kube_events", "log_templates"]


def test_xid79_from_the_simulator_reaches_anomalies_on_the_faulty_gpu_within_a_minute(
    kafka_ready: None, settings: Settings
) -> None:
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


def run_past_onset(sim: Simulator, margin_s: float = 80.0, limit_s: float = 900.0) -> Fault:
    """Step the simulator until ``margin_s`` after its fault's symptom onset; return the fault.

    Every shipped fault scenario starts its fault at 300 s; a bad rollout's symptom starts when the new
    revision's first pod is Ready, about 105 s later (see evals.detect.symptom_onset).
    """
    while sim.t < limit_s:
        sim.step()
        started = [f for f in sim.fault_list() if f.started_at is not None]
        if not started:
            continue
        (fault,) = started
        if (fault.type != "bad_rollout" or "serving_at" in fault.state) and sim.t >= symptom_onset(fault) + margin_s:
            return fault
    raise AssertionError(f"no fault onset within {limit_s} simulated seconds")


@pytest.mark.parametrize("fault_type", sorted(FAULT_TYPES))
def test_every_fault_type_reaches_an_anomaly_on_its_entity_within_a_minute_of_onset(
    kafka_ready: None, settings: Settings, fault_type: str
) -> None:
    ensure_topics(settings)
    sim = Simulator(load_scenario(scenario_per_fault_type()[fault_type]), seed=12)
    sink = KafkaSink(settings)
    sim.sinks.append(sink)
    try:
        fault = run_past_onset(sim)
    finally:
        sink.close()
    onset_ts = sim.telemetry.epoch + symptom_onset(fault)

    detectors = DetectorSet.of([DETECTORS.load(name)() for name in DETECTORS.names()])
    hits: list[Anomaly] = []
    seen: list[Anomaly] = []

    async def run() -> None:
        pipeline = create_pipeline(settings)
        register_detect(pipeline, detectors, max_wait_s=0.2)
        await pipeline.app.start()
        try:
            deadline = time.monotonic() + 120
            while not hits and time.monotonic() < deadline:
                found = await asyncio.to_thread(
                    lambda: [
                        Anomaly.from_bytes(v)
                        for _, _, v in read_raw(settings, [Anomaly.topic], max_messages=5000, timeout_s=3)
                    ]
                )
                seen[:] = found
                hits[:] = [
                    a for a in found if a.status == "firing" and matches(fault, a) and 0 <= a.ts - onset_ts <= 60
                ]
        finally:
            await pipeline.app.stop()

    asyncio.run(run())

    late = sorted({(round(a.ts - onset_ts), a.detector, a.signal) for a in seen if matches(fault, a)})
    assert hits, f"{fault_type}: nothing on {fault.entity} within 60 s of onset; on it at all: {late}"
    first = min(hits, key=lambda a: a.ts)
    assert first.evidence and first.score >= 0 and first.threshold is not None
