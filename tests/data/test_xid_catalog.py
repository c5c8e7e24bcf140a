"""NVIDIA's XID catalog, read from ../shared/data/xid: what it makes of each XID, and who relies on it.

The detector's mechanics are unit-tested on a made-up catalog (tests/unit/test_rules_xid.py); here the
real rows decide the action, severity and playbook, and the runbooks may cite only XIDs NVIDIA lists.
"""

from __future__ import annotations

import pytest

from pipelines.detectors.rules_xid import XidDetector
from pipelines.detectors.xid_catalog import XidCatalog
from services.core.events import MetricBatch, Sample
from services.core.paths import REPO_ROOT
from services.diagnostician.runbooks import load_runbooks

UUID = "GPU-5c1f3f0e-aaaa-bbbb-cccc-000000000003"


def dcgm(xid: float, ts: float) -> MetricBatch:
    labels = {"gpu": "3", "UUID": UUID, "Hostname": "gpu-node-7", "pod": "vllm-llama-0", "namespace": "llm-serving"}
    return MetricBatch(entity=UUID, samples=(Sample(name="DCGM_FI_DEV_XID_ERRORS", labels=labels, value=xid, ts=ts),))


def test_catalog_reads_every_nvidia_row(nvidia_xid_catalog: XidCatalog) -> None:
    assert len(nvidia_xid_catalog) >= 170
    assert nvidia_xid_catalog.get(79).mnemonic == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"


def test_the_default_catalog_is_the_shared_one(nvidia_xid_catalog: XidCatalog) -> None:
    assert XidCatalog.load().entries == nvidia_xid_catalog.entries
    assert XidDetector().catalog.entries == nvidia_xid_catalog.entries


def test_xid_79_needs_a_node_reboot_and_is_critical(nvidia_xid_catalog: XidCatalog) -> None:
    entry = nvidia_xid_catalog.get(79)
    assert entry.action == "reboot_node"
    assert entry.remediation == "reboot_node"
    assert entry.severity == "critical"
    assert "RebootSystem" in entry.gpud_repair_actions


@pytest.mark.parametrize("code", [13, 31, 43])
def test_application_xids_point_at_restarting_the_pod(nvidia_xid_catalog: XidCatalog, code: int) -> None:
    entry = nvidia_xid_catalog.get(code)
    assert entry.app_level
    assert entry.remediation == "restart_pod"
    assert entry.severity in ("info", "warning")


@pytest.mark.parametrize("code", [48, 64, 74, 95, 119, 140])
def test_gpu_level_xids_reset_the_gpu_critically(nvidia_xid_catalog: XidCatalog, code: int) -> None:
    entry = nvidia_xid_catalog.get(code)
    assert (entry.remediation, entry.severity) == ("reset_gpu", "critical")


def test_every_remediation_is_a_known_playbook(nvidia_xid_catalog: XidCatalog) -> None:
    playbooks = {None, "restart_pod", "reset_gpu", "reboot_node", "drain_node", "page_oncall"}
    assert {e.remediation for e in nvidia_xid_catalog.entries.values()} <= playbooks


def test_an_xid_79_anomaly_carries_nvidia_s_description_and_resolution(nvidia_xid_catalog: XidCatalog) -> None:
    detector = XidDetector(catalog=nvidia_xid_catalog)
    _, (a,) = detector.detect([dcgm(0, 100.0), dcgm(79, 115.0)], detector.initial_state())
    assert (a.signal, a.severity, a.labels["node"]) == ("gpu_xid", "critical", "gpu-node-7")
    assert a.evidence["description"] == "GPU has fallen off the bus"
    assert (a.evidence["required_action"], a.evidence["remediation"]) == ("reboot_node", "reboot_node")


def test_every_xid_a_runbook_cites_exists_in_the_nvidia_catalog(nvidia_xid_catalog: XidCatalog) -> None:
    runbooks = load_runbooks(REPO_ROOT / "knowledge" / "runbooks")
    cited = {code for rb in runbooks for code in rb.signals.xid}
    assert cited, "no runbook cites an XID"
    missing = sorted(cited - set(nvidia_xid_catalog.entries))
    assert not missing, f"XIDs not in NVIDIA's catalog: {missing}"
