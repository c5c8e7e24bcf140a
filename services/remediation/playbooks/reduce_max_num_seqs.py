"""Lower vLLM's --max-num-seqs (concurrent sequences per replica)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from services.remediation.actuators.base import Actuator
from services.remediation.model import ActionSpec, PrecheckResult, Step, Targets, VerifySpec
from services.remediation.playbook import Playbook, PlaybookParams, require


class ReduceMaxNumSeqsParams(PlaybookParams):
    """Parameters of :class:`ReduceMaxNumSeqsPlaybook`."""

    deployment: str = Field(min_length=1)
    max_num_seqs: int | None = Field(default=None, ge=1, description="the value to set")
    factor: float | None = Field(default=None, gt=0, lt=1, description="or: the share of the current value to keep")
    timeout_s: float = Field(default=1800.0, gt=0)

    @model_validator(mode="after")
    def _one_of(self) -> ReduceMaxNumSeqsParams:
        if (self.max_num_seqs is None) == (self.factor is None):
            raise ValueError("give exactly one of max_num_seqs (a value) and factor (a share of the current value)")
        return self


class ReduceMaxNumSeqsPlaybook(Playbook):
    """Reduce ``--max-num-seqs`` (batch size) of a deployment; a rolling restart applies it.

    Use for KV-cache exhaustion and preemption storms: fewer concurrent sequences per replica leave
    KV-cache headroom, at some throughput cost. Refuses to *raise* the value. Verified when every
    replica runs with the new value. Rollback restores the previous value.
    """

    name = "reduce_max_num_seqs"
    level = 1
    Params = ReduceMaxNumSeqsParams
    proposed = {"factor": 0.5}  # a diagnosis halves the batch

    def targets(self, params: Any) -> Targets:
        return Targets(namespace=params.namespace, deployment=params.deployment, replicas_out=1)

    def precheck(self, params: Any, actuator: Actuator) -> PrecheckResult:
        if reason := require(actuator, "set_max_num_seqs"):
            return PrecheckResult(ok=False, reason=reason)
        dep = actuator.describe("deployment", params.deployment, params.namespace)
        if dep is None:
            return PrecheckResult(ok=False, reason=f"deployment {params.deployment} not found")
        current = dep.get("max_num_seqs")
        if params.max_num_seqs is not None:
            target = params.max_num_seqs
        elif current is None:
            return PrecheckResult(ok=False, reason=f"the current max_num_seqs of {params.deployment} is not known")
        else:
            target = max(1, int(current * params.factor))
        if current is not None and target >= current:
            return PrecheckResult(ok=False, reason=f"max_num_seqs is {current}; {target} is no reduction")
        return PrecheckResult(ok=True, observed={"max_num_seqs": current, "target": target})

    def steps(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        ns = params.namespace
        target = observed.get("target", params.max_num_seqs)
        return [
            Step(
                name="set_max_num_seqs",
                action=ActionSpec(
                    op="set_max_num_seqs",
                    target=params.deployment,
                    namespace=ns,
                    params={"max_num_seqs": target},
                ),
                wait_s=30.0,
                verify=VerifySpec(
                    check="deployment_ready",
                    target=params.deployment,
                    namespace=ns,
                    params={"max_num_seqs": target},
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
