"""The offline evidence ranker on hand-made incidents: the right runbook ranks first, fast."""

from __future__ import annotations

from typing import Any

import pytest

from pipelines.detectors.registry import signal_catalog
from services.core.events import AlertRef, IncidentEvent, Provenance
from services.core.paths import REPO_ROOT
from services.core.settings import Settings
from services.diagnostician.diagnostician import RankerDiagnostician
from services.diagnostician.ranker import RunbookIndex, rank, runbook_index, supported_level
from services.diagnostician.tools import gather_evidence

T0 = 1_760_000_000.0
# The alerts here stand for ClusterMedic's own detectors on DCGM metrics: a trusted GPU source.
DCGM = Provenance(source="dcgm", stream="scrape", trusted=("gpu_fault", "topology"))


def alert(signal: str, entity: str = "gpu-0", detector: str = "rules", **evidence: Any) -> AlertRef:
    labels = evidence.pop("labels", {"node": "h100-a-07", "gpu": "5", "pod": "llama-0", "model": "llama-70b"})
    return AlertRef(
        provenance=DCGM,
        fingerprint=f"{detector}:{signal}:{entity}",
        entity=entity,
        signal=signal,
        detector=detector,
        severity="critical",
        starts_at=T0,
        labels=labels,
        evidence=evidence,
    )


def incident(*alerts: AlertRef, title: str = "incident") -> IncidentEvent:
    return IncidentEvent(
        incident_id="inc-test",
        kind="opened",
        severity="critical",
        title=title,
        alerts=alerts,
        opened_at=T0,
        ts=T0,
    )


@pytest.fixture(scope="module")
def index() -> RunbookIndex:
    return runbook_index()


def top_causes(index: RunbookIndex, inc: IncidentEvent, n: int = 3) -> list[str]:
    return [h.cause for h in rank(gather_evidence(inc), index)][:n]


CASES: list[tuple[str, IncidentEvent, str]] = [
    (
        "xid79",
        incident(
            alert("gpu_xid", xid=79, mnemonic="GPU has fallen off the bus", remediation="reboot_node"),
            alert("engine_dead", entity="llama-0", detector="log_templates", template="EngineDeadError <*>"),
        ),
        "gpu_xid_79",
    ),
    ("xid48", incident(alert("gpu_xid", xid=48), alert("ecc_dbe", DCGM_FI_DEV_ECC_DBE_VOL_TOTAL=2)), "gpu_xid_48"),
    ("xid74", incident(alert("gpu_xid", xid=74), alert("nccl_timeout", entity="llama-0")), "gpu_xid_74"),
    (
        "kv_cache",
        incident(
            alert("kv_cache_saturation", entity="llama-0", kv_cache_usage=0.99),
            alert("preemption_storm", entity="llama-0", preemptions_in_window=40),
            alert("queue_saturation", entity="llama-0", waiting=80, running=10),
        ),
        "kv_cache_exhaustion",
    ),
    (
        "node_flapping",
        incident(
            alert("node_flapping", entity="node-3"), alert("node_not_ready", entity="node-3", reason="NodeNotReady")
        ),
        "node_flapping",
    ),
    (
        "bad_rollout",
        incident(
            alert("latency_regression", entity="llama"),
            alert("e2e_slo_burn", entity="llama"),
            alert("ttft_slo_burn", entity="llama"),
            alert("kube_event", entity="llama", detector="kube_events", reason="ScalingReplicaSet"),
        ),
        "bad_rollout",
    ),
    (
        "nccl",
        incident(
            alert(
                "nccl_timeout",
                entity="llama-0",
                detector="log_templates",
                example="[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=88, OpType=ALLREDUCE)",
            ),
            alert("engine_dead", entity="llama-0"),
        ),
        "nccl_timeout",
    ),
    (
        "thermal",
        incident(alert("gpu_thermal_throttle", DCGM_FI_DEV_GPU_TEMP=91.0), alert("latency_regression", entity="llama")),
        "thermal_throttle",
    ),
    (
        "network",
        incident(alert("network_latency", entity="llama"), alert("error_rate", entity="llama")),
        "network_latency",
    ),
    (
        "disk",
        incident(
            alert("pod_evicted", entity="llama-0", reason="Evicted"),
            alert("node_pressure", entity="node-3", reason="NodeHasDiskPressure"),
        ),
        "disk_pressure_eviction",
    ),
]


