"""GPU metrics read straight from the NVIDIA driver (NVML), named and labelled like dcgm-exporter.

Most clusters run NVIDIA's dcgm-exporter and ClusterMedic ingests it through Prometheus. Some nodes
have no DCGM (a bare VM, a workstation, a cluster that never installed the GPU operator). For those,
``medic ingest nvml`` runs this collector: it reads each GPU through NVML every interval and

* serves the readings as Prometheus text exposition (``/metrics``) with dcgm-exporter's metric
  names, units and labels (``gpu``, ``UUID``, ``device``, ``modelName``, ``Hostname``, ``pci_bus_id``,
  ``DCGM_FI_DRIVER_VERSION``), so dashboards and our detectors need no second vocabulary;
* and/or publishes them to ``telemetry.metrics.v1`` as metric batches keyed by GPU UUID.

Units follow DCGM, not NVML: memory in MiB (NVML gives bytes; "used" leaves out the driver's
reservation, as nvidia-smi and DCGM do), power in W (NVML gives mW), energy in mJ, clocks in MHz,
temperature in °C. ``DCGM_FI_DEV_XID_ERRORS`` is the last XID the driver reported for the GPU (0 until
one arrives), as in dcgm-exporter; XIDs are read from NVML's critical-error events.

A field the driver does not support on a GPU (ECC on a consumer card, NVLink on a PCIe card, row
remapping before Ampere) is tried once, then left out of that GPU's readings and listed in
:attr:`NvmlCollector.unsupported`. This module imports only the standard library at load time and
``pynvml`` (package ``nvidia-ml-py``) when a collector opens, so it runs on any GPU host.
"""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

MIB = 1024 * 1024


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here: no ``pynvml`` package, no driver library, or no GPU."""


@dataclass(frozen=True)
class Field:
    """One DCGM field and how to read it from NVML."""

    name: str
    kind: str  # "gauge" or "counter", as dcgm-exporter declares it
    help: str
    read: Callable[[Any, Any], float]  # (pynvml module, device handle) -> value in DCGM's unit


@dataclass(frozen=True)
class GpuSample:
    """One reading: a DCGM metric of one GPU."""

    name: str
    labels: dict[str, str]
    value: float


def _memory(nv: Any, h: Any) -> Any:
    """Framebuffer memory with the driver's reservation apart, as DCGM and nvidia-smi count it.

    NVML's first memory call counts the reservation (about 600 MiB on an H200) as used; the v2 call
    (drivers >= R510) reports it separately. Older drivers fall back to v1 (no ``reserved``).
    """
    version = getattr(nv, "nvmlMemory_v2", None)
    if version is not None:
        try:
            return nv.nvmlDeviceGetMemoryInfo(h, version=version)
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) not in (nv.NVML_ERROR_FUNCTION_NOT_FOUND, nv.NVML_ERROR_NOT_SUPPORTED):
                raise
    return nv.nvmlDeviceGetMemoryInfo(h)


def _reserved(nv: Any, h: Any) -> float:
    memory = _memory(nv, h)
    if not hasattr(memory, "reserved"):
        raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
    return float(memory.reserved / MIB)


def _remapped(nv: Any, h: Any, index: int) -> float:
    # (correctable rows, uncorrectable rows, remap pending, remap failed)
    return float(nv.nvmlDeviceGetRemappedRows(h)[index])


def _nvlink_errors(counter: int) -> Callable[[Any, Any], float]:
    """Sum of one NVLink error counter over the GPU's active links (NVLink-less GPUs: unsupported)."""

    def read(nv: Any, h: Any) -> float:
        total, active = 0, 0
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                if nv.nvmlDeviceGetNvLinkState(h, link) != nv.NVML_FEATURE_ENABLED:
                    continue
            except nv.NVMLError:
                break  # past the last link this GPU has
            active += 1
            total += nv.nvmlDeviceGetNvLinkErrorCounter(h, link, counter)
        if not active:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
        return float(total)

    return read


