"""XID catalog mapping and the DCGM XID rule detector."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.detectors.rules_xid import XidDetector, XidState
from pipelines.detectors.xid_catalog import XidCatalog, classify
from services.core.errors import ConfigError
from services.core.events import MetricBatch, Sample

UUID = "GPU-5c1f3f0e-aaaa-bbbb-cccc-000000000003"


def dcgm(xid: float, ts: float, host_label: str = "Hostname", uuid: str = UUID) -> MetricBatch:
    labels = {
        "gpu": "3",
        "UUID": uuid,
        "modelName": "NVIDIA H100 80GB HBM3",
        host_label: "gpu-node-7",
        "pod": "vllm-llama-0",
        "namespace": "llm-serving",
    }
    return MetricBatch(entity=uuid, samples=(Sample(name="DCGM_FI_DEV_XID_ERRORS", labels=labels, value=xid, ts=ts),))


@pytest.fixture(scope="module")
def catalog() -> XidCatalog:
    return XidCatalog.load()


def run(detector: XidDetector, values: list[float], t0: float = 1000.0, step: float = 15.0) -> list[tuple[float, int]]:
    state = detector.initial_state()
    fired = []
    for k, v in enumerate(values):
        state, anomalies = detector.detect([dcgm(v, t0 + k * step)], state)
        fired += [(a.ts, int(a.evidence["xid"])) for a in anomalies]
    return fired


# ---------------------------------------------------------------------------------- catalog


def test_catalog_reads_every_nvidia_row(catalog: XidCatalog) -> None:
    assert len(catalog) >= 170
    assert catalog.get(79).mnemonic == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"


def test_xid_79_needs_a_node_reboot_and_is_critical(catalog: XidCatalog) -> None:
    entry = catalog.get(79)
    assert entry.action == "reboot_node"
    assert entry.remediation == "reboot_node"
    assert entry.severity == "critical"
    assert "RebootSystem" in entry.gpud_repair_actions


@pytest.mark.parametrize("code", [13, 31, 43])
def test_application_xids_point_at_restarting_the_pod(catalog: XidCatalog, code: int) -> None:
    entry = catalog.get(code)
    assert entry.app_level
    assert entry.remediation == "restart_pod"
    assert entry.severity in ("info", "warning")


@pytest.mark.parametrize("code", [48, 64, 74, 95, 119, 140])
def test_gpu_level_xids_reset_the_gpu_critically(catalog: XidCatalog, code: int) -> None:
    entry = catalog.get(code)
    assert (entry.remediation, entry.severity) == ("reset_gpu", "critical")


def test_every_remediation_is_a_known_playbook(catalog: XidCatalog) -> None:
    playbooks = {None, "restart_pod", "reset_gpu", "reboot_node", "drain_node", "page_oncall"}
    assert {e.remediation for e in catalog.entries.values()} <= playbooks


def test_codes_without_nvidia_resolution_fall_back_to_gpud() -> None:
    assert classify("", ("RebootSystem",), "Warning") == ("reboot_node", "warning")
    assert classify("", ("HardwareInspection",), "Fatal") == ("inspect_hardware", "critical")
    assert classify("", (), "Info") == ("none", "info")


def test_unknown_code_pages_a_human(catalog: XidCatalog) -> None:
    entry = catalog.get(9999)
    assert (entry.action, entry.remediation) == ("contact_support", "page_oncall")


def test_missing_catalog_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nvidia_xid_catalog\.csv"):
        XidCatalog.load(tmp_path)
    with pytest.raises(ConfigError):
        XidDetector(catalog_path=tmp_path / "nope")


def test_catalog_loads_without_the_gpud_policy(tmp_path: Path) -> None:
    (tmp_path / "nvidia_xid_catalog.csv").write_text(
        "Code,Mnemonic,Description,ImmediateResolution,InvestigatoryResolution\n"
        "79,FALLEN,GPU has fallen off the bus,RESTART_BM,CONTACT_SUPPORT\n"
    )
    catalog = XidCatalog.load(tmp_path)
    assert catalog.get(79).remediation == "reboot_node"


# --------------------------------------------------------------------------------- detector


def test_new_xid_fires_once_with_catalog_evidence(catalog: XidCatalog) -> None:
    detector = XidDetector(catalog=catalog)
    _, anomalies = detector.detect([dcgm(0, 100.0), dcgm(79, 115.0)], detector.initial_state())
    assert len(anomalies) == 1
    a = anomalies[0]
    assert (a.detector, a.signal, a.entity, a.entity_kind) == ("xid_rules", "gpu_xid", UUID, "gpu")
    assert a.severity == "critical"
    assert a.ts == 115.0
    assert a.evidence["xid"] == 79
    assert a.evidence["description"] == "GPU has fallen off the bus"
    assert a.evidence["required_action"] == "reboot_node"
    assert a.evidence["remediation"] == "reboot_node"
    assert a.evidence["labels"]["UUID"] == UUID
    assert a.labels["node"] == "gpu-node-7"
    assert a.labels["pod"] == "vllm-llama-0"
    assert a.labels["namespace"] == "llm-serving"
    assert a.fingerprint and len(a.fingerprint) == 16


def test_healthy_gpu_is_quiet(catalog: XidCatalog) -> None:
    assert run(XidDetector(catalog=catalog), [0.0] * 50) == []


def test_sticky_gauge_fires_only_on_change(catalog: XidCatalog) -> None:
    fired = run(XidDetector(catalog=catalog), [0, 13, 13, 13, 13, 79, 79])
    assert [code for _, code in fired] == [13, 79]


def test_same_xid_back_within_hold_is_a_repeat(catalog: XidCatalog) -> None:
    detector = XidDetector(catalog=catalog, hold_s=60.0)
    # step 15 s: 79 at t=1015, cleared, back at t=1045 (held), cleared, back at t=1105 (fires again)
    fired = run(detector, [0, 79, 0, 79, 0, 0, 0, 79])
    assert fired == [(1015.0, 79), (1105.0, 79)]


def test_both_hostname_spellings_give_the_node(catalog: XidCatalog) -> None:
    detector = XidDetector(catalog=catalog)
    for label in ("Hostname", "hostname"):
        _, anomalies = detector.detect([dcgm(48, 10.0, host_label=label)], detector.initial_state())
        assert anomalies[0].labels["node"] == "gpu-node-7"
        assert anomalies[0].evidence["labels"][label] == "gpu-node-7"


def test_state_survives_json(catalog: XidCatalog) -> None:
    detector = XidDetector(catalog=catalog)
    state, _ = detector.detect([dcgm(79, 10.0)], detector.initial_state())
    restored = XidState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state
    _, anomalies = detector.detect([dcgm(79, 25.0)], restored)
    assert anomalies == []


def test_late_scrape_is_ignored(catalog: XidCatalog) -> None:
    detector = XidDetector(catalog=catalog)
    state, _ = detector.detect([dcgm(0, 100.0)], detector.initial_state())
    state, anomalies = detector.detect([dcgm(79, 90.0)], state)
    assert anomalies == []
