"""SLO burn-rate rules on vLLM latency histograms, checked against hand-computed burn rates."""

from __future__ import annotations

import json
from typing import Literal

import pytest

from pipelines.detectors.rules_slo import (
    DEFAULT_WINDOWS,
    BurnWindow,
    SloBurnDetector,
    SloBurnState,
    burn_rate,
)
from services.core.events import Anomaly, MetricBatch, Sample

MODEL = "meta-llama/Llama-3.1-70B-Instruct"
TTFT = "vllm:time_to_first_token_seconds"
BOUNDS = ("0.25", "0.5", "1.0", "2.5", "5.0")


def scrape(ts: float, pod: str, good: float, count: float, metric: str = TTFT) -> MetricBatch:
    """A histogram whose bucket le=1.0 holds ``good`` of ``count`` requests (others spread evenly)."""
    base = {"model_name": MODEL, "pod": pod, "namespace": "llm-serving"}
    cumulative = {"0.25": good * 0.5, "0.5": good * 0.8, "1.0": good, "2.5": good + (count - good) * 0.5, "5.0": count}
    samples = [Sample(name=f"{metric}_bucket", labels={**base, "le": le}, value=cumulative[le], ts=ts) for le in BOUNDS]
    samples.append(Sample(name=f"{metric}_bucket", labels={**base, "le": "+Inf"}, value=count, ts=ts))
    samples.append(Sample(name=f"{metric}_count", labels=base, value=count, ts=ts))
    return MetricBatch(entity=pod, samples=tuple(samples))


def short_windows(group_by: Literal["model", "pod"] = "model") -> SloBurnDetector:
    """99% objective, one pair: 60 s long / 20 s short at 10x, 10 s bins, TTFT target 1 s."""
    return SloBurnDetector(
        objective=0.99,
        ttft_target_s=1.0,
        e2e_target_s=None,
        windows=(BurnWindow(60.0, 20.0, 10.0, "critical"),),
        step_s=10.0,
        group_by=group_by,
    )


# increases per 10 s scrape: (total, good)
INCREASES = [(100, 100), (100, 100), (100, 95), (100, 90), (100, 80), (100, 70), (100, 100), (100, 100)]


def cumulative_scrapes(pod: str = "vllm-70b-0", scale: float = 1.0) -> list[MetricBatch]:
    out = [scrape(0.0, pod, 0.0, 0.0)]
    good = count = 0.0
    for k, (total_inc, good_inc) in enumerate(INCREASES, start=1):
        count += total_inc * scale
        good += good_inc * scale
        out.append(scrape(10.0 * k, pod, good, count))
    return out


def run(detector: SloBurnDetector, batches: list[list[MetricBatch]]) -> list[Anomaly]:
    state = detector.initial_state()
    out: list[Anomaly] = []
    for batch in batches:
        state, anomalies = detector.detect(batch, state)
        out += anomalies
    return out


def test_burn_rate_formula() -> None:
    assert burn_rate(good=990.0, total=1000.0, objective=0.99) == pytest.approx(1.0)
    assert burn_rate(good=856.0, total=1000.0, objective=0.99) == pytest.approx(14.4)
    assert burn_rate(good=0.0, total=0.0, objective=0.999) == 0.0


def test_hand_computed_burn_fires_and_resolves() -> None:
    anomalies = run(short_windows(), [[b] for b in cumulative_scrapes()])
    assert [(a.status, a.ts) for a in anomalies] == [("firing", 60.0), ("resolved", 80.0)]
    fired = anomalies[0]
    assert (fired.detector, fired.signal, fired.entity, fired.entity_kind) == (
        "slo_burn",
        "ttft_slo_burn",
        MODEL,
        "model",
    )
    window = fired.evidence["windows"][0]
    # t=60, long (0, 60]: 600 requests, 65 slow -> (65/600)/0.01 = 10.83
    assert window["long_requests"] == 600.0
    assert window["long_slow"] == 65.0
    assert window["long_burn_rate"] == pytest.approx(65 / 600 / 0.01)
    # short (40, 60]: 200 requests, 50 slow -> 0.25/0.01 = 25
    assert window["short_burn_rate"] == pytest.approx(25.0)
    assert fired.score == pytest.approx(65 / 600 / 0.01)
    assert fired.threshold == 10.0
    assert fired.severity == "critical"
    assert fired.evidence["objective"] == 0.99
    assert fired.evidence["target_s"] == 1.0
    assert fired.evidence["good_le"] == 1.0
    assert fired.labels["model"] == MODEL