def _fields() -> tuple[Field, ...]:
    """The collected fields: dcgm-exporter's default counters that NVML can answer, plus health ones."""
    return (
        Field("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).",
              lambda nv, h: float(nv.nvmlDeviceGetUtilizationRates(h).gpu)),
        Field("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).",
              lambda nv, h: float(nv.nvmlDeviceGetUtilizationRates(h).memory)),
        Field("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).",
              lambda nv, h: _memory(nv, h).used / MIB),
        Field("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).",
              lambda nv, h: _memory(nv, h).free / MIB),
        Field("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved by the driver (in MiB).", _reserved),
        Field("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).",
              lambda nv, h: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))),
        Field("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).",
              lambda nv, h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
        Field("DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "Enforced power limit (in W).",
              lambda nv, h: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0),
        Field("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ).",
              lambda nv, h: float(nv.nvmlDeviceGetTotalEnergyConsumption(h))),
        Field("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).",
              lambda nv, h: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))),
        Field("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).",
              lambda nv, h: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))),
        Field("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "Current clock throttle reasons (bitmask).",
              lambda nv, h: float(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))),
        Field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.",
              lambda nv, h: float(nv.nvmlDeviceGetPcieReplayCounter(h))),
        Field("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Single-bit volatile ECC errors.",
              lambda nv, h: float(nv.nvmlDeviceGetTotalEccErrors(
                  h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC))),
        Field("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Double-bit volatile ECC errors.",
              lambda nv, h: float(nv.nvmlDeviceGetTotalEccErrors(
                  h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC))),
        Field("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Rows remapped for correctable errors.",
              lambda nv, h: _remapped(nv, h, 0)),
        Field("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Rows remapped for uncorrectable errors.",
              lambda nv, h: _remapped(nv, h, 1)),
        Field("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Row remapping pending (needs a GPU reset).",
              lambda nv, h: _remapped(nv, h, 2)),
        Field("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Row remapping failed.",
              lambda nv, h: _remapped(nv, h, 3)),
        Field("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "NVLink flow-control CRC errors.",
              lambda nv, h: _nvlink_errors(nv.NVML_NVLINK_ERROR_DL_CRC_FLIT)(nv, h)),
        Field("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter", "NVLink data CRC errors.",
              lambda nv, h: _nvlink_errors(nv.NVML_NVLINK_ERROR_DL_CRC_DATA)(nv, h)),
        Field("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "NVLink replay errors.",
              lambda nv, h: _nvlink_errors(nv.NVML_NVLINK_ERROR_DL_REPLAY)(nv, h)),
        Field("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", "NVLink recovery errors.",
              lambda nv, h: _nvlink_errors(nv.NVML_NVLINK_ERROR_DL_RECOVERY)(nv, h)),
    )


FIELDS = _fields()
XID_FIELD = Field("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", lambda nv, h: 0.0)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class _Gpu:
    index: int
    handle: Any
    labels: dict[str, str]
    events: Any = None  # NVML event set for XID critical errors, None where unsupported
    last_xid: int = 0
    skip: set[str] = field(default_factory=set)