@pytest.mark.parametrize(("name", "inc", "expected"), CASES, ids=[c[0] for c in CASES])
def test_expected_runbook_ranks_first(index: RunbookIndex, name: str, inc: IncidentEvent, expected: str) -> None:
    assert top_causes(index, inc)[0] == expected


def test_hypotheses_cite_evidence_and_runbooks_with_normalised_confidence(index: RunbookIndex) -> None:
    hypotheses = rank(gather_evidence(CASES[0][1]), index)
    top = hypotheses[0]
    assert top.citations[0].doc_id == "gpu-xid-79-fallen-off-bus"
    assert "XID 79" in top.evidence
    assert top.playbook == "evict_gpu_pods" and top.level == 1
    assert 0 < sum(h.confidence for h in hypotheses) <= 1.0
    assert [h.confidence for h in hypotheses] == sorted((h.confidence for h in hypotheses), reverse=True)
    assert top.confidence > 0.5


def test_xid_without_a_runbook_uses_the_catalog_remediation(index: RunbookIndex) -> None:
    inc = incident(alert("gpu_xid", xid=62, remediation="reset_gpu"))
    top = rank(gather_evidence(inc), index)[0]
    assert (top.cause, top.playbook, top.level) == ("gpu_xid_62", "reset_gpu", 2)


def test_no_evidence_means_no_hypotheses(index: RunbookIndex) -> None:
    assert rank(gather_evidence(incident(alert("made_up_signal"))), index) == []


def test_supported_level_follows_matching_runbooks(index: RunbookIndex) -> None:
    assert supported_level(gather_evidence(incident(alert("made_up_signal"))), index) == 1
    assert supported_level(gather_evidence(CASES[0][1]), index) == 3


def test_ranker_diagnosis_proposes_the_top_playbook_with_params() -> None:
    doctor = RankerDiagnostician(Settings(), use_database=False)
    diagnosis = doctor.diagnose(CASES[0][1])
    assert diagnosis.diagnostician == "ranker"
    assert diagnosis.proposed_playbook == "evict_gpu_pods" and diagnosis.level == 1
    assert diagnosis.proposed_params == {"node": "h100-a-07"}
    # a StatefulSet-style pod name (llama-0) names no Deployment: nothing to scale, and the note says so
    kv = doctor.diagnose(CASES[3][1])
    assert kv.proposed_playbook is None and kv.hypotheses[0].cause == "kv_cache_exhaustion"
    assert "no target for scale_replicas in telemetry ClusterMedic collected; no automatic action" in kv.notes
    pod = "llama-70b-7c9d8f6b5b-x2x4k"
    labels = {"node": "h100-a-07", "pod": pod, "model": "llama-70b", "namespace": "serving"}
    burst = incident(
        alert("kv_cache_saturation", entity=pod, labels=labels, kv_cache_usage=0.99),
        alert("preemption_storm", entity=pod, labels=labels, preemptions_in_window=40),
        alert("queue_saturation", entity=pod, labels=labels, waiting=80, running=10),
    )
    kv = doctor.diagnose(burst)
    # one more replica of the Deployment the pod name gives; the model label is no parameter of any playbook
    assert kv.proposed_playbook == "scale_replicas"
    assert kv.proposed_params == {"deployment": "llama-70b", "namespace": "serving", "by": 1}


def test_a_runbook_that_pages_first_pages_though_a_later_playbook_could_act() -> None:
    # rising single-bit ECC errors: the runbook asks for a human before any cordon
    doctor = RankerDiagnostician(Settings(), use_database=False)
    gpu = "GPU-03994431-4d1e-9dd3-2756-82b62dc3bde1"
    labels = {"UUID": gpu, "Hostname": "h100-a-07", "gpu": "2"}
    diagnosis = doctor.diagnose(incident(alert("ecc_sbe_rate", entity=gpu, labels=labels, sbe_per_min=31.0)))
    assert diagnosis.hypotheses[0].cause == "ecc_sbe_accumulation"
    assert (diagnosis.proposed_playbook, diagnosis.level) == ("page_oncall", 3)


