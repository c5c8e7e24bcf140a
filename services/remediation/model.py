"""Serialisable building blocks shared by playbooks, policy, store, executor and actuators.

Everything here is a frozen pydantic model so it can travel through Celery (JSON) and be stored in
Postgres ``jsonb`` as is.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Operations an actuator may be asked to perform (each actuator says which it supports).
Operation = Literal[
    "restart_pod",
    "delete_pod",
    "drain_replica",
    "restore_replica",
    "rollout_restart",
    "scale",
    "set_max_num_seqs",
    "switch_variant",
    "rollback_deployment",
    "cordon_node",
    "uncordon_node",
    "drain_node",
    "reset_gpu",
    "reboot_node",
]

# Read-only checks (see Actuator.check).
Check = Literal[
    "deployment_ready",
    "pod_running",
    "pod_gone",
    "node_ready",
    "node_schedulable",
    "node_unschedulable",
    "node_drained",
    "gpu_healthy",
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class ActionSpec(_Frozen):
    """One change to the world, in the actuator vocabulary."""

    op: Operation
    target: str = Field(min_length=1, description="pod, deployment, node or GPU UUID")
    namespace: str = ""
    params: dict[str, Any] = Field(default_factory=dict)


class VerifySpec(_Frozen):
    """One read-only check that must hold after an action."""

    check: Check
    target: str = Field(min_length=1)
    namespace: str = ""
    params: dict[str, Any] = Field(default_factory=dict)


class Step(_Frozen):
    """One playbook step: an action, a wait, then a verification with a timeout.

    Attributes:
        name: unique within the playbook, shown in the audit log and Slack.
        action: the change; None for a step that only waits and verifies.
        wait_s: world seconds to wait after the action before the first verification.
        verify: what must hold afterwards; None when the action's acceptance is enough.
        timeout_s: world seconds after the action within which ``verify`` must hold.
    """

    name: str = Field(min_length=1)
    action: ActionSpec | None = None
    wait_s: float = Field(default=0.0, ge=0.0)
    verify: VerifySpec | None = None
    timeout_s: float = Field(default=300.0, gt=0.0)


class Targets(_Frozen):
    """What a playbook touches: what guardrails (blast radius, cooldown) reason about."""

    namespace: str = ""
    model: str = ""
    deployment: str = ""
    pods: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    replicas_out: int = Field(default=0, ge=0, description="replicas taken out of service at once")

    def keys(self) -> list[str]:
        """Cooldown keys: one per object touched (``node/gpu-node-000``, ``deployment/ns/name``...)."""
        out = [f"node/{n}" for n in self.nodes] + [f"pod/{self.namespace}/{p}" for p in self.pods]
        out += [f"gpu/{g}" for g in self.gpus]
        if self.deployment:
            out.append(f"deployment/{self.namespace}/{self.deployment}")
        return sorted(set(out))


class PrecheckResult(_Frozen):
    """What a precheck found; ``observed`` is kept for the rollback (e.g. the replica count before)."""

    ok: bool
    reason: str = ""
    observed: dict[str, Any] = Field(default_factory=dict)


class CheckResult(_Frozen):
    """Result of one verification."""

    ok: bool
    detail: str = ""
    observed: dict[str, Any] = Field(default_factory=dict)


class ActionOutcome(_Frozen):
    """What an actuator reported for an accepted action."""

    accepted: bool = True
    message: str = ""
    eta_s: float = 0.0
    data: dict[str, Any] = Field(default_factory=dict)


DecisionOutcome = Literal["execute", "await_approval", "page", "blocked", "dropped"]


class Decision(_Frozen):
    """What the policy decided about a proposed playbook, and why.

    Attributes:
        outcome: ``execute`` (level 1, guardrails pass), ``await_approval`` (level 2, or level 1 in a
            maintenance window), ``page`` (level 3, or the circuit breaker is open), ``blocked`` (a
            guardrail or the kill switch said no for now), ``dropped`` (never executable: unknown
            playbook, bad params, level above the allowed maximum).
        reasons: human-readable reasons, in the order they were found.
    """

    incident_id: str
    playbook: str | None
    params: dict[str, Any] = Field(default_factory=dict)
    level: int = Field(default=3, ge=1, le=3)
    outcome: DecisionOutcome
    dry_run: bool = False
    reasons: tuple[str, ...] = ()
    decided_by: str = ""
    targets: Targets = Field(default_factory=Targets)
    scope: dict[str, str] = Field(default_factory=dict, description="namespace/model/playbook the policy used")
