"""The actuator contract.

An actuator performs :class:`~services.remediation.model.ActionSpec` operations and answers read-only
questions through :meth:`Actuator.describe`, which returns *normalised* views so that checks and
prechecks are written once, here, for every actuator:

=============  ==========================================================================
kind           keys of the dict ``describe`` returns (None: the object does not exist)
=============  ==========================================================================
deployment     replicas, ready, max_num_seqs (int or None), variant (str or None), revision,
               in_rotation (replicas the load balancer sends requests to)
pod            phase ("Running", "Pending"...), node, deployment, ready (bool), in_rotation (bool:
               the load balancer sends it requests; False when not ready or drained)
node           ready, schedulable, rebooting, pods (workload pods on it), unhealthy_gpus,
               failed_gpu_pods (see below)
gpu            node, healthy, xid
=============  ==========================================================================

``failed_gpu_pods`` lists the workload pods bound to an unhealthy GPU of the node, as far as the
actuator can tell, each as ``{"pod", "namespace", "deployment" ("" when no Deployment owns it),
"ready"}``. The simulator knows which GPUs each pod holds. The Kubernetes API does not (the device
plugin's allocation lives in the kubelet), so there the list is the node's GPU pods that are not Ready
and whose container died (crash-looping) while the node reports fewer allocatable GPUs than it has.

Contract:
    * ``act`` changes the world once and raises :class:`ActuatorError` when the action was refused
      or could not be carried out; it never retries an action on its own after the world may have
      changed (the executor decides, and it never retries an action).
    * ``describe`` and ``check`` change nothing and may be called any number of times.
    * ``clock`` is the world's time in seconds (the simulator's simulated time, wall time for a
      real cluster); step timeouts are measured on it, ``time_scale`` converts world seconds
      into wall seconds for the waits between retries.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Literal

from services.remediation.config import ActuatorConfig
from services.remediation.errors import ActuatorError
from services.remediation.model import ActionOutcome, ActionSpec, CheckResult, VerifySpec

ObjectKind = Literal["deployment", "pod", "node", "gpu"]


class Actuator(ABC):
    """Base class of every actuator (see the module docstring for the contract)."""

    name: ClassVar[str] = ""
    operations: ClassVar[frozenset[str]] = frozenset()
    time_scale: float = 1.0

    @classmethod
    def from_config(cls, config: ActuatorConfig) -> Actuator:
        """Build the actuator from the ``actuator`` section of remediation.yaml."""
        raise NotImplementedError

    def supports(self, op: str) -> bool:
        """Whether this actuator can perform ``op``."""
        return op in self.operations

    @abstractmethod
    def act(self, action: ActionSpec) -> ActionOutcome:
        """Perform one action.

        Raises:
            ActuatorUnsupported: the operation is not available on this actuator.
            ActuatorError: the action was refused or failed.
        """

    @abstractmethod
    def describe(self, kind: ObjectKind, name: str, namespace: str = "") -> dict[str, Any] | None:
        """Return the normalised view of one object, or None when it does not exist (read-only)."""

    @abstractmethod
    def clock(self) -> float:
        """The world's current time in seconds."""

    def event_time(self) -> float:
        """The world's current UNIX time (what its telemetry is stamped with); wall time by default."""
        return time.time()

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    def check(self, spec: VerifySpec) -> CheckResult:
        """Evaluate a read-only check against :meth:`describe` (shared by every actuator)."""
        p = spec.params
        ns = spec.namespace
        if spec.check == "deployment_ready":
            d = self.describe("deployment", spec.target, ns)
            if d is None:
                return CheckResult(ok=False, detail=f"deployment {spec.target} not found")
            want = int(p.get("replicas", d["replicas"]))
            problems = []
            if d["replicas"] != want:
                problems.append(f"replicas {d['replicas']} != {want}")
            if d["ready"] < want:
                problems.append(f"ready {d['ready']}/{want}")
            for key in ("max_num_seqs", "variant"):
                if key in p and d.get(key) != p[key]:
                    problems.append(f"{key} {d.get(key)} != {p[key]}")
            if "revision_not" in p and d.get("revision") == p["revision_not"]:
                problems.append(f"still at revision {d.get('revision')}")
            return CheckResult(ok=not problems, detail="; ".join(problems) or "ready", observed=d)
        if spec.check in ("pod_running", "pod_gone"):
            d = self.describe("pod", spec.target, ns)
            if spec.check == "pod_gone":
                return CheckResult(ok=d is None, detail="gone" if d is None else f"pod is {d['phase']}")
            ok = d is not None and d["phase"] == "Running" and bool(d.get("ready", True))
            return CheckResult(ok=ok, detail=d["phase"] if d else "not found", observed=d or {})
        if spec.check.startswith("node_"):
            d = self.describe("node", spec.target, ns)
            if d is None:
                return CheckResult(ok=False, detail=f"node {spec.target} not found")
            if spec.check == "node_ready":
                ok = bool(d["ready"]) and not d.get("rebooting", False)
                if ok and p.get("gpus_healthy") and d.get("unhealthy_gpus", 0):
                    return CheckResult(ok=False, detail=f"{d['unhealthy_gpus']} unhealthy GPUs", observed=d)
                return CheckResult(ok=ok, detail="ready" if ok else "not ready", observed=d)
            if spec.check == "node_schedulable":
                return CheckResult(ok=bool(d["schedulable"]), detail="schedulable check", observed=d)
            if spec.check == "node_unschedulable":
                return CheckResult(ok=not d["schedulable"], detail="unschedulable check", observed=d)
            if spec.check == "node_drained":
                return CheckResult(ok=d["pods"] == 0, detail=f"{d['pods']} pods left", observed=d)
        if spec.check == "gpu_healthy":
            d = self.describe("gpu", spec.target, ns)
            if d is None:
                return CheckResult(ok=False, detail=f"GPU {spec.target} not found")
            return CheckResult(ok=bool(d["healthy"]), detail=f"xid {d.get('xid', 0)}", observed=d)
        raise ActuatorError(f"unknown check {spec.check!r}")
