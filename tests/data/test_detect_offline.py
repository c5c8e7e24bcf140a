"""The detection evaluation offline: every simulator fault type found on its entity within a minute.

The shipped rule and log detectors run over seeded simulator scenarios, the XID rules with NVIDIA's
catalog and the XID faults with its messages, both read from ../shared/data. The evaluation's scoring
helpers are unit-tested (tests/unit/test_detect_evaluate.py).
"""

from __future__ import annotations

import pytest

from evals.detect import matches, run_scenario, scenario_per_fault_type
from pipelines.detect import DetectorSet
from pipelines.detectors.registry import DETECTORS
from services.simulator.faults import FAULT_TYPES

RULES_AND_LOGS = [
    "xid_rules",
    "gpu_rules",
    "serving_rules",
    "slo_burn",
    "kube_events",
    "log_templates",
    "iforest",
    "revision_rules",
]


def rules_and_logs() -> DetectorSet:
    return DetectorSet.of([DETECTORS.load(name)() for name in RULES_AND_LOGS])


@pytest.mark.parametrize("fault_type", sorted(FAULT_TYPES))
def test_each_fault_type_is_found_on_its_entity_within_a_minute_offline(fault_type: str) -> None:
    scenario = scenario_per_fault_type()[fault_type]
    # onsets are at 300 s; a bad rollout's symptom starts when its first new pod is Ready (~405 s)
    result = run_scenario(scenario, seed=11, detectors=rules_and_logs(), duration_s=500.0)
    (fault,) = result.faults
    assert fault.delay_s is not None, f"{fault_type}: no anomaly on {fault.entity}"
    assert fault.delay_s <= 60.0, f"{fault_type}: first anomaly {fault.first_anomaly} after {fault.delay_s} s"


def test_a_bad_rollout_is_timed_from_its_first_ready_pod_and_found_on_the_new_revision() -> None:
    from services.simulator.scenario import load_scenario
    from services.simulator.simulator import Simulator

    sim = Simulator(load_scenario("bad_rollout"), seed=11, telemetry=False)
    while sim.t < 500:
        sim.step()
    (fault,) = [f for f in sim.fault_list() if f.started_at is not None]
    assert fault.state["serving_at"] - fault.started_at >= 60.0  # the model load: no symptom before it
    new_pod = next(p for p in sim.cluster.pods_of(fault.entity) if p.revision == fault.state["revision"])
    assert new_pod.name.startswith(fault.state["replica_set"] + "-")

    result = run_scenario("bad_rollout", seed=11, detectors=rules_and_logs(), duration_s=500.0)
    (scored,) = result.faults
    assert scored.onset == fault.state["serving_at"]
    revision = [
        (t, a)
        for t, a in result.anomalies
        if a.detector == "revision_rules" and a.status == "firing" and a.entity.startswith(fault.state["replica_set"])
    ]
    assert revision, "the new revision was never compared with the old one"
    t, first = revision[0]
    assert t - scored.onset <= 60.0
    assert first.evidence["old_replica_set"] != first.evidence["replica_set"] == fault.state["replica_set"]
    assert first.evidence["slower"]["tpot"]["ratio"] >= 1.3
    # the old revision's pods (whose GPUs go idle as they are replaced) are not the fault's entity
    old_pod = next(p for p in sim.cluster.pods_of(fault.entity) if p.revision != fault.state["revision"])
    assert not matches(fault, first.model_copy(update={"entity": old_pod.name, "labels": {"pod": old_pod.name}}))
    assert matches(fault, first)


def test_the_cli_prints_the_summary_as_json() -> None:
    import json

    from typer.testing import CliRunner

    from services.cli import app

    result = CliRunner().invoke(
        app, ["detect", "evaluate", "--scenario", "ecc", "--seeds", "3", "--models", "none", "--duration", "360"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout[result.stdout.index("{") :])
    assert summary["models"] == "none" and summary["fault_types"]["ecc"]["faults"] == 1
    assert summary["fault_types"]["ecc"]["detected_within"] == 1


