"""Drain a node, reset one GPU, restore traffic."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.remediation.actuators.base import Actuator
from services.remediation.model import ActionSpec, PrecheckResult, Step, Targets, VerifySpec
from services.remediation.playbook import Playbook, PlaybookParams, require
from services.remediation.playbooks._node import (
    cordon,
    drain,
    observe_node,
    restore_schedulable,
    uncordon,
    was_schedulable,
)


class ResetGpuParams(PlaybookParams):
    """Parameters of :class:`ResetGpuPlaybook`."""

    gpu: str = Field(min_length=1, description="GPU UUID")
    drain_timeout_s: float = Field(default=900.0, gt=0)
    reset_timeout_s: float = Field(default=180.0, gt=0)


class ResetGpuPlaybook(Playbook):
    """Reset one GPU (``nvidia-smi -r``): cordon and drain its node, reset, verify, uncordon.

    Use for XIDs whose required action is "reset GPU" (e.g. 48 double-bit ECC, 94/95 contained and
    uncontained ECC, NVLink errors). A GPU reset needs every process on the GPU gone, hence the drain.
    Verified when the GPU reports healthy with no pending XID. Rollback uncordons the node; a node
    that was cordoned before the run stays cordoned.
    """

    name = "reset_gpu"
    level = 2
    Params = ResetGpuParams

    def targets(self, params: Any) -> Targets:
        return Targets(namespace=params.namespace, gpus=(params.gpu,))

    def precheck(self, params: Any, actuator: Actuator) -> PrecheckResult:
        if reason := require(actuator, "cordon_node", "drain_node", "reset_gpu", "uncordon_node"):
            return PrecheckResult(ok=False, reason=reason)
        gpu = actuator.describe("gpu", params.gpu, params.namespace)
        if gpu is None:
            return PrecheckResult(ok=False, reason=f"GPU {params.gpu} not found")
        observed = observe_node(gpu["node"], actuator, params.namespace)
        return PrecheckResult(ok=True, observed={**observed, "xid": gpu.get("xid", 0)})

    def steps(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        node = observed["node"]
        return [
            cordon(node),
            drain(node, params.drain_timeout_s),
            Step(
                name="reset_gpu",
                action=ActionSpec(op="reset_gpu", target=params.gpu),
                wait_s=20.0,
                verify=VerifySpec(check="gpu_healthy", target=params.gpu),
                timeout_s=params.reset_timeout_s,
            ),
            *([uncordon(node)] if was_schedulable(observed) else []),
        ]

    def rollback(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        return restore_schedulable(observed)
