"""Serving rules over vLLM metrics."""

from __future__ import annotations

import json

from pipelines.detectors.rules_serving import ServingRuleDetector, ServingRulesState
from services.core.events import Anomaly, MetricBatch, Sample

POD = "vllm-llama-8b-7d9f-abcde"
BASE = {"model_name": "meta-llama/Llama-3.1-8B-Instruct", "pod": POD, "namespace": "llm-serving", "engine": "0"}


def scrape(
    ts: float,
    *,
    kv: float = 0.4,
    waiting: float = 0.0,
    running: float = 20.0,
    preemptions: float = 0.0,
    stop: float = 0.0,
    length: float = 0.0,
    abort: float = 0.0,
    kv_name: str = "vllm:kv_cache_usage_perc",
    generated: float | None = None,
) -> MetricBatch:
    def s(name: str, value: float, **extra: str) -> Sample:
        return Sample(name=name, labels={**BASE, **extra}, value=value, ts=ts)

    return MetricBatch(
        entity=POD,
        samples=(
            s(kv_name, kv),
            s("vllm:num_requests_waiting", waiting),
            s("vllm:num_requests_running", running),
            s("vllm:num_preemptions_total", preemptions),
            s("vllm:request_success_total", stop, finished_reason="stop"),
            s("vllm:request_success_total", length, finished_reason="length"),
            s("vllm:request_success_total", abort, finished_reason="abort"),
            *(() if generated is None else (s("vllm:generation_tokens_total", generated),)),
        ),
    )


def feed(detector: ServingRuleDetector, scrapes: list[MetricBatch]) -> list[Anomaly]:
    state = detector.initial_state()
    out: list[Anomaly] = []
    for batch in scrapes:
        state, anomalies = detector.detect([batch], state)
        out += anomalies
    return out


def healthy(n: int, t0: float = 0.0, step: float = 15.0) -> list[MetricBatch]:
    return [
        scrape(
            t0 + k * step, kv=0.5 + 0.1 * (k % 3), waiting=float(k % 4), stop=30.0 * k, length=2.0 * k, abort=k // 10
        )
        for k in range(n)
    ]


def test_healthy_pod_is_quiet() -> None:
    assert feed(ServingRuleDetector(), healthy(120)) == []


def test_kv_cache_saturation_sustained_and_resolved() -> None:
    kvs = [0.5, 0.97, 0.99, 0.98, 1.0, 0.6]
    anomalies = feed(ServingRuleDetector(kv_samples=3), [scrape(k * 15.0, kv=v) for k, v in enumerate(kvs)])
    assert [(a.signal, a.status, a.ts) for a in anomalies] == [
        ("kv_cache_saturation", "firing", 45.0),
        ("kv_cache_saturation", "resolved", 75.0),
    ]
    a = anomalies[0]
    assert (a.detector, a.entity, a.entity_kind) == ("serving_rules", POD, "pod")
    assert a.labels["model"] == BASE["model_name"]
    assert a.labels["namespace"] == "llm-serving"
    assert "finished_reason" not in a.labels


def test_older_gpu_cache_usage_name_is_accepted() -> None:
    scrapes = [scrape(k * 15.0, kv=0.99, kv_name="vllm:gpu_cache_usage_perc") for k in range(3)]
    assert [a.signal for a in feed(ServingRuleDetector(), scrapes)] == ["kv_cache_saturation"]


def test_queue_high_and_growing_fires_and_stays_while_high() -> None:
    waiting = [0, 5, 30, 45, 60, 80, 80, 80, 80, 2]
    scrapes = [scrape(k * 15.0, waiting=float(w), running=24.0) for k, w in enumerate(waiting)]
    anomalies = feed(ServingRuleDetector(queue_samples=3, queue_min_waiting=10.0), scrapes)
    assert [(a.signal, a.status) for a in anomalies] == [
        ("queue_saturation", "firing"),
        ("queue_saturation", "resolved"),
    ]
    # "Growing" compares with the value three scrapes earlier, so k=3 (45 > 0), k=4 (60 > 5) and
    # k=5 (80 > 30) are the three high-and-growing scrapes in a row; a flat 80 stays firing.
    assert anomalies[0].ts == 75.0
    assert anomalies[0].evidence["waiting"] == 80.0
    assert anomalies[1].ts == 135.0


def test_steady_high_queue_with_more_running_is_quiet() -> None:
    scrapes = [scrape(k * 15.0, waiting=12.0 + k % 2, running=64.0) for k in range(40)]
    assert feed(ServingRuleDetector(), scrapes) == []


