"""Faults: what can go wrong, when, how badly, and how each failure shows up and gets fixed.

A :class:`Fault` is a plan (type, target, onset, duration, severity, params) plus its life
(``pending`` → ``active`` → ``resolved``, with detection and resolution times). The
:class:`FaultEngine` applies active faults to the cluster every step; their effects then flow through
the same physics and serving code as healthy behaviour, so symptoms appear in metrics, logs and
Kubernetes events with realistic causality (a leak fills VRAM, VRAM full raises CUDA OOM, the crash
drops requests, the restart takes the model's load time).

Repairs come from actuators (:meth:`FaultEngine.on_gpu_reset`, :meth:`FaultEngine.on_node_reboot`)
or from state the engine watches (a pod restarted, a deployment rolled back).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from services.core.errors import ConfigError
from services.core.paths import shared_data_dir

if TYPE_CHECKING:
    from services.simulator.cluster import Cluster, Node, Pod
    from services.simulator.emitter import Emitter
    from services.simulator.traffic import Traffic

FAULT_TYPES: tuple[str, ...] = (
    "vram_leak",
    "kv_cache_exhaustion",
    "xid",
    "ecc",
    "thermal_throttle",
    "nvlink_error",
    "nccl_timeout",
    "network_latency",
    "node_flapping",
    "engine_dead",
    "bad_rollout",
    "pending_pods",
)
# What each fault type is aimed at.
TARGET_KIND: dict[str, str] = {
    "vram_leak": "pod",
    "kv_cache_exhaustion": "deployment",
    "xid": "gpu",
    "ecc": "gpu",
    "thermal_throttle": "gpu",
    "nvlink_error": "gpu",
    "nccl_timeout": "pod",
    "network_latency": "node",
    "node_flapping": "node",
    "engine_dead": "pod",
    "bad_rollout": "deployment",
    "pending_pods": "deployment",
}
# Median duration (s) when random; None: lasts until repaired.
DEFAULT_DURATION: dict[str, float | None] = {
    "vram_leak": None,
    "kv_cache_exhaustion": 600.0,
    "xid": None,
    "ecc": None,
    "thermal_throttle": 1200.0,
    "nvlink_error": None,
    "nccl_timeout": None,
    "network_latency": 900.0,
    "node_flapping": None,
    "engine_dead": None,
    "bad_rollout": None,
    "pending_pods": 900.0,
}
# XID codes drawn for random XID faults, with weights loosely following field frequency.
XID_CODES: tuple[int, ...] = (13, 31, 43, 48, 63, 64, 74, 79, 94, 95, 119)
XID_WEIGHTS: tuple[float, ...] = (0.12, 0.12, 0.06, 0.08, 0.08, 0.04, 0.1, 0.14, 0.08, 0.08, 0.1)
XID_CATALOG = Path("xid") / "nvidia_xid_catalog.csv"

# Catalog "ImmediateResolution" -> what the simulator does about it.
_RESOLUTION_EFFECT = {
    "RESTART_APP": "restart_app",
    "RESET_GPU": "reset_gpu",
    "WORKFLOW_XID_48": "reset_gpu",
    "WORKFLOW_NVLINK_ERR": "reset_gpu",
    "WORKFLOW_NVLINK5_ERR": "reset_gpu",
    "RESTART_BM": "reboot_node",
    "RESTART_VM": "reboot_node",
}


@dataclass(frozen=True)
class XidInfo:
    """One row of NVIDIA's XID catalog and the effect the simulator gives it."""

    code: int
    mnemonic: str
    description: str
    resolution: str
    effect: str  # ignore | restart_app | reset_gpu | reboot_node


@lru_cache(maxsize=4)
def _load_catalog(path: str) -> dict[int, XidInfo]:
    out: dict[int, XidInfo] = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            res = (row.get("ImmediateResolution") or "").strip()
            code = int(row["Code"])
            out[code] = XidInfo(
                code, row["Mnemonic"].strip(), row["Description"].strip(), res, _RESOLUTION_EFFECT.get(res, "ignore")
            )
    return out


def xid_catalog() -> dict[int, XidInfo]:
    """NVIDIA's XID catalog from the shared data folder, keyed by code.

    Raises:
        ConfigError: the catalog file is absent.
    """
    path = shared_data_dir() / XID_CATALOG
    if not path.is_file():
        raise ConfigError(f"NVIDIA XID catalog {path} is absent (see shared/data/xid/SOURCE.txt)")
    return _load_catalog(str(path))


