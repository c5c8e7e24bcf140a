"""drain_replica through the executor on the simulator: a replica on an overheating GPU leaves the router,
finishes its requests, restarts, loads its model and rejoins; its last peer is never drained; a restart
that does not come back in time is rolled back into rotation.

As every playbook runs: :class:`~services.remediation.executor.Executor` on a real Postgres run store,
the simulator actuator over the simulator's control API (in process: ``evals.loop.simulated_executor``)
and the loop's Celery stand-in, on simulated time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from evals.loop import LoopDispatcher, LoopEvents, simulated_executor
from services.core.events import Diagnosis, Hypothesis
from services.core.settings import Settings
from services.remediation.executor import Executor
from services.remediation.store import RunRow, RunStore
from services.simulator.scenario import load_scenario
from services.simulator.simulator import Simulator
from services.store.db import migrate

pytestmark = pytest.mark.integration

MODEL = "llama-70b-fp16"  # two 4-GPU replicas on gpu-node-000
HOT_GPU = 1  # thermal_throttle.yaml: the fan of gpu-node-000/1 fails at t=300


@dataclass
class Loop:
    sim: Simulator
    store: RunStore
    executor: Executor
    dispatcher: LoopDispatcher
    arrivals: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # pod -> (t, requests routed)

    def run_until(self, t: float, done: object = None) -> None:
        """Step simulated time to ``t`` (or until ``done()`` holds), running what the executor queued."""
        c, s = self.sim.cluster, self.sim.serving
        while self.sim.t < t and not (callable(done) and done()):
            now = self.sim.t
            self.sim.step()
            for pod in c.pods_of(MODEL):
                self.arrivals.setdefault(pod.name, []).append((now, float(s.arr_n[pod.slot])))
            self.dispatcher.pump()

    def routed(self, pod: str, start: float, end: float) -> float:
        return sum(n for t, n in self.arrivals.get(pod, []) if start <= t < end)

    def submit(self, params: dict[str, object], incident: str) -> str:
        diagnosis = Diagnosis(
            incident_id=incident,
            diagnostician="ranker",
            hypotheses=(Hypothesis(cause="gpu_thermal_throttling", confidence=0.8, playbook="drain_replica"),),
            proposed_playbook="drain_replica",
            proposed_params=params,
            ts=self.sim.epoch + self.sim.t,
        )
        run_id, decision = self.executor.submit(diagnosis)
        assert decision.outcome == "execute", decision.reasons
        return run_id

    def finished(self, run_id: str) -> RunRow | None:
        run = self.store.get_run(run_id)
        return run if run is not None and run.finished_at is not None and run.rollback_state != "pending" else None

    def hot_replica(self) -> tuple[str, str]:
        c = self.sim.cluster
        pod = c.pods[int(c.gpus.pod_slot[HOT_GPU])]
        (peer,) = [p.name for p in c.pods_of(MODEL) if p is not pod]
        return pod.name, peer


@pytest.fixture
def loop(fresh_database: Settings) -> Iterator[Loop]:
    migrate(fresh_database)
    sim = Simulator(load_scenario("thermal_throttle"), seed=1, telemetry=False)
    store = RunStore(fresh_database)
    executor = simulated_executor(sim, store, LoopEvents())
    assert isinstance(executor.dispatcher, LoopDispatcher)
    try:
        yield Loop(sim, store, executor, executor.dispatcher)
    finally:
        store.close()
        executor.actuator.close()
        sim.close()


def _steps(loop: Loop, run_id: str) -> list[tuple[str, str, str]]:
    return [(s.kind, s.name, s.status) for s in loop.store.steps(run_id)]


def test_the_replica_on_a_throttled_gpu_is_drained_restarted_and_rejoins(loop: Loop):
    loop.run_until(600)
    pod, peer = loop.hot_replica()
    g = loop.sim.cluster.gpus
    assert g.throttle_reasons[HOT_GPU] & 0x40, "the fan fault throttles the GPU before the run"
    restarts = loop.sim.observe()["pods"][pod]["restarts"]

    run_id = loop.submit({"pod": pod, "namespace": "llm-serving"}, "inc-hot-gpu")
    loop.run_until(loop.sim.t + 1200, lambda: loop.finished(run_id) is not None)
    run = loop.finished(run_id)
    assert run is not None and run.status == "succeeded", run
    assert _steps(loop, run_id) == [
        ("precheck", "precheck", "succeeded"),
        ("action", "drain", "succeeded"),
        ("action", "restart", "succeeded"),
        ("verify", "restart", "succeeded"),
        ("action", "restore", "succeeded"),
    ]
    acted = [(a.kind, a.target, a.accepted) for a in loop.sim.actions.log]
    assert acted == [("drain_replica", pod, True), ("restart_pod", pod, True), ("restore_replica", pod, True)]
    t_drain, t_restore = _action_time(loop, run_id, "drain"), _action_time(loop, run_id, "restore")
    assert t_restore - t_drain > 60 + 120, "grace period, then minutes for a 70B replica to load its model"
    # out of rotation from the drain to the restore: no request reached it, its peer took them
    assert loop.routed(pod, t_drain + 1, t_restore) == 0.0
    assert loop.routed(peer, t_drain + 1, t_restore) > 0.7 * (t_restore - t_drain) * _deployment_rate(loop, t_drain)
    assert loop.sim.actions.log[0].params["in_flight"] > 0, "it held requests when drained"
    # the same pod, restarted in place, serves again
    loop.run_until(loop.sim.t + 60)
    view = loop.sim.observe()
    assert view["pods"][pod]["restarts"] == restarts + 1
    assert (view["pods"][pod]["phase"], view["pods"][pod]["in_rotation"]) == ("Running", True)
    assert loop.routed(pod, t_restore + 1, loop.sim.t) > 10
    assert view["deployments"][MODEL]["in_rotation"] == 2


def test_the_last_replica_in_rotation_is_refused_at_the_precheck(loop: Loop):
    loop.run_until(600)
    pod, peer = loop.hot_replica()
    assert loop.sim.actions.drain_replica(peer).accepted  # a human drained the other one already
    run_id = loop.submit({"pod": pod, "namespace": "llm-serving"}, "inc-last-replica")
    loop.run_until(loop.sim.t + 60, lambda: loop.finished(run_id) is not None)
    run = loop.finished(run_id)
    assert run is not None and run.status == "failed", run
    assert f"{pod} is the last replica of {MODEL} in load balancing" in run.detail
    assert _steps(loop, run_id) == [("precheck", "precheck", "failed")]
    assert [(a.kind, a.target) for a in loop.sim.actions.log] == [("drain_replica", peer)]  # only the human's
    assert loop.sim.observe()["pods"][pod]["in_rotation"]


def test_a_restart_that_does_not_come_back_in_time_is_rolled_back_into_rotation(loop: Loop):
    loop.run_until(600)
    pod, _peer = loop.hot_replica()
    # a 70B replica needs about three minutes to load: a 60 s timeout cannot hold
    run_id = loop.submit({"pod": pod, "namespace": "llm-serving", "timeout_s": 60.0, "grace_s": 10.0}, "inc-slow")
    loop.run_until(loop.sim.t + 1200, lambda: loop.finished(run_id) is not None)
    run = loop.finished(run_id)
    assert run is not None and run.status == "rolled_back", run
    acted = [(a.kind, a.target, a.accepted) for a in loop.sim.actions.log]
    assert acted == [("drain_replica", pod, True), ("restart_pod", pod, True), ("restore_replica", pod, True)]
    view = loop.sim.observe()["pods"][pod]
    assert not view["drained"], "the rollback put the replica back into rotation"
    loop.run_until(loop.sim.t + 300, lambda: loop.sim.observe()["pods"][pod]["phase"] == "Running")
    t = loop.sim.t
    loop.run_until(t + 60)
    assert loop.routed(pod, t, loop.sim.t) > 10, "once loaded it serves again"


def _action_time(loop: Loop, run_id: str, step: str) -> float:
    """Simulated second the run's ``step`` acted (steps are stamped with the executor's clock, epoch + t)."""
    (row,) = [s for s in loop.store.steps(run_id) if s.kind == "action" and s.name == step]
    assert row.started_at is not None
    return row.started_at - loop.sim.epoch


def _deployment_rate(loop: Loop, before: float) -> float:
    """Requests a second the deployment's replicas got over the two minutes before ``before``."""
    return sum(loop.routed(p, before - 120, before) for p in loop.arrivals) / 120
