"""The simulator's XID faults, whose kernel messages and effects come from NVIDIA's catalog in ../shared/data.

The other fault types are unit-tested (tests/unit/test_sim_faults.py, tests/unit/test_sim_core.py).
"""

from __future__ import annotations

import pytest

from services.core.events import MetricBatch
from services.simulator.scenario import load_scenario
from services.simulator.simulator import Simulator
from services.simulator.sinks import MemorySink
from tests.sim_telemetry import kube, logs, run, score, values


def test_xid79_gpu_falls_off_the_bus() -> None:
    sim, ev = run("xid79")
    fault = sim.fault_list()[0]
    uuid = fault.entity
    assert 79 in values(ev, "DCGM_FI_DEV_XID_ERRORS", uuid)
    lines = logs(ev, ": 79, pid=")
    assert lines and "GPU has fallen off the bus." in lines[0].line and "NVRM: Xid (PCI:0000:" in lines[0].line
    backoff = kube(ev, "BackOff")
    assert backoff, "the pod on the GPU must crash"
    assert sim.grade().errors > 0
    # Without a reboot the GPU stays broken: the pod keeps failing.
    assert fault.status == "active"


def test_xid48_needs_gpu_reset_and_counts_dbe() -> None:
    sim, ev = run("xid48")
    uuid = sim.fault_list()[0].entity
    assert max(values(ev, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", uuid)) >= 1
    assert 1 in values(ev, "DCGM_FI_DEV_ROW_REMAP_PENDING", uuid)
    assert logs(ev, "double bit error")
    # the replica keeps crashing on start until someone resets the GPU
    assert logs(ev, "RuntimeError: CUDA error")
    assert sim.fault_list()[0].status == "active"


def test_xid13_app_crash_recovers_by_itself() -> None:
    sim, ev = run("xid13", 900)
    f = sim.fault_list()[0]
    assert 13 in values(ev, "DCGM_FI_DEV_XID_ERRORS", f.entity)
    assert f.status == "resolved" and f.resolved_by == "pod_restart"


def test_ecc_sbe_then_dbe() -> None:
    sim, ev = run("ecc", 700)
    uuid = sim.fault_list()[0].entity
    assert max(values(ev, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", uuid)) > 10
    assert 48 in values(ev, "DCGM_FI_DEV_XID_ERRORS", uuid)


def test_nvlink_errors_then_xid74() -> None:
    sim, ev = run("nvlink_error", 600)
    uuid = sim.fault_list()[0].entity
    assert max(values(ev, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", uuid)) > 100
    assert 74 in values(ev, "DCGM_FI_DEV_XID_ERRORS", uuid)


@pytest.mark.parametrize("name", ["ecc", "nvlink_error", "xid13", "xid48", "xid79"])
def test_noop_scores_lower_under_fault(name: str) -> None:
    assert score(name) < score("baseline")


def test_xid79_reboot_repairs_and_records_mttr() -> None:
    sim = Simulator(load_scenario("xid79"), seed=5, telemetry=False)
    sim.run(320)
    f = sim.fault_list()[0]
    assert f.status == "active"
    gpu = sim.cluster.gpu_by_uuid[f.entity]
    node = sim.cluster.nodes[int(sim.cluster.gpus.node[gpu])].name
    assert sim.mark_detected(f.id)
    assert sim.actions.reboot_node(node).accepted
    sim.run(1000)
    assert f.status == "resolved" and f.resolved_by == "reboot_node"
    s = f.summary()
    assert s["mttd_s"] is not None and s["mttr_s"] is not None and s["mttr_s"] > 180


def test_an_off_the_bus_gpu_s_telemetry_survives_revalidation_byte_for_byte() -> None:
    sink = MemorySink()
    Simulator(load_scenario("xid79"), seed=0, sinks=[sink]).run(330)  # the GPU falls off the bus at 300 s
    off_bus = [e for e in sink.events if isinstance(e, MetricBatch) and len(e.samples) == 1]
    assert off_bus, "no batch of a GPU off the bus"
    for e in sink.events:
        twin = type(e).from_bytes(e.to_bytes())
        assert twin == e and twin.to_bytes() == e.to_bytes()
        if isinstance(e, MetricBatch):
            # pydantic turns ints and numpy scalars into float; so must the fast path
            assert all(type(x.value) is float and type(x.ts) is float for x in e.samples), e.entity
