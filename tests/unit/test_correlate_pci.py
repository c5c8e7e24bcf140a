"""A kernel-log XID names its GPU by PCI address only: correlate resolves the address to the GPU's UUID
from what a trusted GPU source (DCGM, NVML) said, so the XID joins the GPU's incident and names the GPU
as a target; no other source can use the mapping."""

from __future__ import annotations

from pipelines.correlate.correlator import Correlator, TopologyFilter
from pipelines.correlate.topology import Topology
from pipelines.detectors.logtemplates import LogTemplateDetector
from services.alerting.config import loads_routing
from services.alerting.labels import alert_fingerprint
from services.core.events import (
    FACT_GPU_FAULT,
    FACT_TOPOLOGY,
    Anomaly,
    IncidentEvent,
    LogRecord,
    MetricBatch,
    Provenance,
    Sample,
)
from services.diagnostician.ranker import playbook_params
from services.diagnostician.tools import gather_evidence

ROUTING = loads_routing(
    """
global: {resolve_timeout: 1h}
route: {receiver: team, group_by: [alertname, node], group_wait: 10s, group_interval: 1m, repeat_interval: 1h}
receivers:
  - {name: team, webhook_configs: [{url: "http://127.0.0.1:9/hook"}]}
correlation:
  flap_detection: {enabled: false}
  topology: {window: 10m, fact_ttl: 24h}
"""
)
CLUSTER = "default"
NODE = "gpu-node-001"
GPU_X = "GPU-03994431-4d1e-9dd3-2756-82b62dc3bde1"
GPU_Y = "GPU-7a1c2b3d-0000-1111-2222-333344445555"
# DCGM exporter's form of the two GPUs' addresses; the kernel prints PCI:0000:3a:00 and PCI:0000:5d:00
PCI = {GPU_X: "00000000:3A:00.0", GPU_Y: "00000000:5D:00.0"}
DCGM = Provenance(source="dcgm", stream="dcgm-exporter", trusted=(FACT_GPU_FAULT, FACT_TOPOLOGY))
T0 = 1_760_000_000.0


def dcgm_labels(uuid: str, index: str) -> dict[str, str]:
    return {"gpu": index, "UUID": uuid, "pci_bus_id": PCI[uuid], "Hostname": NODE, "node": NODE, "modelName": "H100"}


def dcgm_alert(signal: str, uuid: str, ts: float) -> Anomaly:
    return Anomaly(
        entity=uuid,
        entity_kind="gpu",
        signal=signal,
        detector="gpu_rules",
        score=2.0,
        threshold=1.0,
        severity="warning",
        ts=ts,
        labels=dcgm_labels(uuid, "2" if uuid == GPU_X else "3"),
        provenance=DCGM,
    )


def kernel_xid(pci: str, ts: float, code: int = 48) -> Anomaly:
    """What the log detector makes of the node's kernel line, as ingest delivers it from Loki (no UUID)."""
    record = LogRecord(
        stream={"job": "node-journal", "unit": "kernel", "node": NODE, "Hostname": NODE},
        line=f"[ 4711.000042] NVRM: Xid (PCI:{pci}): {code}, pid=2345, name=python3, "
        "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at 0x0000",
        ts=ts,
        entity=NODE,
    )
    detector = LogTemplateDetector()
    _, found = detector.detect([record], detector.initial_state())
    (xid,) = [a for a in found if a.signal == "gpu_xid"]
    assert xid.provenance.source == "kernel_log" and xid.entity == NODE
    return xid


def app_log_quoting_xid(pci: str, ts: float) -> Anomaly:
    """A vLLM request log echoing a prompt that quotes the kernel line: never a GPU fault."""
    pod = "llama-8b-7d9f-abcde"
    record = LogRecord(
        stream={"namespace": "llm-serving", "pod": pod, "container": "vllm", "node": NODE},
        line=f'INFO Received request: prompt="NVRM: Xid (PCI:{pci}): 48, pid=1, name=python3, reset it"',
        ts=ts,
        entity=pod,
    )
    detector = LogTemplateDetector()
    _, found = detector.detect([record], detector.initial_state())
    (quoted,) = [a for a in found if a.signal == "untrusted_xid_text"]
    # even were the detector to put the address in its evidence, the source decides
    return quoted.model_copy(update={"evidence": {**quoted.evidence, "pci": pci}})


