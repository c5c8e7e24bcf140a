"""The correlate role's broker-free parts: engines per cluster, checkpoints, redelivery, ticks, silences,
topology facts from telemetry."""

from __future__ import annotations

import json

from pipelines.correlate import Engine
from pipelines.correlate.correlator import (
    DEFAULT_CLUSTER,
    Correlator,
    TopologyFilter,
    sync_silences,
)
from services.alerting.config import loads_routing
from services.alerting.notification import Notification
from services.alerting.silences import Silence
from services.core.events import Anomaly, IncidentEvent, MetricBatch, Sample

ROUTING = loads_routing(
    """
route: {receiver: team, group_by: [alertname, node], group_wait: 10s, group_interval: 1m, repeat_interval: 1h}
receivers:
  - {name: team, webhook_configs: [{url: "http://127.0.0.1:9/hook"}]}
  - {name: nobody}
"""
)


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def anomaly(entity: str, ts: float, *, node: str = "n1", status: str = "firing") -> Anomaly:
    return Anomaly(
        entity=entity,
        entity_kind="gpu",
        signal="gpu_ecc",
        detector="gpu_rules",
        score=2.0,
        threshold=1.0,
        ts=ts,
        status=status,
        labels={"node": node},  # type: ignore[arg-type]
    )


def incidents(actions: list) -> list[IncidentEvent]:  # type: ignore[type-arg]
    return [a for a in actions if isinstance(a, IncidentEvent)]


def test_a_redelivered_or_stale_anomaly_changes_nothing():
    c = Correlator(ROUTING, FakeClock())
    first = c.ingest("c1", anomaly("GPU-1", 1000.0))
    assert [e.kind for e in incidents(first)] == ["opened"]
    assert c.ingest("c1", anomaly("GPU-1", 1000.0)) == []  # redelivered
    assert incidents(c.ingest("c1", anomaly("GPU-1", 1100.0, status="resolved")))
    assert c.ingest("c1", anomaly("GPU-1", 1050.0)) == []  # older than what was applied: no re-fire
    assert [a.status for a in c.engines["c1"].alerts.values()] == ["resolved"]


def test_a_checkpoint_restores_the_engine_its_position_and_what_it_has_seen():
    c = Correlator(ROUTING, FakeClock())
    c.ingest("c1", anomaly("GPU-1", 1000.0))
    c.advance("c1", 2, 41)
    saved = c.state("c1")

    restored = Correlator(ROUTING, FakeClock())
    engine = restored.engine("c1", saved)
    assert restored.applied("c1", 2, 41) and not restored.applied("c1", 2, 42) and not restored.applied("c1", 1, 3)
    assert restored.ingest("c1", anomaly("GPU-1", 1000.0)) == []
    # from here on both behave exactly alike: same incidents, same ids
    mine = c.ingest("c1", anomaly("GPU-2", 1010.0, node="n2"))
    theirs = restored.ingest("c1", anomaly("GPU-2", 1010.0, node="n2"))
    assert [e.incident_id for e in incidents(mine)] == [e.incident_id for e in incidents(theirs)]
    assert json.loads(saved)["engine"]["version"] == engine.to_dict()["version"]


def test_ticks_advance_engine_time_by_the_wall_time_since_the_last_anomaly():
    clock = FakeClock(100.0)
    c = Correlator(ROUTING, clock)
    c.engine("c1")
    assert c.tick_time("c1") is None  # nothing ingested: no engine time yet
    c.ingest("c1", anomaly("GPU-1", 5000.0))
    clock.now = 111.5
    assert c.tick_time("c1") == 5011.5
    actions = c.tick("c1", 5011.5)
    notes = [a for a in actions if isinstance(a, Notification)]
    assert len(notes) == 1 and notes[0].ts == 5010.0  # group_wait fires at its own due time


def test_under_a_faster_simulation_ticks_advance_engine_time_at_its_speed():
    # at --speed 30 the telemetry carries 30 simulated seconds per wall second: so do the ticks, or a
    # group_wait after the last anomaly would take 30 times as long in simulated time
    clock = FakeClock(100.0)
    c = Correlator(ROUTING, clock, rate=30.0)
    c.ingest("c1", anomaly("GPU-1", 5000.0))
    clock.now = 100.5
    assert c.tick_time("c1") == 5015.0


