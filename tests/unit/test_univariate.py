"""Streaming univariate metric detector: what it flags, what it leaves alone, and its state."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.detectors.univariate import UnivariateConfig, UnivariateState, score

# The threshold NAB's sweep chose for this detector on the AWS CloudWatch corpus (docs/nab.md).
NAB_THRESHOLD = 0.53
WARMUP = 600
STEP = 300.0  # 5-minute samples


def _noise(n: int = 2000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(10.0, 1.0, n)


def _times(n: int) -> np.ndarray:
    return np.arange(n) * STEP


def _scores(values: np.ndarray) -> np.ndarray:
    return score(values, _times(len(values)))[1]


def test_stationary_noise_stays_below_the_threshold() -> None:
    s = _scores(_noise())
    assert ((s >= 0) & (s <= 1)).all()
    assert s[WARMUP:].max() < NAB_THRESHOLD


def test_level_shift_scores_high_at_its_onset() -> None:
    x = _noise()
    x[1500:] += 6.0
    s = _scores(x)
    onset = s[1500:1516].max()
    assert onset > NAB_THRESHOLD
    assert onset > s[WARMUP:1500].max()
    # Once seen, the new level is normal again.
    assert s[1600:].max() < NAB_THRESHOLD


def test_spike_scores_high() -> None:
    x = _noise()
    x[1500] += 12.0
    s = _scores(x)
    assert s[1500] > 0.65
    assert s[1500] > 1.3 * s[WARMUP:1500].max()


def test_repeating_pattern_scores_far_below_its_first_occurrence() -> None:
    # A daily spike (every 288 rows) is novel the first time, then matches its past self: later
    # ones score like the background noise, not like a new spike.
    x = _noise(3000) * 0.1
    spikes = np.arange(100, 3000, 288)
    x[spikes] += 20.0
    s = _scores(x)
    assert s[100] > 0.9
    assert s[spikes[2:]].max() < 0.6


@pytest.mark.parametrize("sizes", [[1] * 40 + [1960], [7, 128, 500, 1365], [999, 1001]])
def test_micro_batches_with_carried_state_equal_one_batch(sizes: list[int]) -> None:
    x = _noise()
    x[1500:] += 4.0
    x[[300, 1200]] = np.nan
    t = _times(len(x))
    whole = score(x, t)[1]
    state: UnivariateState | None = None
    parts = []
    lo = 0
    for size in sizes:
        state, part = score(x[lo : lo + size], t[lo : lo + size], state)
        parts.append(part)
        lo += size
    assert lo == len(x)
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    assert state is not None and state.seen == len(x)


def test_scores_are_causal() -> None:
    x = _noise()
    x[1500:] += 6.0
    np.testing.assert_array_equal(_scores(x[:1400]), _scores(x)[:1400])


def test_state_round_trips_through_a_dict() -> None:
    x = _noise()
    t = _times(len(x))
    state, _ = score(x[:1000], t[:1000])
    restored = UnivariateState.from_dict(state.to_dict())
    _, a = score(x[1000:], t[1000:], state)
    _, b = score(x[1000:], t[1000:], restored)
    np.testing.assert_array_equal(a, b)


def test_state_is_not_mutated_and_memory_is_bounded() -> None:
    cfg = UnivariateConfig(embed=8, history=200, reference=100)
    x = _noise(1000)
    state, _ = score(x[:500], _times(500), UnivariateState(config=cfg))
    before = state.values.copy()
    after, _ = score(x[500:], _times(500) + 500 * STEP, state)
    np.testing.assert_array_equal(state.values, before)
    assert len(after.values) == cfg.history + cfg.embed - 1
    assert len(after.distances) == cfg.reference


def test_missing_samples_score_zero_and_do_not_look_like_spikes() -> None:
    x = _noise()
    x[1000:1005] = np.nan
    s = _scores(x)
    assert (s[1000:1005] == 0).all()
    assert s[1005:1030].max() < NAB_THRESHOLD


def test_mismatched_lengths_are_rejected() -> None:
    with pytest.raises(ValueError):
        score(np.zeros(3), np.zeros(2))
    state, s = score(np.zeros(0), np.zeros(0))
    assert len(s) == 0 and state.seen == 0