def incidents(actions: list) -> list[IncidentEvent]:
    return [a for a in actions if isinstance(a, IncidentEvent)]


def incident_of(c: Correlator, fingerprint: str) -> str:
    return c.engines[CLUSTER].alerts[fingerprint].incident_id or ""


# ------------------------------------------------------------------------------ correlation


def test_a_kernel_xid_joins_its_gpus_incident_not_an_older_one_of_another_gpu_on_the_node() -> None:
    c = Correlator(ROUTING, lambda: 0.0)
    # GPU-y's ECC errors opened an incident long ago; GPU-x's DCGM XID 48 is a new fault beside it
    # (a neighbour on the node joins only a young incident)
    older = incidents(c.ingest(CLUSTER, dcgm_alert("ecc_sbe_rate", GPU_Y, T0)))[0].incident_id
    c.ingest(CLUSTER, dcgm_alert("ecc_sbe_rate", GPU_Y, T0 + 900.0))
    ours = incidents(c.ingest(CLUSTER, dcgm_alert("gpu_xid", GPU_X, T0 + 1000.0)))[0].incident_id
    assert ours != older

    xid = kernel_xid("0000:3a:00", T0 + 1001.0)
    event = incidents(c.ingest(CLUSTER, xid))[-1]
    # the kernel's XID is GPU-x's: one incident with GPU-x's own alert (the node alone reaches every
    # GPU on it, so it used to join the oldest incident there: GPU-y's)
    assert event.incident_id == ours == incident_of(c, xid.fingerprint)
    ref = next(a for a in event.alerts if a.fingerprint == xid.fingerprint)
    assert ref.entity == GPU_X and ref.labels["UUID"] == GPU_X and ref.labels["node"] == NODE
    assert ref.provenance.source == "kernel_log"
    assert {a.signal for a in event.alerts} == {"gpu_xid"} and len(event.alerts) == 2


def test_a_kernel_xid_with_another_gpus_address_does_not_join_by_the_mapping() -> None:
    c = Correlator(ROUTING, lambda: 0.0)
    c.observe(CLUSTER, dcgm_labels(GPU_Y, "3"), T0)  # the correlate-topology agent's fact about GPU-y
    ours = incidents(c.ingest(CLUSTER, dcgm_alert("ecc_sbe_rate", GPU_X, T0)))[0].incident_id
    c.ingest(CLUSTER, dcgm_alert("ecc_sbe_rate", GPU_X, T0 + 900.0))  # still firing, 15 min on

    other = kernel_xid("0000:5d:00", T0 + 901.0)
    event = incidents(c.ingest(CLUSTER, other))[-1]
    assert event.kind == "opened" and event.incident_id != ours
    assert [(a.entity, a.labels.get("UUID")) for a in event.alerts] == [(GPU_Y, GPU_Y)]

    same = kernel_xid("0000:3a:00", T0 + 902.0)
    c.ingest(CLUSTER, same)
    assert incident_of(c, same.fingerprint) == ours  # same GPU: joins however old the incident is


def test_only_a_source_trusted_for_gpu_faults_is_resolved_or_teaches_an_address() -> None:
    c = Correlator(ROUTING, lambda: 0.0)
    c.ingest(CLUSTER, dcgm_alert("ecc_sbe_rate", GPU_X, T0))
    quoted = app_log_quoting_xid("0000:3a:00", T0 + 5.0)
    assert c.resolve(CLUSTER, quoted) is quoted
    webhook = Anomaly(
        entity=NODE,
        entity_kind="node",
        signal="gpu_xid",
        detector="alertmanager",
        score=1.0,
        threshold=1.0,
        ts=T0 + 6.0,
        labels={"node": NODE, "pci_bus_id": "0000:3a:00.0"},
        provenance=Provenance(source="alertmanager_webhook"),
    )
    assert c.resolve(CLUSTER, webhook) is webhook
    for anomaly in (quoted, webhook):
        c.ingest(CLUSTER, anomaly)
        alert = c.engines[CLUSTER].alerts[alert_fingerprint(anomaly)]
        assert alert.entity != GPU_X and "UUID" not in alert.labels

    # a webhook alert stating "GPU-evil is at 0000:5d:00" teaches nothing: a kernel XID there stays the node's
    lying = webhook.model_copy(
        update={"labels": {**dcgm_labels(GPU_Y, "3"), "UUID": "GPU-evil"}, "ts": T0 + 7.0, "signal": "ecc_dbe"}
    )
    c.ingest(CLUSTER, lying)
    assert c.resolve(CLUSTER, kernel_xid("0000:5d:00", T0 + 8.0)).entity == NODE


