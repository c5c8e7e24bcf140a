"""Feature vectors per entity and scrape interval, from the metric batches of one entity.

The learned detectors (isolation forest, LSTM) and the robust-statistics fallback score fixed-length
vectors. This module turns one :class:`MetricBatch` (one scrape of one GPU or one vLLM pod) into such a
vector: gauges are taken as they are, counters become rates against the previous scrape, and latency
histograms become windowed quantiles from the bucket increases since the previous scrape.

Pure and clock-free: what it remembers between scrapes lives in :class:`FeatureState`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from services.core.events import MetricBatch, Sample
from services.core.features import FEATURES_BY_CLASS as CORE_FEATURES_BY_CLASS

# Feature names and order are declared once, in services.core.features (the diagnostician reads them
# back from the learned detectors' evidence); the maps below say how each is computed.
FEATURES_BY_CLASS: dict[str, tuple[str, ...]] = CORE_FEATURES_BY_CLASS
GPU_FEATURES: tuple[str, ...] = FEATURES_BY_CLASS["gpu"]
POD_FEATURES: tuple[str, ...] = FEATURES_BY_CLASS["pod"]

_GAUGES: dict[str, str] = {
    "DCGM_FI_DEV_GPU_UTIL": "gpu_util",
    "DCGM_FI_DEV_GPU_TEMP": "temp_c",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:gpu_cache_usage_perc": "kv_cache_usage",  # name before vLLM 0.7
    "vllm:num_requests_waiting": "requests_waiting",
    "vllm:num_requests_running": "requests_running",
}
_COUNTERS: dict[str, str] = {
    "vllm:prompt_tokens_total": "prompt_tokens_per_s",
    "vllm:generation_tokens_total": "generation_tokens_per_s",
    "vllm:num_preemptions_total": "preemptions_per_s",
}
_HISTOGRAMS: dict[str, tuple[tuple[str, float], ...]] = {
    "vllm:time_to_first_token_seconds": (("ttft_p50_s", 0.5), ("ttft_p99_s", 0.99)),
    "vllm:time_per_output_token_seconds": (("tpot_p50_s", 0.5),),
    "vllm:inter_token_latency_seconds": (("tpot_p50_s", 0.5),),
    "vllm:e2e_request_latency_seconds": (("e2e_p99_s", 0.99),),
}
_ERROR_REASONS = frozenset({"abort", "error"})
# Exact interval means from a histogram's ``_sum`` and ``_count``: (feature, observations feature). They
# ride in ``FeatureVector.values`` beside the fixed rows (``as_row`` leaves them out, so stored models keep
# their shape); the revision rule compares them across a Deployment's ReplicaSets.
_MEANS: dict[str, tuple[str, str]] = {
    "vllm:time_to_first_token_seconds": ("ttft_mean_s", "ttft_observations"),
    "vllm:time_per_output_token_seconds": ("tpot_mean_s", "tpot_observations"),
    "vllm:inter_token_latency_seconds": ("tpot_mean_s", "tpot_observations"),
    "vllm:e2e_request_latency_seconds": ("e2e_mean_s", "e2e_observations"),
}
_MEAN_PARTS: dict[str, str] = {f"{h}{part}": h for h in _MEANS for part in ("_sum", "_count")}
# A Deployment's pods are named <deployment>-<pod-template-hash>-<5 random characters>, and its
# ReplicaSet <deployment>-<pod-template-hash>: the hash names the revision.
_DEPLOYMENT_POD = re.compile(
    r"^(?P<replica_set>(?P<deployment>[a-z0-9][a-z0-9.-]*)-[bcdfghjklmnpqrstvwxz2456789]{5,10})-[a-z0-9]{5}$"
)


@dataclass
class FeatureState:
    """What feature extraction remembers about one entity between scrapes."""

    last_ts: float | None = None
    counters: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form for a Faust table."""
        return {"last_ts": self.last_ts, "counters": self.counters, "buckets": self.buckets}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FeatureState:
        """Inverse of :meth:`to_dict`."""
        return cls(
            last_ts=data.get("last_ts"),
            counters=dict(data.get("counters", {})),
            buckets={k: dict(v) for k, v in data.get("buckets", {}).items()},
        )


@dataclass(frozen=True)
class FeatureVector:
    """One aligned vector for one entity at one scrape."""

    entity: str
    entity_class: str
    ts: float
    values: dict[str, float]
    labels: dict[str, str]

    @property
    def serving(self) -> bool:
        """Whether the entity carries a workload: a vLLM pod, or a GPU with a pod on it.

        The learned detectors judge serving entities only; an idle GPU's flat zeros are not what the
        baseline learned, and the rule detectors still watch it for XIDs, ECC and heat.
        """
        return self.entity_class == "pod" or bool(self.labels.get("pod"))

    def as_row(self) -> list[float]:
        """Values in the class's fixed feature order (NaN where a feature was not seen)."""
        return [self.values.get(name, math.nan) for name in FEATURES_BY_CLASS[self.entity_class]]


