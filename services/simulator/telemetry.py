"""Scrapes: DCGM exporter samples per GPU, vLLM samples per pod, router counters.

Batches are built as plain dicts and validated in one pydantic call each, which keeps the Rust
validator doing the per-sample work (about 1 µs a sample). Label dicts are cached per GPU and per pod
and rebuilt only when the pod on a GPU changes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from services.core.events import MetricBatch
from services.simulator.cluster import NAMESPACE, Cluster
from services.simulator.emitter import Emitter
from services.simulator.serving import Serving

SOURCE = "simulator"
DRIVER_VERSION = "550.90.07"

# (metric name, GpuArrays attribute) in exporter order.
_DCGM_FIELDS: tuple[tuple[str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "sm_clock"),
    ("DCGM_FI_DEV_GPU_TEMP", "temp_c"),
    ("DCGM_FI_DEV_POWER_USAGE", "power_w"),
    ("DCGM_FI_DEV_GPU_UTIL", "util"),
    ("DCGM_FI_DEV_FB_USED", "fb_used_mib"),
    ("DCGM_FI_DEV_FB_FREE", "fb_free_mib"),
    ("DCGM_FI_DEV_XID_ERRORS", "xid"),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "ecc_sbe"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_dbe"),
    ("DCGM_FI_DEV_RETIRED_SBE", "retired_sbe"),
    ("DCGM_FI_DEV_RETIRED_DBE", "retired_dbe"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "remap_failure"),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "remap_pending"),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "throttle_reasons"),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "nvlink_crc"),
)


class Telemetry:
    """Builds the metric batches of one scrape.

    Args:
        cluster: topology and GPU state.
        serving: replica state and counters.
        emitter: where the periodic vLLM statistics lines go.
        epoch: UNIX time of simulated second 0.
    """

    def __init__(self, cluster: Cluster, serving: Serving, emitter: Emitter, epoch: float) -> None:
        self.cluster = cluster
        self.serving = serving
        self.emitter = emitter
        self.epoch = epoch
        self._gpu_labels: dict[int, tuple[tuple[int, str], dict[str, str]]] = {}
        self._pod_labels: dict[
            int, tuple[tuple[str, str], dict[str, str], list[dict[str, str]], dict[str, list[dict[str, str]]]]
        ] = {}

    def gpu_labels(self, i: int) -> dict[str, str]:
        """DCGM exporter labels of GPU ``i`` (with the pod using it, as the exporter's pod mapping adds)."""
        c = self.cluster
        slot = int(c.gpus.pod_slot[i])
        pod = c.pods.get(slot)
        key = (slot, pod.name if pod else "")
        cached = self._gpu_labels.get(i)
        if cached is not None and cached[0] == key:
            return cached[1]
        node = c.nodes[int(c.gpus.node[i])]
        labels = {
            "gpu": str(int(c.gpus.local_index[i])),
            "UUID": c.gpu_uuids[i],
            "pci_bus_id": c.gpu_pci[i],
            "device": f"nvidia{int(c.gpus.local_index[i])}",
            "modelName": node.gpu_spec.model_name,
            "Hostname": node.name,
            "hostname": node.name,
            "DCGM_FI_DRIVER_VERSION": DRIVER_VERSION,
            "container": "vllm" if pod else "",
            "namespace": NAMESPACE if pod else "",
            "pod": pod.name if pod else "",
        }
        self._gpu_labels[i] = (key, labels)
        return labels

    def scrape_dcgm(self, t: float) -> list[MetricBatch]:
        """One batch per GPU (a GPU off the bus reports only its XID)."""
        c = self.cluster
        g = c.gpus
        ts = self.epoch + t
        cols = {attr: getattr(g, attr) for _, attr in _DCGM_FIELDS if attr != "fb_free_mib"}
        cols["fb_free_mib"] = np.maximum(0.0, g.memory_mib - g.fb_used_mib)
        table = np.round(np.stack([cols[attr] for _, attr in _DCGM_FIELDS], axis=1), 3).tolist()
        names = [n for n, _ in _DCGM_FIELDS]
        out: list[MetricBatch] = []
        for i in range(g.n):
            labels = self.gpu_labels(i)
            row = table[i]
            if g.off_bus[i]:
                samples: list[dict[str, Any]] = [
                    {"name": "DCGM_FI_DEV_XID_ERRORS", "labels": labels, "value": row[6], "ts": ts}
                ]
            else:
                samples = [{"name": n, "labels": labels, "value": v, "ts": ts} for n, v in zip(names, row, strict=True)]
            out.append(MetricBatch.model_validate({"entity": c.gpu_uuids[i], "source": SOURCE, "samples": samples}))
        return out

    def _labels_for_pod(
        self, slot: int
    ) -> tuple[dict[str, str], list[dict[str, str]], dict[str, list[dict[str, str]]]]:
        pod = self.cluster.pods[slot]
        node = self.cluster.nodes[pod.node].name if pod.node >= 0 else ""
        cached = self._pod_labels.get(slot)
        if cached is not None and cached[0] == (pod.name, node):
            return cached[1], cached[2], cached[3]
        # `node` is what Prometheus' kubernetes_sd relabelling (__meta_kubernetes_pod_node_name) adds
        base = {"model_name": pod.variant.served_model_name, "pod": pod.name, "namespace": NAMESPACE, "engine": "0"}
        if node:
            base["node"] = node
        reasons = [dict(base, finished_reason=r) for r in ("stop", "length", "abort")]
        les = {
            key: [dict(base, le=str(le)) for le in bounds.tolist()] + [dict(base, le="+Inf")]
            for key, (bounds, _b, _s, _c) in self.serving.hist.items()
        }
        self._pod_labels[slot] = ((pod.name, node), base, reasons, les)
        return base, reasons, les

    def scrape_vllm(self, t: float) -> list[MetricBatch]:
        """One batch per pod whose API server answers /metrics."""
        s = self.serving
        c = self.cluster
        s.flush_histograms()
        ts = self.epoch + t
        # Round whole arrays once: per-sample numpy scalar rounding dominated scrape time.
        gauges = np.round(
            np.stack(
                [s.run_n, s.wait_n, s.preemptions, s.prompt_tokens, s.gen_tokens, s.ok_stop, s.ok_length, s.aborted]
            )
        ).T.tolist()
        kv_all = np.round(s.kv_usage, 4).tolist()
        hists = {
            key: (np.round(b).tolist(), np.round(hs, 4).tolist(), np.round(hc).tolist())
            for key, (_bounds, b, hs, hc) in s.hist.items()
        }
        out: list[MetricBatch] = []
        for slot in sorted(c.pods):
            pod = c.pods[slot]
            if pod.phase != "Running":
                continue
            base, reasons, les = self._labels_for_pod(slot)
            run, wait, pre, prompt, gen, stop, length, abort = gauges[slot]
            samples: list[dict[str, Any]] = [
                {"name": "vllm:num_requests_running", "labels": base, "value": run, "ts": ts},
                {"name": "vllm:num_requests_waiting", "labels": base, "value": wait, "ts": ts},
                {"name": "vllm:kv_cache_usage_perc", "labels": base, "value": kv_all[slot], "ts": ts},
                {"name": "vllm:num_preemptions_total", "labels": base, "value": pre, "ts": ts},
                {"name": "vllm:prompt_tokens_total", "labels": base, "value": prompt, "ts": ts},
                {"name": "vllm:generation_tokens_total", "labels": base, "value": gen, "ts": ts},
                {"name": "vllm:request_success_total", "labels": reasons[0], "value": stop, "ts": ts},
                {"name": "vllm:request_success_total", "labels": reasons[1], "value": length, "ts": ts},
                {"name": "vllm:request_success_total", "labels": reasons[2], "value": abort, "ts": ts},
            ]
            for key, metric in (
                ("ttft", "vllm:time_to_first_token_seconds"),
                ("tpot", "vllm:time_per_output_token_seconds"),
                ("e2e", "vllm:e2e_request_latency_seconds"),
            ):
                buckets, hsum, hcount = hists[key]
                total = hcount[slot]
                name = f"{metric}_bucket"
                for labels, v in zip(les[key], [*buckets[slot], total], strict=True):
                    samples.append({"name": name, "labels": labels, "value": v, "ts": ts})
                samples.append({"name": f"{metric}_sum", "labels": base, "value": hsum[slot], "ts": ts})
                samples.append({"name": f"{metric}_count", "labels": base, "value": total, "ts": ts})
            out.append(MetricBatch.model_validate({"entity": pod.name, "source": SOURCE, "samples": samples}))
        return out

    def vllm_stat_logs(self, t: float, interval: float) -> None:
        """vLLM's periodic throughput/queue log line for every serving pod."""
        s = self.serving
        for slot in sorted(self.cluster.pods):
            pod = self.cluster.pods[slot]
            if pod.phase == "Running" and not pod.engine_dead:
                self.emitter.vllm_stats(
                    self.cluster,
                    pod,
                    t,
                    float(s.interval_prompt[slot]) / interval,
                    float(s.interval_gen[slot]) / interval,
                    float(s.run_n[slot]),
                    float(s.wait_n[slot]),
                    float(s.kv_usage[slot]),
                )

    def scrape_router(self, t: float) -> MetricBatch:
        """The inference gateway's request counters (what the user sees)."""
        ts = self.epoch + t
        s = self.serving
        base = {"namespace": NAMESPACE, "service": "inference-router"}
        return MetricBatch.model_validate(
            {
                "entity": "inference-router",
                "source": SOURCE,
                "samples": [
                    {
                        "name": "router_requests_total",
                        "labels": dict(base, code="200"),
                        "value": float(round(s.router_ok)),
                        "ts": ts,
                    },
                    {
                        "name": "router_requests_total",
                        "labels": dict(base, code="5xx"),
                        "value": float(round(s.router_errors)),
                        "ts": ts,
                    },
                ],
            }
        )

    def scrape(self, t: float, interval: float) -> list[MetricBatch]:
        """Everything one scrape interval produces (logs go to the emitter)."""
        self.vllm_stat_logs(t, interval)
        return [*self.scrape_dcgm(t), *self.scrape_vllm(t), self.scrape_router(t)]
