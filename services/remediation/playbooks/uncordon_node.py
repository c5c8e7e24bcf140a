"""Uncordon a node."""

from __future__ import annotations

from typing import Any

from services.remediation.actuators.base import Actuator
from services.remediation.model import PrecheckResult, Step, Targets
from services.remediation.playbook import Playbook, require
from services.remediation.playbooks._node import NodeParams, cordon, observe_node, resolve_node, uncordon


class UncordonNodePlaybook(Playbook):
    """Uncordon a node so pods are scheduled on it again (after a repair was verified).

    Refuses when the node is not Ready. Rollback cordons it again if it was cordoned before the run.
    """

    name = "uncordon_node"
    level = 1
    Params = NodeParams

    def targets(self, params: Any) -> Targets:
        return Targets(namespace=params.namespace, nodes=(params.node,) if params.node else ())

    def precheck(self, params: Any, actuator: Actuator) -> PrecheckResult:
        if reason := require(actuator, "cordon_node", "uncordon_node"):
            return PrecheckResult(ok=False, reason=reason)
        node, problem = resolve_node(params, actuator)
        if problem:
            return PrecheckResult(ok=False, reason=problem)
        view = actuator.describe("node", node, params.namespace) or {}
        if not view.get("ready"):
            return PrecheckResult(ok=False, reason=f"node {node} is not Ready")
        return PrecheckResult(ok=True, observed=observe_node(node, actuator, params.namespace))

    def steps(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        return [uncordon(observed["node"])]

    def rollback(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        # cordon again only a node that was cordoned before the run (restore, never add)
        return [cordon(observed["node"])] if observed.get("node") and observed.get("schedulable") is False else []
