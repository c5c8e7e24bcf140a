"""Actions a policy or a remediation worker can take on the simulated cluster.

Every action returns an :class:`ActionResult` at once; its effect lands after a realistic delay
(a GPU reset takes tens of seconds, a reboot minutes, a 70B replica minutes to load) and can fail,
drawn from the simulator's action stream so the same seed and the same calls give the same outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from services.simulator.specs import parse_variant

if TYPE_CHECKING:
    from services.simulator.simulator import Simulator

# Disruption weight of each action (what the grader charges for touching production).
DISRUPTION: dict[str, float] = {
    "restart_pod": 1.0,
    "delete_pod": 1.0,
    "drain_replica": 0.3,
    "restore_replica": 0.0,
    "drain_node": 4.0,
    "resume_node": 0.0,
    "cordon_node": 0.3,
    "uncordon_node": 0.0,
    "reset_gpu": 1.5,
    "reboot_node": 5.0,
    "set_max_num_seqs": 1.5,
    "switch_variant": 2.5,
    "rollback": 1.5,
    "scale": 0.1,
    "set_router_weights": 0.02,
}
# Probability that the action fails outright.
FAIL_P: dict[str, float] = {"reset_gpu": 0.05, "reboot_node": 0.03, "restart_pod": 0.01}
ACTIONS: tuple[str, ...] = tuple(DISRUPTION)


@dataclass
class ActionResult:
    """Outcome of an action request."""

    id: str
    kind: str
    target: str
    accepted: bool
    message: str = ""
    eta_s: float = 0.0
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Pending:
    done_at: float
    kind: str
    target: str
    fails: bool


class Actuators:
    """The simulator's control surface.

    Args:
        sim: the simulator acted on.
        rng: the action stream (durations and failures).
    """

    def __init__(self, sim: Simulator, rng: np.random.Generator) -> None:
        self.sim = sim
        self.rng = rng
        self.pending: list[_Pending] = []
        self.log: list[ActionResult] = []
        self.disruption_this_step = 0.0
        self._n = 0

    # ----------------------------------------------------------------------------- plumbing

    def _result(self, kind: str, target: str, ok: bool, msg: str, eta: float = 0.0, **params: Any) -> ActionResult:
        self._n += 1
        res = ActionResult(f"act-{self._n}", kind, target, ok, msg, eta, dict(params))
        self.log.append(res)
        if ok:
            self.disruption_this_step += DISRUPTION.get(kind, 0.0)
        return res

    def _fails(self, kind: str) -> bool:
        return bool(self.rng.random() < FAIL_P.get(kind, 0.0))

    def tick(self, t: float) -> None:
        """Complete actions whose time has come."""
        due = [p for p in self.pending if p.done_at <= t]
        self.pending = [p for p in self.pending if p.done_at > t]
        c = self.sim.cluster
        for p in due:
            if p.kind == "reset_gpu":
                gpu = c.gpu_by_uuid[p.target]
                node = c.nodes[int(c.gpus.node[gpu])]
                if p.fails:
                    self.sim.emitter.kernel_log(
                        node, t, f"NVRM: GPU {c.gpu_pci[gpu]}: GPU reset failed", entity=p.target
                    )
                else:
                    self.sim.emitter.kernel_log(
                        node, t, f"NVRM: GPU {c.gpu_pci[gpu]}: GPU reset completed", entity=p.target
                    )
                    self.sim.faults.on_gpu_reset(gpu, t)
            elif p.kind == "reboot_node":
                node = c.node_by_name[p.target]
                if p.fails:
                    node.rebooting_until = t + 300.0  # stuck in POST; the BMC retries
                    continue
                self.sim.faults.on_node_reboot(node, t)
                self.sim.emitter.node_event(
                    node,
                    t,
                    "Rebooted",
                    f"Node {node.name} has been rebooted, boot id: {int(self.rng.integers(0, 2**31)):08x}",
                    "Warning",
                )

    def apply(self, kind: str, target: str = "", params: dict[str, Any] | None = None) -> ActionResult:
        """Dispatch an action by name (what the HTTP API and the environments call)."""
        params = params or {}
        if kind not in DISRUPTION:
            return self._result(kind, target, False, f"unknown action {kind!r}")
        fn = getattr(self, kind)
        try:
            if kind == "set_router_weights":
                return fn(params.get("weights", params))
            if kind in ("set_max_num_seqs", "scale", "switch_variant"):
                key = {"set_max_num_seqs": "max_num_seqs", "scale": "replicas", "switch_variant": "variant"}[kind]
                return fn(target, params[key])
            return fn(target)
        except (KeyError, ValueError, TypeError) as exc:
            return self._result(kind, target, False, f"bad parameters: {exc}")

    # ------------------------------------------------------------------------------ pods

    def restart_pod(self, pod_name: str) -> ActionResult:
        """Restart the vLLM container in place (``kubectl exec kill 1`` / rollout of one pod)."""
        c, t = self.sim.cluster, self.sim.t
        pod = c.pod_by_name.get(pod_name)
        if pod is None or pod.node < 0:
            return self._result("restart_pod", pod_name, False, "pod not found or not scheduled")
        if self._fails("restart_pod"):
            return self._result("restart_pod", pod_name, False, "container runtime timed out stopping the container")
        c.restart(pod, t)
        return self._result("restart_pod", pod_name, True, "restarting", pod.variant.load_time_s())

    def delete_pod(self, pod_name: str) -> ActionResult:
        """Delete the pod; its ReplicaSet schedules a fresh one (possibly on other GPUs)."""
        c, t = self.sim.cluster, self.sim.t
        pod = c.pod_by_name.get(pod_name)
        if pod is None:
            return self._result("delete_pod", pod_name, False, "pod not found")
        new = c.delete(pod, t)
        return self._result(
            "delete_pod", pod_name, True, f"replaced by {new.name if new else 'nothing'}", pod.variant.load_time_s()
        )

    def drain_replica(self, pod_name: str) -> ActionResult:
        """Take the replica out of the router's rotation: no new requests; what it holds finishes.

        The pod stays Ready (as when a load balancer stops sending to an endpoint), so a restart and a
        readiness check work as usual, and it stays drained through a restart in place until
        :meth:`restore_replica`. Refused when no other replica of its deployment is in rotation (the
        router would have nowhere to send the deployment's requests). Draining a drained replica is
        accepted and changes nothing.
        """
        c = self.sim.cluster
        pod = c.pod_by_name.get(pod_name)
        if pod is None or pod.node < 0:
            return self._result("drain_replica", pod_name, False, "pod not found or not scheduled")
        held = float(self.sim.serving.wait_n[pod.slot] + self.sim.serving.run_n[pod.slot])
        if pod.drained:
            return self._result("drain_replica", pod_name, True, "already drained", in_flight=round(held, 1))
        peers = [p for p in c.pods_of(pod.deployment) if p is not pod and c.in_rotation(p)]
        if not peers:
            return self._result(
                "drain_replica",
                pod_name,
                False,
                f"the last replica of {pod.deployment} in rotation: no other replica would take its requests",
            )
        pod.drained = True
        c.version += 1
        return self._result(
            "drain_replica",
            pod_name,
            True,
            f"out of rotation; {held:.0f} requests in flight finish, {len(peers)} replicas take new ones",
            in_flight=round(held, 1),
        )

    def restore_replica(self, pod_name: str) -> ActionResult:
        """Put a drained replica back into the router's rotation (it gets requests again once Ready).

        Restoring a replica that is not drained is accepted and changes nothing, so a rollback may
        always restore.
        """
        c = self.sim.cluster
        pod = c.pod_by_name.get(pod_name)
        if pod is None:
            return self._result("restore_replica", pod_name, False, "pod not found")
        if not pod.drained:
            return self._result("restore_replica", pod_name, True, "not drained")
        pod.drained = False
        c.version += 1
        msg = "back in rotation" if pod.ready else f"back in rotation once Ready (now {pod.phase})"
        return self._result("restore_replica", pod_name, True, msg)

    # ----------------------------------------------------------------------------- nodes

    def cordon_node(self, node_name: str) -> ActionResult:
        """Mark the node unschedulable."""
        node = self.sim.cluster.node_by_name.get(node_name)
        if node is None:
            return self._result("cordon_node", node_name, False, "node not found")
        node.cordoned = True
        self.sim.emitter.node_event(
            node, self.sim.t, "NodeNotSchedulable", f"Node {node_name} status is now: NodeNotSchedulable"
        )
        return self._result("cordon_node", node_name, True, "cordoned")

    def uncordon_node(self, node_name: str) -> ActionResult:
        """Make the node schedulable again."""
        node = self.sim.cluster.node_by_name.get(node_name)
        if node is None:
            return self._result("uncordon_node", node_name, False, "node not found")
        node.cordoned = False
        self.sim.emitter.node_event(
            node, self.sim.t, "NodeSchedulable", f"Node {node_name} status is now: NodeSchedulable"
        )
        return self._result("uncordon_node", node_name, True, "uncordoned")

    def drain_node(self, node_name: str) -> ActionResult:
        """Cordon and evict every pod (``kubectl drain``); replacements go to other nodes."""
        c, t = self.sim.cluster, self.sim.t
        node = c.node_by_name.get(node_name)
        if node is None:
            return self._result("drain_node", node_name, False, "node not found")
        node.cordoned = True
        for pod in c.pods_on_node(node.index):
            c.delete(pod, t)
        return self._result("drain_node", node_name, True, "drained")

    def resume_node(self, node_name: str) -> ActionResult:
        """Undo a drain (uncordon)."""
        res = self.uncordon_node(node_name)
        return self._result("resume_node", node_name, res.accepted, res.message)

    def reboot_node(self, node_name: str) -> ActionResult:
        """Reboot: pods are evicted, the node is NotReady for minutes, GPUs come back clean."""
        c, t = self.sim.cluster, self.sim.t
        node = c.node_by_name.get(node_name)
        if node is None:
            return self._result("reboot_node", node_name, False, "node not found")
        if node.rebooting_until:
            return self._result("reboot_node", node_name, False, "already rebooting")
        duration = float(self.rng.uniform(180.0, 300.0))
        for pod in c.pods_on_node(node.index):
            c.delete(pod, t)
        c.set_node_ready(node, False, t)
        node.rebooting_until = t + duration
        self.pending.append(_Pending(t + duration - 1.0, "reboot_node", node_name, self._fails("reboot_node")))
        return self._result("reboot_node", node_name, True, "rebooting", duration)

    def reset_gpu(self, gpu_uuid: str) -> ActionResult:
        """``nvidia-smi -r``; pods that crashed on the GPU recover on their next restart."""
        c, t = self.sim.cluster, self.sim.t
        if gpu_uuid not in c.gpu_by_uuid:
            return self._result("reset_gpu", gpu_uuid, False, "GPU not found")
        duration = float(self.rng.uniform(20.0, 45.0))
        self.pending.append(_Pending(t + duration, "reset_gpu", gpu_uuid, self._fails("reset_gpu")))
        return self._result("reset_gpu", gpu_uuid, True, "resetting", duration)

    # ------------------------------------------------------------------------ deployments

    def scale(self, deployment: str, replicas: int) -> ActionResult:
        """Set the desired replica count."""
        dep = self.sim.cluster.deployments.get(deployment)
        if dep is None or int(replicas) < 0:
            return self._result("scale", deployment, False, "deployment not found or bad replica count")
        old = dep.replicas
        dep.replicas = int(replicas)
        self.sim.cluster.version += 1
        self.sim.emitter.kube_deployment(
            dep,
            self.sim.t,
            "ScalingReplicaSet",
            f"Scaled {'up' if dep.replicas > old else 'down'} replica set "
            f"{dep.name}-{dep.template_hash} to {dep.replicas}",
        )
        res = self._result(
            "scale", deployment, True, f"{old} -> {dep.replicas}", dep.variant.load_time_s(), replicas=dep.replicas
        )
        self.disruption_this_step += DISRUPTION["scale"] * (abs(dep.replicas - old) - 1) if dep.replicas != old else 0.0
        return res

    def set_max_num_seqs(self, deployment: str, max_num_seqs: int) -> ActionResult:
        """Change ``--max-num-seqs``: a rolling restart of the deployment."""
        dep = self.sim.cluster.deployments.get(deployment)
        if dep is None or int(max_num_seqs) < 1:
            return self._result("set_max_num_seqs", deployment, False, "deployment not found or bad value")
        self.sim.cluster.rollout(dep, None, int(max_num_seqs), self.sim.t)
        dep.latency_factor = 1.0
        return self._result("set_max_num_seqs", deployment, True, "rolling", dep.variant.load_time_s() * dep.replicas)

    def switch_variant(self, deployment: str, variant: str) -> ActionResult:
        """Roll the deployment to another variant (size/precision/context/TP)."""
        dep = self.sim.cluster.deployments.get(deployment)
        if dep is None:
            return self._result("switch_variant", deployment, False, "deployment not found")
        v = parse_variant(variant)
        self.sim.cluster.rollout(dep, v, None, self.sim.t)
        dep.latency_factor = 1.0
        return self._result("switch_variant", deployment, True, f"rolling to {v.key}", v.load_time_s() * dep.replicas)

    def rollback(self, deployment: str) -> ActionResult:
        """``kubectl rollout undo``: back to the previous revision's variant and arguments."""
        c = self.sim.cluster
        dep = c.deployments.get(deployment)
        if dep is None or dep.previous is None:
            return self._result("rollback", deployment, False, "no previous revision")
        variant, seqs, factor = dep.previous
        c.rollout(dep, variant, seqs, self.sim.t)
        dep.latency_factor = factor
        return self._result("rollback", deployment, True, "rolling back", variant.load_time_s() * dep.replicas)

    def set_router_weights(self, weights: dict[str, float]) -> ActionResult:
        """Set the router's traffic share per deployment (normalised)."""
        s = self.sim.serving
        s.refresh()
        w = np.zeros(len(s.dep_names))
        for name, value in weights.items():
            if name not in s.dep_names or float(value) < 0:
                return self._result(
                    "set_router_weights", "router", False, f"unknown deployment {name!r} or negative weight"
                )
            w[s.dep_names.index(name)] = float(value)
        if w.sum() <= 0:
            return self._result("set_router_weights", "router", False, "weights must not all be zero")
        s.weights = w / w.sum()
        return self._result(
            "set_router_weights",
            "router",
            True,
            "weights set",
            weights={n: round(float(x), 4) for n, x in zip(s.dep_names, s.weights, strict=True)},
        )
