"""Restart one serving pod."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.remediation.actuators.base import Actuator
from services.remediation.model import ActionSpec, PrecheckResult, Step, Targets, VerifySpec
from services.remediation.playbook import Playbook, PlaybookParams, require


class RestartPodParams(PlaybookParams):
    """Parameters of :class:`RestartPodPlaybook`."""

    pod: str = Field(min_length=1)
    timeout_s: float = Field(default=900.0, gt=0)


class RestartPodPlaybook(Playbook):
    """Restart one vLLM pod (the container in place, or delete it so its ReplicaSet replaces it).

    Use for a crashed or wedged engine (EngineCore fatal error, XID with "restart app" as required
    action, CUDA OOM after a leak). Takes one replica out of service for its load time. Verified when
    the deployment is back to full readiness. No rollback: a restart cannot be undone.
    """

    name = "restart_pod"
    level = 1
    Params = RestartPodParams

    def targets(self, params: Any) -> Targets:
        return Targets(namespace=params.namespace, pods=(params.pod,), replicas_out=1)

    def precheck(self, params: Any, actuator: Actuator) -> PrecheckResult:
        if reason := require(actuator, "restart_pod"):
            return PrecheckResult(ok=False, reason=reason)
        pod = actuator.describe("pod", params.pod, params.namespace)
        if pod is None:
            return PrecheckResult(ok=False, reason=f"pod {params.pod} not found")
        return PrecheckResult(ok=True, observed={"deployment": pod.get("deployment", ""), "phase": pod["phase"]})

    def steps(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        ns = params.namespace
        dep = observed.get("deployment", "")
        verify = (
            VerifySpec(check="deployment_ready", target=dep, namespace=ns)
            if dep
            else VerifySpec(check="pod_running", target=params.pod, namespace=ns)
        )
        return [
            Step(
                name="restart",
                action=ActionSpec(op="restart_pod", target=params.pod, namespace=ns),
                wait_s=10.0,
                verify=verify,
                timeout_s=params.timeout_s,
            )
        ]