def test_the_address_of_a_gpu_comes_from_gpu_exporter_batches_only() -> None:
    facts = TopologyFilter()
    labels = dcgm_labels(GPU_X, "2")
    dcgm = MetricBatch(
        entity=GPU_X, source="dcgm", samples=(Sample(name="DCGM_FI_DEV_GPU_TEMP", labels=labels, value=60.0, ts=T0),)
    )
    other = MetricBatch(
        entity="exporter",
        source="prometheus",
        samples=(Sample(name="node_hwmon_temp", labels=labels, value=1.0, ts=T0),),
    )
    found = facts.facts(dcgm.to_bytes())
    assert found is not None and found[1]["pci_bus_id"] == PCI[GPU_X]
    found = facts.facts(other.to_bytes())
    assert found is not None and "pci_bus_id" not in found[1]


def test_addresses_expire_like_other_facts_survive_a_checkpoint_and_follow_a_replaced_board() -> None:
    topo = Topology()
    topo.learn_pci(dcgm_labels(GPU_X, "2"), T0)
    node = {"node": NODE}
    assert topo.gpu_by_pci(node, {"pci": "0000:3a:00"}) == GPU_X
    assert topo.gpu_by_pci({"node": "gpu-node-002"}, {"pci": "0000:3a:00"}) == ""  # another node's 3a:00
    assert topo.gpu_by_pci({**node, "UUID": GPU_Y}, {"pci": "0000:3a:00"}) == ""  # names its GPU already
    assert Topology.from_dict(topo.to_dict()).gpu_by_pci(node, {"pci": "3a:00.0"}) == GPU_X
    # a new board in the slot: the newest UUID at the address wins
    topo.learn_pci({**dcgm_labels(GPU_X, "2"), "UUID": "GPU-new"}, T0 + 60.0)
    assert topo.gpu_by_pci(node, {"pci": "0000:3a:00"}) == "GPU-new"
    topo.forget(T0 + 60.0 + 86399.0, 86400.0)
    assert topo.gpu_by_pci(node, {"pci": "0000:3a:00"}) == "GPU-new"
    topo.forget(T0 + 60.0 + 86400.0, 86400.0)
    assert topo.gpu_by_pci(node, {"pci": "0000:3a:00"}) == "" and not topo.gpu_pci


# ------------------------------------------------------------------------------ evidence tools


def test_the_evidence_tools_see_the_uuid_of_a_kernel_xids_gpu() -> None:
    c = Correlator(ROUTING, lambda: 0.0)
    c.observe(CLUSTER, dcgm_labels(GPU_X, "2"), T0)
    event = incidents(c.ingest(CLUSTER, kernel_xid("0000:3a:00", T0 + 1.0)))[-1]
    evidence = gather_evidence(event, tools=["topology", "incident_anomalies"])
    assert evidence.results["topology"].data["gpu"] == [GPU_X]
    assert evidence.results["topology"].data["node"] == [NODE]
    assert 48 in evidence.xids  # still a trusted kernel XID
    assert playbook_params("reset_gpu", evidence)["gpu"] == GPU_X  # the playbook that needs the UUID


def test_an_app_log_quoting_an_xid_never_names_the_gpu() -> None:
    c = Correlator(ROUTING, lambda: 0.0)
    c.observe(CLUSTER, dcgm_labels(GPU_X, "2"), T0)
    event = incidents(c.ingest(CLUSTER, app_log_quoting_xid("0000:3a:00", T0 + 1.0)))[-1]
    evidence = gather_evidence(event, tools=["topology", "incident_anomalies"])
    assert GPU_X not in evidence.results["topology"].data.get("gpu", [])
    assert "gpu" not in playbook_params("reset_gpu", evidence)
    assert not evidence.xids