def test_preemption_storm_and_restart_reset() -> None:
    detector = ServingRuleDetector(preempt_window_s=60.0, preempt_threshold=50.0)
    totals = [100, 110, 140, 180, 200]
    anomalies = feed(detector, [scrape(k * 15.0, preemptions=float(t)) for k, t in enumerate(totals)])
    assert [(a.signal, a.status, a.score) for a in anomalies] == [("preemption_storm", "firing", 80.0)]
    # pod restart: counter falls to 0 and grows slowly; no storm
    totals = [5000, 5001, 0, 3, 6, 9]
    assert feed(detector, [scrape(k * 15.0, preemptions=float(t)) for k, t in enumerate(totals)]) == []


def test_error_rate_counts_aborts_over_finished() -> None:
    detector = ServingRuleDetector(error_window_s=60.0, error_threshold=0.05, error_min_requests=20.0)
    scrapes = [scrape(0.0, stop=100.0, abort=1.0), scrape(15.0, stop=150.0, abort=1.0)]
    scrapes.append(scrape(30.0, stop=180.0, abort=21.0))  # +30 ok, +20 aborted
    anomalies = feed(detector, scrapes)
    assert [a.signal for a in anomalies] == ["error_rate"]
    a = anomalies[0]
    # window (-30, 30]: 80 stop + 20 abort finished, 20 failed -> 0.2
    assert a.score == 0.2
    assert a.severity == "warning"
    assert a.evidence["by_reason"]["abort"] == 20.0


def test_error_rate_needs_enough_requests() -> None:
    detector = ServingRuleDetector(error_min_requests=20.0)
    scrapes = [scrape(0.0, stop=10.0), scrape(15.0, stop=12.0, abort=3.0)]
    assert feed(detector, scrapes) == []


def test_failure_counter_counts_as_failed() -> None:
    detector = ServingRuleDetector(error_window_s=60.0)

    def batch(ts: float, ok: float, failed: float) -> MetricBatch:
        return MetricBatch(
            entity=POD,
            samples=(
                Sample(name="vllm:request_success_total", labels={**BASE, "finished_reason": "stop"}, value=ok, ts=ts),
                Sample(name="vllm:request_failure_total", labels=BASE, value=failed, ts=ts),
            ),
        )

    anomalies = feed(detector, [batch(0.0, 0.0, 0.0), batch(15.0, 50.0, 50.0)])
    assert [(a.signal, a.severity, a.score) for a in anomalies] == [("error_rate", "critical", 0.5)]


def test_state_survives_json() -> None:
    detector = ServingRuleDetector(kv_samples=2)
    state, _ = detector.detect([scrape(0.0, kv=0.99, stop=10.0)], detector.initial_state())
    restored = ServingRulesState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state
    _, anomalies = detector.detect([scrape(15.0, kv=0.99, stop=20.0)], restored)
    assert [a.signal for a in anomalies] == ["kv_cache_saturation"]


def test_dcgm_batches_are_ignored() -> None:
    dcgm = MetricBatch(
        entity="GPU-1",
        samples=(Sample(name="DCGM_FI_DEV_GPU_TEMP", labels={"UUID": "GPU-1", "pod": POD}, value=90.0, ts=0.0),),
    )
    detector = ServingRuleDetector()
    state, anomalies = detector.detect([dcgm], detector.initial_state())
    assert anomalies == [] and state.pods == {}


def _tokens(values: list[float], running: float = 20.0) -> list[MetricBatch]:
    return [scrape(15.0 * k, running=running, generated=v) for k, v in enumerate(values)]


def test_a_hung_engine_admitting_requests_but_producing_no_token_is_a_stall_until_tokens_flow() -> None:
    # an NCCL hang: requests keep running, generation_tokens_total stops rising
    out = feed(ServingRuleDetector(), _tokens([0, 900, 1800, 1800, 1800, 1800, 1800, 2700]))
    assert [(a.signal, a.status, a.severity, a.ts) for a in out] == [
        ("generation_stalled", "firing", "critical", 75.0),  # the third scrape without a new token
        ("generation_stalled", "resolved", "critical", 105.0),
    ]
    assert out[0].evidence["running"] == 20.0 and out[0].evidence["generation_tokens_total"] == 1800


def test_an_idle_engine_or_one_that_restarted_is_not_stalled() -> None:
    assert feed(ServingRuleDetector(), _tokens([500.0] * 10, running=0.0)) == []  # nothing to produce
    # a restart resets the counter: going down is not a stall, and it produces again
    assert feed(ServingRuleDetector(), _tokens([100, 200, 300, 0, 40, 80, 120])) == []


def test_a_stall_streak_survives_a_restart_of_the_detector() -> None:
    detector = ServingRuleDetector()
    scrapes = _tokens([0, 900, 900, 900, 900])
    state = detector.initial_state()
    for batch in scrapes[:3]:
        state, _ = detector.detect([batch], state)
    restored = ServingRulesState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state
    fired = [a for batch in scrapes[3:] for a in detector.detect([batch], restored)[1]]
    assert [(a.signal, a.ts) for a in fired] == [("generation_stalled", 60.0)]
