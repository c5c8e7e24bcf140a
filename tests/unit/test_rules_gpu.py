"""GPU health rules over DCGM metrics."""

from __future__ import annotations

import json

from pipelines.detectors.rules_gpu import GpuRuleDetector, GpuRulesState, throttle_reason_names
from services.core.events import Anomaly, MetricBatch, Sample

UUID = "GPU-11111111-2222-3333-4444-555555555555"

HEALTHY = {
    "DCGM_FI_DEV_GPU_TEMP": 62.0,
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 0.0,
    "DCGM_FI_DEV_FB_USED": 73000.0,
    "DCGM_FI_DEV_FB_FREE": 8559.0,
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 4.0,
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0.0,
    "DCGM_FI_DEV_ROW_REMAP_PENDING": 0.0,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0.0,
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 0.0,
}


def scrape(
    ts: float, host_label: str = "Hostname", model: str = "NVIDIA H100 80GB HBM3", **values: float
) -> MetricBatch:
    labels = {
        "gpu": "0",
        "UUID": UUID,
        "modelName": model,
        host_label: "gpu-node-1",
        "pod": "vllm-0",
        "namespace": "ns",
    }
    merged = {**HEALTHY, **values}
    return MetricBatch(
        entity=UUID, samples=tuple(Sample(name=n, labels=labels, value=v, ts=ts) for n, v in merged.items())
    )


def feed(detector: GpuRuleDetector, series: list[dict[str, float]], step: float = 15.0) -> list[Anomaly]:
    state = detector.initial_state()
    out: list[Anomaly] = []
    for k, values in enumerate(series):
        state, anomalies = detector.detect([scrape(1000.0 + k * step, **values)], state)
        out += anomalies
    return out


def firing(anomalies: list[Anomaly]) -> list[str]:
    return [a.signal for a in anomalies if a.status == "firing"]


