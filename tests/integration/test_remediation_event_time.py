"""Guardrails follow the executor's clock (event time), not the database's: a simulated clock that runs
far from the wall clock (a week ago, advanced by hand) drives cooldowns, the breaker and approval TTLs;
and a run's steps and its incident's mitigation are stamped on that clock too (a year ago, a simulator).
"""

from __future__ import annotations

import time

import pytest

from evals.loop import LoopDispatcher, simulated_executor
from services.core.events import Diagnosis, Hypothesis, IncidentEvent
from services.core.settings import Settings
from services.remediation.config import PolicySpec
from services.remediation.model import Decision, Targets
from services.remediation.policy import GuardrailState, start_blocks
from services.remediation.runtime import MemoryEventSink
from services.remediation.store import RunStore
from services.simulator.scenario import load_scenario
from services.simulator.simulator import Simulator
from services.store.db import connect, migrate
from services.store.incidents import get_incident, save_incident_events

pytestmark = pytest.mark.integration

T0 = 1_780_000_000.0  # simulated UNIX time: nowhere near the wall clock while the test runs
POLICY = PolicySpec()  # cooldown 900 s, breaker 3 failures per 3600 s


@pytest.fixture
def store(fresh_database):
    migrate(fresh_database)
    s = RunStore(fresh_database)
    yield s
    s.close()


def _run(store: RunStore, run_id: str, node: str, now: float) -> Targets:
    targets = Targets(nodes=(node,))
    decision = Decision(
        incident_id=f"inc-{run_id}", playbook="cordon_node", level=1, outcome="execute", targets=targets
    )
    assert store.create_run(run_id, decision, "proposed", now=now, automatic=True)
    return targets


def _start(store: RunStore, run_id: str, targets: Targets, now: float) -> tuple[str, tuple[str, ...]]:
    def check(state: GuardrailState) -> list[str]:
        return start_blocks(run_id, targets, POLICY, state, now, automatic=True)

    claim = store.claim_run(run_id, ["proposed"], check, now=now, token=f"tok-{run_id}", lease_until=now + 120)
    return claim.outcome, claim.reasons


def test_the_cooldown_is_measured_on_the_simulated_clock(store: RunStore) -> None:
    first = _run(store, "r1", "gpu-node-001", T0)
    assert _start(store, "r1", first, T0)[0] == "claimed"
    assert store.transition("r1", ["running"], "succeeded", now=T0 + 50, finished=True)
    run = store.get_run("r1")
    assert run is not None and (run.created_at, run.started_at, run.finished_at) == (T0, T0, T0 + 50)

    second = _run(store, "r2", "gpu-node-001", T0 + 100)
    outcome, reasons = _start(store, "r2", second, T0 + 100)
    assert outcome == "blocked" and any("cooldown" in r for r in reasons)

    third = _run(store, "r3", "gpu-node-001", T0 + 1000)
    assert _start(store, "r3", third, T0 + 1000)[0] == "claimed"


def test_the_circuit_breaker_window_is_measured_on_the_simulated_clock(store: RunStore) -> None:
    for i in range(POLICY.circuit_breaker.max_failures):
        targets = _run(store, f"f{i}", f"gpu-node-00{i}", T0 + i)
        assert _start(store, f"f{i}", targets, T0 + i)[0] == "claimed"
        assert store.transition(f"f{i}", ["running"], "failed", now=T0 + 10 + i, finished=True)

    late = _run(store, "late", "gpu-node-009", T0 + 100)
    outcome, reasons = _start(store, "late", late, T0 + 100)
    assert outcome == "blocked" and any("circuit breaker" in r for r in reasons)

    after = T0 + 10 + POLICY.circuit_breaker.window_s + 100
    later = _run(store, "later", "gpu-node-008", after)
    assert _start(store, "later", later, after)[0] == "claimed"


def test_runs_their_precheck_refused_do_not_open_the_circuit_breaker(store: RunStore) -> None:
    # a playbook the actuator cannot do fails its precheck every time it is proposed; it never acted
    for i in range(POLICY.circuit_breaker.max_failures + 1):
        targets = _run(store, f"p{i}", f"gpu-node-00{i}", T0 + i)
        assert _start(store, f"p{i}", targets, T0 + i)[0] == "claimed"
        _, step = store.begin_step(f"p{i}", "precheck", 0, "precheck", now=T0 + i)
        store.finish_step(step.step_id, "failed", {"reason": "actuator simulator cannot drain_replica"}, now=T0 + i)
        assert store.transition(f"p{i}", ["running"], "failed", now=T0 + 10 + i, finished=True)
    assert all(r.refused for r in store.guardrail_state(T0 + 50).runs)
    late = _run(store, "late", "gpu-node-009", T0 + 100)
    assert _start(store, "late", late, T0 + 100)[0] == "claimed"


