"""Incidents: topology correlation, lifecycle, severity escalation, deterministic ids, and state that
survives a restart mid-timeline."""

from __future__ import annotations

import json

import pytest

from pipelines.correlate.engine import Engine
from pipelines.correlate.topology import Topology, anchor
from services.alerting.config import loads_routing
from services.alerting.errors import IncidentNotFound
from services.alerting.notification import Notification
from services.alerting.silences import Silence
from services.core.events import Anomaly, IncidentEvent

CONFIG = """
global: {resolve_timeout: 1h}
route:
  receiver: sre
  group_by: [alertname]
  group_wait: 30s
  group_interval: 5m
  repeat_interval: 4h
receivers:
  - name: sre
    webhook_configs: [{url: "http://hooks.local/sre"}]
inhibit_rules:
  - source_matchers: ['alertname="node_not_ready"']
    target_matchers: ['alertname!="node_not_ready"', 'node!=""']
    equal: [node]
correlation:
  flap_detection: {enabled: false}
  topology: {window: 10m}
  incidents:
    resolve_after: %(resolve)s
    group_wait: %(wait)s
    group_interval: %(interval)s
    escalation: {warning_members: %(k)s, after: %(after)s}
"""

NS = "llm-serving"
NODE = "gpu-node-3"
POD = "vllm-llama-7d9f-abcde"
MODEL = "llama-3-8b"
GPU = "GPU-5d4c3b2a-0000-1111-2222-333344445555"


def engine(k: str = "null", after: str = "null", resolve: str = "5m", wait: str = "0s", interval: str = "0s") -> Engine:
    fields = {"k": k, "after": after, "resolve": resolve, "wait": wait, "interval": interval}
    return Engine(loads_routing(CONFIG % fields))


def anomaly(signal: str, entity: str, kind: str, ts: float = 0.0, **fields: object) -> Anomaly:
    base: dict[str, object] = {
        "entity": entity,
        "entity_kind": kind,
        "signal": signal,
        "detector": "rules",
        "score": 1.0,
        "threshold": 0.5,
        "severity": "warning",
        "ts": ts,
    }
    return Anomaly.model_validate({**base, **fields})


def xid(ts: float = 0.0, **kw: object) -> Anomaly:
    # DCGM exporter labels of the GPU, with the pod the exporter maps onto it
    labels = {"UUID": GPU, "gpu": "2", "Hostname": NODE, "pod": POD, "namespace": NS, "modelName": "NVIDIA H100"}
    return anomaly(
        "gpu_xid",
        GPU,
        "gpu",
        ts,
        severity="critical",
        labels=labels,
        evidence={"xid": 79, "message": "GPU has fallen off the bus"},
        **kw,
    )


def crashloop(ts: float = 0.0, **kw: object) -> Anomaly:
    return anomaly(
        "pod_crashloop",
        POD,
        "pod",
        ts,
        detector="kube_events",
        labels={"namespace": NS, "pod": POD, "node": NODE, "app": "vllm-llama"},
        evidence={"restarts": 5, "reason": "BackOff"},
        **kw,
    )


def slo_burn(ts: float = 0.0, **kw: object) -> Anomaly:
    return anomaly(
        "ttft_slo_burn", MODEL, "model", ts, labels={"model_name": MODEL}, evidence={"burn_rate_1h": 14.4}, **kw
    )


def kube_event(ts: float = 0.0, **kw: object) -> Anomaly:
    return anomaly(
        "kube_warning_event",
        f"Pod/{NS}/{POD}",
        "other",
        ts,
        detector="kube_events",
        labels={"namespace": NS, "pod": POD, "reason": "Unhealthy"},
        evidence={"message": "Readiness probe failed"},
        **kw,
    )


def incident_events(actions: list) -> list[IncidentEvent]:
    return [a for a in actions if isinstance(a, IncidentEvent)]


def vllm_labels() -> dict[str, str]:
    # what a vLLM /metrics scrape of the pod says: which model it serves
    return {"model_name": MODEL, "pod": POD, "namespace": NS}


