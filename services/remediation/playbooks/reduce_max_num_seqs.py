"""Lower vLLM's --max-num-seqs (concurrent sequences per replica)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.remediation.actuators.base import Actuator
from services.remediation.model import ActionSpec, PrecheckResult, Step, Targets, VerifySpec
from services.remediation.playbook import Playbook, PlaybookParams, require


class ReduceMaxNumSeqsParams(PlaybookParams):
    """Parameters of :class:`ReduceMaxNumSeqsPlaybook`."""

    deployment: str = Field(min_length=1)
    max_num_seqs: int = Field(ge=1)
    timeout_s: float = Field(default=1800.0, gt=0)


class ReduceMaxNumSeqsPlaybook(Playbook):
    """Reduce ``--max-num-seqs`` (batch size) of a deployment; a rolling restart applies it.

    Use for KV-cache exhaustion and preemption storms: fewer concurrent sequences per replica leave
    KV-cache headroom, at some throughput cost. Refuses to *raise* the value. Verified when every
    replica runs with the new value. Rollback restores the previous value.
    """

    name = "reduce_max_num_seqs"
    level = 1
    Params = ReduceMaxNumSeqsParams

    def targets(self, params: Any) -> Targets:
        return Targets(namespace=params.namespace, deployment=params.deployment, replicas_out=1)

    def precheck(self, params: Any, actuator: Actuator) -> PrecheckResult:
        if reason := require(actuator, "set_max_num_seqs"):
            return PrecheckResult(ok=False, reason=reason)
        dep = actuator.describe("deployment", params.deployment, params.namespace)
        if dep is None:
            return PrecheckResult(ok=False, reason=f"deployment {params.deployment} not found")
        current = dep.get("max_num_seqs")
        if current is not None and params.max_num_seqs >= current:
            return PrecheckResult(ok=False, reason=f"max_num_seqs is {current}; {params.max_num_seqs} is no reduction")
        return PrecheckResult(ok=True, observed={"max_num_seqs": current})

    def steps(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        ns = params.namespace
        return [
            Step(
                name="set_max_num_seqs",
                action=ActionSpec(
                    op="set_max_num_seqs",
                    target=params.deployment,
                    namespace=ns,
                    params={"max_num_seqs": params.max_num_seqs},
                ),
                wait_s=30.0,
                verify=VerifySpec(
                    check="deployment_ready",
                    target=params.deployment,
                    namespace=ns,
                    params={"max_num_seqs": params.max_num_seqs},
                ),
                timeout_s=params.timeout_s,
            )
        ]

    def rollback(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        if observed.get("max_num_seqs") is None:
            return []
        return [
            Step(
                name="restore_max_num_seqs",
                action=ActionSpec(
                    op="set_max_num_seqs",
                    target=params.deployment,
                    namespace=params.namespace,
                    params={"max_num_seqs": observed["max_num_seqs"]},
                ),
            )
        ]