class NvmlCollector:
    """Reads every GPU of this host through NVML.

    Args:
        hostname: the ``Hostname`` label (default: this host's name, as dcgm-exporter does; in
            Kubernetes pass the node name).
        nvml: the ``pynvml`` module; tests pass a stand-in for the driver.
    """

    def __init__(self, hostname: str | None = None, nvml: Any = None) -> None:
        self.hostname = hostname or socket.gethostname()
        self._nv = nvml
        self._gpus: list[_Gpu] = []
        self.unsupported: dict[str, list[str]] = {}  # GPU UUID -> fields its driver refused
        self.xid_events = False

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> NvmlCollector:
        """Initialise NVML and enumerate the GPUs; raises :class:`NvmlUnavailable` with the reason."""
        if self._nv is None:
            try:
                import pynvml
            except ImportError as exc:  # pragma: no cover - it is in the lock
                raise NvmlUnavailable("the nvidia-ml-py package is not installed") from exc
            self._nv = pynvml
        nv = self._nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise NvmlUnavailable(
                f"NVML could not start ({exc}); is the NVIDIA driver installed and a GPU visible?"
            ) from exc
        driver = _text(nv.nvmlSystemGetDriverVersion())
        count = nv.nvmlDeviceGetCount()
        if count == 0:
            nv.nvmlShutdown()
            raise NvmlUnavailable("NVML found no GPU on this host")
        for index in range(count):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            labels = {
                "gpu": str(index),
                "UUID": _text(nv.nvmlDeviceGetUUID(handle)),
                "device": f"nvidia{index}",
                "modelName": _text(nv.nvmlDeviceGetName(handle)),
                "Hostname": self.hostname,
                "pci_bus_id": _text(nv.nvmlDeviceGetPciInfo(handle).busId),
                "DCGM_FI_DRIVER_VERSION": driver,
            }
            gpu = _Gpu(index, handle, labels)
            try:
                gpu.events = nv.nvmlEventSetCreate()
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, gpu.events)
                self.xid_events = True
            except nv.NVMLError:
                gpu.events = None  # e.g. inside some sandboxes: XID then comes from the kernel log only
            self._gpus.append(gpu)
        return self

    def close(self) -> None:
        """Release the event sets and shut NVML down."""
        if self._nv is None or not self._gpus:
            return
        for gpu in self._gpus:
            if gpu.events is not None:
                try:
                    self._nv.nvmlEventSetFree(gpu.events)
                except self._nv.NVMLError:
                    pass
        self._gpus = []
        self._nv.nvmlShutdown()

    def __enter__(self) -> NvmlCollector:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def gpus(self) -> list[dict[str, str]]:
        """The labels of each GPU found."""
        return [dict(g.labels) for g in self._gpus]

    # ------------------------------------------------------------------ reading

    def _drain_xids(self, gpu: _Gpu) -> None:
        nv = self._nv
        while gpu.events is not None:
            try:
                data = nv.nvmlEventSetWait(gpu.events, 0)
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) != nv.NVML_ERROR_TIMEOUT:
                    gpu.events = None  # broken event set: stop asking rather than fail every read
                return
            if data.eventType & nv.nvmlEventTypeXidCriticalError:
                gpu.last_xid = int(data.eventData)

    def collect(self) -> list[GpuSample]:
        """One reading of every supported field of every GPU."""
        if not self._gpus:
            raise NvmlUnavailable("the collector is not open")
        nv = self._nv
        out: list[GpuSample] = []
        for gpu in self._gpus:
            for f in FIELDS:
                if f.name in gpu.skip:
                    continue
                try:
                    value = f.read(nv, gpu.handle)
                except nv.NVMLError as exc:
                    if getattr(exc, "value", None) in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_NO_PERMISSION,
                                                       nv.NVML_ERROR_FUNCTION_NOT_FOUND):
                        gpu.skip.add(f.name)
                        self.unsupported.setdefault(gpu.labels["UUID"], []).append(f.name)
                    continue  # a transient error: this reading goes without the field
                if math.isfinite(value):
                    out.append(GpuSample(f.name, gpu.labels, value))
            if gpu.events is not None:
                self._drain_xids(gpu)
                out.append(GpuSample(XID_FIELD.name, gpu.labels, float(gpu.last_xid)))
        return out


# ---------------------------------------------------------------------------- output formats


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def exposition(samples: Sequence[GpuSample]) -> str:
    """Prometheus text exposition (format 0.0.4) of one reading, grouped by metric with HELP/TYPE."""
    meta = {f.name: f for f in (*FIELDS, XID_FIELD)}
    by_name: dict[str, list[GpuSample]] = {}
    for s in samples:
        by_name.setdefault(s.name, []).append(s)
    lines: list[str] = []
    for name, group in by_name.items():
        f = meta.get(name)
        if f is not None:
            lines.append(f"# HELP {name} {f.help}")
            lines.append(f"# TYPE {name} {f.kind}")
        for s in group:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in s.labels.items())
            value = repr(int(s.value)) if s.value.is_integer() else repr(s.value)
            lines.append(f"{name}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


Series = list[tuple[dict[str, str], list[tuple[float, float]]]]


def series(samples: Iterable[GpuSample], ts: float | None = None) -> Series:
    """The reading as ``(labels with __name__, [(value, ts)])`` series, the shape the ingest normaliser takes."""
    at = time.time() if ts is None else ts
    return [({"__name__": s.name, **s.labels}, [(s.value, at)]) for s in samples]
