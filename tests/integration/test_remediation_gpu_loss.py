"""A GPU that fell off the bus (XID 79), remedied through the executor on the simulator, and what then heals.

The playbook runs as every playbook does: :class:`~services.remediation.executor.Executor` on a real
Postgres run store, the simulator actuator over the simulator's control API (in process, no sockets:
``evals.loop.simulator_transport``) and the loop's Celery stand-in, all on simulated time. The simulator's
telemetry goes through the detect and correlate roles' objects, so the test sees what
ClusterMedic sees: the XID 79 incident, its signals, and whether it resolves.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from evals.correlate import OfflineCorrelate
from evals.detect import OfflineDetect
from evals.loop import LoopDispatcher, LoopEvents, simulated_executor
from pipelines.detect import build_detectors
from services.alerting.config import load_routing
from services.core.events import Diagnosis, Hypothesis, IncidentEvent
from services.core.paths import REPO_ROOT
from services.core.settings import Settings
from services.remediation.executor import Executor
from services.remediation.store import RunRow, RunStore
from services.simulator.scenario import load_scenario
from services.simulator.simulator import Simulator
from services.store.db import migrate

pytestmark = pytest.mark.integration

NODE = "gpu-node-000"  # xid79.yaml: GPU 0 of this node falls off the bus at t=300
MODEL = "llama-70b-fp16"  # its 4-GPU replica used that GPU
SERVING = ("pod_crashloop", "probe_unhealthy", "nccl_timeout")  # the replica's signals in the incident


@dataclass
class Loop:
    """The simulator, the detect role and the correlation engine, and the executor acting on the simulator."""

    sim: Simulator
    store: RunStore
    executor: Executor
    dispatcher: LoopDispatcher
    sink: LoopEvents
    offline: OfflineDetect | None = None
    correlate: OfflineCorrelate | None = None
    incidents: list[IncidentEvent] = field(default_factory=list)

    def run_until(self, t: float, done: object = None) -> None:
        """Step simulated time to ``t`` (or until ``done()`` holds), running what the executor queued."""
        while self.sim.t < t and not (callable(done) and done()):
            now = self.sim.t
            batch = self.sim.step()
            if self.offline is not None and self.correlate is not None:
                self.incidents += self.correlate.feed(batch, self.offline.feed(batch), now)
            self.dispatcher.pump()
            while self.sink.runs and self.correlate is not None:  # the correlate role's remediation agent
                self.incidents += self.correlate.run(*self.sink.runs.pop(0))

    def submit(self, playbook: str, params: dict[str, object], incident: str) -> str:
        diagnosis = Diagnosis(
            incident_id=incident,
            diagnostician="ranker",
            hypotheses=(Hypothesis(cause="gpu_xid_79", confidence=0.9, playbook=playbook),),
            proposed_playbook=playbook,
            proposed_params=params,
            ts=self.sim.epoch + self.sim.t,
        )
        run_id, decision = self.executor.submit(diagnosis)
        assert decision.outcome == "execute", decision.reasons
        return run_id

    def finished(self, run_id: str) -> RunRow | None:
        run = self.store.get_run(run_id)
        return run if run is not None and run.finished_at is not None and run.rollback_state != "pending" else None


def _loop(settings: Settings, *, telemetry: bool) -> Iterator[Loop]:
    migrate(settings)
    sim = Simulator(load_scenario("xid79"), seed=1, telemetry=telemetry)
    store = RunStore(settings)
    sink = LoopEvents()
    executor = simulated_executor(sim, store, sink)
    assert isinstance(executor.dispatcher, LoopDispatcher)
    loop = Loop(sim, store, executor, executor.dispatcher, sink)
    if telemetry:
        loop.offline = OfflineDetect(build_detectors(settings))
        loop.correlate = OfflineCorrelate(load_routing(REPO_ROOT / "infra" / "config" / "routing.yaml"), sim.epoch)
    try:
        yield loop
    finally:
        store.close()
        executor.actuator.close()
        sim.close()


@pytest.fixture
def loop(fresh_database: Settings) -> Iterator[Loop]:
    yield from _loop(fresh_database, telemetry=True)


@pytest.fixture
def quiet_loop(fresh_database: Settings) -> Iterator[Loop]:
    yield from _loop(fresh_database, telemetry=False)


def _xid_incident(loop: Loop) -> IncidentEvent | None:
    return next((e for e in loop.incidents if any(a.signal == "gpu_xid" for a in e.alerts)), None)


def _pods(sim: Simulator) -> dict[str, dict[str, object]]:
    return {name: p for name, p in sim.observe()["pods"].items() if p["deployment"] == MODEL}


@pytest.mark.parametrize(
    ("playbook", "heals"),
    [("evict_gpu_pods", True), ("cordon_node", False)],  # cordon_node: what the XID 79 runbook ran before
)
def test_an_xid79_replica_moves_to_a_healthy_gpu_and_its_incident_resolves(loop: Loop, playbook: str, heals: bool):
    loop.run_until(600, lambda: _xid_incident(loop) is not None)
    opened = _xid_incident(loop)
    assert opened is not None and opened.kind == "opened", "the XID 79 incident did not open"
    assert {a.signal for a in opened.alerts} >= {"gpu_xid", "pod_crashloop"}
    (dead,) = [name for name, p in _pods(loop.sim).items() if p["phase"] != "Running"]
    assert _pods(loop.sim)[dead]["node"] == NODE

    # what the diagnostician proposes for it: the runbook's first playbook, on the GPU's node
    run_id = loop.submit(playbook, {"node": NODE, "namespace": "llm-serving"}, opened.incident_id)
    loop.run_until(loop.sim.t + 1200, lambda: loop.finished(run_id) is not None)
    run = loop.finished(run_id)
    assert run is not None and run.status == "succeeded", run
    acted = [(a.kind, a.target) for a in loop.sim.actions.log]
    resolved_by = loop.sim.t + 900  # alerts resolve after 5 quiet minutes, their incident 5 minutes later
    loop.run_until(resolved_by)
    resolved = [e for e in loop.incidents if e.incident_id == opened.incident_id and e.kind == "resolved"]
    state = loop.sim.observe()
    dep = state["deployments"][MODEL]
    if not heals:
        # the cordon succeeds, and the replica crash-loops on the dead GPU of the cordoned node for good
        assert acted == [("cordon_node", NODE)]
        assert dead in _pods(loop.sim) and dep["ready"] == dep["replicas"] - 1
        assert resolved == [], "the incident resolved with its replica still down"
        return

    assert acted == [("cordon_node", NODE), ("delete_pod", dead)]
    steps = [(s.kind, s.name, s.status) for s in loop.store.steps(run_id) if s.kind != "precheck"]
    assert steps == [
        ("action", "cordon", "succeeded"),
        ("verify", "cordon", "succeeded"),
        ("action", f"evict {dead}", "succeeded"),
        ("verify", f"evict {dead}", "succeeded"),
        ("action", f"replaced {MODEL}", "skipped"),  # verify-only: the replacement loads for minutes
        ("verify", f"replaced {MODEL}", "succeeded"),
    ]
    # the Deployment recreated the replica on four healthy GPUs of another node, and it serves
    assert dep["ready"] == dep["replicas"] == 2
    assert dead not in _pods(loop.sim)
    assert all(p["phase"] == "Running" for p in _pods(loop.sim).values())
    moved = [p for p in _pods(loop.sim).values() if p["node"] != NODE]
    assert len(moved) == 1 and all(state["gpus"][g]["xid"] == 0 for g in moved[0]["gpus"])
    assert state["nodes"][NODE]["cordoned"], "the node with the lost GPU stays cordoned (reboot_node repairs it)"
    (fault,) = loop.sim.fault_list()
    assert fault.status == "active", "the GPU is still lost: only a reboot brings it back"
    # the replica's signals stopped: every alert of the incident resolved, and the incident with them
    assert resolved, f"the XID 79 incident did not resolve by t={resolved_by:.0f}"
    assert {a.signal for a in resolved[-1].alerts} >= {"gpu_xid", *SERVING[:2]}
    assert all(a.status == "resolved" for a in resolved[-1].alerts)
    assert loop.sim.grader.mean(last_n=120) >= 0.99


def test_with_no_healthy_gpus_elsewhere_the_replacement_stays_pending_and_the_run_uncordons(quiet_loop: Loop):
    loop = quiet_loop
    loop.run_until(330)
    # the only other node with four free GPUs was cordoned by a human: no room for a 4-GPU replica
    assert loop.sim.actions.cordon_node("gpu-node-002").accepted
    (dead,) = [name for name, p in _pods(loop.sim).items() if p["phase"] != "Running"]
    params = {"node": NODE, "namespace": "llm-serving", "ready_timeout_s": 300.0}
    run_id = loop.submit("evict_gpu_pods", params, "inc-no-room")
    loop.run_until(loop.sim.t + 1200, lambda: loop.finished(run_id) is not None)
    run = loop.finished(run_id)
    assert run is not None and run.status == "rolled_back", run
    assert f"step replaced {MODEL}: verification did not hold in 300 s" in run.detail
    acted = [(a.kind, a.target) for a in loop.sim.actions.log]
    assert acted == [
        ("cordon_node", "gpu-node-002"),  # the human's
        ("cordon_node", NODE),
        ("delete_pod", dead),
        ("uncordon_node", NODE),  # the rollback restores the node it cordoned; the human's stays cordoned
    ]
    steps = {(s.kind, s.name): s for s in loop.store.steps(run_id)}
    began = steps[("action", f"replaced {MODEL}")].started_at
    failed = steps[("verify", f"replaced {MODEL}")].finished_at
    assert began is not None and failed is not None
    assert failed - began >= 300, "the replacement's timeout did not run from its step"
    # the Deployment's replacement waits for a free healthy 4-GPU slot: none (the lost GPU's node has 3)
    loop.run_until(loop.sim.t + 300)
    state = loop.sim.observe()
    assert sorted(p["phase"] for p in _pods(loop.sim).values()) == ["Pending", "Running"]
    assert not state["nodes"][NODE]["cordoned"] and state["nodes"]["gpu-node-002"]["cordoned"]
    assert state["deployments"][MODEL]["ready"] == 1
