"""The detection evaluation's scoring helpers.

The evaluation itself (every simulator fault type found offline within a minute, by the shipped detectors
with NVIDIA's XID catalog) reads ../shared/data: tests/data/test_detect_offline.py.
"""

from __future__ import annotations

from types import SimpleNamespace

from evals.detect import FaultResult, ScenarioResult, matches, scenario_per_fault_type, summarise
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
