"""Set the replica count of a deployment."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.remediation.actuators.base import Actuator
from services.remediation.model import ActionSpec, PrecheckResult, Step, Targets, VerifySpec
from services.remediation.playbook import Playbook, PlaybookParams, require


class ScaleReplicasParams(PlaybookParams):
    """Parameters of :class:`ScaleReplicasPlaybook`."""

    deployment: str = Field(min_length=1)
    replicas: int = Field(ge=0)
    timeout_s: float = Field(default=1200.0, gt=0)


class ScaleReplicasPlaybook(Playbook):
    """Scale a deployment to ``replicas`` (up for queue saturation, down to release GPUs).

    Verified when the deployment has exactly that many ready replicas; a scale-up that cannot be
    scheduled (no free GPUs) fails verification at its timeout. Rollback restores the previous count.
    """

    name = "scale_replicas"
    level = 1
    Params = ScaleReplicasParams

    def targets(self, params: Any) -> Targets:
        return Targets(namespace=params.namespace, deployment=params.deployment)

    def precheck(self, params: Any, actuator: Actuator) -> PrecheckResult:
        if reason := require(actuator, "scale"):
            return PrecheckResult(ok=False, reason=reason)
        dep = actuator.describe("deployment", params.deployment, params.namespace)
        if dep is None:
            return PrecheckResult(ok=False, reason=f"deployment {params.deployment} not found")
        if dep["replicas"] == params.replicas:
            return PrecheckResult(ok=False, reason=f"already at {params.replicas} replicas")
        return PrecheckResult(ok=True, observed={"replicas": dep["replicas"]})

    def steps(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        ns = params.namespace
        return [
            Step(
                name="scale",
                action=ActionSpec(
                    op="scale", target=params.deployment, namespace=ns, params={"replicas": params.replicas}
                ),
                wait_s=30.0,
                verify=VerifySpec(
                    check="deployment_ready",
                    target=params.deployment,
                    namespace=ns,
                    params={"replicas": params.replicas},
                ),
                timeout_s=params.timeout_s,
            )
        ]

    def rollback(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        if "replicas" not in observed:
            return []
        return [
            Step(
                name="scale_back",
                action=ActionSpec(
                    op="scale",
                    target=params.deployment,
                    namespace=params.namespace,
                    params={"replicas": observed["replicas"]},
                ),
            )
        ]
