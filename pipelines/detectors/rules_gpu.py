"""GPU health rules over DCGM exporter metrics, one GPU (UUID) at a time.

===================== ======================================================= ==========
signal                when                                                    severity
===================== ======================================================= ==========
ecc_sbe_rate          ``DCGM_FI_DEV_ECC_SBE_VOL_TOTAL`` rose by >= sbe_threshold warning
                      within sbe_window_s, or by >= sbe_burst_threshold within
                      sbe_burst_window_s (a burst: a healthy GPU counts ~none)
ecc_dbe               ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` rose (any increase)    critical
row_remap_pending     ``DCGM_FI_DEV_ROW_REMAP_PENDING`` > 0                    warning
row_remap_failure     ``DCGM_FI_DEV_ROW_REMAP_FAILURE`` > 0                    critical
gpu_thermal_throttle  throttle reasons has HW_THERMAL (0x40), SW_THERMAL       warning
                      (0x20) or HW_SLOWDOWN (0x8), or ``DCGM_FI_DEV_GPU_TEMP``
                      >= the model's slowdown temperature, for thermal_samples
gpu_power_throttle    SW_POWER_CAP (0x4) or HW_POWER_BRAKE (0x80) for          info /
                      power_samples (warning when the power brake is on)      warning
nvlink_errors         NVLink CRC/replay errors rose by >= nvlink_threshold      warning /
                      within nvlink_window_s, or any recovery error           critical
gpu_temperature_rise  ``DCGM_FI_DEV_GPU_TEMP`` rose by >= temp_rise_c within      warning
                      temp_rise_window_s while the mean power of that window
                      is within temp_rise_power_w of the lower quartile of the
                      temp_rise_lookback_s before it (heat the load does not
                      explain: cooling)
vram_pressure         FB_USED / (FB_USED + FB_FREE [+ FB_RESERVED]) >          warning
                      vram_threshold for vram_samples
vram_leak             FB_USED of an engine already holding >= leak_loaded_frac  warning
                      of the card grew at each of leak_samples scrapes, by >=
                      leak_min_mib in all (vLLM allocates once, then stays flat)
===================== ======================================================= ==========

Counters are cumulative: a drop is a reset and counts nothing (see
:class:`~pipelines.detectors.rules_common.CounterTrack`). Every rule but ``ecc_dbe`` is a condition:
it fires once, stays quiet while it holds and sends a ``resolved`` anomaly when it clears. A rule
whose metrics are missing from a scrape (a GPU off the bus reports only its XID) is left as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, ClassVar

from pipelines.detectors.rules_common import (
    Condition,
    CounterTrack,
    Finding,
    Snapshot,
    findings_to_anomalies,
    forget_older,
    held_back,
    plain,
    snapshots,
    topology_labels,
)
from services.core.events import Anomaly, MetricBatch, Severity

DETECTOR_NAME = "gpu_rules"

SBE = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
DBE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
REMAP_PENDING = "DCGM_FI_DEV_ROW_REMAP_PENDING"
REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
# DCGM 3.3 renamed the throttle field to "clocks event reasons"; exporters write either.
THROTTLE_REASONS = ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"
SLOWDOWN_TEMP = "DCGM_FI_DEV_SLOWDOWN_TEMP"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
FB_RESERVED = "DCGM_FI_DEV_FB_RESERVED"
NVLINK_ERRORS = (
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
)
NVLINK_RECOVERY = "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"

# NVML clocks-throttle / clocks-event reason bits (nvml.h, nvmlClocksThrottleReason*).
THROTTLE_BITS: dict[int, str] = {
    0x1: "GPU_IDLE",
    0x2: "APPLICATIONS_CLOCKS_SETTING",
    0x4: "SW_POWER_CAP",
    0x8: "HW_SLOWDOWN",
    0x10: "SYNC_BOOST",
    0x20: "SW_THERMAL_SLOWDOWN",
    0x40: "HW_THERMAL_SLOWDOWN",
    0x80: "HW_POWER_BRAKE_SLOWDOWN",
    0x100: "DISPLAY_CLOCK_SETTING",
}
THERMAL_MASK = 0x40 | 0x20 | 0x8
POWER_MASK = 0x4 | 0x80
HW_POWER_BRAKE = 0x80

DEFAULT_SLOWDOWN_TEMPS: tuple[tuple[str, float], ...] = (
    # (substring of DCGM's modelName, ``nvidia-smi -q`` "GPU Slowdown Temp" in °C); first match wins.
    ("H100", 89.0),
    ("H200", 89.0),
    ("A100", 89.0),
    ("L40S", 95.0),
    ("L40", 95.0),
    ("L4", 95.0),
    ("A10", 95.0),
)


def throttle_reason_names(bits: int) -> list[str]:
    """Return the NVML reason names set in a throttle bitmask, lowest bit first."""
    return [name for bit, name in THROTTLE_BITS.items() if bits & bit]


@dataclass
class GpuHealth:
    """What the detector remembers about one GPU.

    Attributes:
        counters: counter metric name -> its track.
        conditions: signal -> its condition.
        fired: signal -> when an event-like signal (``ecc_dbe``) last fired.
        readings: gauge name -> recent ``[ts, value]`` pairs (temperature, power, framebuffer), oldest
            first, kept as long as the slowest rule reading them looks back.
        leak_from_mib: the framebuffer level a firing ``vram_leak`` grew from (None when not firing).
    """

    counters: dict[str, CounterTrack] = field(default_factory=dict)
    conditions: dict[str, Condition] = field(default_factory=dict)
    fired: dict[str, float] = field(default_factory=dict)
    readings: dict[str, list[list[float]]] = field(default_factory=dict)
    leak_from_mib: float | None = None

    def remember(self, name: str, value: float | None, ts: float, keep_s: float) -> list[list[float]]:
        """Append a gauge reading (when present) and return its readings of the last ``keep_s`` seconds."""
        series = self.readings.setdefault(name, [])
        if value is not None and (not series or ts > series[-1][0]):
            series.append([ts, float(value)])
        cut = ts - keep_s
        if series and series[0][0] < cut:
            series[:] = [r for r in series if r[0] >= cut]
        return series


@dataclass
class GpuRulesState:
    """The detector's state: one :class:`GpuHealth` per GPU UUID."""

    gpus: dict[str, GpuHealth] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return the state as JSON-compatible values."""
        return plain(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuRulesState:
        """Rebuild a state written by :meth:`to_dict`."""
        return cls(
            gpus={
                uuid: GpuHealth(
                    counters={k: CounterTrack.from_dict(v) for k, v in g.get("counters", {}).items()},
                    conditions={k: Condition.from_dict(v) for k, v in g.get("conditions", {}).items()},
                    fired={k: float(v) for k, v in g.get("fired", {}).items()},
                    readings={k: [[float(t), float(v)] for t, v in rows] for k, rows in g.get("readings", {}).items()},
                    leak_from_mib=g.get("leak_from_mib"),
                )
                for uuid, g in data.get("gpus", {}).items()
            }
        )


@dataclass(frozen=True)
class GpuRuleDetector:
    """GPU hardware-health rules: ECC, row remapping, thermal and power throttling, NVLink, VRAM.

    Attributes:
        sbe_window_s: window of the single-bit ECC rate (default 3600 s).
        sbe_threshold: SBEs within ``sbe_window_s`` that make a high rate (default 100).
        sbe_burst_window_s: the short window of the single-bit ECC rate (default 120 s).
        sbe_burst_threshold: SBEs within ``sbe_burst_window_s`` that also make a high rate, so a GPU
            that starts failing is reported in a minute, not when the hour's count catches up
            (default 10; ``None`` disables).
        dbe_hold_s: a GPU's ``ecc_dbe`` fires at most once in this many seconds (default 300 s).
        thermal_samples: consecutive throttled or hot samples for ``gpu_thermal_throttle`` (default 3).
        slowdown_temps: ``(modelName substring, slowdown °C)`` pairs, first match wins.
        default_slowdown_c: slowdown temperature of a model not in ``slowdown_temps`` (default 87 °C).
        temp_margin_c: fire this many degrees below the slowdown temperature (default 0).
        power_samples: consecutive power-capped samples for ``gpu_power_throttle`` (default 5).
        nvlink_window_s: window of the NVLink error count (default 300 s).
        nvlink_threshold: CRC + replay errors within the window that fire (default 100).
        vram_threshold: framebuffer share above which memory is under pressure (default 0.95).
        vram_samples: consecutive samples above it for ``vram_pressure`` (default 5).
        temp_rise_c: temperature rise within ``temp_rise_window_s`` that is suspicious (default 10 °C;
            ``None`` disables ``gpu_temperature_rise``).
        temp_rise_window_s: the window of the rise (default 60 s).
        temp_rise_lookback_s: how far before the window the power reference reaches (default 180 s,
            three thermal time constants, so the tail of an earlier load step has died out).
        temp_rise_power_w: mean power of the window may exceed the lookback's lower quartile by this
            much and the rise still counts as unexplained (default 100 W).
        leak_samples: consecutive framebuffer increases for ``vram_leak`` (default 3; ``None`` disables).
        leak_min_mib: total growth over those scrapes (default 256 MiB).
        leak_loaded_frac: share of the card the engine must already hold, so a model loading onto an
            empty GPU is not a leak (default 0.5).
        emit_resolved: send a ``resolved`` anomaly when a condition clears (default True).
    """

    name: ClassVar[str] = DETECTOR_NAME
    consumes: ClassVar[type] = MetricBatch
    signals: ClassVar[frozenset[str]] = frozenset(
        {
            "ecc_sbe_rate",
            "ecc_dbe",
            "row_remap_pending",
            "row_remap_failure",
            "gpu_thermal_throttle",
            "gpu_power_throttle",
            "nvlink_errors",
            "gpu_temperature_rise",
            "vram_pressure",
            "vram_leak",
        }
    )

    sbe_window_s: float = 3600.0
    sbe_threshold: float = 100.0
    dbe_hold_s: float = 300.0
    thermal_samples: int = 3
    slowdown_temps: tuple[tuple[str, float], ...] = DEFAULT_SLOWDOWN_TEMPS
    default_slowdown_c: float = 87.0
    temp_margin_c: float = 0.0
    power_samples: int = 5
    nvlink_window_s: float = 300.0
    nvlink_threshold: float = 100.0
    vram_threshold: float = 0.95
    vram_samples: int = 5
    sbe_burst_window_s: float = 120.0
    sbe_burst_threshold: float | None = 10.0
    temp_rise_c: float | None = 10.0
    temp_rise_window_s: float = 60.0
    temp_rise_lookback_s: float = 180.0
    temp_rise_power_w: float = 100.0
    leak_samples: int | None = 3
    leak_min_mib: float = 256.0
    leak_loaded_frac: float = 0.5
    emit_resolved: bool = True

    def initial_state(self) -> GpuRulesState:
        """Return an empty state."""
        return GpuRulesState()

    def slowdown_for(self, model_name: str) -> float:
        """Return the slowdown temperature (°C) for a DCGM ``modelName``."""
        for needle, temp in self.slowdown_temps:
            if needle.lower() in model_name.lower():
                return temp
        return self.default_slowdown_c

    def detect(self, batch: Sequence[Any], state: GpuRulesState) -> tuple[GpuRulesState, list[Anomaly]]:
        """Evaluate every rule on each GPU scrape in a micro-batch.

        Args:
            batch: :class:`~services.core.events.MetricBatch` items from DCGM (others are ignored).
            state: the state returned by the previous call (or :meth:`initial_state`).

        Returns:
            The updated state (changed in place) and the anomalies, oldest scrape first.
        """
        anomalies: list[Anomaly] = []
        for snap in snapshots(batch, entity_label="UUID"):
            if not any(name.startswith("DCGM_FI_") for name in snap.samples):
                continue
            gpu = state.gpus.setdefault(snap.entity, GpuHealth())
            findings = [
                *self._ecc(snap, gpu),
                *self._row_remap(snap, gpu),
                *self._throttle(snap, gpu),
                *self._nvlink(snap, gpu),
                *self._vram(snap, gpu),
                *self._temperature_rise(snap, gpu),
                *self._vram_leak(snap, gpu),
            ]
            labels = topology_labels(snap.labels())
            anomalies += findings_to_anomalies(
                findings,
                detector=DETECTOR_NAME,
                entity=snap.entity,
                entity_kind="gpu",
                ts=snap.ts,
                labels=labels,
                emit_resolved=self.emit_resolved,
            )
        return state, anomalies

    # -- rules

    @staticmethod
    def _counter(snap: Snapshot, gpu: GpuHealth, name: str, window_s: float) -> tuple[float, float] | None:
        """Fold a counter's sample (summed over its series) in; return (step increase, window increase)."""
        samples = snap.samples.get(name)
        if not samples:
            return None
        track = gpu.counters.setdefault(name, CounterTrack())
        step = track.update(sum(s.value for s in samples), snap.ts, window_s)
        return step, track.window_increase()

    def _ecc(self, snap: Snapshot, gpu: GpuHealth) -> list[Finding]:
        out: list[Finding] = []
        sbe = self._counter(snap, gpu, SBE, self.sbe_window_s)
        if sbe is not None:
            _, in_window = sbe
            in_burst = 0.0
            if self.sbe_burst_threshold is not None:
                # the same counter, tracked again over the short window
                track = gpu.counters.setdefault(SBE + "|burst", CounterTrack())
                samples = snap.samples.get(SBE) or []
                track.update(sum(s.value for s in samples), snap.ts, self.sbe_burst_window_s)
                in_burst = track.window_increase()
            burst = self.sbe_burst_threshold is not None and in_burst >= self.sbe_burst_threshold
            cond = gpu.conditions.setdefault("ecc_sbe_rate", Condition())
            change = cond.update(in_window >= self.sbe_threshold or burst, snap.ts, 1)
            if change is not None:
                # the score is measured against whichever window decided
                score, threshold = (in_burst, self.sbe_burst_threshold) if burst else (in_window, self.sbe_threshold)
                out.append(
                    Finding(
                        "ecc_sbe_rate",
                        change,
                        score,
                        float(threshold or 0.0),
                        "warning",
                        {
                            "sbe_increase": in_window,
                            "window_s": self.sbe_window_s,
                            "sbe_per_hour": in_window * 3600.0 / self.sbe_window_s,
                            "sbe_burst_increase": in_burst,
                            "burst_window_s": self.sbe_burst_window_s,
                            "sbe_total": snap.value(SBE),
                            "remediation": "drain_node",
                        },
                    )
                )
        dbe = self._counter(snap, gpu, DBE, self.dbe_hold_s)
        forget_older(gpu.fired, snap.ts, self.dbe_hold_s)
        if dbe is not None and dbe[0] > 0 and not held_back(gpu.fired, "ecc_dbe", snap.ts, self.dbe_hold_s):
            out.append(
                Finding(
                    "ecc_dbe",
                    "fire",
                    dbe[0],
                    1.0,
                    "critical",
                    {"dbe_increase": dbe[0], "dbe_total": snap.value(DBE), "remediation": "reset_gpu"},
                )
            )
        return out

    def _row_remap(self, snap: Snapshot, gpu: GpuHealth) -> list[Finding]:
        out: list[Finding] = []
        rules: tuple[tuple[str, str, Severity, str], ...] = (
            ("row_remap_pending", REMAP_PENDING, "warning", "reset_gpu"),
            ("row_remap_failure", REMAP_FAILURE, "critical", "drain_node"),
        )
        for signal, metric, severity, remediation in rules:
            value = snap.value(metric)
            if value is None:
                continue
            change = gpu.conditions.setdefault(signal, Condition()).update(value > 0, snap.ts, 1)
            if change is not None:
                evidence = {metric: value, "remediation": remediation}
                out.append(Finding(signal, change, value, 1.0, severity, evidence))
        return out

    def _throttle(self, snap: Snapshot, gpu: GpuHealth) -> list[Finding]:
        out: list[Finding] = []
        reasons_value = snap.value(*THROTTLE_REASONS)
        temp = snap.value(GPU_TEMP)
        reasons = int(reasons_value) if reasons_value is not None else None
        if reasons is not None or temp is not None:
            explicit = snap.value(SLOWDOWN_TEMP)
            slowdown = explicit if explicit else self.slowdown_for(snap.labels().get("modelName", ""))
            hot = temp is not None and temp >= slowdown - self.temp_margin_c
            thermal_bits = (reasons or 0) & THERMAL_MASK
            cond = gpu.conditions.setdefault("gpu_thermal_throttle", Condition())
            change = cond.update(bool(thermal_bits) or hot, snap.ts, self.thermal_samples)
            if change is not None:
                out.append(
                    Finding(
                        "gpu_thermal_throttle",
                        change,
                        float(cond.streak),
                        float(self.thermal_samples),
                        "warning",
                        {
                            "throttle_reasons": reasons,
                            "reasons": throttle_reason_names(reasons or 0),
                            "temp_c": temp,
                            "slowdown_temp_c": slowdown,
                            "since": cond.since,
                            "samples": cond.streak,
                        },
                    )
                )
        if reasons is not None:
            power_bits = reasons & POWER_MASK
            cond = gpu.conditions.setdefault("gpu_power_throttle", Condition())
            change = cond.update(bool(power_bits), snap.ts, self.power_samples)
            if change is not None:
                severity: Severity = "warning" if reasons & HW_POWER_BRAKE else "info"
                out.append(
                    Finding(
                        "gpu_power_throttle",
                        change,
                        float(cond.streak),
                        float(self.power_samples),
                        severity,
                        {
                            "throttle_reasons": reasons,
                            "reasons": throttle_reason_names(reasons),
                            "power_w": snap.value("DCGM_FI_DEV_POWER_USAGE"),
                            "since": cond.since,
                            "samples": cond.streak,
                        },
                    )
                )
        return out

    def _nvlink(self, snap: Snapshot, gpu: GpuHealth) -> list[Finding]:
        errors: dict[str, float] = {}
        for metric in NVLINK_ERRORS:
            counted = self._counter(snap, gpu, metric, self.nvlink_window_s)
            if counted is not None:
                errors[metric] = counted[1]
        recovery = self._counter(snap, gpu, NVLINK_RECOVERY, self.nvlink_window_s)
        if not errors and recovery is None:
            return []
        total = sum(errors.values())
        recovered = recovery[1] if recovery is not None else 0.0
        cond = gpu.conditions.setdefault("nvlink_errors", Condition())
        change = cond.update(total >= self.nvlink_threshold or recovered > 0, snap.ts, 1)
        if change is None:
            return []
        evidence: dict[str, Any] = {
            "window_s": self.nvlink_window_s,
            "errors_in_window": total,
            "recovery_errors_in_window": recovered,
            "by_counter": errors,
            "remediation": "reset_gpu",
        }
        return [
            Finding(
                "nvlink_errors",
                change,
                total,
                self.nvlink_threshold,
                "critical" if recovered > 0 else "warning",
                evidence,
            )
        ]

    def _vram(self, snap: Snapshot, gpu: GpuHealth) -> list[Finding]:
        used = snap.value(FB_USED)
        free = snap.value(FB_FREE)
        if used is None or free is None:
            return []
        total = used + free + (snap.value(FB_RESERVED) or 0.0)
        if total <= 0:
            return []
        ratio = used / total
        cond = gpu.conditions.setdefault("vram_pressure", Condition())
        change = cond.update(ratio > self.vram_threshold, snap.ts, self.vram_samples)
        if change is None:
            return []
        evidence = {"used_mib": used, "total_mib": total, "used_ratio": ratio, "since": cond.since}
        return [Finding("vram_pressure", change, ratio, self.vram_threshold, "warning", evidence)]

    def _temperature_rise(self, snap: Snapshot, gpu: GpuHealth) -> list[Finding]:
        """Heat the load does not explain: the temperature climbs while the power stays level.

        A GPU's temperature follows its power with a lag of about a minute. A failing fan or blocked
        airflow raises it at the same power, long before the slowdown temperature throttles clocks.
        The power reference is the lower quartile of the lookback before the window, so a load step
        (which raises the power first, and drives the temperature for minutes) is not mistaken for a
        cooling fault.
        """
        if self.temp_rise_c is None:
            return []
        keep = self.temp_rise_window_s + self.temp_rise_lookback_s
        temps = gpu.remember(GPU_TEMP, snap.value(GPU_TEMP), snap.ts, keep)
        powers = gpu.remember("DCGM_FI_DEV_POWER_USAGE", snap.value("DCGM_FI_DEV_POWER_USAGE"), snap.ts, keep)
        temp = snap.value(GPU_TEMP)
        if temp is None or not temps:
            return []
        start = snap.ts - self.temp_rise_window_s
        recent = [v for t, v in temps if t >= start]
        rise = temp - min(recent)
        window_power = [v for t, v in powers if t > start]
        reference_power = [v for t, v in powers if t <= start]
        covered = bool(temps) and temps[0][0] <= snap.ts - keep + 1e-6
        # against the lookback's lower quartile, so a load step anywhere in the lookback (an idle GPU
        # whose replica starts serving) still explains the heat it is still driving
        power_step = (
            sum(window_power) / len(window_power) - sorted(reference_power)[len(reference_power) // 4]
            if window_power and reference_power
            else 0.0
        )
        holds = covered and rise >= self.temp_rise_c and power_step <= self.temp_rise_power_w
        cond = gpu.conditions.setdefault("gpu_temperature_rise", Condition())
        # stays firing while it still climbs (half the rise within the window); a GPU that settles hot
        # is then gpu_thermal_throttle's to report
        change = cond.update(holds, snap.ts, 1, stays=holds or rise >= self.temp_rise_c / 2)
        if change is None:
            return []
        evidence = {
            "temp_c": temp,
            "rise_c": rise,
            "window_s": self.temp_rise_window_s,
            "power_step_w": power_step,
            "power_w": snap.value("DCGM_FI_DEV_POWER_USAGE"),
            "slowdown_temp_c": snap.value(SLOWDOWN_TEMP) or self.slowdown_for(snap.labels().get("modelName", "")),
            "remediation": "drain_node",
        }
        return [Finding("gpu_temperature_rise", change, rise, self.temp_rise_c, "warning", evidence)]

    def _vram_leak(self, snap: Snapshot, gpu: GpuHealth) -> list[Finding]:
        """Framebuffer that keeps growing under a running engine.

        vLLM allocates its share of the card when the engine starts (``gpu_memory_utilization``) and
        then stays flat, so steady growth from an already-loaded level is memory the process should
        not be taking. Growth from an almost empty card is a model loading and is ignored.
        """
        if self.leak_samples is None:
            return []
        used, free = snap.value(FB_USED), snap.value(FB_FREE)
        if used is None or free is None:
            return []
        total = used + free + (snap.value(FB_RESERVED) or 0.0)
        series = gpu.readings.setdefault(FB_USED, [])
        if series and snap.ts <= series[-1][0]:
            return []
        series.append([snap.ts, used])
        del series[: max(0, len(series) - (self.leak_samples + 1))]
        values = [v for _, v in series]
        growing = (
            len(values) == self.leak_samples + 1
            and all(b > a for a, b in pairwise(values))
            and values[-1] - values[0] >= self.leak_min_mib
            and total > 0
            and values[0] >= self.leak_loaded_frac * total
        )
        cond = gpu.conditions.setdefault("vram_leak", Condition())
        # keeps firing while the memory is still above where the growth began
        start = gpu.leak_from_mib
        change = cond.update(growing, snap.ts, 1, stays=growing or (start is not None and used > start))
        if change == "fire":
            gpu.leak_from_mib = values[0]
        elif change == "resolve":
            gpu.leak_from_mib = None
        if change is None:
            return []
        growth = values[-1] - values[0]
        seconds = series[-1][0] - series[0][0]
        evidence = {
            "used_mib": used,
            "total_mib": total,
            "growth_mib": growth,
            "over_s": seconds,
            "mib_per_s": growth / seconds if seconds > 0 else None,
            "started_from_mib": gpu.leak_from_mib if change == "fire" else start,
            "remediation": "restart_pod",
        }
        return [Finding("vram_leak", change, growth, self.leak_min_mib, "warning", evidence)]
