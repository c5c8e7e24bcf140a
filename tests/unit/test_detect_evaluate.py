"""The detection evaluation: scoring helpers, and every simulator fault type found offline within a minute."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from evals.detect import FaultResult, ScenarioResult, matches, run_scenario, scenario_per_fault_type, summarise
from pipelines.detect import DetectorSet
from pipelines.detectors.registry import DETECTORS
from services.core.events import Anomaly
from services.simulator.faults import FAULT_TYPES


def anomaly(entity: str, signal: str = "x", status: str = "firing", **labels: str) -> Anomaly:
    return Anomaly(
        entity=entity,
        entity_kind="pod",
        signal=signal,
        detector="d",
        score=2.0,
        threshold=1.0,
        severity="warning",
        status=status,  # type: ignore[arg-type]
        ts=0.0,
        labels=labels,
        evidence={},
        fingerprint=f"{entity}-{signal}",
    )


def test_every_fault_type_has_a_scenario() -> None:
    assert set(scenario_per_fault_type()) == set(FAULT_TYPES)


def test_an_anomaly_matches_its_fault_directly_through_labels_or_by_deployment_prefix() -> None:
    gpu = SimpleNamespace(entity="GPU-1", entity_kind="gpu")
    node = SimpleNamespace(entity="gpu-node-001", entity_kind="node")
    deployment = SimpleNamespace(entity="llama-8b", entity_kind="deployment")
    assert matches(gpu, anomaly("GPU-1"))
    assert matches(gpu, anomaly("node-x", gpu="GPU-1"))
    assert not matches(gpu, anomaly("GPU-2", node="gpu-node-001"))
    assert matches(node, anomaly("llama-8b-abc-123", node="gpu-node-001"))
    assert matches(deployment, anomaly("llama-8b-abc-123"))
    assert not matches(deployment, anomaly("llama-8b2-abc"))


def test_summary_counts_detections_delays_right_entity_share_and_false_positives() -> None:
    def fault(seed: int, delay: float | None, early: int, on_target: int) -> FaultResult:
        return FaultResult(
            "ecc", seed, "ecc-p1", "ecc", "GPU-1", 300.0, "gpu_rules/ecc_sbe_rate", delay, early, on_target
        )

    faulty = [
        ScenarioResult("ecc", 1, 1500.0, faults=[fault(1, 15.0, 2, 1)]),
        ScenarioResult("ecc", 2, 1500.0, faults=[fault(2, 45.0, 1, 1)]),
        ScenarioResult("ecc", 3, 1500.0, faults=[fault(3, 120.0, 1, 0)]),
    ]
    quiet = ScenarioResult("baseline", 1, 3600.0, entities={f"e{i}" for i in range(10)})
    quiet.anomalies = [
        (10.0, anomaly("e1")),
        (20.0, anomaly("e1", "y")),
        (30.0, anomaly("e2")),
        (40.0, anomaly("e2", status="resolved")),
    ]
    summary = summarise([*faulty, quiet], within_s=60.0)
    ecc = summary["fault_types"]["ecc"]
    assert (ecc["faults"], ecc["detected_within"], ecc["detection_rate"]) == (3, 2, round(2 / 3, 4))
    assert (ecc["delay_p50_s"], ecc["delay_max_s"]) == (45.0, 120.0)
    assert ecc["right_entity_rate"] == 0.5 and ecc["missed"] == ["ecc/seed=3"]
    fault_free = summary["fault_free"]
    assert fault_free["anomalies"] == 3  # resolutions are not alarms
    assert fault_free["false_positives_per_entity_hour"] == 0.3  # 3 over 10 entity-hours
    assert fault_free["max_per_entity_hour"] == 2.0  # e1 fired twice in the hour


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


def test_the_cli_refuses_an_unknown_model_source() -> None:
    from typer.testing import CliRunner

    from services.cli import app

    result = CliRunner().invoke(app, ["detect", "evaluate", "--scenario", "ecc", "--models", "newest"])
    assert result.exit_code != 0 and "stored or none" in result.output


def test_a_run_with_no_planted_fault_that_broke_its_availability_slo_is_not_counted_as_false_positives() -> None:
    def anomaly(entity: str, signal: str) -> Anomaly:
        return Anomaly(
            entity=entity,
            entity_kind="pod",
            signal=signal,
            detector="serving_rules",
            score=1,
            threshold=1,
            severity="warning",
            ts=1.0,
            fingerprint=f"{entity}/{signal}",
        )

    calm = ScenarioResult("baseline", 1, 3600.0, entities={"p1", "p2"}, requests=20_000, failed=0)
    calm.anomalies = [(10.0, anomaly("p1", "queue_saturation"))]
    # a burst beyond capacity: 2.5% of requests failed against a 0.1% budget
    burst = ScenarioResult("baseline", 8, 3600.0, entities={"p1", "p2"}, requests=27_000, failed=675)
    burst.anomalies = [(t, anomaly("p1", s)) for t, s in ((10.0, "queue_saturation"), (20.0, "error_rate"))]
    assert burst.slo_breached and not calm.slo_breached
    fault_free = summarise([calm, burst])["fault_free"]
    assert fault_free["runs"] == 1 and fault_free["anomalies"] == 1
    assert fault_free["max_per_entity_hour"] == 1.0
    assert fault_free["overloaded_runs"] == {
        "baseline/seed=8": {"failed_share": 0.025, "anomalies": 2, "max_per_entity_hour": 2.0}
    }
