"""Cordon the node of a failed GPU and move the pods the GPU took down to healthy GPUs."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.remediation.actuators.base import Actuator
from services.remediation.model import ActionSpec, PrecheckResult, Step, Targets, VerifySpec
from services.remediation.playbook import Playbook, require
from services.remediation.playbooks._node import (
    NodeParams,
    cordon,
    node_targets,
    observe_node,
    resolve_node,
    restore_schedulable,
)

MAX_PODS = 8
"""Most pods one run deletes (a GPU node has 8 GPUs); more failed pods than that are drain_node's work."""


class EvictGpuPodsParams(NodeParams):
    """Parameters of :class:`EvictGpuPodsPlaybook` (``drain_timeout_s``: how long a deleted pod may take to go)."""

    ready_timeout_s: float = Field(
        default=1800.0, gt=0, description="time for each Deployment to be fully Ready again (a 70B replica loads)"
    )


class EvictGpuPodsPlaybook(Playbook):
    """Cordon a failed GPU's node and delete the pods the GPU took down: their Deployments recreate them elsewhere.

    Use for a GPU lost for good (XID 79 fallen off the bus, GSP errors): a restart in place lands on the
    same dead GPU, and a cordon alone moves nothing. Only pods that are not Ready are deleted, and only
    pods a Deployment recreates: a pod still serving keeps serving (``drain_node`` moves it, after
    approval), so no replica a model still has is taken away. Verified when every deleted pod is gone
    and its Deployment has all its replicas Ready (they cannot land on the cordoned node); with no free
    healthy GPU elsewhere the replacement stays Pending and the run fails at ``ready_timeout_s``.
    Rollback uncordons the node, unless it was already cordoned before the run; a deleted pod stays
    deleted (its Deployment has already replaced it).
    """

    name = "evict_gpu_pods"
    level = 1
    Params = EvictGpuPodsParams

    def targets(self, params: Any) -> Targets:
        return node_targets(params)

    def precheck(self, params: Any, actuator: Actuator) -> PrecheckResult:
        if reason := require(actuator, "cordon_node", "uncordon_node", "delete_pod"):
            return PrecheckResult(ok=False, reason=reason)
        node, problem = resolve_node(params, actuator)
        if problem:
            return PrecheckResult(ok=False, reason=problem)
        view = actuator.describe("node", node, params.namespace) or {}
        if "failed_gpu_pods" not in view:
            return PrecheckResult(
                ok=False, reason=f"actuator {actuator.name} cannot tell which pods a failed GPU holds"
            )
        evict: list[dict[str, str]] = []
        kept: list[dict[str, str]] = []
        for pod in view["failed_gpu_pods"]:
            ns, dep = pod.get("namespace") or params.namespace, pod.get("deployment") or ""
            if pod.get("ready"):
                kept.append({"pod": pod["pod"], "why": "Ready: it still serves"})
            elif not dep or actuator.describe("deployment", dep, ns) is None:
                kept.append({"pod": pod["pod"], "why": "no Deployment would recreate it"})
            else:
                evict.append({"pod": pod["pod"], "namespace": ns, "deployment": dep})
        if len(evict) > MAX_PODS:
            return PrecheckResult(
                ok=False, reason=f"{len(evict)} pods on failed GPUs of {node}: more than {MAX_PODS}, drain the node"
            )
        return PrecheckResult(
            ok=True, observed={**observe_node(node, actuator, params.namespace), "evict": evict, "kept": kept}
        )

    def steps(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        steps = [cordon(observed["node"])]
        deployments: dict[tuple[str, str], None] = {}
        for pod in observed.get("evict", []):
            ns = pod["namespace"]
            steps.append(
                Step(
                    name=f"evict {pod['pod']}",
                    action=ActionSpec(op="delete_pod", target=pod["pod"], namespace=ns),
                    wait_s=5.0,
                    verify=VerifySpec(check="pod_gone", target=pod["pod"], namespace=ns),
                    timeout_s=params.drain_timeout_s,
                )
            )
            deployments[(ns, pod["deployment"])] = None
        for ns, dep in deployments:
            # the node is cordoned: a Deployment whole and Ready again has its replacements elsewhere
            steps.append(
                Step(
                    name=f"replaced {dep}",
                    wait_s=30.0,
                    verify=VerifySpec(check="deployment_ready", target=dep, namespace=ns),
                    timeout_s=params.ready_timeout_s,
                )
            )
        return steps

    def rollback(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        return restore_schedulable(observed)
