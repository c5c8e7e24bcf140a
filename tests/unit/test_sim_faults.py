"""Each fault type shows its causal symptoms in the right signals."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from services.core.events import Event, KubeEvent, LogRecord, MetricBatch
from services.simulator.faults import catalog_available
from services.simulator.scenario import load_scenario
from services.simulator.simulator import Simulator
from services.simulator.sinks import MemorySink


def _run(name: str, seconds: float = 720.0) -> tuple[Simulator, list[Event]]:
    sink = MemorySink()
    sim = Simulator(load_scenario(name), seed=3, sinks=[sink])
    sim.run(seconds)
    return sim, sink.events


def _values(events: list[Event], metric: str, entity: str | None = None) -> list[float]:
    return [
        s.value
        for e in events
        if isinstance(e, MetricBatch) and (entity is None or e.entity == entity)
        for s in e.samples
        if s.name == metric
    ]


def _logs(events: list[Event], needle: str) -> list[LogRecord]:
    return [e for e in events if isinstance(e, LogRecord) and needle in e.line]


def _kube(events: list[Event], reason: str) -> list[KubeEvent]:
    return [e for e in events if isinstance(e, KubeEvent) and e.reason == reason]


def _needs_catalog() -> None:
    if not catalog_available():
        pytest.fail("shared data absent: the NVIDIA XID catalog (shared_data_dir()/xid/nvidia_xid_catalog.csv)")


def test_xid79_gpu_falls_off_the_bus() -> None:
    _needs_catalog()
    sim, ev = _run("xid79")
    fault = sim.fault_list()[0]
    uuid = fault.entity
    assert 79 in _values(ev, "DCGM_FI_DEV_XID_ERRORS", uuid)
    lines = _logs(ev, ": 79, pid=")
    assert lines and "GPU has fallen off the bus." in lines[0].line and "NVRM: Xid (PCI:0000:" in lines[0].line
    backoff = _kube(ev, "BackOff")
    assert backoff, "the pod on the GPU must crash"
    assert sim.grade().errors > 0
    # Without a reboot the GPU stays broken: the pod keeps failing.
    assert fault.status == "active"


def test_xid48_needs_gpu_reset_and_counts_dbe() -> None:
    _needs_catalog()
    sim, ev = _run("xid48")
    uuid = sim.fault_list()[0].entity
    assert max(_values(ev, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", uuid)) >= 1
    assert 1 in _values(ev, "DCGM_FI_DEV_ROW_REMAP_PENDING", uuid)
    assert _logs(ev, "double bit error")
    # the replica keeps crashing on start until someone resets the GPU
    assert _logs(ev, "RuntimeError: CUDA error")
    assert sim.fault_list()[0].status == "active"


def test_xid13_app_crash_recovers_by_itself() -> None:
    _needs_catalog()
    sim, ev = _run("xid13", 900)
    f = sim.fault_list()[0]
    assert 13 in _values(ev, "DCGM_FI_DEV_XID_ERRORS", f.entity)
    assert f.status == "resolved" and f.resolved_by == "pod_restart"


def test_vram_leak_ends_in_cuda_oom() -> None:
    sim, ev = _run("vram_leak", 900)
    f = sim.fault_list()[0]
    assert _logs(ev, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate")
    used = _values(ev, "DCGM_FI_DEV_FB_USED")
    assert max(used) > 0.95 * 81559
    assert _kube(ev, "BackOff")
    assert f.status == "resolved" and f.resolved_by == "crash"


def test_kv_cache_exhaustion_preempts_and_queues() -> None:
    _, ev = _run("kv_cache_exhaustion")
    assert max(_values(ev, "vllm:kv_cache_usage_perc")) > 0.9
    assert max(_values(ev, "vllm:num_preemptions_total")) > 0
    assert max(_values(ev, "vllm:num_requests_waiting")) > 5


def test_ecc_sbe_then_dbe() -> None:
    _needs_catalog()
    sim, ev = _run("ecc", 700)
    uuid = sim.fault_list()[0].entity
    assert max(_values(ev, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", uuid)) > 10
    assert 48 in _values(ev, "DCGM_FI_DEV_XID_ERRORS", uuid)


def test_thermal_throttle_drops_clocks() -> None:
    sim, ev = _run("thermal_throttle", 900)
    uuid = sim.fault_list()[0].entity
    temps = _values(ev, "DCGM_FI_DEV_GPU_TEMP", uuid)
    reasons = _values(ev, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", uuid)
    clocks = _values(ev, "DCGM_FI_DEV_SM_CLOCK", uuid)
    assert max(temps) >= 88
    assert any(int(r) & 0x40 for r in reasons)
    assert min(c for c in clocks if c > 500) < 1980


def test_nvlink_errors_then_xid74() -> None:
    _needs_catalog()
    sim, ev = _run("nvlink_error", 600)
    uuid = sim.fault_list()[0].entity
    assert max(_values(ev, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", uuid)) > 100
    assert 74 in _values(ev, "DCGM_FI_DEV_XID_ERRORS", uuid)


def test_nccl_timeout_stalls_then_aborts() -> None:
    sim, ev = _run("nccl_timeout", 600)
    assert _logs(ev, "Watchdog caught collective operation timeout")
    pod = sim.fault_list()[0].entity
    assert max(_values(ev, "vllm:num_requests_waiting", pod)) > 0
    assert sim.fault_list()[0].resolved_by == "crash"


def _baseline_grade(seconds: float = 900.0) -> float:
    return Simulator(load_scenario("baseline"), seed=3, telemetry=False).run(seconds).components["latency"]


def test_network_latency_raises_latency() -> None:
    sim = Simulator(load_scenario("network_latency"), seed=3, telemetry=False)
    assert sim.run(900).components["latency"] < _baseline_grade()


def test_node_flapping_emits_not_ready() -> None:
    sim, ev = _run("node_flapping", 600)
    node = sim.fault_list()[0].entity
    assert any(e.involved_object.name == node for e in _kube(ev, "NodeNotReady"))
    assert _kube(ev, "NodeReady")


def test_engine_dead_pod_ready_but_failing() -> None:
    sim, ev = _run("engine_dead", 600)
    pod = sim.fault_list()[0].entity
    assert _logs(ev, "EngineDeadError")
    assert sim.cluster.pod_by_name[pod].phase == "Running"
    assert sim.grade().errors > 50
    assert not [e for e in _kube(ev, "BackOff") if e.involved_object.name == pod]


def test_bad_rollout_regresses_latency() -> None:
    _, ev = _run("bad_rollout", 900)
    assert _kube(ev, "ScalingReplicaSet") and _kube(ev, "Killing")
    sim = Simulator(load_scenario("bad_rollout"), seed=3, telemetry=False)
    assert sim.run(900).components["latency"] < _baseline_grade()


def test_pending_pods_failed_scheduling() -> None:
    _, ev = _run("pending_pods", 600)
    msgs = [e.message for e in _kube(ev, "FailedScheduling")]
    assert msgs and "Insufficient nvidia.com/gpu" in msgs[0]


FAULT_SCENARIOS = [
    "bad_rollout",
    "ecc",
    "engine_dead",
    "kv_cache_exhaustion",
    "nccl_timeout",
    "network_latency",
    "node_flapping",
    "nvlink_error",
    "pending_pods",
    "thermal_throttle",
    "vram_leak",
    "xid13",
    "xid48",
    "xid79",
]


@pytest.mark.parametrize("name", FAULT_SCENARIOS)
def test_noop_scores_lower_under_fault(name: str) -> None:
    if name.startswith("xid") or name in ("ecc", "nvlink_error"):
        _needs_catalog()
    score: Callable[[str], float] = lambda n: Simulator(load_scenario(n), seed=3, telemetry=False).run(900).score  # noqa: E731
    assert score(name) < score("baseline")
