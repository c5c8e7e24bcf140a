"""XID catalog mapping and the DCGM XID rule detector, over a made-up catalog (tests/made_up_xids.py).

What NVIDIA's own catalog says about each XID is checked by the data tier (tests/data/test_xid_catalog.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.detectors.rules_xid import XidDetector, XidState
from pipelines.detectors.xid_catalog import XidCatalog, classify
from services.core.errors import ConfigError
from services.core.events import MetricBatch, Sample
from tests.made_up_xids import APP_CODE, REBOOT_CODE, RESET_CODE, made_up_xid_catalog

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
    return made_up_xid_catalog()  # NVIDIA's catalog is tests/data's (test_xid_catalog.py)


def run(detector: XidDetector, values: list[float], t0: float = 1000.0, step: float = 15.0) -> list[tuple[float, int]]:
    state = detector.initial_state()
    fired = []
    for k, v in enumerate(values):
        state, anomalies = detector.detect([dcgm(v, t0 + k * step)], state)
        fired += [(a.ts, int(a.evidence["xid"])) for a in anomalies]
    return fired


# ---------------------------------------------------------------------------------- catalog


def test_codes_without_nvidia_resolution_fall_back_to_gpud() -> None:
    assert classify("", ("RebootSystem",), "Warning") == ("reboot_node", "warning")
    assert classify("", ("HardwareInspection",), "Fatal") == ("inspect_hardware", "critical")
    assert classify("", (), "Info") == ("none", "info")


def test_unknown_code_pages_a_human(catalog: XidCatalog) -> None:
    entry = catalog.get(12345)
    assert (entry.action, entry.remediation) == ("contact_support", "page_oncall")


def test_missing_catalog_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nvidia_xid_catalog\.csv"):
        XidCatalog.load(tmp_path)
    with pytest.raises(ConfigError):
        XidDetector(catalog_path=tmp_path / "nope")


def test_catalog_loads_without_the_gpud_policy(tmp_path: Path) -> None:
    (tmp_path / "nvidia_xid_catalog.csv").write_text(
        "Code,Mnemonic,Description,ImmediateResolution,InvestigatoryResolution\n"
        f"{REBOOT_CODE},TEST_ONLY_REBOOT,made-up XID for tests,RESTART_BM,CONTACT_SUPPORT\n"
    )
    catalog = XidCatalog.load(tmp_path)
    assert catalog.get(REBOOT_CODE).remediation == "reboot_node"


# --------------------------------------------------------------------------------- detector


def test_new_xid_fires_once_with_catalog_evidence(catalog: XidCatalog) -> None:
    detector = XidDetector(catalog=catalog)
    _, anomalies = detector.detect([dcgm(0, 100.0), dcgm(REBOOT_CODE, 115.0)], detector.initial_state())
    assert len(anomalies) == 1
    a = anomalies[0]
    assert (a.detector, a.signal, a.entity, a.entity_kind) == ("xid_rules", "gpu_xid", UUID, "gpu")
    assert a.severity == "critical"
    assert a.ts == 115.0
    assert a.evidence["xid"] == REBOOT_CODE
    assert a.evidence["mnemonic"] == "TEST_ONLY_REBOOT"
    assert a.evidence["description"] == f"made-up XID {REBOOT_CODE} for tests"
    assert a.evidence["required_action"] == "reboot_node"
    assert a.evidence["remediation"] == "reboot_node"
    assert a.evidence["labels"]["UUID"] == UUID
    assert a.labels["node"] == "gpu-node-7"
    assert a.labels["pod"] == "vllm-llama-0"
    assert a.labels["namespace"] == "llm-serving"
    assert a.fingerprint and len(a.fingerprint) == 16


def test_a_code_the_catalog_lacks_still_fires_and_pages_a_human(catalog: XidCatalog) -> None:
    detector = XidDetector(catalog=catalog)
    (a,) = detector.detect([dcgm(0, 100.0), dcgm(12345, 115.0)], detector.initial_state())[1]
    assert (a.evidence["xid"], a.evidence["mnemonic"], a.evidence["remediation"]) == (12345, "UNKNOWN", "page_oncall")


def test_healthy_gpu_is_quiet(catalog: XidCatalog) -> None:
    assert run(XidDetector(catalog=catalog), [0.0] * 50) == []


def test_sticky_gauge_fires_only_on_change(catalog: XidCatalog) -> None:
    fired = run(XidDetector(catalog=catalog), [0, APP_CODE, APP_CODE, APP_CODE, APP_CODE, REBOOT_CODE, REBOOT_CODE])
    assert [code for _, code in fired] == [APP_CODE, REBOOT_CODE]


def test_same_xid_back_within_hold_is_a_repeat(catalog: XidCatalog) -> None:
    detector = XidDetector(catalog=catalog, hold_s=60.0)
    # step 15 s: the code at t=1015, cleared, back at t=1045 (held), cleared, back at t=1105 (fires again)
    x = REBOOT_CODE
    fired = run(detector, [0, x, 0, x, 0, 0, 0, x])
    assert fired == [(1015.0, x), (1105.0, x)]


def test_both_hostname_spellings_give_the_node(catalog: XidCatalog) -> None:
    detector = XidDetector(catalog=catalog)
    for label in ("Hostname", "hostname"):
        _, anomalies = detector.detect([dcgm(RESET_CODE, 10.0, host_label=label)], detector.initial_state())
        assert anomalies[0].labels["node"] == "gpu-node-7"
        assert anomalies[0].evidence["labels"][label] == "gpu-node-7"


def test_state_survives_json(catalog: XidCatalog) -> None:
    detector = XidDetector(catalog=catalog)
    state, _ = detector.detect([dcgm(REBOOT_CODE, 10.0)], detector.initial_state())
    restored = XidState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state
    _, anomalies = detector.detect([dcgm(REBOOT_CODE, 25.0)], restored)
    assert anomalies == []


def test_late_scrape_is_ignored(catalog: XidCatalog) -> None:
    detector = XidDetector(catalog=catalog)
    state, _ = detector.detect([dcgm(0, 100.0)], detector.initial_state())
    state, anomalies = detector.detect([dcgm(REBOOT_CODE, 90.0)], state)
    assert anomalies == []
