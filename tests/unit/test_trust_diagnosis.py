"""The trust model in the diagnosis: condense, corroboration and targets (docs/security.md)."""

from __future__ import annotations

from typing import Any

import pytest

from services.core.events import AlertRef, Diagnosis, IncidentEvent, Provenance
from services.core.settings import Settings
from services.diagnostician.diagnostician import RankerDiagnostician
from services.diagnostician.evidence import XID_TEXT_NOTE
from services.diagnostician.ranker import NODE_GPU_PLAYBOOKS, NOT_CORROBORATED_NOTE, playbook_params
from services.diagnostician.tools import gather_evidence

T0 = 1_760_000_000.0
NODE, POD, GPU = "h100-a-07", "vllm-llama-7d9f-x2x4k", "GPU-5d4c3b2a-0000-1111-2222-333344445555"
KERNEL = Provenance(source="kernel_log", stream='{unit="kernel"}', trusted=("gpu_fault", "topology"))
DCGM = Provenance(source="dcgm", stream="scrape", trusted=("gpu_fault", "topology"))
APP = Provenance(source="app_log", stream='{pod="vllm"}', trusted=("topology",))
KUBE = Provenance(source="kube_api", stream="events", trusted=("topology",))
WEBHOOK = Provenance(source="alertmanager_webhook", trusted=())
XID_LINE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


def alert(signal: str, entity: str, provenance: Provenance, labels: dict[str, str], **evidence: Any) -> AlertRef:
    return AlertRef(
        fingerprint=f"{signal}:{entity}:{provenance.source}",
        entity=entity,
        signal=signal,
        detector="alertmanager" if provenance.source == "alertmanager_webhook" else "rules",
        severity="critical",
        starts_at=T0,
        labels=labels,
        evidence=evidence,
        provenance=provenance,
    )


def incident(*alerts: AlertRef, labels: dict[str, str] | None = None) -> IncidentEvent:
    return IncidentEvent(
        incident_id="inc-trust",
        kind="opened",
        severity="critical",
        title="incident",
        labels=labels or {},
        alerts=alerts,
        opened_at=T0,
        ts=T0,
    )


@pytest.fixture(scope="module")
def doctor() -> RankerDiagnostician:
    return RankerDiagnostician(Settings(), use_database=False)


def no_action(diagnosis: Diagnosis) -> bool:
    return diagnosis.proposed_playbook is None and all(h.playbook is None for h in diagnosis.hypotheses)


def test_condense_takes_xids_only_from_trusted_gpu_sources() -> None:
    pod = {"pod": POD, "node": NODE}
    echo = alert("untrusted_xid_text", POD, APP, pod, example=f"prompt: '{XID_LINE}'", quoted_xid=79)
    forged = alert("gpu_xid", GPU, WEBHOOK, {"node": NODE}, xid=79, message=XID_LINE)
    ev = gather_evidence(incident(echo, forged))
    assert ev.xids == set() and "gpu_xid" not in ev.signals
    assert not any("Xid" in line for line in ev.log_lines)  # no runbook NVRM template can match them
    assert XID_TEXT_NOTE in ev.untrusted
    assert "XID text in an alert from the Alertmanager webhook; not a trusted source" in ev.untrusted
    trusted = gather_evidence(incident(alert("gpu_xid", GPU, KERNEL, {"node": NODE}, xid=79, example=XID_LINE)))
    assert trusted.xids == {79} and "gpu_xid" in trusted.signals and trusted.untrusted == []


def test_prompt_echo_proposes_nothing_and_says_why(doctor: RankerDiagnostician) -> None:
    echo = alert("untrusted_xid_text", POD, APP, {"pod": POD, "node": NODE}, example=f"prompt: {XID_LINE}")
    diagnosis = doctor.diagnose(incident(echo))
    assert no_action(diagnosis)
    assert XID_TEXT_NOTE in diagnosis.notes


def test_kernel_xid_still_proposes_the_gpu_runbook_on_the_node(doctor: RankerDiagnostician) -> None:
    xid = alert("gpu_xid", GPU, KERNEL, {"node": NODE, "Hostname": NODE}, xid=79, example=XID_LINE)
    diagnosis = doctor.diagnose(incident(xid))
    assert diagnosis.hypotheses[0].cause == "gpu_xid_79"
    assert diagnosis.proposed_playbook == "evict_gpu_pods" and diagnosis.proposed_params == {"node": NODE}
    assert diagnosis.notes == ()


@pytest.mark.parametrize(
    ("labels", "playbooks"),
    [
        ({"alertname": "KubePodCrashLooping", "pod": POD, "namespace": "serving"}, "restart_pod"),
        ({"alertname": "gpu_xid", "node": NODE, "xid": "79"}, "evict_gpu_pods"),
    ],
)
def test_a_webhook_alert_alone_decides_no_action(
    doctor: RankerDiagnostician, labels: dict[str, str], playbooks: str
) -> None:
    signal = "pod_crashloop" if "pod" in labels else "gpu_xid"
    evidence = {"xid": 79} if signal == "gpu_xid" else {}
    forged = alert(signal, labels.get("pod", NODE), WEBHOOK, labels, **evidence)
    diagnosis = doctor.diagnose(incident(forged, labels=labels))
    assert no_action(diagnosis)
    assert NOT_CORROBORATED_NOTE in diagnosis.notes
    assert diagnosis.proposed_params == {}


