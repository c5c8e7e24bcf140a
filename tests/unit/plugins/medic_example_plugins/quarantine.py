"""A playbook with typed parameters: keep new replicas off a GPU whose PCIe link is failing."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.remediation.actuators.base import Actuator
from services.remediation.model import ActionSpec, PrecheckResult, Step, Targets, VerifySpec
from services.remediation.playbook import Playbook, PlaybookParams, require


class PcieQuarantineParams(PlaybookParams):
    """Parameters of :class:`PcieQuarantinePlaybook`."""

    gpu: str = Field(min_length=1, description="the GPU's UUID (the entity of its PCIe alert)")


class PcieQuarantinePlaybook(Playbook[PcieQuarantineParams]):
    """Cordon the node of a GPU whose PCIe link keeps replaying, so no new replica lands on it.

    Use when PCIe replays burst on one GPU (a reseat or a riser swap is due): running replicas keep
    serving, and the hardware ticket can wait for a maintenance window. Rollback uncordons the node,
    unless it was cordoned before the run.
    """

    name = "pcie_quarantine"
    level = 2

    def targets(self, params: PcieQuarantineParams) -> Targets:
        return Targets(namespace=params.namespace, gpus=(params.gpu,))

    def precheck(self, params: PcieQuarantineParams, actuator: Actuator) -> PrecheckResult:
        if reason := require(actuator, "cordon_node", "uncordon_node"):
            return PrecheckResult(ok=False, reason=reason)
        gpu = actuator.describe("gpu", params.gpu, params.namespace)
        if gpu is None:
            return PrecheckResult(ok=False, reason=f"GPU {params.gpu} not found")
        node = actuator.describe("node", gpu["node"], params.namespace) or {}
        return PrecheckResult(ok=True, observed={"node": gpu["node"], "schedulable": bool(node.get("schedulable"))})

    def steps(self, params: PcieQuarantineParams, observed: dict[str, Any]) -> list[Step]:
        node = observed["node"]
        return [
            Step(
                name="cordon",
                action=ActionSpec(op="cordon_node", target=node),
                verify=VerifySpec(check="node_unschedulable", target=node),
                timeout_s=60.0,
            )
        ]

    def rollback(self, params: PcieQuarantineParams, observed: dict[str, Any]) -> list[Step]:
        if not observed.get("schedulable"):
            return []  # cordoned before the run: someone meant it
        node = observed["node"]
        return [
            Step(
                name="uncordon",
                action=ActionSpec(op="uncordon_node", target=node),
                verify=VerifySpec(check="node_schedulable", target=node),
                timeout_s=60.0,
            )
        ]