def catalog_available() -> bool:
    """True when the XID catalog can be read."""
    try:
        xid_catalog()
    except ConfigError:
        return False
    return True


@dataclass
class Fault:
    """One injected fault and its life cycle.

    Attributes:
        id: unique within the episode (``xid-1``).
        type: one of :data:`FAULT_TYPES`.
        target: requested target ("" = random); after onset, the resolved entity name
            (GPU UUID, pod, node or deployment).
        onset: simulated second it starts.
        duration: seconds it lasts, or None until repaired.
        severity: 0..1.
        params: type-specific knobs (``code`` for XID, ``rate_mib_s`` for a leak...).
    """

    id: str
    type: str
    target: str = ""
    onset: float = 0.0
    duration: float | None = None
    severity: float = 0.5
    params: dict[str, Any] = field(default_factory=dict)
    status: str = "pending"
    entity: str = ""
    entity_kind: str = ""
    started_at: float | None = None
    detected_at: float | None = None
    resolved_at: float | None = None
    resolved_by: str = ""
    repaired: bool = False
    state: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """JSON-friendly record for grades and the HTTP API."""
        mttd = None if self.detected_at is None or self.started_at is None else self.detected_at - self.started_at
        mttr = None if self.resolved_at is None or self.started_at is None else self.resolved_at - self.started_at
        return {
            "id": self.id,
            "type": self.type,
            "entity": self.entity,
            "entity_kind": self.entity_kind,
            "onset": self.onset,
            "severity": round(self.severity, 4),
            "params": dict(self.params),
            "status": self.status,
            "started_at": self.started_at,
            "detected_at": self.detected_at,
            "resolved_at": self.resolved_at,
            "resolved_by": self.resolved_by,
            "mttd_s": mttd,
            "mttr_s": mttr,
            # a bad rollout's new revision and its first Ready pod (symptom_onset, points_at)
            "replica_set": self.state.get("replica_set"),
            "serving_at": self.state.get("serving_at"),
        }

    def points_at(self, entity: str, labels: Mapping[str, str]) -> bool:
        """Whether a signal about ``entity`` (with its topology ``labels``) is about this fault."""
        return points_at(self.summary(), entity, labels)

    def symptom_onset(self) -> float | None:
        """When the fault's effect can first reach telemetry (see :func:`symptom_onset`); None before it starts."""
        return symptom_onset(self.summary())


def points_at(fault: Mapping[str, Any], entity: str, labels: Mapping[str, str]) -> bool:
    """Whether a signal about ``entity`` points at a fault (its :meth:`Fault.summary`), directly or
    through topology labels: the one rule every evaluation and the demo use.

    A bad rollout's entity is the new revision: a pod of its ReplicaSet, not the Deployment's old pods
    (whose GPUs go idle as they are replaced). A Deployment's fault is any of its pods.
    """
    target = str(fault.get("entity") or "")
    if not target:
        return False
    replica_set = fault.get("replica_set") if fault.get("type") == "bad_rollout" else None
    if replica_set:
        prefix = f"{replica_set}-"
        return entity.startswith(prefix) or labels.get("pod", "").startswith(prefix)
    if entity == target or target in labels.values():
        return True
    if fault.get("entity_kind") == "deployment":
        prefix = f"{target}-"
        return entity.startswith(prefix) or labels.get("pod", "").startswith(prefix)
    return False


def symptom_onset(fault: Mapping[str, Any]) -> float | None:
    """When a fault's effect can first reach telemetry: its start, except for a bad rollout.

    A bad rollout starts with a change, not a symptom: the slow revision's first pod serves only after
    its model has loaded (about 105 s for the 70B replicas). Its clock starts at that pod's first Ready
    second, which the simulator records.
    """
    serving_at = fault.get("serving_at") if fault.get("type") == "bad_rollout" else None
    started = fault.get("started_at")
    if serving_at is not None:
        return float(serving_at)
    return None if started is None else float(started)