# ---------------------------------------------------------------------------------- topology


def test_gpu_pod_model_and_kube_event_alerts_join_one_incident():
    eng = engine()
    eng.observe_topology(vllm_labels(), 0)
    (opened,) = incident_events(eng.ingest(xid(0), 0))
    assert opened.kind == "opened" and opened.severity == "critical"
    events = []
    for t, a in ((20, crashloop(20)), (40, slo_burn(40)), (60, kube_event(60))):
        events += incident_events(eng.ingest(a, t))
    assert [e.kind for e in events] == ["updated"] * 3
    assert {e.incident_id for e in events} == {opened.incident_id}
    last = events[-1]
    # every alert stays linked, with its own evidence
    assert [a.signal for a in last.alerts] == ["gpu_xid", "pod_crashloop", "ttft_slo_burn", "kube_warning_event"]
    assert last.alerts[0].evidence["xid"] == 79 and last.alerts[2].evidence["burn_rate_1h"] == 14.4
    assert last.title == f"gpu_xid on {GPU} (+3 related)"
    assert last.labels["node"] == NODE and last.labels["pod"] == POD and MODEL in last.labels["model"]
    assert len(eng.incidents) == 1


def test_alerts_elsewhere_open_their_own_incidents():
    eng = engine()
    eng.observe_topology(vllm_labels(), 0)
    eng.ingest(xid(0), 0)
    other_node = anomaly("gpu_ecc_dbe", "GPU-other", "gpu", 10, labels={"UUID": "GPU-other", "Hostname": "gpu-node-9"})
    other_model = anomaly("ttft_slo_burn", "mistral-7b", "model", 20, labels={"model_name": "mistral-7b"})
    (a,) = incident_events(eng.ingest(other_node, 10))
    (b,) = incident_events(eng.ingest(other_model, 20))
    assert a.kind == b.kind == "opened" and len(eng.incidents) == 3


def test_relation_rules_between_anchors():
    topo = Topology()
    topo.learn({"UUID": "G1", "Hostname": "n1", "pod": "p1"}, 0)
    topo.learn({"UUID": "G2", "Hostname": "n1", "pod": "p1"}, 0)
    topo.learn({"UUID": "G3", "Hostname": "n2", "pod": "p2"}, 0)
    topo.learn({"pod": "p1", "model_name": "m"}, 0)
    topo.learn({"pod": "p2", "model_name": "m"}, 0)
    g1, g2, g3 = (anchor({"UUID": g}, g, "gpu") for g in ("G1", "G2", "G3"))
    p1, p2 = (anchor({"pod": p}, p, "pod") for p in ("p1", "p2"))
    model = anchor({"model_name": "m"}, "m", "model")
    # on one chain
    assert topo.related(g1, p1) and topo.related(g1, model) and topo.related(anchor({}, "n1", "node"), g2)
    assert topo.related(model, g3)
    # one node is one failure domain; replicas of one model are one service
    assert topo.related(g1, g2) and topo.related(p1, p2)
    # GPUs on different nodes meet only through an alert on what they share (here: the model)
    assert not topo.related(g1, g3)
    assert not topo.related(g1, anchor({}, "n2", "node"))
    assert not topo.related(anchor({}, "x", "other"), anchor({}, "y", "other"))
    assert topo.related(anchor({}, "x", "other"), anchor({}, "x", "other"))
    assert Topology.from_dict(topo.to_dict()).to_dict() == topo.to_dict()


def test_a_related_alert_after_the_window_opens_a_new_incident():
    def gpu_incident_resolved_at_100() -> Engine:
        eng = engine(resolve="1h")  # the incident itself stays open; only the window matters
        eng.ingest(xid(0), 0)
        eng.ingest(xid(100, status="resolved"), 100)
        return eng

    # 100 + 10m window: the GPU alert no longer pulls related alerts in
    (late,) = incident_events(gpu_incident_resolved_at_100().ingest(crashloop(701), 701))
    assert late.kind == "opened"
    (joined,) = incident_events(gpu_incident_resolved_at_100().ingest(crashloop(699), 699))
    assert joined.kind == "updated"


