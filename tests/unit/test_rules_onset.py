"""Rules that report a fault within a minute of its onset: SBE bursts, unexplained heat, VRAM leaks,
latency regressions; and the SLO pairs that wait for enough history."""

from __future__ import annotations

import json

from pipelines.detectors.rules_gpu import GpuRuleDetector, GpuRulesState
from pipelines.detectors.rules_serving import ServingRuleDetector, ServingRulesState
from pipelines.detectors.rules_slo import BurnWindow, SloBurnDetector
from services.core.events import Anomaly, MetricBatch, Sample

UUID = "GPU-11111111-2222-3333-4444-555555555555"
POD = "vllm-llama-70b-7d9f-abcde"
TOTAL_MIB = 81559.0


def gpu_scrape(
    ts: float, *, temp: float = 60.0, power: float = 400.0, fb: float = 69000.0, sbe: float = 0.0
) -> MetricBatch:
    labels = {"gpu": "0", "UUID": UUID, "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "node-1", "pod": POD}
    values = {
        "DCGM_FI_DEV_GPU_TEMP": temp,
        "DCGM_FI_DEV_POWER_USAGE": power,
        "DCGM_FI_DEV_FB_USED": fb,
        "DCGM_FI_DEV_FB_FREE": TOTAL_MIB - fb,
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": sbe,
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 0.0,
    }
    return MetricBatch(
        entity=UUID, samples=tuple(Sample(name=n, labels=labels, value=v, ts=ts) for n, v in values.items())
    )


def run_gpu(detector: GpuRuleDetector, scrapes: list[MetricBatch], round_trip: bool = False) -> list[Anomaly]:
    state = detector.initial_state()
    out: list[Anomaly] = []
    for batch in scrapes:
        if round_trip:  # what the detect role's changelog does between scrapes
            state = GpuRulesState.from_dict(json.loads(json.dumps(state.to_dict())))
        state, found = detector.detect([batch], state)
        out += found
    return out


def fired(anomalies: list[Anomaly], signal: str) -> list[float]:
    return [a.ts for a in anomalies if a.signal == signal and a.status == "firing"]


# -- ECC


def test_an_sbe_burst_fires_within_a_minute_long_before_the_hourly_count() -> None:
    # 40 SBEs a minute from t=300: the hourly threshold (100) needs 2.5 minutes, the burst window 15 s
    scrapes = [gpu_scrape(k * 15.0, sbe=max(0.0, (k * 15.0 - 300.0) * 40.0 / 60.0)) for k in range(40)]
    found = run_gpu(GpuRuleDetector(), scrapes)
    first = min((a for a in found if a.signal == "ecc_sbe_rate" and a.status == "firing"), key=lambda a: a.ts)
    assert 300.0 < first.ts <= 330.0
    assert first.threshold == 10.0 and first.score >= 10.0
    assert first.evidence["sbe_burst_increase"] == first.score and first.evidence["burst_window_s"] == 120.0


def test_a_few_scattered_sbes_are_not_a_burst() -> None:
    scrapes = [gpu_scrape(k * 15.0, sbe=float(k // 8)) for k in range(240)]  # one SBE every 2 minutes
    assert fired(run_gpu(GpuRuleDetector(), scrapes), "ecc_sbe_rate") == []


# -- unexplained heat


def test_heat_at_level_power_fires_a_temperature_rise() -> None:
    temps = [60.0] * 20 + [68.0, 74.0, 79.0, 83.0, 86.0, 88.0, 89.0, 89.0]
    found = run_gpu(GpuRuleDetector(), [gpu_scrape(k * 15.0, temp=t) for k, t in enumerate(temps)], round_trip=True)
    rise = [a for a in found if a.signal == "gpu_temperature_rise"]
    assert [a.status for a in rise] == ["firing"]
    assert rise[0].ts == 21 * 15.0  # the second hot scrape: +14 degrees within a minute
    assert rise[0].evidence["rise_c"] == 14.0 and abs(rise[0].evidence["power_step_w"]) < 1e-9


def test_heat_that_follows_a_load_step_is_explained() -> None:
    # the power jumps by 300 W and the temperature follows it with a lag
    powers = [150.0] * 20 + [450.0] * 20
    temps = [45.0] * 20 + [45.0 + 25.0 * (1 - 0.78 ** (k + 1)) for k in range(20)]
    scrapes = [gpu_scrape(k * 15.0, temp=t, power=p) for k, (t, p) in enumerate(zip(temps, powers, strict=True))]
    assert fired(run_gpu(GpuRuleDetector(), scrapes), "gpu_temperature_rise") == []


# -- VRAM leak


def test_growing_framebuffer_under_a_loaded_engine_is_a_leak_until_the_memory_is_freed() -> None:
    fbs = [69000.0] * 10 + [69000.0 + 600.0 * k for k in range(1, 8)] + [1.0, 69000.0, 69000.0]
    found = run_gpu(GpuRuleDetector(), [gpu_scrape(k * 15.0, fb=f) for k, f in enumerate(fbs)], round_trip=True)
    leak = [a for a in found if a.signal == "vram_leak"]
    assert [(a.status, a.ts) for a in leak] == [("firing", 12 * 15.0), ("resolved", 17 * 15.0)]
    assert leak[0].evidence["growth_mib"] == 1800.0 and leak[0].evidence["started_from_mib"] == 69000.0


def test_a_model_loading_onto_an_empty_gpu_is_not_a_leak() -> None:
    fbs = [1.0] * 5 + [20000.0, 45000.0, 69000.0, 69000.0, 69000.0]
    assert fired(run_gpu(GpuRuleDetector(), [gpu_scrape(k * 15.0, fb=f) for k, f in enumerate(fbs)]), "vram_leak") == []


# -- latency regression


def pod_scrape(
    ts: float, *, requests: float, ttft_sum: float, running: float = 6.0, waiting: float = 0.0
) -> MetricBatch:
    base = {"model_name": "llama-70b", "pod": POD, "namespace": "llm", "node": "node-1"}
    values = {
        "vllm:num_requests_running": running,
        "vllm:num_requests_waiting": waiting,
        "vllm:kv_cache_usage_perc": 0.5,
        "vllm:prompt_tokens_total": requests * 1500.0,
        "vllm:time_to_first_token_seconds_sum": ttft_sum,
        "vllm:time_to_first_token_seconds_count": requests,
    }
    return MetricBatch(
        entity=POD, samples=tuple(Sample(name=n, labels=base, value=v, ts=ts) for n, v in values.items())
    )


def pod_series(ttfts: list[float], per_scrape: float = 10.0, **kwargs: float) -> list[MetricBatch]:
    """Scrapes of a pod serving ``per_scrape`` requests each interval with the given mean TTFTs."""
    out, total, count = [], 0.0, 0.0
    for k, ttft in enumerate(ttfts):
        out.append(pod_scrape(k * 15.0, requests=count, ttft_sum=total, **kwargs))
        count += per_scrape
        total += per_scrape * ttft
    return out


def run_pod(detector: ServingRuleDetector, scrapes: list[MetricBatch]) -> list[Anomaly]:
    state = detector.initial_state()
    out: list[Anomaly] = []
    for batch in scrapes:
        state = ServingRulesState.from_dict(json.loads(json.dumps(state.to_dict())))
        state, found = detector.detect([batch], state)
        out += found
    return out


def test_a_latency_step_at_the_same_load_is_a_regression_reported_once() -> None:
    # a steady pod (TTFT ~1 s) whose requests all take 2 s longer from scrape 30 on, for ten minutes
    ttfts = [1.0 + 0.05 * (k % 3) for k in range(30)] + [3.0] * 40
    found = [a for a in run_pod(ServingRuleDetector(), pod_series(ttfts)) if a.signal == "latency_regression"]
    assert [a.status for a in found] == ["firing"]
    # the scrape at 31*15 s reports the first slow interval; half the pooled minute is slow two scrapes later
    assert 31 * 15.0 < found[0].ts <= 31 * 15.0 + 60.0
    slower = found[0].evidence["slower"]["ttft"]
    assert slower["mean_s"] >= 2 * slower["baseline_mean_s"] and found[0].threshold == 2.0


def test_a_slowdown_with_a_queue_is_load_not_a_regression() -> None:
    ttfts = [1.0] * 30 + [3.0] * 20
    scrapes = pod_series(ttfts)
    queued = [pod_series(ttfts, waiting=40.0)[k] if k >= 30 else s for k, s in enumerate(scrapes)]
    assert fired(run_pod(ServingRuleDetector(), queued), "latency_regression") == []


def test_the_slow_tail_of_a_burst_is_load_not_a_regression() -> None:
    # a burst fills the batch for two scrapes; the requests it delayed finish while the batch drains
    ttfts = [1.0] * 30 + [3.0] * 4 + [1.0] * 16
    running = [6.0] * 30 + [30.0, 30.0] + [6.0] * 18
    scrapes = [pod_series(ttfts, running=r)[k] for k, r in enumerate(running)]
    assert fired(run_pod(ServingRuleDetector(), scrapes), "latency_regression") == []
    # the same slowdown without the burst is reported
    assert fired(run_pod(ServingRuleDetector(), pod_series(ttfts)), "latency_regression")


def test_latency_that_swings_as_usual_is_quiet() -> None:
    ttfts = [1.0, 1.2, 0.9, 1.6, 1.1, 0.8, 1.4, 1.0] * 20
    assert fired(run_pod(ServingRuleDetector(), pod_series(ttfts)), "latency_regression") == []


# -- SLO history shorter than the window


def slo_firings(slow_share: float, minutes: int, pad: bool) -> list[float]:
    """Seconds at which a fresh pod's TTFT SLO fires when ``slow_share`` of its 100 requests a minute are slow."""
    detector = SloBurnDetector(
        objective=0.99,
        ttft_target_s=1.0,
        e2e_target_s=None,
        windows=(BurnWindow(3600.0, 300.0, 6.0),),
        pad_unobserved=pad,
    )
    base = {"model_name": "m", "pod": POD}
    state = detector.initial_state()
    out: list[float] = []
    for k in range(minutes * 4 + 1):
        ts, count = k * 15.0, 25.0 * k
        samples = (
            Sample(name=f"{TTFT}_bucket", labels={**base, "le": "1.0"}, value=count * (1 - slow_share), ts=ts),
            Sample(name=f"{TTFT}_bucket", labels={**base, "le": "+Inf"}, value=count, ts=ts),
            Sample(name=f"{TTFT}_count", labels=base, value=count, ts=ts),
        )
        state, found = detector.detect([MetricBatch(entity=POD, samples=samples)], state)
        out += [a.ts for a in found if a.status == "firing"]
    return out


def test_a_busy_first_forty_minutes_is_not_an_hour_of_burning() -> None:
    # 7% slow is a burn of 7: over the first 40 minutes only, not over the hour the pair is about
    assert slo_firings(0.07, 40, pad=True) == []
    assert slo_firings(0.07, 40, pad=False)  # unpadded, the 40 minutes pass for the whole hour


def test_a_new_pod_serving_only_slow_requests_still_fires_within_minutes() -> None:
    fired_at = slo_firings(1.0, 10, pad=True)
    # burn 100 over t seconds and on-budget before: (100 t + 3600 - t) / 3600 >= 6 from t ~ 182 s
    assert fired_at and 150.0 <= fired_at[0] <= 240.0


TTFT = "vllm:time_to_first_token_seconds"
