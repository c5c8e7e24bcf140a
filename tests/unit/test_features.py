import math

import pytest

from pipelines.features import FeatureState, entity_class, extract, histogram_quantile
from services.core.events import MetricBatch, Sample


def _pod_batch(ts: float, tokens: float, ok: float, failed: float, buckets: dict[str, float]) -> MetricBatch:
    labels = {"pod": "p1", "model_name": "llama"}
    samples = [
        Sample(name="vllm:kv_cache_usage_perc", labels=labels, value=0.4, ts=ts),
        Sample(name="vllm:num_requests_waiting", labels=labels, value=3, ts=ts),
        Sample(name="vllm:generation_tokens_total", labels=labels, value=tokens, ts=ts),
        Sample(name="vllm:request_success_total", labels={**labels, "finished_reason": "stop"}, value=ok, ts=ts),
        Sample(name="vllm:request_success_total", labels={**labels, "finished_reason": "abort"}, value=failed, ts=ts),
    ]
    samples += [
        Sample(name="vllm:time_to_first_token_seconds_bucket", labels={**labels, "le": le}, value=v, ts=ts)
        for le, v in buckets.items()
    ]
    return MetricBatch(entity="p1", samples=tuple(samples))


def test_first_scrape_primes_and_second_gives_rates_and_quantiles():
    state, vector = extract(_pod_batch(0, 100, 10, 0, {"0.1": 0, "0.5": 0, "+Inf": 0}), FeatureState())
    assert vector is None
    state, vector = extract(_pod_batch(15, 400, 28, 2, {"0.1": 10, "0.5": 20, "+Inf": 20}), state)
    assert vector is not None and vector.entity_class == "pod"
    assert vector.values["generation_tokens_per_s"] == pytest.approx(300 / 15)
    assert vector.values["error_rate"] == pytest.approx(2 / 20)
    assert vector.values["ttft_p50_s"] == pytest.approx(0.1)
    assert vector.values["kv_cache_usage"] == 0.4
    row = vector.as_row()
    assert len(row) == 11 and math.isnan(row[-4])  # e2e not scraped


def test_counter_reset_is_not_a_negative_rate():
    state, _ = extract(_pod_batch(0, 5000, 10, 0, {"+Inf": 0}), FeatureState())
    state, vector = extract(_pod_batch(15, 30, 1, 0, {"+Inf": 0}), state)
    assert vector is not None and vector.values["generation_tokens_per_s"] == pytest.approx(2.0)


def test_state_round_trips_through_json_form():
    state, _ = extract(_pod_batch(0, 1, 1, 0, {"0.1": 1, "+Inf": 1}), FeatureState())
    assert FeatureState.from_dict(state.to_dict()) == state


def test_gpu_memory_fraction_from_used_and_free():
    labels = {"UUID": "GPU-1"}
    batch = MetricBatch(
        entity="GPU-1",
        samples=(
            Sample(name="DCGM_FI_DEV_FB_USED", labels=labels, value=60, ts=1),
            Sample(name="DCGM_FI_DEV_FB_FREE", labels=labels, value=20, ts=1),
        ),
    )
    assert entity_class(batch) == "gpu"
    state, _ = extract(batch, FeatureState())
    later = MetricBatch(entity="GPU-1", samples=tuple(s.model_copy(update={"ts": 16}) for s in batch.samples))
    _, vector = extract(later, state)
    assert vector is not None and vector.values["mem_used_frac"] == pytest.approx(0.75)


@pytest.mark.parametrize(
    ("q", "expected"),
    [(0.25, 0.25), (0.5, 0.5), (0.75, 0.75), (0.99, 0.99), (1.0, 1.0)],
)
def test_histogram_quantile_interpolates_like_prometheus(q, expected):
    buckets = [("0.5", 50.0), ("1", 100.0), ("+Inf", 100.0)]
    assert histogram_quantile(q, buckets) == pytest.approx(expected)


def test_histogram_quantile_of_nothing_is_none_and_inf_bucket_caps():
    assert histogram_quantile(0.5, [("1", 0.0), ("+Inf", 0.0)]) is None
    assert histogram_quantile(0.99, [("1", 1.0), ("+Inf", 100.0)]) == 1.0


def _latency_batch(pod: str, ts: float, tpot_sum: float, tokens: float) -> MetricBatch:
    labels = {"pod": pod, "model_name": "llama"}
    return MetricBatch(
        entity=pod,
        samples=(
            Sample(name="vllm:time_per_output_token_seconds_sum", labels=labels, value=tpot_sum, ts=ts),
            Sample(name="vllm:time_per_output_token_seconds_count", labels=labels, value=tokens, ts=ts),
        ),
    )


def test_interval_means_come_from_sum_and_count_and_stay_out_of_the_model_rows():
    pod = "llama-70b-7d9f8b6c5d-x2x9q"
    state, _ = extract(_latency_batch(pod, 0, 10.0, 400), FeatureState())
    state, vector = extract(_latency_batch(pod, 15, 16.0, 500), state)
    assert vector is not None
    assert vector.values["tpot_mean_s"] == pytest.approx(6.0 / 100)
    assert vector.values["tpot_observations"] == 100
    assert len(vector.as_row()) == 11  # stored models keep their shape
    assert vector.labels["deployment"] == "llama-70b" and vector.labels["replica_set"] == "llama-70b-7d9f8b6c5d"
    # an interval without tokens has no mean, and a restarted pod's counters count from zero
    state, idle = extract(_latency_batch(pod, 30, 16.0, 500), state)
    assert idle is not None and "tpot_mean_s" not in idle.values and idle.values["tpot_observations"] == 0
    _, restarted = extract(_latency_batch(pod, 45, 1.0, 10), state)
    assert restarted is not None and restarted.values["tpot_mean_s"] == pytest.approx(0.1)


def test_only_deployment_pod_names_get_revision_labels():
    from pipelines.features import revision_labels

    assert revision_labels("web-5d4f8c7b9-abcde") == {"deployment": "web", "replica_set": "web-5d4f8c7b9"}
    assert revision_labels("postgres-0") == {}
    assert revision_labels("gpu-node-000") == {}