def test_a_gpu_fault_long_after_serving_symptoms_on_its_node_is_a_new_incident():
    # a bad rollout's replica keeps failing on the node; ECC errors start on a GPU there much later
    def rollout_incident() -> Engine:
        eng = engine(resolve="1h")
        eng.observe_topology({"UUID": GPU, "Hostname": NODE}, 0)
        eng.ingest(crashloop(0), 0)
        return eng

    def ecc(ts: float) -> Anomaly:
        return anomaly("ecc_sbe_rate", GPU, "gpu", ts, severity="critical", labels={"UUID": GPU, "Hostname": NODE})

    (late,) = incident_events(rollout_incident().ingest(ecc(601), 601))
    assert late.kind == "opened" and [a.signal for a in late.alerts] == ["ecc_sbe_rate"]
    # within the window it may be their cause (an XID's log line can arrive after the pod's crash)
    (early,) = incident_events(rollout_incident().ingest(ecc(599), 599))
    assert early.kind == "updated" and len(early.alerts) == 2
    # the other way round is unchanged: serving symptoms join a GPU's incident whenever they appear
    eng = engine(resolve="1h")
    eng.ingest(xid(0), 0)
    (symptom,) = incident_events(eng.ingest(crashloop(1800), 1800))
    assert symptom.kind == "updated"


def test_another_deployment_on_the_same_node_joins_only_while_the_incident_is_young():
    # a KV-cache burst on one model's replica, then a bad rollout of another model's replica on the node
    def burst_incident() -> Engine:
        eng = engine(resolve="1h")
        eng.ingest(crashloop(0), 0)
        # a busy GPU on the node looks odd too: it is on every pod's node, not on every pod's chain
        eng.ingest(anomaly("metric_outlier", GPU, "gpu", 0, labels={"UUID": GPU, "Hostname": NODE}), 0)
        return eng

    def rollout(ts: float) -> Anomaly:
        other = "llama-70b-int4-7m6ppjfgdw-k4gft"
        return anomaly("revision_regression", other, "pod", ts, labels={"pod": other, "node": NODE, "app": "int4"})

    (late,) = incident_events(burst_incident().ingest(rollout(601), 601))
    assert late.kind == "opened"
    (early,) = incident_events(burst_incident().ingest(rollout(599), 599))  # a node-wide cause hits both at once
    assert early.kind == "updated"
    # replicas of one deployment stay one incident however late (a bad rollout crashes every replica)
    eng = burst_incident()
    sibling = POD.rsplit("-", 1)[0] + "-x2x4k"
    (same,) = incident_events(
        eng.ingest(anomaly("pod_crashloop", sibling, "pod", 1800, labels={"pod": sibling, "app": "vllm-llama"}), 1800)
    )
    assert same.kind == "updated"


def test_a_new_revisions_replicas_join_a_sibling_of_the_old_revision_only_while_the_incident_is_young():
    # a burst saturated a replica of llama-70b (revision 7d9f); a quarter of an hour later a rollout's
    # new revision (5c8b) regresses: a change, and a new fault, not the burst's
    def burst() -> Engine:
        eng = engine(resolve="1h")
        eng.ingest(anomaly("kv_cache_saturation", POD, "pod", 0, labels={"pod": POD, "app": "vllm-llama"}), 0)
        return eng

    def new_revision(ts: float) -> Anomaly:
        pod = POD.replace("-7d9f-", "-5c8b-")
        return anomaly("revision_regression", pod, "pod", ts, labels={"pod": pod, "app": "vllm-llama"})

    (late,) = incident_events(burst().ingest(new_revision(900), 900))
    assert late.kind == "opened"
    (early,) = incident_events(burst().ingest(new_revision(60), 60))
    assert early.kind == "updated"