def test_short_blip_without_long_burn_does_not_fire() -> None:
    # At t=50 the short window burns 15x but the long one only 7x (35 slow of 500): no alert yet.
    anomalies = run(short_windows(), [[b] for b in cumulative_scrapes()[:6]])
    assert anomalies == []


def test_pods_of_one_model_share_the_slo() -> None:
    # Two pods, each with half the traffic, scraped at the same instants: same answer as one pod.
    a, b = cumulative_scrapes("pod-a", 0.5), cumulative_scrapes("pod-b", 0.5)
    anomalies = run(short_windows(), [[x, y] for x, y in zip(a, b, strict=True)])
    assert [(x.status, x.ts) for x in anomalies] == [("firing", 60.0), ("resolved", 80.0)]
    assert anomalies[0].evidence["pods"] == ["pod-a", "pod-b"]
    assert anomalies[0].evidence["windows"][0]["long_requests"] == 600.0


def test_default_groups_by_pod_like_the_per_entity_state() -> None:
    detector = SloBurnDetector(
        objective=0.99,
        ttft_target_s=1.0,
        e2e_target_s=None,
        windows=(BurnWindow(60.0, 20.0, 10.0),),
        step_s=10.0,
    )
    anomalies = run(detector, [[b] for b in cumulative_scrapes("pod-a")])
    assert (anomalies[0].entity, anomalies[0].entity_kind) == ("pod-a", "pod")
    assert anomalies[0].labels["model"] == MODEL
    assert anomalies[0].labels["pod"] == "pod-a"


def test_healthy_latency_is_quiet() -> None:
    scrapes = [scrape(10.0 * k, "p", 100.0 * k, 100.0 * k) for k in range(40)]
    assert run(short_windows(), [[b] for b in scrapes]) == []
    assert run(SloBurnDetector(), [[b] for b in scrapes]) == []


def test_pod_restart_resets_counters_without_alarm() -> None:
    scrapes = [scrape(10.0 * k, "p", 1000.0 + 100.0 * k, 1000.0 + 100.0 * k) for k in range(5)]
    scrapes += [scrape(10.0 * k, "p", 100.0 * (k - 5), 100.0 * (k - 5)) for k in range(5, 12)]
    assert run(short_windows(), [[b] for b in scrapes]) == []


def test_e2e_uses_its_own_histogram_and_target() -> None:
    detector = SloBurnDetector(
        objective=0.99,
        ttft_target_s=None,
        e2e_target_s=1.0,
        windows=(BurnWindow(60.0, 20.0, 10.0),),
        step_s=10.0,
    )
    e2e = "vllm:e2e_request_latency_seconds"
    good = count = 0.0
    batches = [[scrape(0.0, "p", 0.0, 0.0, metric=e2e)]]
    for k, (total_inc, good_inc) in enumerate(INCREASES, start=1):
        count += total_inc
        good += good_inc
        batches.append([scrape(10.0 * k, "p", good, count, metric=e2e)])
    anomalies = run(detector, batches)
    assert [a.signal for a in anomalies] == ["e2e_slo_burn", "e2e_slo_burn"]


def test_target_between_bounds_uses_the_lower_bound() -> None:
    detector = SloBurnDetector(objective=0.99, ttft_target_s=2.0, e2e_target_s=None, step_s=10.0)
    state, _ = detector.detect([scrape(0.0, "p", 0.0, 0.0)], detector.initial_state())
    assert state.groups["p"].slis["ttft_slo_burn"].le == 1.0


def test_default_windows_are_the_workbook_paging_pairs() -> None:
    assert [(w.long_s, w.short_s, w.burn_rate) for w in DEFAULT_WINDOWS] == [
        (3600.0, 300.0, 14.4),
        (21600.0, 1800.0, 6.0),
    ]
    assert SloBurnDetector().objective == 0.99


def test_state_survives_json() -> None:
    detector = short_windows()
    scrapes = cumulative_scrapes()
    state = detector.initial_state()
    for b in scrapes[:6]:
        state, _ = detector.detect([b], state)
    restored = SloBurnState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state
    _, anomalies = detector.detect([scrapes[6]], restored)
    assert [(a.status, a.ts) for a in anomalies] == [("firing", 60.0)]
