"""Draining one replica in the simulator: the router, the replica, its peers and its GPU; the control API,
the OpenEnv action and the simulator actuator's views that drain_replica's precheck reads.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from evals.loop import simulator_transport
from services.remediation.actuators.simulator import SimulatorActuator
from services.remediation.model import ActionSpec
from services.remediation.registry import load_playbook, playbook_registry
from services.simulator.envs import ClusterAction, ClusterOpenEnv
from services.simulator.http import create_http_app
from services.simulator.scenario import FaultSpec, Scenario, load_scenario
from services.simulator.simulator import Simulator

DEPLOYMENT = "llama-70b-fp16"  # two 4-GPU replicas on gpu-node-000 (GPUs 0-3 and 4-7) in the default fleet
SLOW_GPU = 2  # a GPU of the first replica


def _slow_gpu(fault: str, severity: float) -> Scenario:
    return Scenario(
        name=f"slow-{fault}",
        duration_s=1200,
        faults=[FaultSpec(type=fault, target=f"gpu-node-000/{SLOW_GPU}", onset=120, severity=severity)],
    )


def _replicas(sim: Simulator) -> tuple[str, str]:
    """The replica on the slow GPU and its peer."""
    c = sim.cluster
    pod = c.pods[int(c.gpus.pod_slot[SLOW_GPU])]
    (peer,) = [p for p in c.pods_of(pod.deployment) if p is not pod]
    assert pod.deployment == DEPLOYMENT and pod.phase == peer.phase == "Running"
    return pod.name, peer.name


def _arrivals(sim: Simulator, seconds: float, *pods: str) -> list[float]:
    """Requests the router sent each pod over the next ``seconds`` (one step at a time)."""
    c, s = sim.cluster, sim.serving
    got = [0.0] * len(pods)
    end = sim.t + seconds
    while sim.t < end:
        sim.step()
        for i, name in enumerate(pods):
            got[i] += float(s.arr_n[c.pod_by_name[name].slot])
    return got


@pytest.fixture
def throttled() -> Iterator[Simulator]:
    sim = Simulator(load_scenario("thermal_throttle"), seed=1, telemetry=False)  # gpu-node-000/1 overheats
    sim.run(600)
    yield sim
    sim.close()


def test_a_drained_replica_gets_no_new_requests_finishes_its_own_and_its_peer_takes_its_share(throttled: Simulator):
    sim = throttled
    c, s = sim.cluster, sim.serving
    pod = c.pods[int(c.gpus.pod_slot[1])].name  # the replica on the overheating GPU
    (peer,) = [p.name for p in c.pods_of(DEPLOYMENT) if p.name != pod]
    before = _arrivals(sim, 120, pod, peer)
    assert min(before) > 50, "both replicas serve before the drain"
    slot = c.pod_by_name[pod].slot
    held = float(s.wait_n[slot] + s.run_n[slot])
    done_before = float(s.ok_stop[slot] + s.ok_length[slot])
    assert held > 1

    res = sim.actions.apply("drain_replica", pod)
    assert res.accepted and res.params["in_flight"] == pytest.approx(held, abs=0.1), res
    after = _arrivals(sim, 120, pod, peer)
    assert after[0] == 0.0, "the router still sends the drained replica requests"
    assert after[1] > 1.6 * before[1], f"its peer did not take its share: {before} -> {after}"
    # what it held finished there (nothing was dropped), and the pod stays Ready
    assert float(s.wait_n[slot] + s.run_n[slot]) < 0.01
    assert float(s.ok_stop[slot] + s.ok_length[slot]) - done_before == pytest.approx(held, rel=0.05)
    assert float(s.aborted[slot]) == 0.0
    view = sim.observe()
    p = view["pods"][pod]
    assert (p["phase"], p["drained"], p["in_rotation"]) == ("Running", True, False)
    dep = view["deployments"][DEPLOYMENT]
    assert (dep["replicas"], dep["ready"], dep["in_rotation"], dep["drained"]) == (2, 2, 1, 1)

    # restored, it takes its share again
    assert sim.actions.apply("restore_replica", pod).message == "back in rotation"
    restored = _arrivals(sim, 120, pod, peer)
    assert restored[0] > 50
    assert sim.observe()["deployments"][DEPLOYMENT]["in_rotation"] == 2
    assert [(a.kind, a.target, a.accepted) for a in sim.actions.log] == [
        ("drain_replica", pod, True),
        ("restore_replica", pod, True),
    ]


def test_a_drained_replica_on_an_overheating_gpu_cools_down_and_stops_throttling(throttled: Simulator):
    sim = throttled
    g = sim.cluster.gpus
    pod = sim.cluster.pods[int(g.pod_slot[1])].name
    assert g.throttle_reasons[1] & 0x40, "the fan fault throttles GPU 1 before the drain"
    hot = float(g.temp_c[1])
    assert sim.actions.drain_replica(pod).accepted
    sim.run(sim.t + 180)
    assert not g.throttle_reasons[1] & 0x40, "the idle GPU still throttles"
    assert float(g.temp_c[1]) < hot - 10
    assert sim.fault_list()[0].status == "active", "draining hides the fault, it does not repair the fan"


def test_draining_the_replica_on_a_slow_gpu_lowers_the_latency_requests_see():
    e2e = {}
    for drain in (False, True):
        sim = Simulator(_slow_gpu("nvlink_error", 0.5), seed=3, telemetry=False)  # link retries: 1.75x step time
        sim.run(400)
        pod, peer = _replicas(sim)
        s, c = sim.serving, sim.cluster
        assert s.tpot_last[c.pod_by_name[pod].slot] > 2 * s.tpot_last[c.pod_by_name[peer].slot]
        if drain:
            assert sim.actions.drain_replica(pod).accepted
        sim.run(460)  # in-flight requests finish on the slow replica
        n0 = len(sim.grader.records)
        sim.run(700)
        recs = sim.grader.records[n0:]
        e2e[drain] = sum(r.e2e_mean for r in recs) / len(recs)
    assert e2e[True] < 0.93 * e2e[False], e2e


def test_the_last_replica_in_rotation_is_not_drained_and_drains_are_idempotent(throttled: Simulator):
    sim = throttled
    a, b = (p.name for p in sim.cluster.pods_of(DEPLOYMENT))
    assert sim.actions.drain_replica(a).accepted
    refused = sim.actions.drain_replica(b)
    assert not refused.accepted and "last replica of llama-70b-fp16 in rotation" in refused.message
    assert sim.actions.drain_replica(a).message == "already drained"
    assert sim.actions.restore_replica(b).message == "not drained"  # a rollback may always restore
    assert not sim.actions.drain_replica("nope").accepted
    assert not sim.actions.restore_replica("nope").accepted
    # a peer that is restarting (Loading) is not in rotation either
    assert sim.actions.restore_replica(a).accepted
    assert sim.actions.restart_pod(a).accepted
    assert not sim.actions.drain_replica(b).accepted


def test_a_replica_restarted_while_drained_loads_its_model_and_stays_out_until_restored(throttled: Simulator):
    sim = throttled
    c, s = sim.cluster, sim.serving
    pod = c.pods[int(c.gpus.pod_slot[1])]
    assert sim.actions.drain_replica(pod.name).accepted
    sim.run(sim.t + 60)
    restarts = pod.restarts
    res = sim.actions.restart_pod(pod.name)
    assert res.accepted and res.eta_s > 120, "a 70B replica takes minutes to load"
    assert pod.phase == "Loading" and pod.restarts == restarts + 1
    sim.run(sim.t + res.eta_s + 5)
    assert c.pod_by_name[pod.name] is pod and pod.phase == "Running" and pod.drained
    assert _arrivals(sim, 30, pod.name) == [0.0]
    assert sim.actions.restore_replica(pod.name).accepted
    assert _arrivals(sim, 60, pod.name)[0] > 10
    assert float(s.aborted[pod.slot]) == 0.0


def test_a_replacement_pod_starts_in_rotation(throttled: Simulator):
    sim = throttled
    a, _b = (p.name for p in sim.cluster.pods_of(DEPLOYMENT))
    assert sim.actions.drain_replica(a).accepted
    assert sim.actions.delete_pod(a).accepted
    (new,) = [p for p in sim.cluster.pods_of(DEPLOYMENT) if p.name not in (a, _b)]
    assert not new.drained


def test_the_control_api_drains_refuses_and_logs():
    sim = Simulator(load_scenario("thermal_throttle"), seed=1, telemetry=False)
    sim.run(60)
    client = TestClient(create_http_app(sim))
    a, b = (p.name for p in sim.cluster.pods_of(DEPLOYMENT))
    ok = client.post("/actions/drain_replica", json={"target": a})
    assert ok.status_code == 200 and ok.json()["accepted"] and ok.json()["kind"] == "drain_replica"
    refused = client.post("/actions/drain_replica", json={"target": b})
    assert refused.status_code == 409 and "last replica" in refused.json()["detail"]
    state = client.get("/state").json()
    assert state["pods"][a]["drained"] and not state["pods"][a]["in_rotation"] and state["pods"][b]["in_rotation"]
    assert client.post("/actions/restore_replica", json={"target": a}).status_code == 200
    logged = [(x["kind"], x["target"], x["accepted"]) for x in client.get("/actions").json()]
    assert logged == [("drain_replica", a, True), ("drain_replica", b, False), ("restore_replica", a, True)]


def test_openenv_agents_can_drain_and_restore_a_replica():
    env = ClusterOpenEnv("baseline", decision_interval=15.0, duration_s=300.0)
    obs = env.reset(seed=0)
    pod = next(name for name, p in obs.view["pods"].items() if p["deployment"] == DEPLOYMENT)
    obs = env.step(ClusterAction(kind="drain_replica", target=pod))
    assert obs.last_action["accepted"] and obs.view["pods"][pod]["drained"]
    obs = env.step(ClusterAction(kind="restore_replica", target=pod))
    assert obs.last_action["accepted"] and obs.view["pods"][pod]["in_rotation"]


def test_the_simulator_actuator_drains_and_gives_the_precheck_its_views(throttled: Simulator):
    sim = throttled
    actuator = SimulatorActuator("http://simulator.test", transport=simulator_transport(sim))
    playbook = load_playbook(playbook_registry(), "drain_replica")
    a, b = (p.name for p in sim.cluster.pods_of(DEPLOYMENT))
    try:
        assert actuator.supports("drain_replica") and actuator.supports("restore_replica")
        assert actuator.describe("pod", a) == {
            "phase": "Running",
            "node": "gpu-node-000",
            "deployment": DEPLOYMENT,
            "ready": True,
            "in_rotation": True,
        }
        assert actuator.describe("deployment", DEPLOYMENT)["in_rotation"] == 2
        params = playbook.parse({"pod": a, "namespace": "llm-serving"})
        pre = playbook.precheck(params, actuator)
        assert pre.ok and pre.observed == {"deployment": DEPLOYMENT, "peers_in_rotation": 1}, pre

        actuator.act(ActionSpec(op="drain_replica", target=b))
        assert actuator.describe("pod", b)["in_rotation"] is False
        assert actuator.describe("pod", b)["ready"] is True
        # with its peer drained, the replica is the deployment's last in rotation
        pre = playbook.precheck(params, actuator)
        assert not pre.ok and f"{a} is the last replica of {DEPLOYMENT} in load balancing" in pre.reason
        # draining the drained one again is fine: the other stays in rotation
        assert playbook.precheck(playbook.parse({"pod": b}), actuator).ok
        actuator.act(ActionSpec(op="restore_replica", target=b))
        assert actuator.describe("deployment", DEPLOYMENT)["in_rotation"] == 2
    finally:
        actuator.close()
