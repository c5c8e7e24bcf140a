"""Pieces of the simulator-based diagnosis evaluation that need no simulation."""

from __future__ import annotations

from types import SimpleNamespace

from evals.diagnose import (
    FAULT_CAUSES,
    FAULT_SCENARIOS,
    XID_CODES,
    CaseResult,
    alert_matches,
    pick_incident,
    summarise,
    xid_cause,
)
from services.core.events import AlertRef, IncidentEvent
from services.diagnostician.ranker import runbook_index
from services.simulator.faults import FAULT_TYPES
from services.simulator.scenario import list_scenarios


def test_every_fault_type_has_a_scenario_and_known_causes() -> None:
    index = runbook_index()
    assert set(FAULT_SCENARIOS) == set(FAULT_TYPES)
    assert set(FAULT_SCENARIOS.values()) <= set(list_scenarios())
    for fault_type, causes in FAULT_CAUSES.items():
        assert causes and all(c in index.by_root_cause for c in causes), fault_type
    assert all(xid_cause(index, code) in index.by_root_cause for code in XID_CODES)
    assert xid_cause(index, 63) == "gpu_xid_63_row_remap_pending"
    assert xid_cause(index, 9999) == "gpu_xid_9999"


def test_alerts_match_faults_directly_through_labels_or_by_deployment() -> None:
    def alert(entity: str, **labels: str) -> AlertRef:
        return AlertRef(
            fingerprint="f", entity=entity, signal="s", detector="d", severity="warning", starts_at=0, labels=labels
        )

    gpu = SimpleNamespace(entity="GPU-1", entity_kind="gpu")
    assert alert_matches(gpu, alert("GPU-1")) and alert_matches(gpu, alert("node-0", gpu="GPU-1"))
    assert not alert_matches(gpu, alert("GPU-2"))
    dep = SimpleNamespace(entity="llama-70b", entity_kind="deployment")
    assert alert_matches(dep, alert("llama-70b-3")) and alert_matches(dep, alert("x", pod="llama-70b-1"))


def test_summary_counts_top1_top3_and_detection() -> None:
    results = [
        CaseResult("a", 1, "kv_cache_exhaustion", ("kv_cache_exhaustion",), "i1", ["kv_cache_exhaustion"], 10.0),
        CaseResult("b", 1, "engine_dead", ("engine_dead",), "i2", ["nccl_timeout", "x", "engine_dead"], 30.0),
        CaseResult("c", 1, "engine_dead", ("engine_dead",)),
    ]
    summary = summarise(results)
    assert summary["faults"] == 3 and summary["incidents_diagnosed"] == 2
    assert summary["top1_accuracy"] == 0.5 and summary["top3_accuracy"] == 1.0
    assert summary["by_fault_type"]["engine_dead"]["misses"] == ["engine_dead -> nccl_timeout"]


EPOCH = 1_000_000.0


def _incident(iid: str, kind: str, opened_at: float, ts: float, *alerts: tuple[str, float]) -> IncidentEvent:
    """An incident version; each alert is (entity, simulated start second)."""
    return IncidentEvent(
        incident_id=iid,
        kind=kind,  # type: ignore[arg-type]
        severity="warning",
        title=iid,
        opened_at=opened_at,
        ts=ts,
        alerts=tuple(
            AlertRef(
                fingerprint=f"{iid}-{i}", entity=e, signal="s", detector="d", severity="warning", starts_at=EPOCH + t
            )
            for i, (e, t) in enumerate(alerts)
        ),
    )


def test_the_case_is_the_last_version_within_the_window_of_the_incident_the_fault_opened() -> None:
    fault = SimpleNamespace(entity="GPU-1", entity_kind="gpu", started_at=300.0)
    events = [
        _incident("old", "opened", 100.0, 100.0, ("pod-a", 100.0)),
        # the fault's alert joins the older incident too, but the incident it opened is the case
        _incident("old", "updated", 100.0, 310.0, ("pod-a", 100.0), ("GPU-1", 310.0)),
        _incident("new", "opened", 310.0, 310.0, ("GPU-1", 310.0)),
        _incident("new", "updated", 310.0, 400.0, ("GPU-1", 310.0), ("node-1", 390.0)),
        _incident("new", "updated", 310.0, 600.0, ("GPU-1", 310.0), ("node-1", 390.0), ("x", 590.0)),
    ]
    incident, merged = pick_incident(fault, events, EPOCH, window_s=180.0)
    assert incident is not None and not merged
    assert incident.incident_id == "new" and incident.ts == 400.0


def test_a_fault_that_only_joins_an_earlier_incident_is_merged_and_alerts_before_onset_do_not_count() -> None:
    fault = SimpleNamespace(entity="GPU-1", entity_kind="gpu", started_at=300.0)
    before = [_incident("old", "opened", 100.0, 350.0, ("GPU-1", 100.0))]
    assert pick_incident(fault, before, EPOCH, window_s=180.0) == (None, False)
    joined = [*before, _incident("old", "updated", 100.0, 360.0, ("GPU-1", 100.0), ("GPU-1", 355.0))]
    incident, merged = pick_incident(fault, joined, EPOCH, window_s=180.0)
    assert merged and incident is not None and incident.incident_id == "old"


def test_merged_faults_are_not_detected_and_are_summarised_apart() -> None:
    results = [
        CaseResult("a", 1, "ecc", ("ecc_sbe_accumulation",), "i1", ["ecc_sbe_accumulation"], 5.0),
        CaseResult("b", 1, "ecc", ("ecc_sbe_accumulation",), "i0", ["e2e_slo_burn"], 5.0, merged=True),
    ]
    summary = summarise(results)
    assert summary["incidents_diagnosed"] == 1 and summary["top1_accuracy"] == 1.0
    assert summary["merged_into_earlier_incident"] == {"faults": 1, "top1": 0, "top3": 0}
    assert summary["by_fault_type"]["ecc"]["merged"] == 1
