"""Streaming univariate metric detector: what it alerts on, what it leaves alone, and its state."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.detectors.univariate import (
    UnivariateConfig,
    UnivariateState,
    combine,
    detect,
    score,
    suppress,
)

STEP = 300.0  # 5-minute samples


def _noise(n: int = 2000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(10.0, 1.0, n)


def _times(n: int) -> np.ndarray:
    return np.arange(n) * STEP


def _alerts(values: np.ndarray) -> np.ndarray:
    return np.flatnonzero(detect(values, _times(len(values)))[1].alerts)


def test_alerts_are_exactly_the_rows_scoring_at_least_one_half() -> None:
    x = _noise()
    x[1500:] += 6.0
    result = detect(x, _times(len(x)))[1]
    assert ((result.scores >= 0) & (result.scores <= 1)).all()
    np.testing.assert_array_equal(result.alerts, result.scores >= 0.5)


def test_stationary_noise_alerts_rarely_once_its_range_is_known() -> None:
    # A record of 4,000 rows of noise is rare, and must beat the range by the threshold's share.
    late = [int((_alerts(_noise(4000, seed)) >= 1000).sum()) for seed in range(5)]
    assert sum(late) <= 15  # at most one alert per thousand rows


def test_level_shift_alerts_at_its_onset_and_the_new_level_becomes_normal() -> None:
    x = _noise()
    x[1500:] += 6.0
    alerts = _alerts(x)
    assert 1500 in alerts
    assert not (alerts >= 1600).any()


def test_spike_alerts_with_a_high_score() -> None:
    x = _noise()
    x[1500] += 12.0
    result = detect(x, _times(len(x)))[1]
    assert result.alerts[1500]
    assert result.scores[1500] > 0.9


def test_repeating_pattern_alerts_only_the_first_time() -> None:
    # A daily spike (every 288 rows) is new the first time, then matches its past self.
    x = _noise(3000) * 0.1
    spikes = np.arange(400, 3000, 288)
    x[spikes] += 20.0
    alerts = _alerts(x)
    assert spikes[0] in alerts
    assert not np.isin(spikes[1:], alerts).any()


def test_flat_series_that_first_moves_scores_one() -> None:
    x = np.full(1000, 5.0)
    x[700] = 6.0
    result = detect(x, _times(len(x)))[1]
    assert result.scores[700] == 1.0
    assert np.flatnonzero(result.alerts).tolist() == [700]


def test_one_event_raises_one_alert_and_a_later_one_its_own() -> None:
    x = _noise()
    x[1500] += 12.0
    x[1510] += 14.0  # inside the suppression span: same event
    x[1600] += 16.0  # after it: a new alert
    result = detect(x, _times(len(x)))[1]
    alerts = np.flatnonzero(result.alerts)
    assert 1500 in alerts and 1600 in alerts and 1510 not in alerts
    assert result.scores[1510] == 0.0  # already reported


def test_warmup_rows_never_alert() -> None:
    cfg = UnivariateConfig()
    x = _noise()
    x[10] += 50.0
    assert not (_alerts(x) < cfg.warmup).any()


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


@pytest.mark.parametrize("i", [150, 299, 300, 1000, 1499, 1500, 1507, 1999])
def test_score_at_a_row_is_the_same_whether_or_not_the_series_continues(i: int) -> None:
    # NAB's online rule: each point is seen once, in order, with no look-ahead.
    x = _noise()
    x[1500:] += 6.0
    x[1505] += 10.0
    t = _times(len(x))
    full = detect(x, t)[1]
    cut = detect(x[: i + 1], t[: i + 1])[1]
    np.testing.assert_array_equal(cut.scores, full.scores[: i + 1])
    np.testing.assert_array_equal(cut.alerts, full.alerts[: i + 1])


def test_state_round_trips_through_a_dict() -> None:
    x = _noise()
    x[1200] += 12.0
    t = _times(len(x))
    state, _ = score(x[:1201], t[:1201])
    assert state.last_alert == 1200
    restored = UnivariateState.from_dict(state.to_dict())
    assert restored.to_dict() == state.to_dict()
    _, a = score(x[1201:], t[1201:], state)
    _, b = score(x[1201:], t[1201:], restored)
    np.testing.assert_array_equal(a, b)


def test_state_is_not_mutated_and_memory_is_bounded() -> None:
    cfg = UnivariateConfig(embed=8, history=200, reference=100, record_span=300)
    x = _noise(1000)
    state, _ = score(x[:500], _times(500), UnivariateState(config=cfg))
    before = state.values.copy()
    after, _ = score(x[500:], _times(500) + 500 * STEP, state)
    np.testing.assert_array_equal(state.values, before)
    assert len(after.values) == cfg.keep == 300
    assert len(after.distances) == cfg.reference


def test_missing_samples_score_zero_and_do_not_look_like_spikes() -> None:
    x = _noise()
    x[1000:1005] = np.nan
    result = detect(x, _times(len(x)))[1]
    assert (result.scores[1000:1005] == 0).all()
    assert not result.alerts[1000:1030].any()


def test_suppress_carries_the_last_alert_across_calls() -> None:
    combined = np.array([0.0, 1.0, 1.0, 0.0, 1.0])
    alerts, last = suppress(combined, 0.5, span=2, first_row=10, last_alert=8)
    # Row 11 is 3 rows after 8: alerts; 12 and 13 are within 2 of 11; 14 is 3 after.
    assert alerts.tolist() == [False, True, False, False, True]
    assert last == 14


def test_combine_takes_either_kind_of_evidence() -> None:
    out = combine(np.array([0.0, 0.2, 0.0]), np.array([0.0, 0.0, 2.0]), 0.5)
    assert out.tolist() == [0.0, 0.2, 1.0]


def test_mismatched_lengths_are_rejected() -> None:
    with pytest.raises(ValueError):
        score(np.zeros(3), np.zeros(2))
    state, s = score(np.zeros(0), np.zeros(0))
    assert len(s) == 0 and state.seen == 0


def test_bad_settings_are_rejected() -> None:
    with pytest.raises(ValueError):
        UnivariateConfig(threshold=0.0)
    with pytest.raises(ValueError):
        UnivariateConfig(record_span=0)
