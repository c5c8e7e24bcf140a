"""A GPU falls off the bus in the simulator; detect and correlate run together on the real broker: the
metric, log, Kubernetes-event and SLO anomalies it causes arrive as ONE incident, every alert linked
with its own evidence, in PostgreSQL and on incidents.v1.

The scenario is xid79 (onset after 30 minutes of serving) with traffic concentrated on the 70B fp16
model (95 % of requests): losing the replica on the failed GPU then overloads its sibling, whose
latency SLO burns fast enough for the 1 h / 5 min pair (14.4x) to page within minutes. The sibling runs on
the same node and serves the same model; the correlate role learns that from the telemetry itself
(DCGM and vLLM label sets), not from the anomalies, which do not name it.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from pipelines.app import create_pipeline
from pipelines.correlate.agent import CorrelateOptions, register_correlate
from pipelines.detect import DetectorSet, register_detect
from pipelines.detectors.registry import DETECTORS
from services.alerting.config import load_routing
from services.alerting.notification import Notification
from services.core.bus import ensure_topics, read_raw
from services.core.events import IncidentEvent
from services.core.paths import REPO_ROOT
from services.simulator.scenario import load_scenario
from services.simulator.simulator import Simulator
from services.simulator.sinks import KafkaSink
from services.store.db import connect, migrate
from services.store.incidents import get_incident, list_incidents

pytestmark = pytest.mark.integration

RULES = ["xid_rules", "gpu_rules", "serving_rules", "kube_events", "log_templates", "slo_burn"]
# detector -> the kind of signal it stands for in the wording
KINDS = {"xid_rules": "metric", "log_templates": "log", "kube_events": "event", "slo_burn": "slo"}


# The cluster has served for half an hour when the GPU fails: an SLO burn rate is judged against the
# history the SLI has (slo_burn pads a young pod's unobserved time as on budget), as in production.
ONSET_S = 1800.0


def _scenario():  # type: ignore[no-untyped-def]
    base = load_scenario("xid79")
    fp16, int4, small = base.fleet()
    return base.model_copy(
        update={
            "deployments": [
                fp16.model_copy(update={"weight": 0.95}),
                int4.model_copy(update={"weight": 0.025}),
                small.model_copy(update={"weight": 0.025}),
            ],
            "faults": [f.model_copy(update={"onset": ONSET_S}) for f in base.faults],
        }
    )


def test_an_xid_fault_arrives_as_one_incident_with_metric_log_event_and_slo_alerts_linked(
    kafka_ready, fresh_database, settings
):
    settings = fresh_database.model_copy(update={"topic_prefix": settings.topic_prefix})
    migrate(settings)
    ensure_topics(settings)
    sim = Simulator(_scenario(), seed=5)
    sink = KafkaSink(settings)
    sim.sinks.append(sink)
    try:
        while sim.t < ONSET_S + 600:  # the sibling's SLO burn pages about 6-8 minutes after the onset
            sim.step()
    finally:
        sink.close()
    fault = next(f for f in sim.fault_list() if f.type == "xid")
    notes: list[Notification] = []

    def incident_of_fault() -> str | None:
        with connect(settings) as conn:
            for row in list_incidents(conn, limit=50):
                full = get_incident(conn, row.incident_id)
                if full is None or fault.entity not in {a.entity for a in full.alerts}:
                    continue
                if {KINDS.get(a.detector) for a in full.alerts} >= set(KINDS.values()):
                    return row.incident_id
        return None

    found: list[str] = []

    async def run() -> None:
        pipeline = create_pipeline(settings)
        register_detect(pipeline, DetectorSet.of([DETECTORS.load(n)() for n in RULES]), max_wait_s=0.2)
        register_correlate(
            pipeline,
            load_routing(REPO_ROOT / "infra" / "config" / "routing.yaml"),
            notify=notes.append,
            options=CorrelateOptions(tick_s=0.5, checkpoint_s=1.0),
        )
        await pipeline.app.start()
        try:
            deadline = time.monotonic() + 120
            while not found and time.monotonic() < deadline:
                incident = await asyncio.to_thread(incident_of_fault)
                if incident:
                    found.append(incident)
                else:
                    await asyncio.sleep(0.5)
        finally:
            await pipeline.app.stop()

    asyncio.run(run())

    assert found, f"no incident holds the metric, log, event and SLO alerts of the XID on {fault.entity}"
    with connect(settings) as conn:
        incident = get_incident(conn, found[0])
    assert incident is not None
    by_kind: dict[str, list[str]] = {}
    for alert in incident.alerts:
        by_kind.setdefault(KINDS.get(alert.detector, "other"), []).append(f"{alert.signal} on {alert.entity}")
        assert alert.evidence, f"{alert.signal} on {alert.entity} lost its evidence"
    assert {"metric", "log", "event", "slo"} <= set(by_kind), by_kind
    xid = [a for a in incident.alerts if a.signal == "gpu_xid" and a.entity == fault.entity]
    assert {a.detector for a in xid} == {"xid_rules", "log_templates"}  # linked side by side, not merged
    assert incident.severity == "critical"
    # every other incident is unrelated to the fault's node (nothing of it was split off)
    with connect(settings) as conn:
        others = [get_incident(conn, r.incident_id) for r in list_incidents(conn) if r.incident_id != found[0]]
    node = incident.labels.get("node", "")
    assert all(not ({a.labels.get("node") for a in o.alerts} & {node}) for o in others if o is not None), (
        "an alert on the fault's node opened its own incident"
    )
    published = [
        IncidentEvent.from_bytes(v)
        for _, _, v in read_raw(settings, [IncidentEvent.topic], max_messages=10_000, timeout_s=5)
    ]
    mine = [e for e in published if e.incident_id == found[0]]
    assert mine and mine[0].kind == "opened"
    assert {a.fingerprint for a in mine[-1].alerts} >= {a.fingerprint for a in incident.alerts}
