"""Take one replica out of load balancing, restart it, put it back."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.remediation.actuators.base import Actuator
from services.remediation.model import ActionSpec, PrecheckResult, Step, Targets, VerifySpec
from services.remediation.playbook import Playbook, PlaybookParams, require


class DrainReplicaParams(PlaybookParams):
    """Parameters of :class:`DrainReplicaPlaybook`."""

    pod: str = Field(min_length=1)
    grace_s: float = Field(default=60.0, ge=0, description="time for in-flight requests to finish")
    restart: bool = True
    timeout_s: float = Field(default=900.0, gt=0)


class DrainReplicaPlaybook(Playbook):
    """Drain traffic from one replica, let in-flight requests finish, restart it, restore traffic.

    Use for one replica with high latency or errors while its peers are healthy. The replica leaves
    the Service endpoints (no new requests), waits ``grace_s`` for in-flight requests, is restarted
    when ``restart`` is set, and rejoins once running. Rollback puts it back into load balancing.
    Refused when no other replica of its Deployment is in load balancing: its requests would have
    nowhere to go.
    """

    name = "drain_replica"
    level = 1
    Params = DrainReplicaParams

    def targets(self, params: Any) -> Targets:
        return Targets(namespace=params.namespace, pods=(params.pod,), replicas_out=1)

    def precheck(self, params: Any, actuator: Actuator) -> PrecheckResult:
        ops = ("drain_replica", "restore_replica") + (("restart_pod",) if params.restart else ())
        if reason := require(actuator, *ops):
            return PrecheckResult(ok=False, reason=reason)
        pod = actuator.describe("pod", params.pod, params.namespace)
        if pod is None:
            return PrecheckResult(ok=False, reason=f"pod {params.pod} not found")
        deployment = str(pod.get("deployment", ""))
        if not deployment:
            return PrecheckResult(
                ok=False, reason=f"pod {params.pod} has no Deployment: no peer would take its requests"
            )
        dep = actuator.describe("deployment", deployment, params.namespace)
        if dep is None or "in_rotation" not in dep:
            return PrecheckResult(ok=False, reason=f"cannot tell which replicas of {deployment} are in load balancing")
        peers = int(dep["in_rotation"]) - (1 if pod.get("in_rotation") else 0)
        if peers < 1:
            return PrecheckResult(
                ok=False,
                reason=f"pod {params.pod} is the last replica of {deployment} in load balancing: "
                "draining it would leave its requests nowhere to go",
            )
        return PrecheckResult(ok=True, observed={"deployment": deployment, "peers_in_rotation": peers})

    def steps(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        ns, pod = params.namespace, params.pod
        steps = [
            Step(
                name="drain",
                action=ActionSpec(op="drain_replica", target=pod, namespace=ns),
                wait_s=params.grace_s,
            )
        ]
        if params.restart:
            steps.append(
                Step(
                    name="restart",
                    action=ActionSpec(op="restart_pod", target=pod, namespace=ns),
                    wait_s=10.0,
                    verify=VerifySpec(check="pod_running", target=pod, namespace=ns),
                    timeout_s=params.timeout_s,
                )
            )
        steps.append(Step(name="restore", action=ActionSpec(op="restore_replica", target=pod, namespace=ns)))
        return steps

    def rollback(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        return [
            Step(name="restore", action=ActionSpec(op="restore_replica", target=params.pod, namespace=params.namespace))
        ]
