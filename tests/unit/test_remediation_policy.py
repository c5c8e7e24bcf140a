"""Policy and guardrails: what each one blocks, with no I/O."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from services.core.events import Diagnosis, Hypothesis
from services.remediation.config import PolicyConfig, parse_config
from services.remediation.model import Targets
from services.remediation.policy import GuardrailState, RunSummary, check_guardrails, plan_from_diagnosis
from services.remediation.registry import playbook_registry

NOW = 1_764_000_000.0  # a Monday, 16:00 UTC
REG = playbook_registry()


def diagnosis(playbook: str | None, params: dict[str, Any] | None = None, level: int | None = None) -> Diagnosis:
    return Diagnosis(
        incident_id="inc-1",
        diagnostician="ranker",
        hypotheses=(Hypothesis(cause="gpu_xid_79", confidence=0.9),),
        proposed_playbook=playbook,
        proposed_params=params or {},
        level=level,
        ts=NOW,
    )


def policy(**defaults: Any) -> PolicyConfig:
    return parse_config({"policy": {"defaults": defaults}}).policy


def run(run_id: str, status: str, ago: float, automatic: bool = True, **targets: Any) -> RunSummary:
    return RunSummary(
        run_id=run_id,
        playbook="restart_pod",
        status=status,
        automatic=automatic,
        started_at=NOW - ago,
        finished_at=NOW - ago + 10,
        targets=Targets(**targets),
    )


RESTART = ("restart_pod", {"pod": "llama-0"})


def test_level_one_runs_automatically():
    d = plan_from_diagnosis(diagnosis(*RESTART), policy(), REG)
    assert d.outcome == "execute" and d.level == 1 and d.targets.pods == ("llama-0",)


def test_a_playbook_outside_the_registry_is_dropped():
    d = plan_from_diagnosis(diagnosis("rm_rf_slash", {"path": "/"}), policy(), REG)
    assert d.outcome == "dropped" and "not registered" in d.reasons[0]


def test_a_level_above_the_allowed_maximum_is_dropped_and_a_diagnosis_cannot_lower_a_level():
    d = plan_from_diagnosis(diagnosis("reboot_node", {"node": "n1"}), policy(max_level=1), REG)
    assert d.outcome == "dropped" and "above the allowed maximum" in d.reasons[0]
    d = plan_from_diagnosis(diagnosis("reboot_node", {"node": "n1"}, level=1), policy(), REG)
    assert d.level == 2 and d.outcome == "await_approval"
    d = plan_from_diagnosis(diagnosis("restart_pod", {"pod": "p"}, level=3), policy(), REG)
    assert d.outcome == "page", "a diagnosis may raise the level to 3: then nothing acts"


def test_bad_params_are_dropped():
    d = plan_from_diagnosis(diagnosis("scale_replicas", {"deployment": "x", "replicas": "many"}), policy(), REG)
    assert d.outcome == "dropped"


def test_level_three_pages_and_level_two_waits_for_approval():
    assert plan_from_diagnosis(diagnosis("page_oncall", {}), policy(), REG).outcome == "page"
    assert plan_from_diagnosis(diagnosis("drain_node", {"node": "n1"}), policy(), REG).outcome == "await_approval"
    assert plan_from_diagnosis(diagnosis(None), policy(), REG).outcome == "dropped"


def test_kill_switch_blocks_and_dry_run_is_carried():
    assert plan_from_diagnosis(diagnosis(*RESTART), policy(kill_switch=True), REG).outcome == "blocked"
    d = plan_from_diagnosis(diagnosis(*RESTART), policy(dry_run=True), REG)
    assert d.outcome == "execute" and d.dry_run


def test_overrides_apply_per_playbook_namespace_and_model():
    cfg = parse_config(
        {
            "policy": {
                "overrides": [
                    {"match": {"namespace": "prod-*"}, "set": {"max_auto_level": 0}},
                    {"match": {"model": "llama-8b*", "playbook": "scale_replicas"}, "set": {"max_auto_level": 2}},
                ]
            }
        }
    ).policy
    d = plan_from_diagnosis(diagnosis("restart_pod", {"pod": "p", "namespace": "prod-eu"}), cfg, REG)
    assert d.outcome == "await_approval"
    d = plan_from_diagnosis(diagnosis("scale_replicas", {"deployment": "llama-8b-fp16", "replicas": 4}), cfg, REG)
    assert d.outcome == "execute" and d.scope["model"] == "llama-8b-fp16"


def test_cooldown_blocks_the_same_target_only():
    state = GuardrailState(runs=(run("r0", "succeeded", 300, pods=("llama-0",)),))
    d = plan_from_diagnosis(diagnosis(*RESTART), policy(cooldown_s=900), REG, state=state)
    assert d.outcome == "blocked" and "cooldown" in d.reasons[0]
    d = plan_from_diagnosis(diagnosis("restart_pod", {"pod": "llama-1"}), policy(cooldown_s=900), REG, state=state)
    assert d.outcome == "execute"
    d = plan_from_diagnosis(diagnosis(*RESTART), policy(cooldown_s=200), REG, state=state)
    assert d.outcome == "execute", "the cooldown has passed"


def test_rate_limit_counts_runs_that_acted_in_the_window():
    runs = tuple(run(f"r{i}", "succeeded", 100 + i, pods=(f"p{i}",)) for i in range(3))
    runs += (run("blocked", "blocked", 10, pods=("q",)),)
    limited = policy(rate_limit={"max_runs": 3, "window_s": 3600})
    d = plan_from_diagnosis(diagnosis(*RESTART), limited, REG, state=GuardrailState(runs=runs))
    assert d.outcome == "blocked" and "rate limit" in d.reasons[0]
    roomy = policy(rate_limit={"max_runs": 4, "window_s": 3600})
    assert plan_from_diagnosis(diagnosis(*RESTART), roomy, REG, state=GuardrailState(runs=runs)).outcome == "execute"


def test_blast_radius_limits_replicas_fraction_and_nodes():
    busy = GuardrailState(
        runs=(run("r0", "running", 5, deployment="llama", replicas_out=1, pods=("llama-9",)),),
        deployment_replicas={"/llama": 4},
    )
    d = plan_from_diagnosis(
        diagnosis("rollout_restart", {"deployment": "llama"}), policy(cooldown_s=0), REG, state=busy
    )
    assert d.outcome == "blocked" and "2 replicas of llama" in d.reasons[0]
    two = policy(cooldown_s=0, blast_radius={"max_replicas": 2, "max_fraction": 0.25})
    d = plan_from_diagnosis(diagnosis("rollout_restart", {"deployment": "llama"}), two, REG, state=busy)
    assert d.outcome == "blocked" and "2/4" in d.reasons[0]
    nodes = GuardrailState(runs=(run("r1", "running", 5, nodes=("n1",)),))
    assert check_guardrails(Targets(nodes=("n2",)), policy().resolve({}), nodes, NOW)
    assert not check_guardrails(Targets(nodes=("n2",)), policy().resolve({}), GuardrailState(), NOW)
    done = GuardrailState(runs=(run("r1", "succeeded", 5000, nodes=("n1",)),))
    assert not check_guardrails(Targets(nodes=("n2",)), policy().resolve({}), done, NOW)


def test_circuit_breaker_stops_automatic_runs_and_pages_after_m_failures():
    failures = tuple(run(f"f{i}", "rolled_back", 600 + i, pods=(f"x{i}",)) for i in range(3))
    d = plan_from_diagnosis(diagnosis(*RESTART), policy(), REG, state=GuardrailState(runs=failures))
    assert d.outcome == "page" and "circuit breaker" in d.reasons[0]
    old = tuple(run(f"f{i}", "failed", 7200 + i, pods=(f"x{i}",)) for i in range(3))
    assert plan_from_diagnosis(diagnosis(*RESTART), policy(), REG, state=GuardrailState(runs=old)).outcome == "execute"
    refused = tuple(
        run(f"f{i}", "failed", 600 + i, pods=(f"x{i}",)).model_copy(update={"refused": True}) for i in range(3)
    )
    d = plan_from_diagnosis(diagnosis(*RESTART), policy(), REG, state=GuardrailState(runs=refused))
    assert d.outcome == "execute", "runs their precheck refused never acted: they do not trip the breaker"
    manual = tuple(run(f"f{i}", "failed", 60, automatic=False, pods=(f"x{i}",)) for i in range(3))
    d = plan_from_diagnosis(diagnosis(*RESTART), policy(), REG, state=GuardrailState(runs=manual))
    assert d.outcome == "execute", "approved runs failing do not trip the automatic breaker"


@pytest.mark.parametrize(
    ("window", "inside"),
    [
        ({"days": ["mon"], "start": "15:00", "end": "17:00"}, True),
        ({"days": ["tue"], "start": "15:00", "end": "17:00"}, False),
        ({"start": "23:00", "end": "16:30"}, True),
        ({"start": "2025-11-24T15:00:00", "end": "2025-11-24T15:59:00"}, False),
    ],
)
def test_maintenance_windows_send_automatic_runs_to_a_human(window: dict[str, Any], inside: bool):
    assert dt.datetime.fromtimestamp(NOW, dt.UTC).strftime("%a %H:%M") == "Mon 16:00"
    d = plan_from_diagnosis(diagnosis(*RESTART), policy(maintenance_windows=[window]), REG)
    assert d.outcome == ("await_approval" if inside else "execute")


def test_start_checks_kill_switch_breaker_and_guardrails_leaving_the_run_itself_out():
    from services.remediation.policy import KillSwitch, start_blocks

    spec = policy().resolve({})
    me = run("me", "running", 0, nodes=("n1",))  # the run being started is already in the snapshot
    assert start_blocks("me", Targets(nodes=("n1",)), spec, GuardrailState(runs=(me,)), NOW, automatic=True) == []
    other = run("other", "running", 1, nodes=("n2",))
    blocks = start_blocks("me", Targets(nodes=("n1",)), spec, GuardrailState(runs=(other,)), NOW, automatic=True)
    assert blocks and "blast radius" in blocks[0]
    failures = tuple(run(f"f{i}", "failed", 60 + i, pods=(f"x{i}",)) for i in range(3))
    state = GuardrailState(runs=failures)
    assert "circuit breaker" in start_blocks("me", Targets(pods=("p",)), spec, state, NOW, automatic=True)[0]
    assert start_blocks("me", Targets(pods=("p",)), spec, state, NOW, automatic=False) == [], "a human approved it"
    live = GuardrailState(kill_switch=KillSwitch(set_by="alice", reason="incident review"))
    blocks = start_blocks("me", Targets(pods=("p",)), spec, live, NOW, automatic=False)
    assert blocks == ["kill switch is on (set by alice: incident review)"]


def test_before_each_action_only_kill_switch_and_breaker_are_asked_again():
    from services.remediation.policy import KillSwitch, act_blocks

    spec = policy(rate_limit={"max_runs": 1, "window_s": 3600}).resolve({})
    busy = GuardrailState(runs=tuple(run(f"r{i}", "running", 5, pods=(f"p{i}",)) for i in range(3)))
    assert act_blocks(spec, busy, NOW, automatic=True) == [], "a running run keeps the slot it was admitted to"
    assert act_blocks(spec, GuardrailState(kill_switch=KillSwitch(set_by="bob")), NOW, automatic=True)
    failures = GuardrailState(runs=tuple(run(f"f{i}", "rolled_back", 60, pods=(f"x{i}",)) for i in range(3)))
    assert act_blocks(spec, failures, NOW, automatic=True) and not act_blocks(spec, failures, NOW, automatic=False)


def test_a_failed_run_whose_rollback_is_pending_still_counts_toward_the_blast_radius():
    pending = RunSummary(
        run_id="r0",
        playbook="drain_node",
        status="failed",
        rollback_pending=True,
        started_at=NOW - 30,
        targets=Targets(nodes=("n1",)),
    )
    assert check_guardrails(Targets(nodes=("n2",)), policy().resolve({}), GuardrailState(runs=(pending,)), NOW)


def test_the_live_kill_switch_blocks_decisions_too():
    from services.remediation.policy import KillSwitch

    state = GuardrailState(kill_switch=KillSwitch(set_by="alice"))
    d = plan_from_diagnosis(diagnosis(*RESTART), policy(), REG, state=state)
    assert d.outcome == "blocked" and "set by alice" in d.reasons[0]


def test_at_start_running_automatic_runs_count_as_failures_that_may_yet_happen():
    from services.remediation.policy import start_blocks

    spec = policy(circuit_breaker={"max_failures": 3, "window_s": 3600}).resolve({})
    two_running = GuardrailState(runs=tuple(run(f"r{i}", "running", 1, pods=(f"p{i}",)) for i in range(2)))
    assert start_blocks("me", Targets(pods=("q",)), spec, two_running, NOW, automatic=True) == []
    one_failed = GuardrailState(runs=(*two_running.runs, run("f", "rolled_back", 30, pods=("x",))))
    blocks = start_blocks("me", Targets(pods=("q",)), spec, one_failed, NOW, automatic=True)
    assert blocks and "1 automatic runs failed" in blocks[0] and "2 are still running" in blocks[0]
    assert start_blocks("me", Targets(pods=("q",)), spec, one_failed, NOW, automatic=False) == []


def test_an_incident_runs_one_automatic_remedy_at_a_time():
    # the GPU's pods are being evicted; a drain of one of them, proposed meanwhile, waits for a later
    # diagnosis instead of acting on what the first run is changing
    from services.remediation.policy import start_blocks

    evicting = run("r-evict", "running", 30, nodes=("n9",)).model_copy(update={"incident_id": "inc-a"})
    state = GuardrailState(runs=(evicting,))
    d = plan_from_diagnosis(diagnosis(*RESTART).model_copy(update={"incident_id": "inc-a"}), policy(), REG, state=state)
    assert d.outcome == "blocked" and "in flight" in d.reasons[0]
    other = plan_from_diagnosis(
        diagnosis(*RESTART).model_copy(update={"incident_id": "inc-b"}), policy(), REG, state=state
    )
    assert other.outcome == "execute"
    spec = policy().resolve({})
    held = start_blocks("me", Targets(pods=("p",)), spec, state, NOW, automatic=True, incident_id="inc-a")
    assert held and "in flight" in held[0]
    assert start_blocks("me", Targets(pods=("p",)), spec, state, NOW, automatic=False, incident_id="inc-a") == []


def test_no_level_two_remedy_is_put_to_a_human_while_a_run_of_its_incident_acts():
    # the demo: evict_gpu_pods verifying the XID 79 replica's replacement, whose startup probe made the
    # ranker propose rollback_deployment; approved blind, it failed and kept the SLO down
    evicting = run("r-evict", "running", 30, nodes=("n9",)).model_copy(update={"incident_id": "inc-a"})
    state = GuardrailState(runs=(evicting,))
    rollback = diagnosis("drain_node", {"node": "n1"}).model_copy(update={"incident_id": "inc-a"})
    d = plan_from_diagnosis(rollback, policy(), REG, state=state)
    assert d.outcome == "blocked" and "r-evict in flight" in d.reasons[0]
    later = plan_from_diagnosis(rollback, policy(), REG, state=GuardrailState(runs=()))
    assert later.outcome == "await_approval"  # once the run has finished, the human is asked
