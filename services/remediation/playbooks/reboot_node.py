"""Drain a node, reboot it, verify its GPUs, restore traffic."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.remediation.actuators.base import Actuator
from services.remediation.model import ActionSpec, PrecheckResult, Step, Targets, VerifySpec
from services.remediation.playbook import Playbook, require
from services.remediation.playbooks._node import (
    NodeParams,
    cordon,
    drain,
    node_targets,
    resolve_node,
    restore_schedulable,
    uncordon,
    was_schedulable,
)


class RebootNodeParams(NodeParams):
    """Parameters of :class:`RebootNodePlaybook`."""

    reboot_timeout_s: float = Field(default=900.0, gt=0)


class RebootNodePlaybook(Playbook):
    """Reboot a node: cordon, drain (PDB-aware), reboot, verify it is Ready with healthy GPUs, uncordon.

    Use for XIDs whose required action is "restart the bare-metal host / VM" (XID 79 GPU fallen off
    the bus, 119/120 GSP timeouts) and for a kubelet that keeps flapping. Every replica on the node
    moves and the node is gone for minutes, so it needs approval. Rollback uncordons the node. A node
    that was cordoned before the run stays cordoned, on success and on rollback.
    """

    name = "reboot_node"
    level = 2
    Params = RebootNodeParams

    def targets(self, params: Any) -> Targets:
        return node_targets(params)

    def precheck(self, params: Any, actuator: Actuator) -> PrecheckResult:
        if reason := require(actuator, "cordon_node", "drain_node", "reboot_node", "uncordon_node"):
            return PrecheckResult(ok=False, reason=reason)
        node, problem = resolve_node(params, actuator)
        if problem:
            return PrecheckResult(ok=False, reason=problem)
        view = actuator.describe("node", node, params.namespace) or {}
        if view.get("rebooting"):
            return PrecheckResult(ok=False, reason=f"node {node} is already rebooting")
        return PrecheckResult(ok=True, observed={"node": node, "schedulable": bool(view.get("schedulable", False))})

    def steps(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        node = observed["node"]
        return [
            cordon(node),
            drain(node, params.drain_timeout_s),
            Step(
                name="reboot",
                action=ActionSpec(op="reboot_node", target=node),
                wait_s=60.0,
                verify=VerifySpec(check="node_ready", target=node, params={"gpus_healthy": True}),
                timeout_s=params.reboot_timeout_s,
            ),
            *([uncordon(node)] if was_schedulable(observed) else []),
        ]

    def rollback(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        return restore_schedulable(observed)
