"""Cluster topology: nodes, GPUs, deployments, pods, scheduling and the Kubernetes-like lifecycle.

GPU state that changes every simulated second lives in numpy arrays (:class:`GpuArrays`, one row
per GPU) so a 1,000-node cluster costs a handful of vector operations per step. Pods, nodes and
deployments are small Python objects because they change rarely (crash, restart, reschedule) and
their lifecycle reads best as plain code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from services.simulator.specs import GPU_SPECS, GpuSpec, Variant, parse_variant

if TYPE_CHECKING:
    from services.simulator.emitter import Emitter

NAMESPACE = "llm-serving"
# The alphabet Kubernetes uses for generated name suffixes (no vowels, no look-alike characters).
_K8S_ALPHABET = np.array(list("bcdfghjklmnpqrstvwxz2456789"))
# PCI bus ids of the eight SXM GPUs of an HGX H100 board, in nvidia-smi order.
_PCI_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")

# Kubernetes timings (kubelet / node-controller defaults) that shape how faults surface.
CRASH_BACKOFF_START_S = 10.0
CRASH_BACKOFF_MAX_S = 300.0
NODE_EVICTION_TIMEOUT_S = 300.0


def k8s_suffix(rng: np.random.Generator, n: int) -> str:
    """Return an ``n``-character Kubernetes-style random name suffix."""
    return "".join(rng.choice(_K8S_ALPHABET, size=n))


def gpu_uuid(rng: np.random.Generator) -> str:
    """Return a UUID in nvidia-smi form, ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``."""
    h = "".join(f"{b:02x}" for b in rng.integers(0, 256, size=16))
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@dataclass
class Node:
    """A Kubernetes node carrying GPUs.

    Attributes:
        index: position in the cluster's node list.
        name: node name (also DCGM's ``Hostname``).
        gpu_spec: the GPU model installed.
        gpus: indices into :class:`GpuArrays`.
        ready: kubelet reports Ready.
        cordoned: unschedulable (``kubectl cordon``).
        not_ready_since: when the node last went NotReady (for taint-based eviction).
        rebooting_until: simulated time the reboot finishes, or 0.
    """

    index: int
    name: str
    gpu_spec: GpuSpec
    gpus: list[int]
    ready: bool = True
    cordoned: bool = False
    not_ready_since: float = 0.0
    rebooting_until: float = 0.0


@dataclass
class Deployment:
    """A Deployment serving one model variant behind the shared router.

    Attributes:
        name: deployment name.
        variant: the served :class:`Variant`.
        replicas: desired replica count.
        max_num_seqs: vLLM ``--max-num-seqs``.
        revision: rollout generation; a new one restarts every pod.
        template_hash: pod-template hash in pod names (changes with the revision).
        latency_factor: >1 when the running revision regressed (bad rollout).
        previous: (variant, max_num_seqs, latency_factor) of the revision before, for rollback.
    """

    name: str
    variant: Variant
    replicas: int
    max_num_seqs: int = 256
    revision: int = 1
    template_hash: str = ""
    latency_factor: float = 1.0
    previous: tuple[Variant, int, float] | None = None
    rollout_todo: list[str] = field(default_factory=list)


@dataclass
class Pod:
    """One vLLM replica.

    ``phase`` is the simulator's compact view of pod + container state:
    ``Pending`` (not scheduled), ``Loading`` (container started, model loading, not Ready),
    ``Running`` (Ready, serving), ``Crashed`` (container exited, waiting out CrashLoopBackOff),
    ``Terminated`` (deleted; the slot is free).

    ``drained``: taken out of the router's rotation (``drain_replica``): it gets no new requests but
    finishes those it holds, and stays Ready. It is the pod's, like a label, so it outlives a restart
    in place and ends with the pod (a replacement starts in rotation).
    """

    slot: int
    name: str
    deployment: str
    variant: Variant
    revision: int
    node: int = -1
    gpus: tuple[int, ...] = ()
    phase: str = "Pending"
    phase_since: float = 0.0
    ready_at: float = 0.0
    restarts: int = 0
    backoff_s: float = CRASH_BACKOFF_START_S
    engine_dead: bool = False
    hung: bool = False  # a collective never returns (NCCL): Ready, but no progress
    drained: bool = False
    uid: str = ""

    @property
    def ready(self) -> bool:
        """Kubernetes readiness: Running, whatever the engine inside thinks."""
        return self.phase == "Running"


class GpuArrays:
    """Per-GPU state as parallel numpy arrays (row = GPU index)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.node = np.zeros(n, dtype=np.int64)
        self.local_index = np.zeros(n, dtype=np.int64)
        self.memory_mib = np.zeros(n)
        self.tdp_w = np.zeros(n)
        self.idle_w = np.zeros(n)
        self.slowdown_c = np.zeros(n)
        self.shutdown_c = np.zeros(n)
        self.max_clock = np.zeros(n)
        self.idle_clock = np.zeros(n)
        self.cost_per_s = np.zeros(n)
        self.temp_c = np.full(n, 32.0)
        self.power_w = np.zeros(n)
        self.util = np.zeros(n)
        self.sm_clock = np.zeros(n)
        self.fb_used_mib = np.zeros(n)
        self.leak_mib = np.zeros(n)  # extra memory held by a leaking process
        self.heat_c = np.zeros(n)  # extra degrees from a cooling fault
        self.throttle_reasons = np.zeros(n, dtype=np.int64)
        self.xid = np.zeros(n, dtype=np.int64)  # last XID (DCGM reports the latest one)
        self.ecc_sbe = np.zeros(n)
        self.ecc_dbe = np.zeros(n)
        self.retired_sbe = np.zeros(n)
        self.retired_dbe = np.zeros(n)
        self.remap_failure = np.zeros(n)
        self.remap_pending = np.zeros(n)
        self.nvlink_crc = np.zeros(n)
        self.slowdown = np.ones(n)  # multiplies step time of pods using the GPU (nvlink retries...)
        self.broken = np.zeros(n, dtype=bool)  # needs a reset or reboot before it can run CUDA
        self.off_bus = np.zeros(n, dtype=bool)  # XID 79: invisible to the driver until reboot
        self.pod_slot = np.full(n, -1, dtype=np.int64)


class Cluster:
    """Nodes, GPUs, deployments and pods, plus scheduling and the pod lifecycle.

    Args:
        rng: generator for names and UUIDs (topology only; dynamics use other streams).
        node_specs: GPU type key of each node.
        gpus_per_node: GPUs on every node.
        deployments: (name, variant key, replicas, max_num_seqs) of each deployment.
        emitter: where Kubernetes events and logs go.
    """

    def __init__(
        self,
        rng: np.random.Generator,
        node_specs: list[str],
        gpus_per_node: int,
        deployments: list[tuple[str, str, int, int]],
        emitter: Emitter,
    ) -> None:
        self.rng = rng
        self.emitter = emitter
        self.nodes: list[Node] = []
        n_gpus = len(node_specs) * gpus_per_node
        self.gpus = GpuArrays(n_gpus)
        self.gpu_uuids: list[str] = []
        self.gpu_pci: list[str] = []
        width = max(3, len(str(len(node_specs))))
        for i, key in enumerate(node_specs):
            spec = GPU_SPECS[key]
            idx = list(range(i * gpus_per_node, (i + 1) * gpus_per_node))
            self.nodes.append(Node(i, f"gpu-node-{i:0{width}d}", spec, idx))
            g = self.gpus
            sl = slice(idx[0], idx[-1] + 1)
            g.node[sl] = i
            g.local_index[sl] = np.arange(gpus_per_node)
            g.memory_mib[sl] = spec.memory_mib
            g.tdp_w[sl] = spec.tdp_w
            g.idle_w[sl] = spec.idle_w
            g.slowdown_c[sl] = spec.slowdown_temp_c
            g.shutdown_c[sl] = spec.shutdown_temp_c
            g.max_clock[sl] = spec.max_sm_clock_mhz
            g.idle_clock[sl] = spec.idle_sm_clock_mhz
            g.cost_per_s[sl] = spec.cost_per_hour / 3600.0
            g.sm_clock[sl] = spec.idle_sm_clock_mhz
            g.power_w[sl] = spec.idle_w
            for j in range(gpus_per_node):
                self.gpu_uuids.append(gpu_uuid(rng))
                bus = _PCI_BUSES[j] if j < len(_PCI_BUSES) else f"{0xE0 + j:02x}"
                self.gpu_pci.append(f"0000:{bus}:00.0")
        self.gpu_by_uuid = {u: i for i, u in enumerate(self.gpu_uuids)}
        self.node_by_name = {n.name: n for n in self.nodes}
        self.deployments: dict[str, Deployment] = {}
        self.pods: dict[int, Pod] = {}  # slot -> pod
        self.pod_by_name: dict[str, Pod] = {}
        # A pending pod needs a slot too; leave headroom above one pod per GPU.
        self.max_slots = n_gpus + 64 + n_gpus // 4
        self._free_slots = list(range(self.max_slots - 1, -1, -1))
        self.version = 0  # bumped whenever pods or routability change, so caches can refresh
        # Slots whose engine process just died or (re)started; the serving model drains these lists
        # to drop in-flight requests and reset the pod's Prometheus counters.
        self.down_slots: list[tuple[int, bool]] = []  # (slot, graceful)
        self.started_slots: list[int] = []
        for name, vkey, replicas, seqs in deployments:
            dep = Deployment(name, parse_variant(vkey), replicas, seqs, template_hash=k8s_suffix(rng, 10))
            self.deployments[name] = dep
            for _ in range(replicas):
                self._new_pod(dep, 0.0, quiet=True)

    # ------------------------------------------------------------------------------- pods

    def _new_pod(self, dep: Deployment, t: float, quiet: bool = False) -> Pod | None:
        if not self._free_slots:
            return None
        slot = self._free_slots.pop()
        name = f"{dep.name}-{dep.template_hash}-{k8s_suffix(self.rng, 5)}"
        pod = Pod(slot, name, dep.name, dep.variant, dep.revision, phase_since=t, uid=k8s_suffix(self.rng, 12))
        self.pods[slot] = pod
        self.pod_by_name[name] = pod
        self.version += 1
        if not self._schedule(pod, t, quiet):
            if not quiet:
                self.emitter.kube_failed_scheduling(pod, t, self._unschedulable_reason(pod))
        elif quiet:
            # The initial pods are already serving when the simulation starts.
            pod.phase = "Running"
            pod.ready_at = t
        return pod

    def _fits_on(self, node: Node, variant: Variant) -> list[int] | None:
        if not node.ready or node.cordoned or node.rebooting_until > 0 or not variant.fits(node.gpu_spec):
            return None
        g = self.gpus
        free = [i for i in node.gpus if g.pod_slot[i] < 0 and not g.broken[i]]
        return free[: variant.tp] if len(free) >= variant.tp else None

    def _schedule(self, pod: Pod, t: float, quiet: bool) -> bool:
        for node in self.nodes:
            picked = self._fits_on(node, pod.variant)
            if picked is None:
                continue
            pod.node = node.index
            pod.gpus = tuple(picked)
            for i in picked:
                self.gpus.pod_slot[i] = pod.slot
            self._start_container(pod, t, quiet)
            return True
        return False

    def _unschedulable_reason(self, pod: Pod) -> str:
        n = len(self.nodes)
        cordoned = sum(1 for x in self.nodes if x.cordoned or not x.ready)
        short = n - cordoned
        parts = [f"0/{n} nodes are available:"]
        if short:
            parts.append(f"{short} Insufficient nvidia.com/gpu.")
        if cordoned:
            parts.append(f"{cordoned} node(s) were unschedulable.")
        return (
            " ".join(parts)
            + f" preemption: 0/{n} nodes are available: {n} No preemption victims found for incoming pod."
        )

    def _start_container(self, pod: Pod, t: float, quiet: bool) -> None:
        pod.phase = "Loading"
        pod.phase_since = t
        pod.ready_at = t + pod.variant.load_time_s()
        self.started_slots.append(pod.slot)
        if not quiet:
            self.emitter.pod_started(self, pod, t)
        self.version += 1

    def release(self, pod: Pod, graceful: bool = False) -> None:
        """Free the pod's GPUs and slot; a graceful stop lets in-flight requests finish elsewhere."""
        self.down_slots.append((pod.slot, graceful))
        for i in pod.gpus:
            if self.gpus.pod_slot[i] == pod.slot:
                self.gpus.pod_slot[i] = -1
                self.gpus.leak_mib[i] = 0.0
        pod.gpus = ()
        pod.node = -1
        pod.phase = "Terminated"
        self.pods.pop(pod.slot, None)
        self.pod_by_name.pop(pod.name, None)
        self._free_slots.append(pod.slot)
        self.version += 1

    def crash(self, pod: Pod, t: float, reason: str) -> None:
        """The container exited: it waits out CrashLoopBackOff, then restarts in place."""
        if pod.phase in ("Crashed", "Pending", "Terminated"):
            return
        pod.phase = "Crashed"
        pod.phase_since = t
        pod.restarts += 1
        pod.engine_dead = False
        pod.hung = False
        pod.ready_at = t + pod.backoff_s
        pod.backoff_s = min(CRASH_BACKOFF_MAX_S, pod.backoff_s * 2)
        for i in pod.gpus:
            self.gpus.leak_mib[i] = 0.0
        self.down_slots.append((pod.slot, False))
        self.emitter.pod_crashed(self, pod, t, reason)
        self.version += 1

    def restart(self, pod: Pod, t: float) -> None:
        """Restart the container in place (same pod name, same GPUs); resets CrashLoop backoff."""
        if pod.phase == "Pending" or pod.phase == "Terminated":
            return
        self.emitter.kube(pod, t, "Killing", "Normal", "Stopping container vllm", node=self.nodes[pod.node].name)
        pod.restarts += 1
        pod.engine_dead = False
        pod.hung = False
        pod.backoff_s = CRASH_BACKOFF_START_S
        for i in pod.gpus:
            self.gpus.leak_mib[i] = 0.0
        self.down_slots.append((pod.slot, pod.phase == "Running" and not pod.engine_dead and not pod.hung))
        self._start_container(pod, t, False)

    def delete(self, pod: Pod, t: float, reason: str = "Killing", replace: bool = True) -> Pod | None:
        """Delete a pod; the ReplicaSet creates a replacement (new name, rescheduled)."""
        if pod.node >= 0:
            kind = "Warning" if reason == "Evicted" else "Normal"
            msg = "Stopping container vllm" if reason == "Killing" else "The node was drained or became NotReady"
            self.emitter.kube(pod, t, reason, kind, msg, node=self.nodes[pod.node].name)
        # Planned deletions drain (terminationGracePeriod); evictions from a dead node do not.
        self.release(pod, graceful=reason == "Killing" and not pod.engine_dead and not pod.hung)
        dep = self.deployments.get(pod.deployment)
        if replace and dep is not None and self.replica_count(dep.name) < dep.replicas:
            return self._new_pod(dep, t)
        return None

    def replica_count(self, deployment: str) -> int:
        """Pods (any phase but Terminated) the deployment owns."""
        return sum(1 for p in self.pods.values() if p.deployment == deployment)

    def pods_of(self, deployment: str) -> list[Pod]:
        """The deployment's pods, in slot order (deterministic)."""
        return [self.pods[s] for s in sorted(self.pods) if self.pods[s].deployment == deployment]

    def in_rotation(self, pod: Pod) -> bool:
        """Whether the router sends the pod new requests: Ready, on a Ready node, not drained."""
        return pod.ready and not pod.drained and self.nodes[pod.node].ready

    def pods_on_node(self, node: int) -> list[Pod]:
        """Pods bound to node ``node``, in slot order."""
        return [self.pods[s] for s in sorted(self.pods) if self.pods[s].node == node]

    # --------------------------------------------------------------------------- lifecycle

    def tick(self, t: float) -> None:
        """Advance pod and node lifecycles to time ``t`` (one call per simulated step)."""
        for node in self.nodes:
            if node.rebooting_until and t >= node.rebooting_until:
                node.rebooting_until = 0.0
                node.ready = True
                self.emitter.node_ready(node, t)
                self.version += 1
            if not node.ready and not node.rebooting_until and node.not_ready_since:
                if t - node.not_ready_since >= NODE_EVICTION_TIMEOUT_S:
                    for evicted in self.pods_on_node(node.index):
                        self.delete(evicted, t, reason="Evicted")
        for slot in list(self.pods):
            pod = self.pods.get(slot)
            if pod is None:
                continue
            if pod.phase == "Loading" and t >= pod.ready_at:
                if any(self.gpus.broken[i] for i in pod.gpus):
                    self.crash(pod, t, "cuda_init")
                else:
                    pod.phase = "Running"
                    pod.phase_since = t
                    pod.backoff_s = CRASH_BACKOFF_START_S
                    self.emitter.pod_ready(self, pod, t)
                    self.version += 1
            elif pod.phase == "Crashed" and t >= pod.ready_at:
                node = self.nodes[pod.node]
                if node.ready:
                    self._start_container(pod, t, False)
                else:
                    pod.ready_at = t + pod.backoff_s
            elif pod.phase == "Pending" and int(t) % 10 == 0:
                # The scheduler retries unschedulable pods on a backoff; every 10 s is close enough.
                if not self._schedule(pod, t, False) and int(t) % 60 == 0:
                    self.emitter.kube_failed_scheduling(pod, t, self._unschedulable_reason(pod))
        # One pass groups the pods; reconciling a deployment only touches that deployment's pods.
        by_deployment = self.pods_by_deployment()
        for dep in self.deployments.values():
            self._reconcile(dep, t, by_deployment[dep.name])

    def pods_by_deployment(self) -> dict[str, list[Pod]]:
        """Every deployment's pods, in slot order (``pods_of`` for all deployments in one pass)."""
        out: dict[str, list[Pod]] = {name: [] for name in self.deployments}
        for slot in sorted(self.pods):
            pod = self.pods[slot]
            out.setdefault(pod.deployment, []).append(pod)
        return out

    def _reconcile(self, dep: Deployment, t: float, pods: list[Pod]) -> None:
        """ReplicaSet + rolling update controller (maxSurge 0, maxUnavailable 1); ``pods`` = ``pods_of(dep)``."""
        if len(pods) < dep.replicas:
            for _ in range(dep.replicas - len(pods)):
                self._new_pod(dep, t)
            pods = self.pods_of(dep.name)
        elif len(pods) > dep.replicas:
            # Scale down removes the least useful pods first: pending, then crashed, then newest.
            order = {"Pending": 0, "Crashed": 1, "Loading": 2, "Running": 3}
            victims = sorted(pods, key=lambda p: (order.get(p.phase, 4), -p.slot))[: len(pods) - dep.replicas]
            for p in victims:
                self.delete(p, t, replace=False)
            pods = self.pods_of(dep.name)
        stale = [p for p in pods if p.revision != dep.revision]
        if stale and not any(p.phase == "Loading" for p in pods):
            self.delete(stale[0], t)

    def rollout(self, dep: Deployment, variant: Variant | None, max_num_seqs: int | None, t: float) -> None:
        """Start a rolling update to a new revision (new variant and/or engine arguments)."""
        dep.previous = (dep.variant, dep.max_num_seqs, dep.latency_factor)
        if variant is not None:
            dep.variant = variant
        if max_num_seqs is not None:
            dep.max_num_seqs = max_num_seqs
        dep.revision += 1
        dep.template_hash = k8s_suffix(self.rng, 10)
        self.emitter.kube_deployment(
            dep, t, "ScalingReplicaSet", f"Scaled up replica set {dep.name}-{dep.template_hash} to 1"
        )
        self.version += 1

    # ----------------------------------------------------------------------------- nodes

    def set_node_ready(self, node: Node, ready: bool, t: float) -> None:
        """Flip a node's Ready condition (kubelet heartbeat lost or regained)."""
        if node.ready == ready:
            return
        node.ready = ready
        node.not_ready_since = 0.0 if ready else t
        if ready:
            self.emitter.node_ready(node, t)
        else:
            self.emitter.node_not_ready(node, t)
        self.version += 1

    def gpu_cost_per_s(self) -> float:
        """USD per second of the GPUs held by pods (what the cluster pays for the serving fleet)."""
        g = self.gpus
        return float(g.cost_per_s[g.pod_slot >= 0].sum())