def test_a_throttled_gpu_is_drained_only_once_requests_are_slower() -> None:
    # the thermal runbook's drain_replica has `when: [latency_regression, ...]`: a replica's capacity is
    # worth more than its lost clock speed while nobody feels it, so the node is cordoned instead
    doctor = RankerDiagnostician(Settings(), use_database=False)
    gpu, pod = "GPU-477d5cce-0de5-979d-f61d-74b91d7aecaf", "llama-70b-fp16-dmgtt9pk5s-zkqd7"
    labels = {"UUID": gpu, "Hostname": "gpu-node-000", "gpu": "0", "pod": pod, "namespace": "llm-serving"}
    hot = alert("gpu_thermal_throttle", entity=gpu, labels=labels, sm_clock_ratio=0.6)
    quiet = doctor.diagnose(incident(hot))
    assert quiet.hypotheses[0].cause == "thermal_throttle"
    assert quiet.proposed_playbook == "cordon_node" and quiet.proposed_params["node"] == "gpu-node-000"
    slow = alert("latency_regression", entity=pod, labels={**labels, "model": "llama-70b-fp16"}, metric="tpot")
    felt = doctor.diagnose(incident(hot, slow))
    assert felt.hypotheses[0].cause == "thermal_throttle"
    assert felt.proposed_playbook == "drain_replica" and felt.proposed_params["pod"] == pod


def test_a_playbook_condition_naming_a_signal_no_detector_emits_is_refused(tmp_path) -> None:
    from services.core.errors import ConfigError
    from services.diagnostician.runbooks import check_anomaly_signals, load_runbook

    source = (REPO_ROOT / "knowledge/runbooks/gpu/gpu-thermal-throttling.md").read_text()
    path = tmp_path / "gpu" / "gpu-thermal-throttling.md"
    path.parent.mkdir()
    path.write_text(source.replace("when: [latency_regression,", "when: [latency_regresion,"))
    with pytest.raises(ConfigError, match="drain_replica is proposed only when 'latency_regresion' fires"):
        check_anomaly_signals([load_runbook(path)], signal_catalog())
    check_anomaly_signals(
        [load_runbook(REPO_ROOT / "knowledge/runbooks/gpu/gpu-thermal-throttling.md")], signal_catalog()
    )


def _knowledge_with(tmp_path, runbook: str, old: str, new: str):
    """A copy of the shipped runbooks with one edited, and its index (built fresh: a new folder)."""
    import shutil

    from services.diagnostician.ranker import runbook_index

    shutil.copytree(REPO_ROOT / "knowledge" / "runbooks", tmp_path / "runbooks")
    path = tmp_path / "runbooks" / runbook
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    return lambda: runbook_index(tmp_path)


def test_a_runbooks_playbook_params_go_into_the_proposal(tmp_path) -> None:
    build = _knowledge_with(
        tmp_path,
        "serving/serving-kv-cache-exhaustion.md",
        "  - name: scale_replicas\n    level: 1\n",
        "  - name: scale_replicas\n    level: 1\n    params: {by: 2}\n",
    )
    doctor = RankerDiagnostician(Settings(), index=build(), use_database=False)
    pod = "llama-70b-7c9d8f6b5b-x2x4k"
    labels = {"node": "h100-a-07", "pod": pod, "model": "llama-70b", "namespace": "serving"}
    burst = incident(
        alert("kv_cache_saturation", entity=pod, labels=labels, kv_cache_usage=0.99),
        alert("preemption_storm", entity=pod, labels=labels, preemptions_in_window=40),
        alert("queue_saturation", entity=pod, labels=labels, waiting=80, running=10),
    )
    kv = doctor.diagnose(burst)
    assert kv.proposed_playbook == "scale_replicas"
    assert kv.proposed_params == {"deployment": "llama-70b", "namespace": "serving", "by": 2}  # the runbook's 2


def test_a_runbook_giving_a_playbook_a_parameter_it_does_not_take_is_refused(tmp_path) -> None:
    from services.core.errors import ConfigError

    build = _knowledge_with(
        tmp_path,
        "serving/serving-kv-cache-exhaustion.md",
        "  - name: scale_replicas\n    level: 1\n",
        "  - name: scale_replicas\n    level: 1\n    params: {selector: app=vllm}\n",
    )
    with pytest.raises(ConfigError, match="playbook scale_replicas has no parameter 'selector'"):
        build()
