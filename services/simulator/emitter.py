"""Log lines and Kubernetes events, written the way the real systems print them.

Every helper appends frozen event models (:class:`LogRecord`, :class:`KubeEvent`) to a buffer the
simulator drains once per step; nothing here draws random numbers except through the generator it
is given, so the output is a pure function of the seed and the scenario.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import numpy as np

from services.core.events import Event, KubeEvent, LogRecord, ObjectRef
from services.simulator.trusted import log_record

if TYPE_CHECKING:
    from services.simulator.cluster import Cluster, Deployment, Node, Pod

# Kernel messages NVRM prints after "Xid (PCI:...): <code>, pid=..., name=...," for common codes.
XID_DETAIL: dict[int, str] = {
    13: "Graphics SM Warp Exception on (GPC 1, TPC 0, SM 1): Out Of Range Address",
    31: "Ch 00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_1c000000. "
    "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000008",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 3, "
    "subpartition 0.",
    63: "Row Remapper: New row (0x00000000000ab123) Marked for Remapping, reset gpu to activate.",
    64: "Row Remapper Error: (0x00000000000ab123) - All reserved rows for bank are remapped",
    74: "NVLink: fatal error detected on link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU2 GSP! Expected function 76 (GSP_RM_CONTROL) "
    "(0x20800a4c 0x4).",
}


def vllm_time(ts: float) -> str:
    """vLLM's log timestamp: ``MM-DD HH:MM:SS``."""
    return datetime.fromtimestamp(ts, UTC).strftime("%m-%d %H:%M:%S")


def kernel_time(ts: float) -> str:
    """dmesg -T style timestamp: ``[Sun Feb 23 16:24:18 2025]``."""
    return datetime.fromtimestamp(ts, UTC).strftime("[%a %b %d %H:%M:%S %Y]")