# --------------------------------------------------------------------------------- lifecycle


def test_lifecycle_opened_updated_mitigated_resolved():
    eng = engine()
    (opened,) = incident_events(eng.ingest(crashloop(0), 0))
    iid = opened.incident_id
    (updated,) = incident_events(eng.ingest(kube_event(10), 10))
    assert updated.kind == "updated" and len(updated.alerts) == 2
    (mitigated,) = incident_events(eng.mitigate(iid, 20))
    assert mitigated.kind == "mitigated" and mitigated.labels["state"] == "mitigated"
    assert eng.mitigate(iid, 21) == []  # redelivered: nothing new
    eng.ingest(crashloop(30, status="resolved"), 30)
    eng.ingest(kube_event(40, status="resolved"), 40)
    # resolved only when every alert has stayed resolved for resolve_after (5m) after the last one
    assert not [e for e in incident_events(eng.tick(339)) if e.kind == "resolved"]
    (resolved,) = [e for e in incident_events(eng.tick(340)) if e.kind == "resolved"]
    assert resolved.ts == 340 and all(a.status == "resolved" for a in resolved.alerts)
    # the same failure later is a new incident with a new id
    (again,) = [e for e in incident_events(eng.ingest(crashloop(1000), 1000)) if e.kind == "opened"]
    assert again.incident_id != iid
    with pytest.raises(IncidentNotFound):
        eng.mitigate("inc-nope", 1000)


def test_a_member_firing_again_before_resolution_keeps_the_incident_open():
    eng = engine()
    (opened,) = incident_events(eng.ingest(crashloop(0), 0))
    eng.mitigate(opened.incident_id, 5)
    eng.ingest(crashloop(10, status="resolved"), 10)
    (refired,) = incident_events(eng.ingest(crashloop(200), 200))
    assert refired.kind == "updated" and refired.incident_id == opened.incident_id
    assert refired.labels["state"] == "open"  # mitigation did not hold
    assert not [e for e in incident_events(eng.tick(2000)) if e.kind == "resolved"]


def _quiet_incident(eng: Engine) -> str:
    """An incident whose two alerts resolved at 30 and 40 (it would resolve at 340)."""
    (opened,) = incident_events(eng.ingest(crashloop(0), 0))
    eng.ingest(kube_event(10), 10)
    eng.ingest(crashloop(30, status="resolved"), 30)
    eng.ingest(kube_event(40, status="resolved"), 40)
    return opened.incident_id


def _resolved(actions: list) -> list[IncidentEvent]:
    return [e for e in incident_events(actions) if e.kind == "resolved"]


def test_a_run_acting_on_an_incident_holds_it_open_until_the_run_ends():
    # the evict_gpu_pods case: the run deletes the dead pod, its probes go quiet, and the incident must
    # not resolve before the replacement is verified Ready (nor under a run that then fails)
    eng = engine()
    iid = _quiet_incident(eng)
    assert eng.acting(iid, "run-1", True, 50) == []
    assert eng.acting(iid, "run-1", True, 55) == []  # redelivered: nothing new
    assert not _resolved(eng.tick(1000))  # quiet since 40, but the run still acts
    (mitigated,) = incident_events(eng.mitigate(iid, 1100))
    assert mitigated.kind == "mitigated"
    (resolved,) = _resolved(eng.acting(iid, "run-1", False, 1100))  # quiet long enough already: at once
    assert resolved.ts == 1100 and resolved.incident_id == iid


def test_a_run_that_ended_lets_its_incident_resolve_resolve_after_its_alerts_went_quiet():
    eng = engine()
    iid = _quiet_incident(eng)
    eng.acting(iid, "run-1", True, 50)
    eng.acting(iid, "run-2", True, 51)
    assert eng.acting(iid, "run-1", False, 100) == []  # failed, say: run-2 still holds it
    assert eng.acting(iid, "run-2", False, 200) == []  # not quiet for resolve_after yet
    assert eng.acting(iid, "run-2", False, 201) == []  # a redelivered end changes nothing
    assert eng.acting("inc-nope", "run-3", True, 201) == []  # an unknown incident is ignored
    assert not _resolved(eng.tick(339))
    (resolved,) = _resolved(eng.tick(340))  # 5 minutes after the last alert resolved, as without runs
    assert resolved.incident_id == iid