def test_a_webhook_alert_corroborated_by_own_telemetry_acts_on_the_topology_target(
    doctor: RankerDiagnostician,
) -> None:
    own = alert("pod_crashloop", POD, KUBE, {"pod": POD, "namespace": "serving", "node": NODE}, reason="BackOff")
    # the webhook names another pod: its labels never choose the target
    pushed = alert("pod_crashloop", "victim-0", WEBHOOK, {"pod": "victim-0", "namespace": "kube-system"})
    diagnosis = doctor.diagnose(incident(pushed, own, labels={"pod": "victim-0"}))
    assert diagnosis.proposed_playbook is not None
    assert diagnosis.proposed_params.get("pod", POD) == POD
    assert "victim-0" not in diagnosis.proposed_params.values()


def test_playbook_params_come_only_from_own_telemetry() -> None:
    pushed = alert("gpu_xid", NODE, WEBHOOK, {"node": "victim-node"})
    own = alert("gpu_xid", GPU, DCGM, {"Hostname": NODE, "UUID": GPU}, xid=79)
    ev = gather_evidence(incident(pushed, own, labels={"node": "victim-node"}))
    assert playbook_params("cordon_node", ev) == {"node": NODE}
    assert playbook_params("cordon_node", gather_evidence(incident(pushed))) == {}


def test_a_gpu_fault_claimed_only_in_app_text_gets_no_node_action(doctor: RankerDiagnostician) -> None:
    # an app line a GPU runbook lists, with no XID or ECC signal from DCGM or the kernel
    line = "RuntimeError: CUDA error: uncorrectable ECC error encountered"
    crash = alert("log_new_template", POD, APP, {"pod": POD, "node": NODE}, template=line, example=line)
    diagnosis = doctor.diagnose(incident(crash))
    assert "evict_gpu_pods" in NODE_GPU_PLAYBOOKS and diagnosis.proposed_playbook not in NODE_GPU_PLAYBOOKS


def test_a_deployment_target_comes_from_the_pod_names_of_own_alerts() -> None:
    # vLLM pods carry no deployment label; rollback_deployment was dropped for want of its target
    from services.core.events import AlertRef, IncidentEvent, Provenance
    from services.diagnostician.evidence import condense
    from services.diagnostician.ranker import playbook_params

    own = Provenance(source="kube_api", trusted=("topology",))
    alert = AlertRef(
        fingerprint="f1",
        entity="llama-70b-int4-7m6ppjfgdw-rjxrd",
        signal="revision_regression",
        detector="revision_rules",
        severity="warning",
        starts_at=1.0,
        labels={"pod": "llama-70b-int4-7m6ppjfgdw-rjxrd", "namespace": "llm-serving"},
        provenance=own,
    )
    incident = IncidentEvent(
        incident_id="inc-1", kind="opened", severity="warning", title="t", alerts=(alert,), opened_at=1.0, ts=1.0
    )
    params = playbook_params("rollback_deployment", condense(incident, {}))
    assert params == {"namespace": "llm-serving", "deployment": "llama-70b-int4"}


def _condensed(ev: Any) -> tuple[Any, ...]:
    return (ev.signals, ev.xids, ev.metrics, ev.event_reasons, ev.scope, ev.log_lines, ev.untrusted, ev.facts)


def test_condense_reads_the_alerts_from_the_tool_results_so_recorded_output_replays() -> None:
    from services.diagnostician.evidence import ToolResult, condense

    kernel = alert("gpu_xid", GPU, KERNEL, {"node": NODE, "pod": POD}, xid=79, example=XID_LINE)
    echo = alert("untrusted_xid_text", POD, APP, {"pod": POD, "node": NODE}, example=f"prompt: '{XID_LINE}'")
    live = gather_evidence(incident(kernel, echo))
    # the results as a recording keeps them (JSON), condensed for an incident event that lists no alert
    recorded = {name: ToolResult.model_validate_json(r.model_dump_json()) for name, r in live.results.items()}
    replayed = condense(incident(), recorded)
    assert _condensed(replayed) == _condensed(live)
    assert replayed.xids == {79} and XID_TEXT_NOTE in replayed.untrusted  # provenance came with the records


def test_without_the_anomalies_result_condense_reads_the_incident_s_own_alerts() -> None:
    from services.diagnostician.evidence import ToolResult, condense

    kernel = alert("gpu_xid", GPU, KERNEL, {"node": NODE}, xid=79, example=XID_LINE)
    live = gather_evidence(incident(kernel))
    # the anomalies tool failed (its history query hit a broken database): the diagnosis still has its alerts
    broken = {**live.results, "incident_anomalies": ToolResult(tool="incident_anomalies", status="error", error="x")}
    assert _condensed(condense(incident(kernel), broken)) == _condensed(live)
    assert _condensed(condense(incident(kernel), {})) == _condensed(live)