class Emitter:
    """Collects logs and Kubernetes events produced during one step.

    Args:
        rng: generator for incidental numbers in messages (pids, addresses).
    """

    def __init__(self, rng: np.random.Generator, epoch: float = 0.0) -> None:
        self.rng = rng
        self.epoch = epoch  # UNIX time of simulated second 0; callers pass simulated seconds
        self.buffer: list[Event] = []
        self._vt_last: tuple[float, str] = (math.nan, "")

    def vt(self, t: float) -> str:
        """vLLM log timestamp of simulated second ``t`` (the last one is kept: a scrape logs every pod at once)."""
        ts = self.epoch + t
        if self._vt_last[0] != ts:
            self._vt_last = (ts, vllm_time(ts))
        return self._vt_last[1]

    def drain(self) -> list[Event]:
        """Return and clear the buffered events."""
        out, self.buffer = self.buffer, []
        return out

    # ---------------------------------------------------------------------------------- logs

    def pod_log(self, cluster: Cluster, pod: Pod, t: float, line: str) -> None:
        """One container log line of a vLLM pod."""
        node = cluster.nodes[pod.node].name if pod.node >= 0 else ""
        stream = {"namespace": "llm-serving", "pod": pod.name, "container": "vllm", "app": pod.deployment, "node": node}
        # the hot path (a stats line per pod per scrape): built without re-validating its own values
        self.buffer.append(log_record(stream, line, float(self.epoch + t), pod.name))

    def kernel_log(self, node: Node, t: float, line: str, entity: str = "") -> None:
        """One kernel (dmesg / journald) line of a node."""
        stream = {"job": "node-journal", "unit": "kernel", "node": node.name, "Hostname": node.name}
        self.buffer.append(
            LogRecord(
                stream=stream,
                line=f"{kernel_time(self.epoch + t)} {line}",
                ts=self.epoch + t,
                entity=entity or node.name,
            )
        )

    def xid(self, cluster: Cluster, gpu: int, code: int, t: float, description: str) -> None:
        """The NVRM kernel line DCGM and gpud parse for XID errors."""
        node = cluster.nodes[int(cluster.gpus.node[gpu])]
        pci = cluster.gpu_pci[gpu][:-2]  # NVRM prints domain:bus:device without the function
        slot = int(cluster.gpus.pod_slot[gpu])
        pid = int(self.rng.integers(1000, 400000))
        name = "python3" if slot >= 0 else ""
        detail = XID_DETAIL.get(code, description)
        uuid = cluster.gpu_uuids[gpu]
        self.kernel_log(node, t, f"NVRM: GPU at PCI:{pci}: {uuid}", entity=uuid)
        self.kernel_log(node, t, f"NVRM: Xid (PCI:{pci}): {code}, pid={pid}, name={name}, {detail}", entity=uuid)

    def cuda_oom(self, cluster: Cluster, pod: Pod, t: float, total_gib: float, free_gib: float) -> None:
        """The vLLM engine's fatal CUDA out-of-memory traceback."""
        tried = float(self.rng.uniform(0.5, 4.0))
        used = total_gib - free_gib
        ts = self.vt(t)
        lines = [
            f"ERROR {ts} [core.py:588] EngineCore encountered a fatal error.",
            "Traceback (most recent call last):",
            '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 579, in run_engine_core',
            "    engine_core.run_busy_loop()",
            '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 1402, '
            "in execute_model",
            "    hidden_states = self.model(",
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried:.2f} GiB. GPU 0 has a total "
            f"capacity of {total_gib:.2f} GiB of which {free_gib * 1024:.2f} MiB is free. Process "
            f"{int(self.rng.integers(1000, 400000))} has {used:.2f} GiB memory in use. Of the allocated memory "
            f"{used * 0.93:.2f} GiB is allocated by PyTorch, and {used * 0.05:.2f} GiB is reserved by PyTorch but "
            "unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
            "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        ]
        for line in lines:
            self.pod_log(cluster, pod, t, line)

    def nccl_timeout(self, cluster: Cluster, pod: Pod, t: float, timeout_s: float) -> None:
        """The PyTorch NCCL watchdog lines printed before the process aborts."""
        stamp = datetime.fromtimestamp(self.epoch + t, UTC).strftime("%m%d %H:%M:%S.%f")
        seq = int(self.rng.integers(10000, 900000))
        ms = int(timeout_s * 1000)
        for rank in range(1, pod.variant.tp):
            self.pod_log(
                cluster,
                pod,
                t,
                f"[rank{rank}]:[E{stamp} 2891 ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective "
                f"operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=8192, NumelOut=8192, "
                f"Timeout(ms)={ms}) ran for {ms + 54} milliseconds before timing out.",
            )
        self.pod_log(
            cluster,
            pod,
            t,
            f"[rank1]:[E{stamp} 2891 ProcessGroupNCCL.cpp:1632] [PG 0 Rank 1] Process group watchdog thread "
            "terminated with exception: [Rank 1] Watchdog caught collective operation timeout",
        )

    def engine_dead(self, cluster: Cluster, pod: Pod, t: float) -> None:
        """What a vLLM API server prints for a request once its engine loop has died."""
        ts = self.vt(t)
        self.pod_log(cluster, pod, t, f"ERROR {ts} [async_llm.py:416] AsyncLLM output_handler failed.")
        self.pod_log(
            cluster,
            pod,
            t,
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
            "See stack trace (above) for the root cause.",
        )
        self.pod_log(
            cluster,
            pod,
            t,
            'INFO:     10.0.3.17:50412 - "POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error',
        )

    def vllm_stats(
        self,
        cluster: Cluster,
        pod: Pod,
        t: float,
        prompt_tps: float,
        gen_tps: float,
        running: float,
        waiting: float,
        kv: float,
    ) -> None:
        """vLLM's periodic engine statistics line."""
        self.pod_log(
            cluster,
            pod,
            t,
            f"INFO {self.vt(t)} [loggers.py:123] Engine 000: Avg prompt throughput: {prompt_tps:.1f} tokens/s, "
            f"Avg generation throughput: {gen_tps:.1f} tokens/s, Running: {round(running)} reqs, "
            f"Waiting: {round(waiting)} reqs, GPU KV cache usage: {kv * 100:.1f}%, Prefix cache hit rate: 0.0%",
        )

    # ---------------------------------------------------------------------------- kube events

    def kube(self, pod: Pod, t: float, reason: str, kind: str, message: str, node: str = "") -> None:
        """A core/v1 Event about a pod."""
        self.buffer.append(
            KubeEvent(
                reason=reason,
                type="Warning" if kind == "Warning" else "Normal",
                involved_object=ObjectRef(kind="Pod", name=pod.name, namespace="llm-serving", uid=pod.uid),
                message=message,
                ts=self.epoch + t,
                node=node,
                source_component="kubelet" if reason not in ("FailedScheduling", "Scheduled") else "default-scheduler",
            )
        )

    def kube_deployment(self, dep: Deployment, t: float, reason: str, message: str) -> None:
        """A deployment-controller Event."""
        self.buffer.append(
            KubeEvent(
                reason=reason,
                involved_object=ObjectRef(kind="Deployment", name=dep.name, namespace="llm-serving"),
                message=message,
                ts=self.epoch + t,
                source_component="deployment-controller",
            )
        )

    def kube_failed_scheduling(self, pod: Pod, t: float, message: str) -> None:
        """The scheduler could not place the pod."""
        self.kube(pod, t, "FailedScheduling", "Warning", message)

    def pod_started(self, cluster: Cluster, pod: Pod, t: float) -> None:
        """Scheduled → Pulled → Created → Started, plus vLLM's start-up line."""
        node = cluster.nodes[pod.node].name
        if pod.restarts == 0:
            self.kube(pod, t, "Scheduled", "Normal", f"Successfully assigned llm-serving/{pod.name} to {node}", node)
        self.kube(
            pod, t, "Pulled", "Normal", 'Container image "vllm/vllm-openai:v0.10.1" already present on machine', node
        )
        self.kube(pod, t, "Created", "Normal", "Created container: vllm", node)
        self.kube(pod, t, "Started", "Normal", "Started container vllm", node)
        v = pod.variant
        self.pod_log(
            cluster,
            pod,
            t,
            f"INFO {self.vt(t)} [api_server.py:1805] vLLM API server version 0.10.1; model={v.served_model_name} "
            f"tensor_parallel_size={v.tp} max_model_len={v.max_model_len}",
        )

    def pod_ready(self, cluster: Cluster, pod: Pod, t: float) -> None:
        """The engine finished loading and the server listens."""
        self.pod_log(
            cluster,
            pod,
            t,
            f"INFO {self.vt(t)} [launcher.py:29] Available routes are: /health, /metrics, /v1/completions",
        )
        self.pod_log(cluster, pod, t, "INFO:     Application startup complete.")

    def pod_crashed(self, cluster: Cluster, pod: Pod, t: float, reason: str) -> None:
        """Container exit: BackOff / Unhealthy events and the last log lines."""
        node = cluster.nodes[pod.node].name if pod.node >= 0 else ""
        ip = f"10.{pod.node // 250 % 250}.{pod.node % 250}.{pod.slot % 250 + 2}"
        if reason == "cuda_init":
            self.pod_log(
                cluster,
                pod,
                t,
                "RuntimeError: CUDA error: unspecified launch failure\nCUDA kernel errors might be "
                "asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
            )
        elif reason == "host_oom":
            self.kube(pod, t, "OOMKilled", "Warning", "Container vllm was OOMKilled (exit code 137)", node)
        self.kube(
            pod,
            t,
            "Unhealthy",
            "Warning",
            f'Readiness probe failed: Get "http://{ip}:8000/health": dial tcp {ip}:8000: connect: connection refused',
            node,
        )
        self.kube(pod, t, "BackOff", "Warning", f"Back-off restarting failed container vllm in pod {pod.name}", node)

    def node_not_ready(self, node: Node, t: float) -> None:
        """Node controller: the kubelet stopped posting status."""
        self.buffer.append(
            KubeEvent(
                reason="NodeNotReady",
                type="Warning",
                involved_object=ObjectRef(kind="Node", name=node.name),
                message=f"Node {node.name} status is now: NodeNotReady",
                ts=self.epoch + t,
                node=node.name,
                source_component="node-controller",
            )
        )
        self.kernel_log(
            node,
            t,
            "kubelet[2104]: E1129 Error updating node status, will retry: error getting node: "
            "context deadline exceeded",
        )

    def node_ready(self, node: Node, t: float) -> None:
        """The kubelet reports Ready again."""
        self.buffer.append(
            KubeEvent(
                reason="NodeReady",
                involved_object=ObjectRef(kind="Node", name=node.name),
                message=f"Node {node.name} status is now: NodeReady",
                ts=self.epoch + t,
                node=node.name,
                source_component="kubelet",
            )
        )

    def node_event(self, node: Node, t: float, reason: str, message: str, kind: str = "Normal") -> None:
        """Any other Node event (Rebooted, NodeNotSchedulable...)."""
        self.buffer.append(
            KubeEvent(
                reason=reason,
                type="Warning" if kind == "Warning" else "Normal",
                involved_object=ObjectRef(kind="Node", name=node.name),
                message=message,
                ts=self.epoch + t,
                node=node.name,
                source_component="kubelet",
            )
        )
