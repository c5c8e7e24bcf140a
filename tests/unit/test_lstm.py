import numpy as np
import pytest

from pipelines.detectors import lstm
from pipelines.detectors.lstm import LstmDetector, LstmState
from pipelines.features import GPU_FEATURES, FeatureVector

# Every test here scores with an LSTM trained on torch for the module (7 to 13 s on 2 cores): `make test` runs
# them, `make test-unit` does not.
pytestmark = pytest.mark.slow


def _series(n: int, seed: int, leak_from: int | None = None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    util = 70 + 10 * np.sin(t / 6) + rng.normal(0, 1, n)
    mem = 0.6 + rng.normal(0, 0.005, n)
    if leak_from is not None:
        mem[leak_from:] += 0.02 * np.arange(n - leak_from)
    return np.column_stack([util, mem, 60 + rng.normal(0, 0.5, n), 300 + util, np.full(n, 1980.0)])


@pytest.fixture(scope="module")
def model() -> lstm.TrainedLSTM:
    return lstm.train("gpu", [_series(300, s) for s in range(3)], window=8, epochs=5)


def _run(detector, rows, entity="GPU-1"):
    state = detector.initial_state()
    fired_at = []
    for i, row in enumerate(rows):
        vec = FeatureVector(entity, "gpu", i * 15.0, dict(zip(GPU_FEATURES, row, strict=True)), {"UUID": entity})
        state, anomalies = detector.detect([vec], state)
        fired_at += [i for _ in anomalies]
    return state, fired_at


def test_a_memory_leak_is_caught_and_a_normal_series_is_quiet(model):
    detector = LstmDetector({"gpu": model})
    _, quiet = _run(detector, _series(120, seed=11))
    _, leak = _run(detector, _series(120, seed=12, leak_from=60))
    assert len(quiet) <= 1
    assert leak and 60 <= leak[0] <= 80


def test_segments_scored_together_equal_segments_scored_alone(model):
    segments = [_series(9, seed=s) for s in (21, 22, 23)]
    together = model.score_segments(segments)
    alone = np.concatenate([model.score_segments([s]) for s in segments])
    assert np.allclose(together, alone)


def test_segment_scores_are_what_lstmad_gives_the_segments_last_rows(model):
    # the scorer forecasts only each segment's last row; pyod's decision_function forecasts every row
    segments = [_series(9, seed=s) for s in (31, 32, 33)]
    fast = model.score_segments(segments)
    reference = [model.model.decision_function(model.scaler.transform(seg))[-1] for seg in segments]
    assert np.allclose(fast, reference, rtol=1e-5, atol=1e-6)


def test_state_round_trips_and_no_model_means_silence(model):
    state, _ = _run(LstmDetector({"gpu": model}), _series(20, seed=1))
    again = LstmState.from_dict(state.to_dict())
    assert np.allclose(np.array(again.windows["GPU-1"]), np.array(state.windows["GPU-1"]))
    _, fired = _run(LstmDetector(), _series(40, seed=2, leak_from=10))
    assert fired == []


def test_a_stored_model_scores_like_the_trained_one(model):
    restored = lstm.TrainedLSTM.from_bytes(model.to_bytes())
    segments = [_series(9, seed=s) for s in (31, 32)]
    assert np.allclose(restored.score_segments(segments), model.score_segments(segments))
    assert restored.threshold == model.threshold


def _idle_from(rows: np.ndarray, start: int) -> np.ndarray:
    out = rows.copy()
    out[start:, 0] = 0.0  # utilisation
    out[start:, 2] = 40.0  # temperature
    out[start:, 3] = 90.0  # power
    out[start:, 4] = 345.0  # SM clock
    return out


def test_a_gpu_going_idle_is_no_sequence_anomaly_while_its_load_explains_it(model):
    rows = _idle_from(_series(80, seed=13), 60)
    _, gated = _run(LstmDetector({"gpu": model}), rows)
    _, ungated = _run(LstmDetector({"gpu": model}, load_z=float("inf")), rows)
    assert any(60 <= i < 68 for i in ungated), "the drop is an anomaly to the model itself"
    assert not any(60 <= i < 68 for i in gated)
