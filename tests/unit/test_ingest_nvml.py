"""The NVML collector: DCGM names, units and labels; unsupported fields; XID events; serving and publishing.

NVML is the NVIDIA driver's library, so these tests stand in for the driver (a GPU is not part of CI);
the stand-in uses pynvml's own error class and constants, so error codes mean what they mean on a real
host. ``bench/gpu_nvml_check.py`` runs the real collector against a real GPU.
"""

from __future__ import annotations

import threading
import urllib.request
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from services.core.settings import Settings
from services.ingest.normalise import metric_batches
from services.ingest.nvml import NvmlCollector, NvmlUnavailable, exposition, series
from services.ingest.nvml_service import Exposition, run, serve_metrics

GIB = 1024**3


class Driver:
    """Two H100s as NVML reports them: bytes, milliwatts, one with ECC, neither with NVLink."""

    def __init__(self, gpus: int = 2, *, init_error: int | None = None) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlEventType", "nvmlMemory_v")):
                setattr(self, name, getattr(pynvml, name))
        self.NVMLError = pynvml.NVMLError
        self.count = gpus
        self.init_error = init_error
        self.calls: dict[str, int] = {}
        self.pending_xids: dict[int, list[int]] = {i: [] for i in range(gpus)}
        self.ecc_supported = {0: True, 1: False}
        self.flaky_util_once = False
        self.shut = False
        self.memory_v2 = True

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.95.05"

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-0000000{h}-aaaa-bbbb-cccc-dddddddddddd"

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"  # older pynvml returns bytes

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0")

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        self._count("util")
        if self.flaky_util_once:
            self.flaky_util_once = False
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return SimpleNamespace(gpu=87 + h, memory=41)

    def nvmlDeviceGetMemoryInfo(self, h: int, version: int | None = None) -> Any:
        if version is None:  # v1 counts the driver's reservation as used
            return SimpleNamespace(total=80 * GIB, used=61 * GIB, free=19 * GIB)
        if not self.memory_v2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        assert version == pynvml.nvmlMemory_v2
        return SimpleNamespace(total=80 * GIB, reserved=512 * 1024**2, used=60 * GIB + 512 * 1024**2, free=19 * GIB)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 71

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 512_345  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        return 123_456_789  # mJ

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619}[clock]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return 0x20  # SW thermal slowdown

    def nvmlDeviceGetPcieReplayCounter(self, h: int) -> int:
        return 0

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        self._count(f"ecc{h}")
        if not self.ecc_supported[h]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 3 if kind == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else 0

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        return (2, 0, 1, 0)

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlEventSetCreate(self) -> dict[str, int]:
        return {}

    def nvmlDeviceRegisterEvents(self, h: int, kinds: int, event_set: dict[str, int]) -> None:
        event_set["gpu"] = h

    def nvmlEventSetWait(self, event_set: dict[str, int], timeout_ms: int) -> Any:
        queue = self.pending_xids[event_set["gpu"]]
        if not queue:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return SimpleNamespace(eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=queue.pop(0))

    def nvmlEventSetFree(self, event_set: dict[str, int]) -> None:
        pass


def reading(samples: list[Any], name: str, gpu: str = "0") -> float:
    [value] = [s.value for s in samples if s.name == name and s.labels["gpu"] == gpu]
    return value


def test_readings_carry_dcgm_names_units_and_labels() -> None:
    with NvmlCollector("node-a", nvml=Driver()) as collector:
        samples = collector.collect()
    assert reading(samples, "DCGM_FI_DEV_FB_USED") == 60 * 1024 + 512  # MiB, not bytes; reservation apart
    assert reading(samples, "DCGM_FI_DEV_FB_RESERVED") == 512
    assert reading(samples, "DCGM_FI_DEV_FB_FREE") == 19 * 1024
    assert reading(samples, "DCGM_FI_DEV_POWER_USAGE") == pytest.approx(512.345)  # W, not mW
    assert reading(samples, "DCGM_FI_DEV_POWER_MGMT_LIMIT") == 700.0
    assert reading(samples, "DCGM_FI_DEV_GPU_UTIL", gpu="1") == 88
    assert reading(samples, "DCGM_FI_DEV_SM_CLOCK") == 1980
    assert reading(samples, "DCGM_FI_DEV_ROW_REMAP_PENDING") == 1
    assert reading(samples, "DCGM_FI_DEV_XID_ERRORS") == 0
    labels = next(s.labels for s in samples if s.labels["gpu"] == "1")
    assert labels == {
        "gpu": "1",
        "UUID": "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd",
        "device": "nvidia1",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "node-a",
        "pci_bus_id": "00000000:19:00.0",
        "DCGM_FI_DRIVER_VERSION": "580.95.05",
    }


