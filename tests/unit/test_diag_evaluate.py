"""Pieces of the simulator-based diagnosis evaluation that need no simulation."""

from __future__ import annotations

from types import SimpleNamespace

from services.core.events import AlertRef
from services.diagnostician.evaluate import (
    FAULT_CAUSES,
    FAULT_SCENARIOS,
    XID_CODES,
    CaseResult,
    alert_matches,
    summarise,
    xid_cause,
)
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