def test_a_run_that_never_reports_its_end_holds_its_incident_at_most_hold_while_acting():
    eng = engine()
    iid = _quiet_incident(eng)
    eng.acting(iid, "run-lost", True, 50)
    assert not _resolved(eng.tick(50 + 3600 - 1))
    (resolved,) = _resolved(eng.tick(50 + 3600))
    assert resolved.ts == 3650
    assert eng.acting(iid, "run-lost", False, 4000) == []  # its late end changes nothing


def test_a_hold_survives_a_restart():
    eng = engine()
    iid = _quiet_incident(eng)
    eng.acting(iid, "run-1", True, 50)
    eng = Engine.from_dict(eng.config, json.loads(json.dumps(eng.to_dict())))
    assert not _resolved(eng.tick(1000))
    (resolved,) = _resolved(eng.acting(iid, "run-1", False, 1000))
    assert resolved.ts == 1000


def test_notifications_name_the_incident():
    eng = engine()
    (opened,) = incident_events(eng.ingest(crashloop(0), 0))
    (note,) = [a for a in eng.tick(30) if isinstance(a, Notification)]
    assert note.incident_id == opened.incident_id and note.incident_ids == (opened.incident_id,)


def test_inhibited_alerts_join_the_node_incident_but_never_open_one():
    eng = engine()
    node_down = anomaly("node_not_ready", NODE, "node", 0, severity="critical", labels={"node": NODE})
    (opened,) = incident_events(eng.ingest(node_down, 0))
    (joined,) = incident_events(eng.ingest(crashloop(10), 10))
    assert joined.incident_id == opened.incident_id
    # a silenced node-down alert opens nothing, yet still inhibits (as in Alertmanager), so the pod
    # alert it explains opens nothing either
    eng2 = engine()
    eng2.silences.add(Silence.of(['node="gpu-node-7"', 'alertname="node_not_ready"'], starts_at=0, ends_at=900))
    node7 = anomaly("node_not_ready", "gpu-node-7", "node", 0, severity="critical", labels={"node": "gpu-node-7"})
    assert incident_events(eng2.ingest(node7, 0)) == []
    pod = anomaly("pod_crashloop", "p7", "pod", 10, labels={"node": "gpu-node-7", "pod": "p7"})
    assert incident_events(eng2.ingest(pod, 10)) == []
    assert [a for a in eng2.tick(600) if isinstance(a, Notification)] == []


def test_silenced_alert_opens_no_incident_until_the_silence_ends():
    eng = engine()
    eng.silences.add(Silence.of([f'pod="{POD}"'], starts_at=0, ends_at=300, created_by="ana", comment="rollout"))
    assert incident_events(eng.ingest(crashloop(0), 0)) == []
    assert incident_events(eng.ingest(crashloop(200), 200)) == []
    (opened,) = incident_events(eng.tick(300))
    assert opened.kind == "opened" and opened.ts == 300


# -------------------------------------------------------------------------------- severity


def test_three_warning_members_escalate_to_critical():
    eng = engine(k="3")
    (opened,) = incident_events(eng.ingest(crashloop(0), 0))
    assert opened.severity == "warning"
    (two,) = incident_events(eng.ingest(kube_event(10), 10))
    assert two.severity == "warning"
    eng.observe_topology(vllm_labels(), 15)
    (three,) = incident_events(eng.ingest(slo_burn(20), 20))
    assert three.severity == "critical" and three.labels["escalation"] == "warning_members"