def test_a_driver_without_the_v2_memory_call_falls_back_to_v1_without_reserved() -> None:
    driver = Driver()
    driver.memory_v2 = False
    with NvmlCollector("node-a", nvml=driver) as collector:
        samples = collector.collect()
    assert reading(samples, "DCGM_FI_DEV_FB_USED") == 61 * 1024
    assert not [s for s in samples if s.name == "DCGM_FI_DEV_FB_RESERVED"]
    assert "DCGM_FI_DEV_FB_RESERVED" in collector.unsupported["GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"]


def test_exposition_parses_with_types_and_one_series_per_gpu() -> None:
    with NvmlCollector("node-a", nvml=Driver()) as collector:
        text = exposition(collector.collect())
    families = {f.name: f for f in text_string_to_metric_families(text)}
    # the parser strips _total from counter names
    assert families["DCGM_FI_DEV_GPU_TEMP"].type == "gauge"
    assert families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "counter"
    temps = families["DCGM_FI_DEV_GPU_TEMP"].samples
    assert sorted(s.labels["gpu"] for s in temps) == ["0", "1"]
    assert all(s.value == 71 for s in temps)


def test_an_unsupported_field_is_tried_once_and_reported_a_transient_error_only_skips_one_reading() -> None:
    driver = Driver()
    with NvmlCollector("node-a", nvml=driver) as collector:
        first = collector.collect()
        driver.flaky_util_once = True
        second = collector.collect()
        third = collector.collect()
    assert reading(first, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", gpu="0") == 3
    assert not [s for s in first if s.name == "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" and s.labels["gpu"] == "1"]
    assert driver.calls["ecc1"] == 2  # SBE and DBE once each, then never again
    assert driver.calls["ecc0"] == 6
    uuid1 = "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd"
    assert set(collector.unsupported[uuid1]) >= {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"}
    assert "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL" in collector.unsupported[uuid1]
    # the unknown error dropped GPU 0's utilisation from one reading only
    assert not [s for s in second if s.name == "DCGM_FI_DEV_GPU_UTIL" and s.labels["gpu"] == "0"]
    assert reading(third, "DCGM_FI_DEV_GPU_UTIL", gpu="0") == 87


def test_xid_events_set_the_last_xid_of_their_gpu_only() -> None:
    driver = Driver()
    with NvmlCollector("node-a", nvml=driver) as collector:
        assert collector.xid_events
        driver.pending_xids[1] += [13, 79]
        first = collector.collect()
        later = collector.collect()
    assert reading(first, "DCGM_FI_DEV_XID_ERRORS", gpu="1") == 79
    assert reading(first, "DCGM_FI_DEV_XID_ERRORS", gpu="0") == 0
    assert reading(later, "DCGM_FI_DEV_XID_ERRORS", gpu="1") == 79  # the last one seen, as dcgm-exporter


@pytest.mark.parametrize(
    ("driver", "message"),
    [(Driver(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED), "NVML could not start"), (Driver(gpus=0), "no GPU")],
)
def test_no_driver_or_no_gpu_is_a_clear_error(driver: Driver, message: str) -> None:
    with pytest.raises(NvmlUnavailable, match=message):
        NvmlCollector(nvml=driver).open()


def test_readings_become_one_metric_batch_per_gpu() -> None:
    with NvmlCollector("node-a", nvml=Driver()) as collector:
        samples = collector.collect()
    batches, dropped = metric_batches(series(samples, ts=1_700_000_000.0), source="nvml", max_samples=1000)
    assert dropped == 0
    assert len(batches) == 2
    uuids = {s.labels["UUID"] for s in samples}
    assert {b.entity for b in batches} == uuids  # keyed by GPU UUID, like DCGM samples from remote_write
    assert sum(len(b.samples) for b in batches) == len(samples)
    assert all(s.ts == 1_700_000_000.0 for b in batches for s in b.samples)


def test_the_loop_serves_the_latest_reading_and_publishes_each_one() -> None:
    settings = Settings(ingest_nvml_interval_s=0.01)
    published: list[Any] = []
    latest = Exposition()
    server = serve_metrics("127.0.0.1:0", latest)
    try:
        with NvmlCollector("node-a", nvml=Driver()) as collector:
            stop = threading.Event()
            taken = run(settings, collector, publish=published.append, latest=latest, stop=stop, readings=3)
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as answer:
            assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            body = answer.read().decode()
    finally:
        server.shutdown()
    assert taken == 3
    assert len(published) == 3 and all(len(batches) == 2 for batches in published)
    assert 'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"' in body


def test_cli_says_why_when_this_host_has_no_nvidia_driver() -> None:
    from services.cli import app

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # a GPU host: the command must read it instead
        pynvml.nvmlShutdown()
        result = CliRunner().invoke(app, ["ingest", "nvml", "--once"])
        assert result.exit_code == 0 and "DCGM_FI_DEV_GPU_UTIL" in result.output
        return
    result = CliRunner().invoke(app, ["ingest", "nvml", "--once"])
    assert result.exit_code == 2
    assert "NVML could not start" in result.output