def test_healthy_gpu_is_quiet() -> None:
    series = [{"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 4.0 + (k // 20)} for k in range(200)]
    assert feed(GpuRuleDetector(), series) == []


def test_sbe_rate_fires_over_window_and_resolves() -> None:
    detector = GpuRuleDetector(sbe_window_s=60.0, sbe_threshold=50.0, sbe_burst_threshold=None)
    totals = [10, 10, 30, 50, 70, 70, 70, 70, 70, 70]
    anomalies = feed(detector, [{"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": float(t)} for t in totals])
    fired = [a for a in anomalies if a.signal == "ecc_sbe_rate"]
    assert [a.status for a in fired] == ["firing", "resolved"]
    assert fired[0].score == 60.0 and fired[0].threshold == 50.0
    assert fired[0].ts == 1000.0 + 4 * 15.0


def test_counter_reset_is_not_an_alarm() -> None:
    detector = GpuRuleDetector(sbe_window_s=600.0, sbe_threshold=50.0)
    # The driver reloads: SBE and DBE counters fall to 0, then the SBE one creeps up slowly.
    series = [
        {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 4000.0, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 3.0},
        {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 4000.0, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 3.0},
        {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 0.0, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0.0},
        {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 2.0, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0.0},
        {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 3.0, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0.0},
    ]
    assert feed(detector, series) == []


def test_dbe_increase_is_critical_and_held() -> None:
    detector = GpuRuleDetector(dbe_hold_s=60.0)
    totals = [0, 0, 1, 2, 2, 2, 2, 2, 3]
    anomalies = feed(detector, [{"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": float(t)} for t in totals])
    dbe = [a for a in anomalies if a.signal == "ecc_dbe"]
    # t=1030 fires; t=1045 is within the 60 s hold; t=1120 fires again.
    assert [a.ts for a in dbe] == [1030.0, 1120.0]
    assert all(a.severity == "critical" and a.entity_kind == "gpu" for a in dbe)


def test_row_remap_pending_and_failure() -> None:
    series = [{}, {"DCGM_FI_DEV_ROW_REMAP_PENDING": 1.0}, {"DCGM_FI_DEV_ROW_REMAP_PENDING": 1.0}]
    series.append({"DCGM_FI_DEV_ROW_REMAP_FAILURE": 1.0})
    anomalies = feed(GpuRuleDetector(), series)
    assert [(a.signal, a.status, a.severity) for a in anomalies] == [
        ("row_remap_pending", "firing", "warning"),
        ("row_remap_pending", "resolved", "warning"),
        ("row_remap_failure", "firing", "critical"),
    ]


def test_thermal_bits_sustained_fire_once() -> None:
    detector = GpuRuleDetector(thermal_samples=3)
    hot = {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": float(0x40 | 0x20)}
    anomalies = feed(detector, [{}, hot, hot, hot, hot, hot, {}])
    thermal = [a for a in anomalies if a.signal == "gpu_thermal_throttle"]
    assert [(a.status, a.ts) for a in thermal] == [("firing", 1045.0), ("resolved", 1090.0)]
    assert thermal[0].evidence["reasons"] == ["SW_THERMAL_SLOWDOWN", "HW_THERMAL_SLOWDOWN"]


def test_two_hot_samples_are_not_sustained() -> None:
    hot = {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 8.0}
    assert feed(GpuRuleDetector(thermal_samples=3), [hot, hot, {}, hot, hot, {}]) == []


def test_temperature_over_model_slowdown_fires_without_bits() -> None:
    detector = GpuRuleDetector(thermal_samples=2)
    assert detector.slowdown_for("NVIDIA L40S") == 95.0
    anomalies = feed(detector, [{"DCGM_FI_DEV_GPU_TEMP": 90.0}] * 3)
    assert firing(anomalies) == ["gpu_thermal_throttle"]
    assert anomalies[0].evidence["slowdown_temp_c"] == 89.0
    # 90 °C is fine for an L40S
    state = detector.initial_state()
    for k in range(3):
        state, out = detector.detect([scrape(k * 15.0, model="NVIDIA L40S", DCGM_FI_DEV_GPU_TEMP=90.0)], state)
        assert out == []


def test_power_cap_is_info_and_power_brake_is_warning() -> None:
    capped = {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 4.0}
    braked = {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": float(0x80)}
    detector = GpuRuleDetector(power_samples=2)
    assert [(a.signal, a.severity) for a in feed(detector, [capped] * 3)] == [("gpu_power_throttle", "info")]
    assert [(a.signal, a.severity) for a in feed(detector, [braked] * 3)] == [("gpu_power_throttle", "warning")]
    assert throttle_reason_names(0x80 | 0x1) == ["GPU_IDLE", "HW_POWER_BRAKE_SLOWDOWN"]


def test_idle_gpu_is_not_throttled() -> None:
    assert feed(GpuRuleDetector(), [{"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 1.0}] * 10) == []


def test_nvlink_errors_rise_fires_and_reset_does_not() -> None:
    detector = GpuRuleDetector(nvlink_window_s=60.0, nvlink_threshold=100.0)
    crc = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
    anomalies = feed(detector, [{crc: v} for v in (0.0, 40.0, 90.0, 160.0)])
    assert firing(anomalies) == ["nvlink_errors"]
    assert anomalies[0].score == 160.0 and anomalies[0].severity == "warning"
    assert feed(detector, [{crc: v} for v in (5000.0, 5000.0, 0.0, 10.0)]) == []


def test_nvlink_recovery_error_is_critical() -> None:
    rec = "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"
    anomalies = feed(GpuRuleDetector(), [{rec: 0.0}, {rec: 1.0}])
    assert [(a.signal, a.severity) for a in anomalies] == [("nvlink_errors", "critical")]


def test_vram_pressure_sustained() -> None:
    full = {"DCGM_FI_DEV_FB_USED": 80000.0, "DCGM_FI_DEV_FB_FREE": 1559.0}
    anomalies = feed(GpuRuleDetector(vram_samples=3), [full, full, full, full])
    assert firing(anomalies) == ["vram_pressure"]
    assert anomalies[0].score > 0.95 and anomalies[0].threshold == 0.95
    assert anomalies[0].ts == 1030.0


def test_both_hostname_spellings_give_the_node() -> None:
    detector = GpuRuleDetector(thermal_samples=1)
    for label in ("Hostname", "hostname"):
        batch = scrape(0.0, host_label=label, DCGM_FI_DEV_CLOCK_THROTTLE_REASONS=64.0)
        _, anomalies = detector.detect([batch], detector.initial_state())
        assert anomalies[0].labels["node"] == "gpu-node-1"
        assert anomalies[0].labels["UUID"] == UUID
        assert anomalies[0].entity == UUID


def test_gpu_off_the_bus_keeps_its_conditions() -> None:
    detector = GpuRuleDetector(thermal_samples=1)
    state, anomalies = detector.detect([scrape(0.0, DCGM_FI_DEV_CLOCK_THROTTLE_REASONS=64.0)], detector.initial_state())
    assert firing(anomalies) == ["gpu_thermal_throttle"]
    only_xid = MetricBatch(
        entity=UUID, samples=(Sample(name="DCGM_FI_DEV_XID_ERRORS", labels={"UUID": UUID}, value=79, ts=15.0),)
    )
    state, anomalies = detector.detect([only_xid], state)
    assert anomalies == []
    assert state.gpus[UUID].conditions["gpu_thermal_throttle"].active


def test_fingerprint_is_stable_across_firings() -> None:
    detector = GpuRuleDetector(thermal_samples=1)
    hot, cool = {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 64.0}, {}
    anomalies = feed(detector, [hot, cool, hot])
    assert len({a.fingerprint for a in anomalies}) == 1


def test_state_survives_json() -> None:
    detector = GpuRuleDetector(thermal_samples=2)
    hot = {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 64.0, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 9.0}
    state, _ = detector.detect([scrape(0.0, **hot)], detector.initial_state())
    restored = GpuRulesState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state
    _, anomalies = detector.detect([scrape(15.0, **hot)], restored)
    assert firing(anomalies) == ["gpu_thermal_throttle"]
