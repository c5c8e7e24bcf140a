"""The feature vocabulary: what the learned detectors score, and what their evidence names.

``pipelines/features.py`` turns each scrape of a GPU or a vLLM pod into a fixed-length vector of these
features; the learned detectors (isolation forest with its robust fallback, LSTM) score them and report
the features that deviated by name (``top_deviations``, ``window_drift``); the diagnostician reads a
deviation in a feature's harmful direction as evidence of the metric behind it. The stage that computes
them is the pipeline, the stage that reads their names back is a service, so the one list of them lives
here, below both. Everything per feature is declared once, in :data:`FEATURES`; the tables the detectors
and the diagnostician use are derived from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EntityClass = Literal["gpu", "pod"]


@dataclass(frozen=True)
class Feature:
    """One feature of an entity's vector.

    Attributes:
        name: the key in ``FeatureVector.values`` (and in the learned detectors' evidence).
        entity_class: ``gpu`` (DCGM) or ``pod`` (vLLM).
        metric: the metric it is computed from, as the diagnostician cites it (the current name where
            vLLM renamed one).
        harmful: the direction a failure pushes it (+1 up, -1 down, 0: neither is a symptom on its own).
        unit: the size of a change too small to matter (the robust fallback's scale floor).
        log_scale: it moves by factors (latencies, queues, rates), so it is compared as ``log(1 + x / unit)``.
        load: it measures the entity's load; the direction in which a change is load, not fault (+1 up,
            -1 down, 0: not a load feature).
        load_driven: a load change moves it on a healthy entity (latencies and queues of a pod; power, heat
            and clocks of a GPU), so a load change excuses its deviation.
    """

    name: str
    entity_class: EntityClass
    metric: str
    harmful: int
    unit: float
    log_scale: bool = False
    load: int = 0
    load_driven: bool = True


# Order matters: it is the column order of the vectors, hence of every stored model.
FEATURES: tuple[Feature, ...] = (
    Feature("gpu_util", "gpu", "DCGM_FI_DEV_GPU_UTIL", harmful=-1, unit=5.0, load=-1),
    Feature("mem_used_frac", "gpu", "DCGM_FI_DEV_FB_USED", harmful=+1, unit=0.02, load_driven=False),
    Feature("temp_c", "gpu", "DCGM_FI_DEV_GPU_TEMP", harmful=+1, unit=2.0),
    Feature("power_w", "gpu", "DCGM_FI_DEV_POWER_USAGE", harmful=+1, unit=20.0),
    Feature("sm_clock_mhz", "gpu", "DCGM_FI_DEV_SM_CLOCK", harmful=-1, unit=50.0),
    Feature("kv_cache_usage", "pod", "vllm:kv_cache_usage_perc", harmful=+1, unit=0.05, log_scale=True),
    Feature("requests_waiting", "pod", "vllm:num_requests_waiting", harmful=+1, unit=2.0, log_scale=True, load=+1),
    Feature("requests_running", "pod", "vllm:num_requests_running", harmful=0, unit=2.0, log_scale=True, load=+1),
    Feature("ttft_p50_s", "pod", "vllm:time_to_first_token_seconds", harmful=+1, unit=0.1, log_scale=True),
    Feature("ttft_p99_s", "pod", "vllm:time_to_first_token_seconds", harmful=+1, unit=0.1, log_scale=True),
    Feature("tpot_p50_s", "pod", "vllm:inter_token_latency_seconds", harmful=+1, unit=0.005, log_scale=True),
    Feature("e2e_p99_s", "pod", "vllm:e2e_request_latency_seconds", harmful=+1, unit=0.5, log_scale=True),
    Feature("prompt_tokens_per_s", "pod", "vllm:prompt_tokens_total", harmful=+1, unit=20.0, log_scale=True, load=+1),
    Feature("generation_tokens_per_s", "pod", "vllm:generation_tokens_total", harmful=0, unit=20.0, log_scale=True),
    Feature("preemptions_per_s", "pod", "vllm:num_preemptions_total", harmful=+1, unit=0.1, log_scale=True),
    Feature("error_rate", "pod", "vllm:request_success_total", harmful=+1, unit=0.01, load_driven=False),
)

FEATURE_BY_NAME: dict[str, Feature] = {f.name: f for f in FEATURES}
FEATURES_BY_CLASS: dict[str, tuple[str, ...]] = {
    cls: tuple(f.name for f in FEATURES if f.entity_class == cls) for cls in ("gpu", "pod")
}
"""Each entity class's feature names, in vector order."""
