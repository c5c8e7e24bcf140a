"""Each fault type shows its causal symptoms in the right signals.

The faults that raise an XID (xid, ecc's double-bit error, nvlink_error's XID 74) take its message and
effect from NVIDIA's catalog in ../shared/data: they are the data tier's (tests/data/test_sim_xid_faults.py).
"""

from __future__ import annotations

import pytest

from services.simulator.scenario import load_scenario
from services.simulator.simulator import Simulator
from tests.sim_telemetry import kube as _kube
from tests.sim_telemetry import logs as _logs
from tests.sim_telemetry import run as _run
from tests.sim_telemetry import score
from tests.sim_telemetry import values as _values


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


def test_thermal_throttle_drops_clocks() -> None:
    sim, ev = _run("thermal_throttle", 900)
    uuid = sim.fault_list()[0].entity
    temps = _values(ev, "DCGM_FI_DEV_GPU_TEMP", uuid)
    reasons = _values(ev, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", uuid)
    clocks = _values(ev, "DCGM_FI_DEV_SM_CLOCK", uuid)
    assert max(temps) >= 88
    assert any(int(r) & 0x40 for r in reasons)
    assert min(c for c in clocks if c > 500) < 1980


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
    "engine_dead",
    "kv_cache_exhaustion",
    "nccl_timeout",
    "network_latency",
    "node_flapping",
    "pending_pods",
    "thermal_throttle",
    "vram_leak",
]  # and the XID ones in tests/data/test_sim_xid_faults.py


@pytest.mark.slow  # two 900 s episodes each, about 1 s a scenario
@pytest.mark.parametrize("name", FAULT_SCENARIOS)
def test_noop_scores_lower_under_fault(name: str) -> None:
    assert score(name) < score("baseline")
