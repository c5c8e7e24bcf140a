"""NAB scorer on hand-made files whose scores can be worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.nabscore import (
    STANDARD_PROFILE,
    ScoredFile,
    normalized_score,
    optimize_threshold,
    parse_times,
    prepare_file,
    probation_rows,
    row_weights,
    scaled_sigmoid,
    score_detections,
    score_file,
    window_rows,
)

ROWS = 1000  # probation: 150 rows
WINDOW = (400, 499)  # 100 rows


def _file(detections: list[int], windows: tuple[tuple[int, int], ...] = (WINDOW,), rows: int = ROWS) -> ScoredFile:
    scores = np.zeros(rows)
    scores[detections] = 1.0
    return ScoredFile("synthetic/a.csv", scores, windows)


def test_scaled_sigmoid_matches_nab_reference_points() -> None:
    assert scaled_sigmoid(-1.0) == pytest.approx(0.98661, abs=1e-5)
    assert scaled_sigmoid(-0.5) == pytest.approx(0.84828, abs=1e-5)
    assert scaled_sigmoid(0.0) == 0.0
    assert scaled_sigmoid(3.5) == -1.0


def test_probation_is_15_percent_capped_at_750_rows() -> None:
    assert probation_rows(1000) == 150
    assert probation_rows(4032) == 604
    assert probation_rows(20000) == 750


def test_tp_at_window_start_scores_one() -> None:
    result = score_file(_file([400]), threshold=0.5)
    assert result.score == pytest.approx(1.0)
    assert (result.tp, result.fp, result.fn) == (1, 0, 0)
    assert result.normalized == pytest.approx(100.0)


def test_late_tp_scores_less_and_later_detections_in_window_do_not_count() -> None:
    late = score_file(_file([480]), threshold=0.5).score
    assert 0 < late < 0.5
    # A second, later detection in the same window changes nothing.
    assert score_file(_file([400, 450, 499]), threshold=0.5).score == pytest.approx(1.0)


def test_fp_far_after_window_costs_fp_weight() -> None:
    # 3 window-widths past the end is where the sigmoid saturates at -1.
    result = score_file(_file([400, 900]), threshold=0.5)
    assert result.score == pytest.approx(1.0 - STANDARD_PROFILE.fp_weight)
    assert result.fp == 1


def test_fp_just_after_window_costs_less() -> None:
    score = score_file(_file([400, 505]), threshold=0.5).score
    assert 1.0 - STANDARD_PROFILE.fp_weight < score < 1.0


def test_fp_before_any_window_costs_full_fp_weight() -> None:
    result = score_file(_file([200]), threshold=0.5)
    assert result.score == pytest.approx(-1.0 - STANDARD_PROFILE.fp_weight)
    assert (result.tp, result.fp, result.fn) == (0, 1, 1)


def test_detections_in_probation_are_ignored() -> None:
    result = score_file(_file([10, 100]), threshold=0.5)
    assert result.score == -1.0
    assert result.fp == 0


def test_row_weights_sign_and_window_membership() -> None:
    weights, window_of = row_weights(ROWS, (WINDOW,), STANDARD_PROFILE)
    assert (window_of[400:500] == 0).all() and (window_of[:400] == -1).all()
    assert (weights[400:500] > 0).all() and (weights[:400] < 0).all() and (weights[500:] < 0).all()
    assert np.all(np.diff(weights[400:500]) < 0)  # earlier is better


def test_null_detector_normalises_to_zero_and_perfect_to_100() -> None:
    windows = ((300, 349), (700, 749))
    files = [_file([], windows), _file([], (WINDOW,))]
    threshold, raw = optimize_threshold(files)
    assert math.isinf(threshold) and raw == -3.0
    assert normalized_score([score_file(f, threshold) for f in files]) == pytest.approx(0.0)

    perfect = [_file([300, 700], windows), _file([400], (WINDOW,))]
    threshold, _ = optimize_threshold(perfect)
    assert normalized_score([score_file(f, threshold) for f in perfect]) == pytest.approx(100.0)


def test_threshold_sweep_finds_the_best_cut_over_the_corpus() -> None:
    # Graded scores: the TP at 0.9, ten FPs at 0.8, one more TP at 0.7.
    a = np.zeros(ROWS)
    a[400] = 0.9
    a[[200 + i for i in range(10)]] = 0.8
    b = np.zeros(ROWS)
    b[400] = 0.7
    files = [ScoredFile("a", a, (WINDOW,)), ScoredFile("b", b, (WINDOW,))]
    threshold, raw = optimize_threshold(files)
    # Taking 0.7 gains a window (+2) for ten FPs (-1.1): worth it.
    assert threshold == pytest.approx(0.7)
    assert raw == pytest.approx(2.0 - 10 * STANDARD_PROFILE.fp_weight)
    # The sweep agrees with scoring each file at that threshold.
    assert sum(score_file(f, threshold).score for f in files) == pytest.approx(raw)


def test_window_rows_from_timestamps_are_inclusive() -> None:
    times = parse_times([f"2014-01-01 00:{m:02d}:00" for m in range(0, 60, 5)])
    assert window_rows(times, [("2014-01-01 00:10:00.000000", "2014-01-01 00:20:00.000000")]) == ((2, 4),)


@pytest.mark.parametrize("seed", range(5))
def test_scoring_a_set_of_detections_agrees_with_scoring_binary_scores(seed: int) -> None:
    # The suppressing detector is scored from its alert rows; the result must be NAB's score of
    # the same rows given as scores of 1 at threshold 0.5.
    windows = ((300, 349), (600, 699), (800, 809))
    rows = np.random.default_rng(seed).choice(ROWS, size=25, replace=False)
    binary = score_file(_file(rows.tolist(), windows), threshold=0.5)
    fast = score_detections(prepare_file("synthetic/a.csv", ROWS, windows, STANDARD_PROFILE), rows)
    assert fast.score == pytest.approx(binary.score)
    assert (fast.tp, fast.fp, fast.fn, fast.windows) == (binary.tp, binary.fp, binary.fn, binary.windows)


def test_only_the_earliest_detection_in_a_window_counts() -> None:
    prepared = prepare_file("synthetic/a.csv", ROWS, (WINDOW,), STANDARD_PROFILE)
    assert score_detections(prepared, [499, 450, 400]).score == pytest.approx(1.0)