def test_the_approval_ttl_runs_on_the_simulated_clock(store: RunStore) -> None:
    ttl = 3600.0
    for run_id in ("a1", "a2"):
        _run(store, run_id, "gpu-node-001", T0)
        store.request_approval(run_id, now=T0, expires_at=T0 + ttl)

    assert store.expire_approvals(T0 + ttl - 1) == []
    assert store.decide_approval("a1", "approved", approver="alice", channel="cli", comment="", now=T0 + 60)
    assert store.expire_approvals(T0 + ttl) == ["a2"]
    assert not store.decide_approval("a2", "approved", approver="bob", channel="cli", comment="", now=T0 + ttl + 1)

    a1, a2 = store.get_approval("a1"), store.get_approval("a2")
    assert a1 is not None and (a1.requested_at, a1.decided_at, a1.status) == (T0, T0 + 60, "approved")
    assert a2 is not None and (a2.requested_at, a2.decided_at, a2.status) == (T0, T0 + ttl, "expired")


def test_a_runs_steps_and_its_incidents_mitigation_are_on_the_simulated_clock(
    fresh_database: Settings, store: RunStore
) -> None:
    year_ago = float(int(time.time() - 365 * 86_400) // 60 * 60)
    sim = Simulator(load_scenario("xid79"), seed=0, telemetry=False, epoch=year_ago)
    executor = simulated_executor(sim, store, MemoryEventSink())
    dispatcher = executor.dispatcher
    assert isinstance(dispatcher, LoopDispatcher)
    for _ in range(30):
        sim.step()
    opened = sim.epoch + sim.t
    save_incident_events(
        fresh_database,
        [
            IncidentEvent(
                incident_id="inc-sim", kind="opened", severity="critical", title="t", opened_at=opened, ts=opened
            )
        ],
    )
    pod = next(p.name for p in sim.cluster.pods.values() if p.deployment)
    diagnosis = Diagnosis(
        incident_id="inc-sim",
        diagnostician="ranker",
        hypotheses=(Hypothesis(cause="engine_crash", confidence=0.9),),
        proposed_playbook="restart_pod",
        proposed_params={"pod": pod},
        ts=opened,
    )
    run_id, decision = executor.submit(diagnosis)
    assert decision.outcome == "execute", decision.reasons
    while dispatcher.pending() and sim.t < 1200:
        dispatcher.pump()
        sim.step()  # the pod reloads its model: the verification waits for it on simulated time

    run = store.get_run(run_id)
    assert run is not None and run.status == "succeeded", run
    assert run.started_at is not None and run.finished_at is not None
    assert run.started_at >= opened and run.finished_at - run.started_at >= 10  # the step's wait, at least
    steps = store.steps(run_id)
    assert [s.kind for s in steps] == ["precheck", "action", "verify"]
    for s in steps:  # on the run's clock, a year from the wall clock the database's now() reads
        assert s.started_at is not None and s.finished_at is not None
        assert run.started_at <= s.started_at <= s.finished_at <= run.finished_at, s
    verify = steps[-1]
    assert verify.started_at is not None and verify.finished_at is not None
    assert verify.finished_at - verify.started_at >= 1  # verified after retries: it took simulated time
    with connect(fresh_database) as conn:
        incident = get_incident(conn, "inc-sim")
    assert incident is not None and incident.status == "mitigated" and incident.mitigated_at is not None
    assert run.started_at <= incident.mitigated_at.timestamp() <= run.finished_at
    # the incident's updated_at stays event time: correlate's next version of it (later, on the same
    # clock) is still newer than the row and is stored
    assert incident.updated_at.timestamp() <= run.finished_at
    resolved = run.finished_at + 60
    save_incident_events(
        fresh_database,
        [
            IncidentEvent(
                incident_id="inc-sim", kind="resolved", severity="critical", title="t", opened_at=opened, ts=resolved
            )
        ],
    )
    with connect(fresh_database) as conn:
        later = get_incident(conn, "inc-sim")
    assert later is not None and later.status == "resolved" and later.resolved_at is not None
    assert later.mitigated_at == incident.mitigated_at
