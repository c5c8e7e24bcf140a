"""Roll a deployment to a cheaper or smaller-context model variant."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.remediation.actuators.base import Actuator
from services.remediation.model import ActionSpec, PrecheckResult, Step, Targets, VerifySpec
from services.remediation.playbook import Playbook, PlaybookParams, require


class SwitchVariantParams(PlaybookParams):
    """Parameters of :class:`SwitchVariantPlaybook`."""

    deployment: str = Field(min_length=1)
    variant: str = Field(min_length=1, description="variant key, e.g. 70b-int4-32k-tp1")
    timeout_s: float = Field(default=2400.0, gt=0)


class SwitchVariantPlaybook(Playbook):
    """Switch a deployment to another model variant (quantisation, size, context length, TP).

    Use when capacity is short (GPUs lost, traffic surge) or long contexts exhaust the KV cache: a
    smaller or quantised variant serves more with the same GPUs at some quality cost, which is why it
    needs approval. Verified when every replica runs the new variant. Rollback switches back.
    """

    name = "switch_variant"
    level = 2
    Params = SwitchVariantParams

    def targets(self, params: Any) -> Targets:
        return Targets(namespace=params.namespace, deployment=params.deployment, replicas_out=1)

    def precheck(self, params: Any, actuator: Actuator) -> PrecheckResult:
        if reason := require(actuator, "switch_variant"):
            return PrecheckResult(ok=False, reason=reason)
        dep = actuator.describe("deployment", params.deployment, params.namespace)
        if dep is None:
            return PrecheckResult(ok=False, reason=f"deployment {params.deployment} not found")
        if dep.get("variant") == params.variant:
            return PrecheckResult(ok=False, reason=f"already running {params.variant}")
        return PrecheckResult(ok=True, observed={"variant": dep.get("variant")})

    def steps(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        ns = params.namespace
        return [
            Step(
                name="switch_variant",
                action=ActionSpec(
                    op="switch_variant", target=params.deployment, namespace=ns, params={"variant": params.variant}
                ),
                wait_s=60.0,
                verify=VerifySpec(
                    check="deployment_ready", target=params.deployment, namespace=ns, params={"variant": params.variant}
                ),
                timeout_s=params.timeout_s,
            )
        ]

    def rollback(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        if not observed.get("variant"):
            return []
        return [
            Step(
                name="switch_back",
                action=ActionSpec(
                    op="switch_variant",
                    target=params.deployment,
                    namespace=params.namespace,
                    params={"variant": observed["variant"]},
                ),
            )
        ]
