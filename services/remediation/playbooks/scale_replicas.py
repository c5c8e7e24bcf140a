"""Set the replica count of a deployment."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from services.remediation.actuators.base import Actuator
from services.remediation.model import ActionSpec, PrecheckResult, Step, Targets, VerifySpec
from services.remediation.playbook import Playbook, PlaybookParams, require

MAX_STEP = 4
"""Most replicas one relative scale (``by``) adds or removes."""


class ScaleReplicasParams(PlaybookParams):
    """Parameters of :class:`ScaleReplicasPlaybook`: an absolute count, or a change of the current one."""

    deployment: str = Field(min_length=1)
    replicas: int | None = Field(default=None, ge=0, description="the replica count to set")
    by: int = Field(default=0, ge=-MAX_STEP, le=MAX_STEP, description="or: replicas to add (negative: remove)")
    timeout_s: float = Field(default=1200.0, gt=0)

    @model_validator(mode="after")
    def _one_of(self) -> ScaleReplicasParams:
        if (self.replicas is None) == (self.by == 0):
            raise ValueError("give exactly one of replicas (a count) and by (a non-zero change)")
        return self


class ScaleReplicasPlaybook(Playbook):
    """Scale a deployment to ``replicas``, or by ``by`` replicas (up for queue saturation, down to release GPUs).

    Verified when the deployment has exactly that many ready replicas; a scale-up that cannot be
    scheduled (no free GPUs) fails verification at its timeout. Rollback restores the previous count.
    """

    name = "scale_replicas"
    level = 1
    Params = ScaleReplicasParams
    proposed = {"by": 1}  # a diagnosis scales out by one replica

    def targets(self, params: Any) -> Targets:
        return Targets(namespace=params.namespace, deployment=params.deployment)

    def precheck(self, params: Any, actuator: Actuator) -> PrecheckResult:
        if reason := require(actuator, "scale"):
            return PrecheckResult(ok=False, reason=reason)
        dep = actuator.describe("deployment", params.deployment, params.namespace)
        if dep is None:
            return PrecheckResult(ok=False, reason=f"deployment {params.deployment} not found")
        current = int(dep["replicas"])
        target = params.replicas if params.replicas is not None else current + params.by
        if target < 0:
            return PrecheckResult(ok=False, reason=f"{current} replicas cannot change by {params.by}")
        if target == current:
            return PrecheckResult(ok=False, reason=f"already at {current} replicas")
        return PrecheckResult(ok=True, observed={"replicas": current, "target": target})

    def steps(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        ns = params.namespace
        target = observed.get("target", params.replicas)
        return [
            Step(
                name="scale",
                action=ActionSpec(op="scale", target=params.deployment, namespace=ns, params={"replicas": target}),
                wait_s=30.0,
                verify=VerifySpec(
                    check="deployment_ready",
                    target=params.deployment,
                    namespace=ns,
                    params={"replicas": target},
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