def test_a_long_warning_incident_escalates_after_the_duration():
    eng = engine(after="30m")
    eng.ingest(crashloop(0), 0)
    for t in range(600, 1800, 600):
        eng.ingest(crashloop(t), t)  # still firing
    assert incident_events(eng.tick(1799)) == []
    (escalated,) = incident_events(eng.tick(1800))
    assert escalated.kind == "updated" and escalated.severity == "critical" and escalated.ts == 1800
    assert escalated.labels["escalation"] == "duration"


def test_severity_is_the_highest_member_and_does_not_drop():
    eng = engine()
    (opened,) = incident_events(eng.ingest(crashloop(0), 0))
    (up,) = incident_events(eng.ingest(xid(5), 5))
    assert (opened.severity, up.severity) == ("warning", "critical")
    (down,) = incident_events(eng.ingest(xid(10, status="resolved"), 10))
    assert down.severity == "critical"


# ------------------------------------------------------------------------ determinism, restarts


def timeline() -> list[tuple[float, Anomaly | None]]:
    """A mixed timeline: ``None`` means a tick."""
    steps: list[tuple[float, Anomaly | None]] = [
        (0, xid(0)),
        (15, crashloop(15)),
        (30, None),
        (45, slo_burn(45)),
        (50, kube_event(50)),
        (200, anomaly("gpu_ecc_dbe", "GPU-x", "gpu", 200, labels={"UUID": "GPU-x", "Hostname": "gpu-node-9"})),
        (330, None),
        (400, crashloop(400, status="resolved")),
        (700, None),
        (900, xid(900, status="resolved")),
        (950, slo_burn(950, status="resolved")),
        (960, kube_event(960, status="resolved")),
        (1300, None),
        (5000, None),
        (20000, None),
    ]
    return steps


def run(eng: Engine, steps: list[tuple[float, Anomaly | None]], restart_after: int | None = None) -> list:
    out: list = []
    eng.observe_topology(vllm_labels(), 0)
    config = eng.config
    for i, (t, a) in enumerate(steps):
        out += eng.tick(t) if a is None else eng.ingest(a, t)
        if restart_after is not None and i == restart_after:
            state = json.loads(json.dumps(eng.to_dict()))  # JSON-safe, as a Faust table would store it
            eng = Engine.from_dict(config, state)
    return out


def test_replay_gives_the_same_ids_and_actions():
    first = run(engine(k="3"), timeline())
    second = run(engine(k="3"), timeline())
    assert first == second
    ids = {a.incident_id for a in first if isinstance(a, IncidentEvent)}
    assert len(ids) == 2 and all(i.startswith("inc-") for i in ids)
    kinds = [a.kind for a in first if isinstance(a, IncidentEvent)]
    assert kinds.count("opened") == 2 and kinds.count("resolved") == 2


@pytest.mark.parametrize("restart_after", range(len(timeline())))
def test_restart_from_serialised_state_continues_identically(restart_after):
    assert run(engine(k="3"), timeline(), restart_after) == run(engine(k="3"), timeline())


@pytest.mark.parametrize("restart_after", range(len(timeline())))
def test_a_restart_while_changes_wait_to_be_announced_loses_none(restart_after):
    batched = {"k": "3", "wait": "30s", "interval": "1m"}
    assert run(engine(**batched), timeline(), restart_after) == run(engine(**batched), timeline())


def test_state_is_json_safe_and_round_trips():
    eng = engine()
    eng.silences.add(Silence.of(['pod="x"'], starts_at=0, ends_at=100))
    run(eng, timeline()[:6])
    state = eng.to_dict()
    assert json.loads(json.dumps(state)) == state
    assert Engine.from_dict(eng.config, state).to_dict() == state
    frozen = json.dumps(state, sort_keys=True)
    restored = Engine.from_dict(eng.config, state)
    run(restored, timeline()[6:])
    assert json.dumps(state, sort_keys=True) == frozen  # the restored engine does not write into its input


