"""Scrapes: DCGM exporter samples per GPU, vLLM samples per pod, router counters.

Values come from float64 arrays rounded and converted once per scrape; samples and batches are built
without re-validation (services.simulator.trusted: the simulator made every value, and validating
~270k samples a scrape at 1,000 nodes was most of the cost). Label dicts are cached per GPU and per
pod, rebuilt only when the pod on a GPU changes, and shared by that entity's samples.
"""

from __future__ import annotations

import numpy as np

from services.core.events import MetricBatch, Sample
from services.simulator.cluster import NAMESPACE, Cluster
from services.simulator.emitter import Emitter
from services.simulator.serving import Serving
from services.simulator.trusted import entity_samples, gc_paused, metric_batch, sample, series_samples

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
_XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"
_XID_COLUMN = [name for name, _ in _DCGM_FIELDS].index(_XID_METRIC)

# (histogram key in Serving.hist, vLLM metric family) in exposition order.
_VLLM_HISTOGRAMS: tuple[tuple[str, str], ...] = (
    ("ttft", "vllm:time_to_first_token_seconds"),
    ("tpot", "vllm:time_per_output_token_seconds"),
    ("e2e", "vllm:e2e_request_latency_seconds"),
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
        ts = float(self.epoch + t)
        cols = {attr: getattr(g, attr) for _, attr in _DCGM_FIELDS if attr != "fb_free_mib"}
        cols["fb_free_mib"] = np.maximum(0.0, g.memory_mib - g.fb_used_mib)
        # float64 before .tolist(): samples carry Python floats, as validation would have made them
        table = np.round(np.stack([cols[attr] for _, attr in _DCGM_FIELDS], axis=1).astype(np.float64), 3).tolist()
        names = [n for n, _ in _DCGM_FIELDS]
        off_bus = g.off_bus.tolist()
        out: list[MetricBatch] = []
        for i in range(g.n):
            labels = self.gpu_labels(i)
            row = table[i]
            if off_bus[i]:
                samples: tuple[Sample, ...] = (sample(_XID_METRIC, labels, row[_XID_COLUMN], ts),)
            else:
                samples = tuple(entity_samples(names, labels, row, ts))
            out.append(metric_batch(c.gpu_uuids[i], SOURCE, samples))
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
        ts = float(self.epoch + t)
        # Round whole float64 arrays once and convert with .tolist(): per-sample numpy scalar
        # rounding dominated scrape time, and samples must carry Python floats.
        # Only the pods that answer: a scrape's values of the Running slots, in slot order.
        running = [slot for slot in sorted(c.pods) if c.pods[slot].phase == "Running"]
        if not running:
            return []
        idx = np.array(running, dtype=np.int64)
        gauges = np.round(
            np.stack(
                [s.run_n, s.wait_n, s.preemptions, s.prompt_tokens, s.gen_tokens, s.ok_stop, s.ok_length, s.aborted]
            )[:, idx].astype(np.float64)
        ).T.tolist()
        kv_all = np.round(s.kv_usage[idx].astype(np.float64), 4).tolist()
        hists = {
            key: (
                np.round(b[idx].astype(np.float64)).tolist(),
                np.round(hs[idx].astype(np.float64), 4).tolist(),
                np.round(hc[idx].astype(np.float64)).tolist(),
            )
            for key, (_bounds, b, hs, hc) in s.hist.items()
        }
        out: list[MetricBatch] = []
        for row, slot in enumerate(running):
            pod = c.pods[slot]
            base, reasons, les = self._labels_for_pod(slot)
            run, wait, pre, prompt, gen, stop, length, abort = gauges[row]
            samples = [
                sample("vllm:num_requests_running", base, run, ts),
                sample("vllm:num_requests_waiting", base, wait, ts),
                sample("vllm:kv_cache_usage_perc", base, kv_all[row], ts),
                sample("vllm:num_preemptions_total", base, pre, ts),
                sample("vllm:prompt_tokens_total", base, prompt, ts),
                sample("vllm:generation_tokens_total", base, gen, ts),
                sample("vllm:request_success_total", reasons[0], stop, ts),
                sample("vllm:request_success_total", reasons[1], length, ts),
                sample("vllm:request_success_total", reasons[2], abort, ts),
            ]
            for key, metric in _VLLM_HISTOGRAMS:
                buckets, hsum, hcount = hists[key]
                total = hcount[row]
                samples.extend(series_samples(f"{metric}_bucket", les[key], [*buckets[row], total], ts))
                samples.append(sample(f"{metric}_sum", base, hsum[row], ts))
                samples.append(sample(f"{metric}_count", base, total, ts))
            out.append(metric_batch(pod.name, SOURCE, tuple(samples)))
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
        ts = float(self.epoch + t)
        s = self.serving
        base = {"namespace": NAMESPACE, "service": "inference-router"}
        return metric_batch(
            "inference-router",
            SOURCE,
            (
                sample("router_requests_total", dict(base, code="200"), float(round(s.router_ok)), ts),
                sample("router_requests_total", dict(base, code="5xx"), float(round(s.router_errors)), ts),
            ),
        )

    def scrape(self, t: float, interval: float) -> list[MetricBatch]:
        """Everything one scrape interval produces (logs go to the emitter)."""
        self.vllm_stat_logs(t, interval)
        with gc_paused():
            return [*self.scrape_dcgm(t), *self.scrape_vllm(t), self.scrape_router(t)]