def random_faults(
    rng: np.random.Generator, duration_s: float, per_hour: float, types: tuple[str, ...] = FAULT_TYPES
) -> list[Fault]:
    """Draw faults for an episode: Poisson count, uniform onsets, Beta severities, log-normal durations."""
    if not catalog_available():
        types = tuple(t for t in types if t != "xid")
    n = int(rng.poisson(per_hour * duration_s / 3600.0))
    out: list[Fault] = []
    for i in range(n):
        kind = str(types[int(rng.integers(0, len(types)))])
        onset = float(np.round(rng.uniform(60.0, max(61.0, duration_s * 0.8))))
        sev = float(np.round(rng.beta(2.0, 2.0), 3))
        base = DEFAULT_DURATION[kind]
        dur = None if base is None else float(np.round(base * rng.lognormal(0.0, 0.4)))
        params: dict[str, Any] = {}
        if kind == "xid":
            params["code"] = int(rng.choice(XID_CODES, p=np.array(XID_WEIGHTS) / sum(XID_WEIGHTS)))
        out.append(Fault(f"{kind}-{i + 1}", kind, "", onset, dur, sev, params))
    return out


class FaultEngine:
    """Activates, applies, repairs and ends faults.

    Args:
        cluster: the cluster the faults act on.
        traffic: traffic source (for load-type faults).
        emitter: logs and events sink.
        rng: the fault stream (target picks, repair success).
        faults: the planned faults.
    """

    def __init__(
        self, cluster: Cluster, traffic: Traffic, emitter: Emitter, rng: np.random.Generator, faults: list[Fault]
    ) -> None:
        self.cluster = cluster
        self.traffic = traffic
        self.emitter = emitter
        self.rng = rng
        self.faults = sorted(faults, key=lambda f: (f.onset, f.id))
        self.latency_by_node: dict[int, float] = {}

    # ------------------------------------------------------------------------------ queries

    def active(self) -> list[Fault]:
        """Faults currently active."""
        return [f for f in self.faults if f.status == "active"]

    def get(self, fault_id: str) -> Fault | None:
        """The fault with this id."""
        return next((f for f in self.faults if f.id == fault_id), None)

    # ------------------------------------------------------------------------------ targets

    def _running_pods(self, deployment: str | None = None, min_tp: int = 1) -> list[Pod]:
        c = self.cluster
        return [
            c.pods[s]
            for s in sorted(c.pods)
            if c.pods[s].phase == "Running"
            and c.pods[s].variant.tp >= min_tp
            and (deployment is None or c.pods[s].deployment == deployment)
        ]

    def _pick(self, items: list[Any]) -> Any:
        return items[int(self.rng.integers(0, len(items)))] if items else None

    def _resolve_target(self, f: Fault) -> bool:
        c = self.cluster
        kind = TARGET_KIND[f.type]
        tgt = f.target.strip()
        min_tp = 2 if f.type in ("nccl_timeout", "nvlink_error") else 1
        if kind == "deployment":
            name = tgt if tgt in c.deployments else self._pick(sorted(c.deployments))
            if f.type == "kv_cache_exhaustion" and not tgt:
                # Long-context bursts hit the deployment with the longest context window.
                name = max(sorted(c.deployments), key=lambda d: c.deployments[d].variant.max_model_len)
            f.entity, f.entity_kind = name or "", "deployment"
            return bool(name)
        if kind == "node":
            node: Node | None = c.node_by_name.get(tgt)
            if node is None:
                pods = self._running_pods(tgt if tgt in c.deployments else None)
                pod = self._pick(pods)
                node = c.nodes[pod.node] if pod is not None else self._pick(c.nodes)
            if node is None:
                return False
            f.entity, f.entity_kind = node.name, "node"
            return True
        if kind == "pod":
            pod = c.pod_by_name.get(tgt)
            if pod is None:
                pods = self._running_pods(tgt if tgt in c.deployments else None, min_tp)
                pod = self._pick(pods) or self._pick(self._running_pods(None, min_tp))
            if pod is None:
                return False
            f.entity, f.entity_kind = pod.name, "pod"
            f.state["pod_slot"] = pod.slot
            f.state["restarts"] = pod.restarts
            return True
        # gpu: "node/index", a UUID, or a deployment name (a GPU of one of its running pods)
        gpu: int | None = None
        if tgt in c.gpu_by_uuid:
            gpu = c.gpu_by_uuid[tgt]
        elif "/" in tgt:
            node_name, _, idx = tgt.partition("/")
            n = c.node_by_name.get(node_name)
            if n is not None and idx.isdigit() and int(idx) < len(n.gpus):
                gpu = n.gpus[int(idx)]
        if gpu is None:
            pods = self._running_pods(tgt if tgt in c.deployments else None, min_tp)
            pod = self._pick(pods) or self._pick(self._running_pods(None))
            if pod is None:
                return False
            gpu = pod.gpus[int(self.rng.integers(0, len(pod.gpus)))]
        f.entity, f.entity_kind = c.gpu_uuids[gpu], "gpu"
        f.state["gpu"] = gpu
        return True

    # ---------------------------------------------------------------------------------- step

    def step(self, t: float, dt: float) -> None:
        """Start due faults, apply active ones, end expired ones."""
        self.latency_by_node = {}
        for f in self.faults:
            if f.status == "pending" and t >= f.onset:
                if self._resolve_target(f):
                    f.status = "active"
                    f.started_at = t
                    getattr(self, f"_start_{f.type}")(f, t)
                else:
                    f.status = "resolved"
                    f.resolved_by = "no_target"
            if f.status != "active":
                continue
            getattr(self, f"_apply_{f.type}")(f, t, dt)
            if f.status == "active" and f.duration is not None and t >= (f.started_at or 0.0) + f.duration:
                self._end(f, t, "expired")

    def _end(self, f: Fault, t: float, by: str) -> None:
        if f.status != "active":
            return
        f.status = "resolved"
        f.resolved_at = t
        f.resolved_by = by
        stop = getattr(self, f"_stop_{f.type}", None)
        if stop is not None:
            stop(f, t)

    def mark_detected(self, fault_id: str, t: float) -> bool:
        """Record that a policy detected the fault (first call wins)."""
        f = self.get(fault_id)
        if f is None or f.started_at is None:
            return False
        if f.detected_at is None:
            f.detected_at = t
        return True

    # ------------------------------------------------------------------------------ helpers

    def _pod(self, f: Fault) -> Pod | None:
        pod = self.cluster.pods.get(int(f.state.get("pod_slot", -1)))
        return pod if pod is not None and pod.name == f.entity else None

    def _pod_restarted(self, f: Fault) -> bool:
        pod = self._pod(f)
        return pod is None or pod.restarts > int(f.state.get("restarts", 0))

    def _gpu_pod(self, gpu: int) -> Pod | None:
        return self.cluster.pods.get(int(self.cluster.gpus.pod_slot[gpu]))

    def _xid(self, f: Fault, gpu: int, code: int, t: float) -> str:
        """Raise XID ``code`` on ``gpu``: metric, kernel log, and the catalog's effect."""
        c = self.cluster
        info = xid_catalog().get(code) or XidInfo(code, "UNKNOWN", "Unknown Xid", "", "ignore")
        c.gpus.xid[gpu] = code
        self.emitter.xid(c, gpu, code, t, info.description)
        pod = self._gpu_pod(gpu)
        if code in (48, 94, 95):
            c.gpus.ecc_dbe[gpu] += 1
            c.gpus.retired_dbe[gpu] += 1
            c.gpus.remap_pending[gpu] = 1
        elif code == 63:
            c.gpus.remap_pending[gpu] = 1
            c.gpus.retired_sbe[gpu] += 1
        elif code == 64:
            c.gpus.remap_failure[gpu] = 1
        elif code == 74:
            c.gpus.nvlink_crc[gpu] += 5000
        if info.effect in ("reset_gpu", "reboot_node"):
            c.gpus.broken[gpu] = True
            if code == 79:
                c.gpus.off_bus[gpu] = True
        if info.effect != "ignore" and pod is not None:
            if pod.variant.tp > 1 and info.effect != "restart_app":
                self.emitter.nccl_timeout(c, pod, t, 600.0)
            self.emitter.pod_log(
                c,
                pod,
                t,
                f"ERROR {self.emitter.vt(t)} [core.py:588] EngineCore encountered a fatal error. "
                "RuntimeError: CUDA error: "
                + ("unspecified launch failure" if code != 79 else "an illegal memory access was encountered"),
            )
            c.crash(pod, t, f"xid{code}")
        return info.effect

    # ---------------------------------------------------------------------------- vram_leak

    def _start_vram_leak(self, f: Fault, t: float) -> None:
        f.params.setdefault("rate_mib_s", round(5.0 + 45.0 * f.severity, 3))

    def _apply_vram_leak(self, f: Fault, t: float, dt: float) -> None:
        c = self.cluster
        pod = self._pod(f)
        if pod is None or self._pod_restarted(f):
            self._end(f, t, "restart")
            return
        if pod.phase != "Running":
            return
        g = c.gpus
        for i in pod.gpus:
            g.leak_mib[i] += float(f.params["rate_mib_s"]) * dt
        gpu0 = pod.gpus[0]
        used = g.memory_mib[gpu0] * 0.85 + g.leak_mib[gpu0]
        if used >= g.memory_mib[gpu0]:
            total = g.memory_mib[gpu0] / 1024.0
            self.emitter.cuda_oom(c, pod, t, total, max(0.0, total - used / 1024.0) + 0.2)
            c.crash(pod, t, "cuda_oom")
            self._end(f, t, "crash")

    # ------------------------------------------------------------------ kv_cache_exhaustion

    def _start_kv_cache_exhaustion(self, f: Fault, t: float) -> None:
        dep = self.cluster.deployments[f.entity]
        n_pods = max(1, dep.replicas)
        max_len = dep.variant.max_model_len
        rps = float(f.params.get("rps", n_pods * (0.15 + 0.6 * f.severity)))
        end = t + (f.duration if f.duration is not None else 600.0)
        f.duration = end - t
        self.traffic.add_long_context_burst(t, end, rps, 0.45 * max_len, 0.9 * max_len, 1500.0)

    def _apply_kv_cache_exhaustion(self, f: Fault, t: float, dt: float) -> None:
        return None

    # ---------------------------------------------------------------------------------- xid

    def _start_xid(self, f: Fault, t: float) -> None:
        code = int(f.params.setdefault("code", 79))
        f.state["effect"] = self._xid(f, int(f.state["gpu"]), code, t)
        if f.state["effect"] == "ignore":
            self._end(f, t, "informational")

    def _apply_xid(self, f: Fault, t: float, dt: float) -> None:
        gpu = int(f.state["gpu"])
        effect = f.state["effect"]
        if effect == "restart_app" or f.repaired:
            pod = self._gpu_pod(gpu)
            if pod is None or pod.phase == "Running":
                self._end(f, t, f.state.get("repaired_by", "pod_restart"))

    # ---------------------------------------------------------------------------------- ecc

    def _start_ecc(self, f: Fault, t: float) -> None:
        f.params.setdefault("sbe_per_min", round(1.0 + 60.0 * f.severity, 3))
        if f.severity >= 0.6:
            f.params.setdefault("dbe_after_s", 300.0)

    def _apply_ecc(self, f: Fault, t: float, dt: float) -> None:
        g = self.cluster.gpus
        gpu = int(f.state["gpu"])
        if f.repaired:
            pod = self._gpu_pod(gpu)
            if pod is None or pod.phase == "Running":
                self._end(f, t, f.state.get("repaired_by", "reset_gpu"))
            return
        k = int(self.rng.poisson(float(f.params["sbe_per_min"]) * dt / 60.0))
        if k:
            g.ecc_sbe[gpu] += k
            g.retired_sbe[gpu] = min(64.0, g.retired_sbe[gpu] + 0.02 * k)
        if g.ecc_sbe[gpu] >= 500 and not f.state.get("xid92"):
            f.state["xid92"] = True
            self._xid(f, gpu, 92, t)
        after = f.params.get("dbe_after_s")
        if after is not None and not f.state.get("dbe") and t >= (f.started_at or 0.0) + float(after):
            f.state["dbe"] = True
            self._xid(f, gpu, 48, t)

    # ------------------------------------------------------------------------- thermal

    def _thermal_gpus(self, f: Fault) -> list[int]:
        gpu = int(f.state["gpu"])
        if f.params.get("scope") == "node":
            return list(self.cluster.nodes[int(self.cluster.gpus.node[gpu])].gpus)
        return [gpu]

    def _start_thermal_throttle(self, f: Fault, t: float) -> None:
        delta = float(f.params.setdefault("delta_c", round(18.0 + 22.0 * f.severity, 2)))
        for i in self._thermal_gpus(f):
            self.cluster.gpus.heat_c[i] += delta

    def _apply_thermal_throttle(self, f: Fault, t: float, dt: float) -> None:
        return None

    def _stop_thermal_throttle(self, f: Fault, t: float) -> None:
        for i in self._thermal_gpus(f):
            self.cluster.gpus.heat_c[i] = max(0.0, self.cluster.gpus.heat_c[i] - float(f.params["delta_c"]))

    # ------------------------------------------------------------------------------ nvlink

    def _start_nvlink_error(self, f: Fault, t: float) -> None:
        f.params.setdefault("crc_per_min", round(100.0 + 5000.0 * f.severity, 1))
        f.params.setdefault("slowdown", round(1.0 + 1.5 * f.severity, 3))
        if f.severity >= 0.7:
            f.params.setdefault("xid74_after_s", 120.0)
        self.cluster.gpus.slowdown[int(f.state["gpu"])] = float(f.params["slowdown"])

    def _apply_nvlink_error(self, f: Fault, t: float, dt: float) -> None:
        g = self.cluster.gpus
        gpu = int(f.state["gpu"])
        if f.repaired:
            pod = self._gpu_pod(gpu)
            if pod is None or pod.phase == "Running":
                self._end(f, t, f.state.get("repaired_by", "reset_gpu"))
            return
        g.nvlink_crc[gpu] += float(self.rng.poisson(float(f.params["crc_per_min"]) * dt / 60.0))
        after = f.params.get("xid74_after_s")
        if after is not None and not f.state.get("xid") and t >= (f.started_at or 0.0) + float(after):
            f.state["xid"] = True
            self._xid(f, gpu, 74, t)

    def _stop_nvlink_error(self, f: Fault, t: float) -> None:
        self.cluster.gpus.slowdown[int(f.state["gpu"])] = 1.0

    # ------------------------------------------------------------------------------- nccl

    def _start_nccl_timeout(self, f: Fault, t: float) -> None:
        f.params.setdefault("timeout_s", 180.0)
        pod = self._pod(f)
        if pod is not None:
            pod.hung = True
            self.cluster.version += 1

    def _apply_nccl_timeout(self, f: Fault, t: float, dt: float) -> None:
        pod = self._pod(f)
        if pod is None or self._pod_restarted(f):
            self._end(f, t, "restart")
            return
        if t >= (f.started_at or 0.0) + float(f.params["timeout_s"]):
            self.emitter.nccl_timeout(self.cluster, pod, t, float(f.params["timeout_s"]))
            self.cluster.crash(pod, t, "nccl_timeout")
            self._end(f, t, "crash")

    def _stop_nccl_timeout(self, f: Fault, t: float) -> None:
        pod = self._pod(f)
        if pod is not None:
            pod.hung = False
        self.cluster.version += 1

    # --------------------------------------------------------------------------- network

    def _start_network_latency(self, f: Fault, t: float) -> None:
        f.params.setdefault("latency_ms", round(200.0 + 2300.0 * f.severity, 1))

    def _apply_network_latency(self, f: Fault, t: float, dt: float) -> None:
        node = self.cluster.node_by_name[f.entity]
        self.latency_by_node[node.index] = (
            self.latency_by_node.get(node.index, 0.0) + float(f.params["latency_ms"]) / 1000.0
        )

    # -------------------------------------------------------------------------- flapping

    def _start_node_flapping(self, f: Fault, t: float) -> None:
        f.params.setdefault("period_s", 120.0)
        f.params.setdefault("down_fraction", round(0.3 + 0.5 * f.severity, 3))

    def _apply_node_flapping(self, f: Fault, t: float, dt: float) -> None:
        node = self.cluster.node_by_name[f.entity]
        if node.rebooting_until:
            return
        phase = ((t - (f.started_at or 0.0)) % float(f.params["period_s"])) / float(f.params["period_s"])
        self.cluster.set_node_ready(node, phase >= float(f.params["down_fraction"]), t)

    def _stop_node_flapping(self, f: Fault, t: float) -> None:
        node = self.cluster.node_by_name[f.entity]
        if not node.rebooting_until:
            self.cluster.set_node_ready(node, True, t)

    # ------------------------------------------------------------------------ engine_dead

    def _start_engine_dead(self, f: Fault, t: float) -> None:
        pod = self._pod(f)
        if pod is not None:
            pod.engine_dead = True
            self.cluster.version += 1
            self.emitter.engine_dead(self.cluster, pod, t)

    def _apply_engine_dead(self, f: Fault, t: float, dt: float) -> None:
        pod = self._pod(f)
        if pod is None or self._pod_restarted(f):
            self._end(f, t, "restart")
            return
        if int(t - (f.started_at or 0.0)) % 30 == 0:
            self.emitter.engine_dead(self.cluster, pod, t)

    # ------------------------------------------------------------------------ bad_rollout

    def _start_bad_rollout(self, f: Fault, t: float) -> None:
        dep = self.cluster.deployments[f.entity]
        f.params.setdefault("latency_factor", round(1.5 + 2.0 * f.severity, 3))
        self.cluster.rollout(dep, None, None, t)
        dep.latency_factor = float(f.params["latency_factor"])
        f.state["revision"] = dep.revision
        f.state["replica_set"] = f"{dep.name}-{dep.template_hash}"

    def _apply_bad_rollout(self, f: Fault, t: float, dt: float) -> None:
        dep = self.cluster.deployments[f.entity]
        if "serving_at" not in f.state and any(
            p.ready and p.revision == f.state["revision"] for p in self.cluster.pods_of(dep.name)
        ):
            # the slow revision's first Ready pod: its symptom can reach telemetry from here on
            f.state["serving_at"] = t
        if dep.revision != f.state["revision"] and dep.latency_factor <= 1.0:
            f.state.setdefault("fixed_at", t)
            if not any(p.revision != dep.revision for p in self.cluster.pods_of(dep.name)):
                self._end(f, t, "rollback")

    # ----------------------------------------------------------------------- pending_pods

    def _start_pending_pods(self, f: Fault, t: float) -> None:
        c = self.cluster
        dep = c.deployments[f.entity]
        free = int((c.gpus.pod_slot < 0).sum())
        extra = int(f.params.setdefault("extra_replicas", free // dep.variant.tp + 1 + round(2 * f.severity)))
        f.state["replicas_before"] = dep.replicas
        dep.replicas += extra
        c.version += 1
        surge = float(f.params.setdefault("surge", round(1.0 + 0.8 * f.severity, 3)))
        end = t + (f.duration if f.duration is not None else 900.0)
        f.duration = end - t
        self.traffic.add_surge(t, end, surge)
        c.emitter.kube_deployment(
            dep, t, "ScalingReplicaSet", f"Scaled up replica set {dep.name}-{dep.template_hash} to {dep.replicas}"
        )

    def _apply_pending_pods(self, f: Fault, t: float, dt: float) -> None:
        return None

    # ----------------------------------------------------------------------------- repairs

    def on_gpu_reset(self, gpu: int, t: float) -> None:
        """``nvidia-smi -r`` finished on ``gpu``: clear what a reset clears."""
        g = self.cluster.gpus
        if g.off_bus[gpu]:
            # A GPU that fell off the bus rarely comes back without a power cycle.
            if self.rng.random() >= 0.3:
                self.emitter.kernel_log(
                    self.cluster.nodes[int(g.node[gpu])],
                    t,
                    f"NVRM: GPU {self.cluster.gpu_pci[gpu]}: GPU reset failed; a node reboot is required",
                    entity=self.cluster.gpu_uuids[gpu],
                )
                return
        self._clear_gpu(gpu)
        for f in self.active():
            if f.state.get("gpu") == gpu and f.type in ("xid", "ecc", "nvlink_error"):
                f.repaired = True
                f.state["repaired_by"] = "reset_gpu"

    def on_node_reboot(self, node: Node, t: float) -> None:
        """The node came back from a reboot: every GPU is fresh; flapping kubelets usually recover."""
        for gpu in node.gpus:
            self._clear_gpu(gpu)
        for f in self.active():
            if f.state.get("gpu") in node.gpus and f.type in ("xid", "ecc", "nvlink_error", "thermal_throttle"):
                f.repaired = True
                f.state["repaired_by"] = "reboot_node"
                if f.type == "thermal_throttle" and f.params.get("scope") != "node":
                    self._end(f, t, "reboot_node")
            if f.type == "node_flapping" and f.entity == node.name and self.rng.random() < 0.8:
                self._end(f, t, "reboot_node")

    def _clear_gpu(self, gpu: int) -> None:
        g = self.cluster.gpus
        g.broken[gpu] = False
        g.off_bus[gpu] = False
        g.xid[gpu] = 0
        g.ecc_sbe[gpu] = 0.0
        g.ecc_dbe[gpu] = 0.0
        g.remap_pending[gpu] = 0.0
        g.nvlink_crc[gpu] = 0.0
        g.slowdown[gpu] = 1.0
        self.cluster.version += 1


def severity_from(value: float) -> float:
    """Clamp a severity to [0, 1] (NaN becomes 0.5)."""
    return 0.5 if math.isnan(value) else min(1.0, max(0.0, value))
