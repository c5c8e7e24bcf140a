"""`medic eval loop` on one short XID 79 episode, through the real Postgres (the loop's own database)."""

from __future__ import annotations

import pytest

from evals.loop import evaluate, scorecard
from services.core.settings import Settings

pytestmark = pytest.mark.integration


def test_an_xid79_gpu_loss_is_detected_diagnosed_its_replica_moved_and_scored(database_url: str) -> None:
    # 300 s of fault: enough for the XID to reach the kernel log, the incident to open, the lost replica to be
    # recreated on another node and load (about 3 minutes for a 70B replica), and the run to verify
    episodes = evaluate(Settings(database_url=database_url), [1], scenario="xid79", duration_s=600.0, progress=None)

    (episode,) = episodes
    (fault,) = episode.faults
    assert fault.fault_type == "xid" and fault.detected
    assert fault.cause == "gpu_xid_79" and fault.cause_right
    # the level-1 playbook of the XID 79 runbook, decided by policy and carried out by the executor
    evictions = [r for r in episode.runs if r.playbook == "evict_gpu_pods" and r.acted_at is not None]
    assert evictions and evictions[0].status == "succeeded"
    assert evictions[0].targets == ["gpu-node-000"]  # the GPU's node, from the topology
    assert fault.right_action == "evict_gpu_pods" and fault.mitigated_after_s is not None

    card = scorecard(episodes)["by_fault_type"]["xid"]
    assert card["detection_rate"] == 1.0 and card["root_cause_top1"] == 1.0 and card["right_action_rate"] == 1.0
    assert card["harmful"]["count"] == 0
    slo = card["slo_score"]
    # the replica is back on healthy GPUs minutes after the loss: at least what doing nothing scores (the
    # simulated traffic needs little of the second 70B replica, so not by much); the acting baselines
    # reboot the node and lose its replicas for minutes
    assert slo["clustermedic"] >= slo["noop"]
    assert slo["clustermedic"] > slo["static"] and slo["clustermedic"] > slo["autoscaler"]


def test_an_unknown_scenario_fails_before_any_database_work() -> None:
    from services.core.errors import ConfigError

    with pytest.raises(ConfigError):
        evaluate(Settings(database_url="postgresql://nowhere.invalid/none"), [1], scenario="no-such-scenario")
