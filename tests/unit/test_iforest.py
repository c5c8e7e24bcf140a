import numpy as np
import pytest

from pipelines.detectors import iforest
from pipelines.detectors.episodes import EpisodePolicy
from pipelines.detectors.iforest import IForestState, IsolationForestDetector
from pipelines.features import GPU_FEATURES, FeatureVector


def _vector(entity: str, ts: float, util: float, temp: float) -> FeatureVector:
    values = {"gpu_util": util, "mem_used_frac": 0.6, "temp_c": temp, "power_w": 300 + util, "sm_clock_mhz": 1980}
    return FeatureVector(entity, "gpu", ts, values, {"UUID": entity, "Hostname": "n1", "pod": "p"})


def _normal_rows(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    util = rng.normal(70, 5, n)
    return np.column_stack([util, np.full(n, 0.6), rng.normal(60, 2, n), 300 + util, np.full(n, 1980.0)])


# A trained forest imports pyod (3 to 4 s on 2 cores) and fits 2000 rows: the tests that score with one are
# `slow` (make test runs them, make test-unit does not); the fallback's run in the unit tier.
@pytest.fixture(scope="module")
def model() -> iforest.TrainedIForest:
    return iforest.train("gpu", _normal_rows(2000), contamination=0.01)


@pytest.mark.slow
def test_a_hot_gpu_is_an_outlier_after_persistence_and_fires_once(model):
    detector = IsolationForestDetector({"gpu": model}, episodes=EpisodePolicy(warmup=0, persistence=2))
    state = detector.initial_state()
    fired = []
    for t in range(6):
        hot = t >= 2
        state, anomalies = detector.detect([_vector("GPU-1", t * 15, 70, 95 if hot else 60)], state)
        fired.append(len(anomalies))
    assert fired == [0, 0, 0, 1, 0, 0]


@pytest.mark.slow
def test_normal_scrapes_rarely_fire(model):
    detector = IsolationForestDetector({"gpu": model})
    state = detector.initial_state()
    rows = _normal_rows(200, seed=1)
    total = 0
    for i, row in enumerate(rows):
        vec = FeatureVector("GPU-2", "gpu", i * 15.0, dict(zip(GPU_FEATURES, row, strict=True)), {})
        state, anomalies = detector.detect([vec], state)
        total += len(anomalies)
    assert total <= 1


@pytest.mark.slow
def test_evidence_names_the_feature_that_moved(model):
    detector = IsolationForestDetector({"gpu": model}, episodes=EpisodePolicy(warmup=0, persistence=1))
    _, anomalies = detector.detect([_vector("GPU-1", 0, 70, 99)], detector.initial_state())
    assert anomalies and next(iter(anomalies[0].evidence["top_deviations"])) == "temp_c"
    assert anomalies[0].labels == {"node": "n1", "gpu": "GPU-1", "pod": "p"}
    assert anomalies[0].entity_kind == "gpu" and anomalies[0].signal == "metric_outlier"


def test_fallback_without_model_catches_a_gross_outlier_after_warmup():
    detector = IsolationForestDetector(episodes=EpisodePolicy(warmup=0, persistence=1), fallback_history=20)
    state = detector.initial_state()
    rng = np.random.default_rng(3)
    for t in range(20):
        state, anomalies = detector.detect([_vector("GPU-3", t, 70 + rng.normal(0, 1), 60 + rng.normal(0, 1))], state)
        assert anomalies == []
    state, anomalies = detector.detect([_vector("GPU-3", 21, 70, 120)], state)
    assert len(anomalies) == 1 and anomalies[0].evidence["model"] == "robust_fallback"


@pytest.mark.slow
def test_state_and_model_serialise(model):
    detector = IsolationForestDetector({"gpu": model})
    state, _ = detector.detect([_vector("GPU-1", 0, 70, 60)], detector.initial_state())
    again = IForestState.from_dict(state.to_dict())
    assert again.entities["GPU-1"].rows == state.entities["GPU-1"].rows
    restored = iforest.TrainedIForest.from_bytes(model.to_bytes())
    rows = _normal_rows(5, seed=9)
    assert np.allclose(restored.score(rows), model.score(rows))


def _pod(ts: float, waiting: float, ttft_p99: float) -> FeatureVector:
    values = {
        "kv_cache_usage": 0.3,
        "requests_waiting": waiting,
        "requests_running": 8.0,
        "ttft_p50_s": 0.2,
        "ttft_p99_s": ttft_p99,
        "tpot_p50_s": 0.03,
        "e2e_p99_s": 9.0,
        "prompt_tokens_per_s": 900.0,
        "generation_tokens_per_s": 250.0,
        "preemptions_per_s": 0.0,
        "error_rate": 0.0,
    }
    return FeatureVector("pod-1", "pod", ts, values, {"pod": "pod-1", "node": "n1"})


def test_fallback_takes_a_usual_queue_blip_calmly_but_not_a_tenfold_latency():
    detector = IsolationForestDetector(episodes=EpisodePolicy(warmup=0, persistence=1), fallback_history=20)
    state = detector.initial_state()
    for t in range(20):  # an empty queue and a p99 that never left its histogram bucket
        state, anomalies = detector.detect([_pod(t * 15.0, 0.0, 0.75)], state)
        assert anomalies == []
    # a burst queues six requests and the p99 moves up one bucket: ordinary, not a thousand sigmas
    state, anomalies = detector.detect([_pod(300.0, 6.0, 1.5)], state)
    assert anomalies == []
    state, anomalies = detector.detect([_pod(315.0, 0.0, 12.0)], state)  # sixteen times the p99
    assert len(anomalies) == 1 and "ttft_p99_s" in anomalies[0].evidence["top_deviations"]


def _burst(ts: float, factor: float, ttft_p99: float, error_rate: float = 0.0) -> FeatureVector:
    vector = _pod(ts, 0.0 if factor == 1 else 4.0 * factor, ttft_p99)
    values = {
        **vector.values,
        "prompt_tokens_per_s": 900.0 * factor,
        "requests_running": 8.0 * factor,
        "error_rate": error_rate,
    }
    return FeatureVector(vector.entity, "pod", ts, values, vector.labels)


def test_a_traffic_burst_explains_slower_requests_but_not_failing_ones():
    detector = IsolationForestDetector(episodes=EpisodePolicy(warmup=0, persistence=1), fallback_history=20)
    state = detector.initial_state()
    for t in range(20):
        state, _ = detector.detect([_burst(t * 15.0, 1.0, 0.75)], state)
    # four times the traffic: the p99 is sixteen times higher, the queue long; that is what load does
    state, anomalies = detector.detect([_burst(300.0, 4.0, 12.0)], state)
    assert anomalies == []
    # the same burst failing a fifth of its requests is not explained by load
    state, anomalies = detector.detect([_burst(315.0, 4.0, 12.0, error_rate=0.2)], state)
    assert len(anomalies) == 1 and list(anomalies[0].evidence["top_deviations"]) == ["error_rate"]


def test_the_same_latency_at_the_usual_load_is_still_an_outlier():
    detector = IsolationForestDetector(episodes=EpisodePolicy(warmup=0, persistence=1), fallback_history=20)
    state = detector.initial_state()
    for t in range(20):
        state, _ = detector.detect([_burst(t * 15.0, 1.0, 0.75)], state)
    state, anomalies = detector.detect([_burst(300.0, 1.0, 12.0)], state)
    assert len(anomalies) == 1


@pytest.mark.slow
def test_a_gpu_going_idle_explains_its_lower_clocks_and_power(model):
    detector = IsolationForestDetector({"gpu": model}, episodes=EpisodePolicy(warmup=0, persistence=1))
    state = detector.initial_state()
    for t in range(10):
        state, _ = detector.detect([_vector("GPU-1", t * 15.0, 70, 60)], state)
    idle = FeatureVector(
        "GPU-1",
        "gpu",
        150.0,
        {"gpu_util": 0.0, "mem_used_frac": 0.6, "temp_c": 45.0, "power_w": 90.0, "sm_clock_mhz": 345.0},
        {"UUID": "GPU-1"},
    )
    state, anomalies = detector.detect([idle], state)
    assert anomalies == []
    leaking = FeatureVector("GPU-1", "gpu", 165.0, {**idle.values, "mem_used_frac": 0.99}, {"UUID": "GPU-1"})
    state, anomalies = detector.detect([leaking], state)
    assert len(anomalies) == 1, "memory is not a load-driven feature"


def test_the_windowed_load_check_judges_each_row_as_the_single_row_check_does():
    from pipelines.features import POD_FEATURES

    rng = np.random.default_rng(3)
    names = POD_FEATURES
    window = np.abs(rng.normal(1.0, 0.5, (12, len(names)))) * np.array([iforest.FALLBACK_UNITS[n] for n in names])
    z = iforest.shift_z(names, window[0], window[1:])
    for i, row in enumerate(window[1:]):
        assert np.allclose(z[i], iforest.recent_z(names, window[:1], row))
    burst = window.copy()
    burst[7, names.index("prompt_tokens_per_s")] *= 20
    for rows in (window, burst):
        later = rows[1:]
        one_by_one = any(
            iforest.load_explained("pod", names, iforest.recent_z(names, rows[:1], r), 3.0, r) is not None
            for r in later
        )
        assert iforest.load_moved_in("pod", names, iforest.shift_z(names, rows[0], later), later, 3.0) == one_by_one
    assert iforest.load_moved_in("pod", names, iforest.shift_z(names, burst[0], burst[1:]), burst[1:], 3.0)
