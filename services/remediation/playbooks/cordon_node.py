"""Cordon a node."""

from __future__ import annotations

from typing import Any

from services.remediation.actuators.base import Actuator
from services.remediation.model import PrecheckResult, Step, Targets
from services.remediation.playbook import Playbook, require
from services.remediation.playbooks._node import (
    NodeParams,
    cordon,
    node_targets,
    observe_node,
    resolve_node,
    restore_schedulable,
)


class CordonNodePlaybook(Playbook):
    """Cordon a node: no new pods are scheduled on it; running pods keep serving.

    Use as the first, harmless response to a suspect node (XID, ECC errors, flapping kubelet) so
    replacements land elsewhere. Rollback uncordons it, unless it was already cordoned before the run.
    """

    name = "cordon_node"
    level = 1
    Params = NodeParams

    def targets(self, params: Any) -> Targets:
        return node_targets(params)

    def precheck(self, params: Any, actuator: Actuator) -> PrecheckResult:
        if reason := require(actuator, "cordon_node", "uncordon_node"):
            return PrecheckResult(ok=False, reason=reason)
        node, problem = resolve_node(params, actuator)
        if problem:
            return PrecheckResult(ok=False, reason=problem)
        return PrecheckResult(ok=True, observed=observe_node(node, actuator, params.namespace))

    def steps(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        return [cordon(observed["node"])]

    def rollback(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        return restore_schedulable(observed)