def test_forgotten_state_stays_small():
    eng = engine()
    run(eng, timeline())
    eng.tick(200_000)
    assert eng.alerts == {} and eng.groups == {} and eng.incidents == {}


# ---------------------------------------------------------------------------------- announcing


def test_a_new_incident_is_announced_after_group_wait_with_every_alert_that_joined():
    eng = engine(wait="30s", interval="1m")
    eng.observe_topology(vllm_labels(), 0)
    assert incident_events(eng.ingest(xid(0), 0)) == []
    assert incident_events(eng.ingest(crashloop(10), 10)) == []
    assert incident_events(eng.tick(29.9)) == []
    (opened,) = incident_events(eng.tick(30))
    # one event, diagnosed once, holding the fault's first symptoms together
    assert opened.kind == "opened" and opened.ts == 30 and opened.opened_at == 0
    assert [a.signal for a in opened.alerts] == ["gpu_xid", "pod_crashloop"]


def test_later_changes_are_announced_at_most_once_per_group_interval():
    eng = engine(wait="30s", interval="1m")
    eng.observe_topology(vllm_labels(), 0)
    eng.ingest(xid(0), 0)
    (opened,) = incident_events(eng.tick(30))
    assert incident_events(eng.ingest(slo_burn(40), 40)) == []
    assert incident_events(eng.ingest(kube_event(50), 50)) == []
    assert incident_events(eng.tick(89)) == []
    (updated,) = incident_events(eng.tick(90))
    assert updated.kind == "updated" and updated.ts == 90
    assert [a.signal for a in updated.alerts] == ["gpu_xid", "ttft_slo_burn", "kube_warning_event"]
    # a change after a quiet group_interval goes out at once
    (later,) = incident_events(eng.ingest(crashloop(300), 300))
    assert later.kind == "updated" and later.ts == 300 and len(later.alerts) == 4
    assert {e.incident_id for e in (opened, updated, later)} == {opened.incident_id}


def test_announcements_do_not_depend_on_how_often_the_engine_is_ticked():
    # At --speed 30 the correlate agent ticks rarely in simulated time; at --speed 1, every simulated
    # second. Timers fire at their own due time, so the batches are the same.
    steps = [(0.0, xid(0)), (12.0, crashloop(12)), (45.0, slo_burn(45)), (70.0, kube_event(70))]

    def announced(tick_every: float | None) -> list[tuple[str, float, tuple[str, ...]]]:
        eng = engine(wait="30s", interval="1m")
        eng.observe_topology(vllm_labels(), 0)
        out: list = []
        clock = 0.0
        for t, a in steps:
            while tick_every is not None and clock + tick_every < t:
                clock += tick_every
                out += eng.tick(clock)
            out += eng.ingest(a, t)
            clock = t
        out += eng.tick(400)
        return [(e.kind, e.ts, tuple(x.signal for x in e.alerts)) for e in incident_events(out)]

    coarse, fine = announced(None), announced(0.5)
    assert coarse == fine
    assert [(kind, ts) for kind, ts, _ in coarse] == [("opened", 30.0), ("updated", 90.0)]


def test_a_waiting_change_goes_out_before_the_incident_is_mitigated_or_resolved():
    eng = engine(wait="10m", interval="10m", resolve="1m")
    (opened,) = incident_events(eng.ingest(crashloop(0), 0) + eng.tick(600))
    eng.ingest(kube_event(610), 610)
    # the kube event joined but waits; mitigating announces it first, then the mitigation
    events = incident_events(eng.mitigate(opened.incident_id, 620))
    assert [(e.kind, len(e.alerts)) for e in events] == [("updated", 2), ("mitigated", 2)]
    # an incident whose alerts all resolved before its first announcement still says it opened
    eng2 = engine(wait="10m", resolve="1m")
    eng2.ingest(crashloop(0), 0)
    eng2.ingest(crashloop(5, status="resolved"), 5)
    assert [e.kind for e in incident_events(eng2.tick(65))] == ["opened", "resolved"]
