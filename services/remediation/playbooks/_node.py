"""Shared pieces of the node playbooks: node parameters and the cordon / drain / uncordon steps.

A node playbook restores the node as it found it: the precheck records whether the node was
schedulable (:func:`observe_node`), and neither the rollback nor the playbook's own last step
uncordons a node that was already cordoned before the run (a human may have cordoned it on purpose).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from services.remediation.actuators.base import Actuator
from services.remediation.model import ActionSpec, Step, Targets, VerifySpec
from services.remediation.playbook import PlaybookParams


class NodeParams(PlaybookParams):
    """A node, named directly or through one of its GPUs (the entity of an XID alert)."""

    node: str = ""
    gpu: str = Field(default="", description="GPU UUID; its node is looked up in the precheck")
    drain_timeout_s: float = Field(default=900.0, gt=0)

    @model_validator(mode="after")
    def _node_or_gpu(self) -> NodeParams:
        if not self.node and not self.gpu:
            raise ValueError("give node or gpu")
        return self


def node_targets(params: Any) -> Targets:
    """What a playbook acting on a node (named directly or through its GPU) touches, for the guardrails."""
    return Targets(
        namespace=params.namespace,
        nodes=(params.node,) if params.node else (),
        gpus=(params.gpu,) if params.gpu else (),
    )


def resolve_node(params: Any, actuator: Actuator) -> tuple[str, str]:
    """Return ``(node, problem)``: the node to act on, or why it cannot be found."""
    node = params.node
    if not node:
        gpu = actuator.describe("gpu", params.gpu, params.namespace)
        if gpu is None:
            return "", f"GPU {params.gpu} not found"
        node = gpu["node"]
    if actuator.describe("node", node, params.namespace) is None:
        return "", f"node {node} not found"
    return node, ""


def cordon(node: str) -> Step:
    """Mark the node unschedulable, verified."""
    return Step(
        name="cordon",
        action=ActionSpec(op="cordon_node", target=node),
        verify=VerifySpec(check="node_unschedulable", target=node),
        timeout_s=60.0,
    )


def drain(node: str, timeout_s: float) -> Step:
    """Evict the node's workload pods (honouring PodDisruptionBudgets), verified empty."""
    return Step(
        name="drain",
        action=ActionSpec(op="drain_node", target=node),
        wait_s=5.0,
        verify=VerifySpec(check="node_drained", target=node),
        timeout_s=timeout_s,
    )


def uncordon(node: str, name: str = "uncordon") -> Step:
    """Make the node schedulable again (restore traffic), verified."""
    return Step(
        name=name,
        action=ActionSpec(op="uncordon_node", target=node),
        verify=VerifySpec(check="node_schedulable", target=node),
        timeout_s=60.0,
    )


def observe_node(node: str, actuator: Actuator, namespace: str = "") -> dict[str, Any]:
    """What the precheck records about a node for the rollback: its name and whether it was schedulable."""
    view = actuator.describe("node", node, namespace) or {}
    return {"node": node, "schedulable": bool(view.get("schedulable", False))}


def was_schedulable(observed: dict[str, Any]) -> bool:
    """Whether the precheck saw the node schedulable (unknown counts as no: leaving it cordoned is safe)."""
    return bool(observed.get("node")) and observed.get("schedulable") is True


def restore_schedulable(observed: dict[str, Any]) -> list[Step]:
    """The rollback of a playbook that cordons: uncordon the node only if it was schedulable before the run."""
    return [uncordon(observed["node"])] if was_schedulable(observed) else []
