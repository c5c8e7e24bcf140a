"""Rolling restart of a deployment."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.remediation.actuators.base import Actuator
from services.remediation.model import ActionSpec, PrecheckResult, Step, Targets, VerifySpec
from services.remediation.playbook import Playbook, PlaybookParams, require


class RolloutRestartParams(PlaybookParams):
    """Parameters of :class:`RolloutRestartPlaybook`."""

    deployment: str = Field(min_length=1)
    timeout_s: float = Field(default=1800.0, gt=0)


class RolloutRestartPlaybook(Playbook):
    """Rolling restart of a deployment (``kubectl rollout restart``: a pod-template annotation).

    Use when every replica shows the same degradation (slow leak, stuck NCCL communicator after a
    network blip). The rollout replaces one replica at a time. Verified when every replica is ready
    again. No rollback.
    """

    name = "rollout_restart"
    level = 1
    Params = RolloutRestartParams

    def targets(self, params: Any) -> Targets:
        return Targets(namespace=params.namespace, deployment=params.deployment, replicas_out=1)

    def precheck(self, params: Any, actuator: Actuator) -> PrecheckResult:
        if reason := require(actuator, "rollout_restart"):
            return PrecheckResult(ok=False, reason=reason)
        dep = actuator.describe("deployment", params.deployment, params.namespace)
        if dep is None:
            return PrecheckResult(ok=False, reason=f"deployment {params.deployment} not found")
        return PrecheckResult(ok=True, observed={"replicas": dep["replicas"], "revision": dep.get("revision")})

    def steps(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        ns = params.namespace
        return [
            Step(
                name="rollout_restart",
                action=ActionSpec(op="rollout_restart", target=params.deployment, namespace=ns),
                wait_s=30.0,
                verify=VerifySpec(check="deployment_ready", target=params.deployment, namespace=ns),
                timeout_s=params.timeout_s,
            )
        ]