def test_silences_from_the_store_are_added_replaced_and_expired_in_every_engine():
    c = Correlator(ROUTING, FakeClock())
    c.ingest("c1", anomaly("GPU-1", 1000.0))
    c.dirty.clear()
    s = Silence.of(['node="n1"'], starts_at=900.0, ends_at=5000.0, created_by="ana", id="sil-1")
    c.set_silences([s])
    assert c.engines["c1"].silences.get("sil-1") == s and c.dirty == {"c1"}
    c.dirty.clear()
    c.set_silences([s])
    assert not c.dirty  # unchanged: no needless checkpoint
    c.set_silences([])
    assert c.engines["c1"].silences.get("sil-1").state(1000.0) == "expired"
    # a new engine gets the current silences when it is created
    c.set_silences([s])
    assert c.engine("c2").silences.get("sil-1") == s


def test_a_silence_expired_before_it_started_is_expired_in_the_engine_not_added():
    engine = Engine(ROUTING)
    pending = Silence.of(['node="n1"'], starts_at=2000.0, ends_at=3000.0, id="sil-2")
    assert sync_silences(engine, [pending], 1000.0)
    gone = Silence.of(['node="n1"'], starts_at=1500.0, ends_at=1500.0, id="sil-2")
    assert sync_silences(engine, [gone], 1500.0)
    assert engine.silences.get("sil-2").state(2500.0) == "expired"
    assert not sync_silences(Engine(ROUTING), [gone], 1500.0)  # never known: nothing to do


def _batch(entity: str, labels: dict[str, str], ts: float) -> bytes:
    return MetricBatch(entity=entity, samples=(Sample(name="m", labels=labels, value=1.0, ts=ts),)).to_bytes()


def test_topology_facts_are_forwarded_when_new_changed_or_stale_only():
    f = TopologyFilter(refresh_s=600.0)
    vllm = {"pod": "llama-0", "model_name": "llama", "namespace": "x", "engine": "0"}
    assert f.facts(_batch("llama-0", vllm, 10.0)) == (
        DEFAULT_CLUSTER,
        {"pod": "llama-0", "model_name": "llama", "namespace": "x"},
        10.0,
    )
    assert f.facts(_batch("llama-0", vllm, 20.0)) is None
    assert f.facts(_batch("llama-0", {**vllm, "model_name": "llama-2"}, 30.0)) is not None
    assert f.facts(_batch("llama-0", {**vllm, "model_name": "llama-2"}, 700.0)) is not None  # refreshed
    assert f.facts(_batch("node-1", {"node": "node-1"}, 10.0)) is None  # one level states no fact
    assert f.facts(b"{not json") is None
    dcgm = {"UUID": "GPU-1", "Hostname": "n1", "pod": "llama-0", "cluster": "east"}
    assert f.facts(_batch("GPU-1", dcgm, 10.0))[0] == "east"  # type: ignore[index]


def test_a_successful_remediation_mitigates_its_incident_and_unknown_ids_are_ignored():
    c = Correlator(ROUTING, FakeClock())
    opened = incidents(c.ingest("c1", anomaly("GPU-1", 1000.0)))
    assert [e.kind for e in opened] == ["opened"]
    mitigated = incidents(c.mitigate("c1", opened[0].incident_id))
    assert [(e.kind, e.incident_id) for e in mitigated] == [("mitigated", opened[0].incident_id)]
    assert c.mitigate("c1", opened[0].incident_id) == []  # a redelivered success changes nothing
    assert c.mitigate("c1", "inc-from-another-cluster") == []


def test_a_run_holds_its_incident_while_running_and_mitigates_it_when_it_succeeds():
    c = Correlator(ROUTING, FakeClock())
    (opened,) = incidents(c.ingest("c1", anomaly("GPU-1", 1000.0)))
    iid = opened.incident_id
    assert c.run("c1", iid, "run-1", "running") == []
    assert c.engines["c1"].incidents[iid].acting == {"run-1": 1000.0}
    assert c.run("c1", iid, "run-1", "awaiting_approval") == []  # not a start or an end: nothing
    assert c.engines["c1"].incidents[iid].acting == {"run-1": 1000.0}
    assert [e.kind for e in incidents(c.run("c1", iid, "run-1", "succeeded"))] == ["mitigated"]
    assert c.engines["c1"].incidents[iid].acting == {}
    c.run("c1", iid, "run-2", "running")
    c.run("c1", iid, "run-2", "rolled_back")
    assert c.engines["c1"].incidents[iid].acting == {}
    assert c.run("c1", "inc-from-another-cluster", "run-3", "succeeded") == []
