"""Roll a deployment back to its previous revision."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.remediation.actuators.base import Actuator
from services.remediation.model import ActionSpec, PrecheckResult, Step, Targets, VerifySpec
from services.remediation.playbook import Playbook, PlaybookParams, require


class RollbackDeploymentParams(PlaybookParams):
    """Parameters of :class:`RollbackDeploymentPlaybook`."""

    deployment: str = Field(min_length=1)
    timeout_s: float = Field(default=2400.0, gt=0)


class RollbackDeploymentPlaybook(Playbook):
    """Roll a deployment back to its previous revision (``kubectl rollout undo``).

    Use when a bad rollout (new image, arguments or variant) correlates with the regression. Verified
    when every replica is ready on a new revision. No rollback of the rollback: rolling forward
    again is a human decision.
    """

    name = "rollback_deployment"
    level = 2
    Params = RollbackDeploymentParams

    def targets(self, params: Any) -> Targets:
        return Targets(namespace=params.namespace, deployment=params.deployment, replicas_out=1)

    def precheck(self, params: Any, actuator: Actuator) -> PrecheckResult:
        if reason := require(actuator, "rollback_deployment"):
            return PrecheckResult(ok=False, reason=reason)
        dep = actuator.describe("deployment", params.deployment, params.namespace)
        if dep is None:
            return PrecheckResult(ok=False, reason=f"deployment {params.deployment} not found")
        return PrecheckResult(ok=True, observed={"revision": dep.get("revision")})

    def steps(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        ns = params.namespace
        return [
            Step(
                name="rollback",
                action=ActionSpec(op="rollback_deployment", target=params.deployment, namespace=ns),
                wait_s=60.0,
                verify=VerifySpec(
                    check="deployment_ready",
                    target=params.deployment,
                    namespace=ns,
                    params={"revision_not": observed.get("revision")},
                ),
                timeout_s=params.timeout_s,
            )
        ]
