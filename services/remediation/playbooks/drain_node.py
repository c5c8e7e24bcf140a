"""Cordon and drain a node."""

from __future__ import annotations

from typing import Any

from services.remediation.actuators.base import Actuator
from services.remediation.model import PrecheckResult, Step, Targets
from services.remediation.playbook import Playbook, require
from services.remediation.playbooks._node import (
    NodeParams,
    cordon,
    drain,
    observe_node,
    resolve_node,
    restore_schedulable,
)


class DrainNodePlaybook(Playbook):
    """Cordon a node and evict its pods through the eviction API (PodDisruptionBudgets are honoured).

    Use before hardware work or when a node keeps failing pods. Every replica on the node moves, so
    it needs approval. Verified when no workload pod is left. Rollback uncordons the node, unless it
    was already cordoned before the run.
    """

    name = "drain_node"
    level = 2
    Params = NodeParams

    def targets(self, params: Any) -> Targets:
        return Targets(namespace=params.namespace, nodes=(params.node,) if params.node else ())

    def precheck(self, params: Any, actuator: Actuator) -> PrecheckResult:
        if reason := require(actuator, "cordon_node", "drain_node", "uncordon_node"):
            return PrecheckResult(ok=False, reason=reason)
        node, problem = resolve_node(params, actuator)
        if problem:
            return PrecheckResult(ok=False, reason=problem)
        return PrecheckResult(ok=True, observed=observe_node(node, actuator, params.namespace))

    def steps(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        node = observed["node"]
        return [cordon(node), drain(node, params.drain_timeout_s)]

    def rollback(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        return restore_schedulable(observed)