def entity_class(batch: MetricBatch) -> str | None:
    """``"gpu"`` for DCGM batches, ``"pod"`` for vLLM batches, None for anything else."""
    for sample in batch.samples:
        if sample.name.startswith("DCGM_FI_"):
            return "gpu"
        if sample.name.startswith("vllm:"):
            return "pod"
    return None


def extract(batch: MetricBatch, state: FeatureState) -> tuple[FeatureState, FeatureVector | None]:
    """Turn one scrape into a feature vector; the first scrape of an entity only primes the state."""
    cls = entity_class(batch)
    if cls is None or not batch.samples:
        return state, None
    ts = max(sample.ts for sample in batch.samples)
    values: dict[str, float] = {}
    labels: dict[str, str] = {}
    counters: dict[str, float] = {}
    buckets: dict[str, dict[str, float]] = {}
    fb_used = fb_free = None
    ok = failed = 0.0
    for sample in batch.samples:
        name = sample.name
        if not labels:
            labels = dict(sample.labels)
        if name in _GAUGES:
            values[_GAUGES[name]] = sample.value
        elif name == "DCGM_FI_DEV_FB_USED":
            fb_used = sample.value
        elif name == "DCGM_FI_DEV_FB_FREE":
            fb_free = sample.value
        elif name in _COUNTERS:
            counters[name] = counters.get(name, 0.0) + sample.value
        elif name == "vllm:request_success_total":
            reason = sample.labels.get("finished_reason", "")
            key = f"{name}|{'fail' if reason in _ERROR_REASONS else 'ok'}"
            counters[key] = counters.get(key, 0.0) + sample.value
        elif name in _MEAN_PARTS:
            counters[name] = counters.get(name, 0.0) + sample.value
        elif name.endswith("_bucket") and name[: -len("_bucket")] in _HISTOGRAMS:
            le = sample.labels.get("le", "+Inf")
            per_le = buckets.setdefault(name[: -len("_bucket")], {})
            per_le[le] = per_le.get(le, 0.0) + sample.value
    if fb_used is not None and fb_free is not None and fb_used + fb_free > 0:
        values["mem_used_frac"] = fb_used / (fb_used + fb_free)
    if cls == "pod":
        labels.update(revision_labels(labels.get("pod", "") or batch.entity))
    new_state = FeatureState(last_ts=ts, counters=counters, buckets=buckets)
    if state.last_ts is None or ts <= state.last_ts:
        return new_state, None
    dt = ts - state.last_ts
    for name, feature in _COUNTERS.items():
        if name in counters and name in state.counters:
            values[feature] = _increase(state.counters[name], counters[name]) / dt
    ok_key, fail_key = "vllm:request_success_total|ok", "vllm:request_success_total|fail"
    if ok_key in counters or fail_key in counters:
        ok = _increase(state.counters.get(ok_key, 0.0), counters.get(ok_key, 0.0))
        failed = _increase(state.counters.get(fail_key, 0.0), counters.get(fail_key, 0.0))
        values["error_rate"] = failed / (ok + failed) if ok + failed > 0 else 0.0
    for hist, (feature, observations) in _MEANS.items():
        total, count = f"{hist}_sum", f"{hist}_count"
        if total in counters and count in counters and total in state.counters and count in state.counters:
            n = _increase(state.counters[count], counters[count])
            values[observations] = n
            if n > 0:
                values[feature] = _increase(state.counters[total], counters[total]) / n
    for hist, per_le in buckets.items():
        before = state.buckets.get(hist, {})
        deltas = {le: _increase(before.get(le, 0.0), count) for le, count in per_le.items()}
        for feature, q in _HISTOGRAMS[hist]:
            quantile = histogram_quantile(q, deltas.items())
            if quantile is not None:
                values[feature] = quantile
    return new_state, FeatureVector(batch.entity, cls, ts, values, labels)


def revision_labels(pod: str) -> dict[str, str]:
    """``deployment`` and ``replica_set`` (the revision) of a Deployment's pod, from its name; {} otherwise."""
    match = _DEPLOYMENT_POD.match(pod)
    if match is None:
        return {}
    return {"deployment": match["deployment"], "replica_set": match["replica_set"]}


def _increase(before: float, now: float) -> float:
    # a counter that went down was reset (process restart): its whole value is the increase
    return now - before if now >= before else now


def histogram_quantile(q: float, buckets: Iterable[tuple[str, float]]) -> float | None:
    """Prometheus-style quantile from cumulative ``(le, count)`` buckets, linear within a bucket.

    Returns None when the buckets hold no observations.
    """
    parsed = sorted((math.inf if le in ("+Inf", "Inf", "inf") else float(le), count) for le, count in buckets)
    if not parsed or parsed[-1][1] <= 0:
        return None
    total = parsed[-1][1]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for upper, count in parsed:
        if count >= rank:
            if math.isinf(upper):
                return lower_bound  # as Prometheus: the highest finite bound
            if count == lower_count:
                return upper
            return lower_bound + (upper - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = upper, count
    return lower_bound


def samples_by_name(samples: Iterable[Sample]) -> dict[str, list[Sample]]:
    """Group samples by metric name, keeping their order."""
    grouped: dict[str, list[Sample]] = {}
    for sample in samples:
        grouped.setdefault(sample.name, []).append(sample)
    return grouped
