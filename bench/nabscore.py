"""NAB scoring, written from the Numenta Anomaly Benchmark's published rules.

The rules (Lavin & Ahmad 2015, arXiv:1510.03336, and NAB's documentation) that this module follows:

* Each labelled anomaly has a *window* of rows around it (``labels/combined_windows.json``); a
  detection is any row whose anomaly score is at or above the detector's threshold.
* A detection inside a window is worth ``tp_weight * sigmoid(x) / sigmoid(-1)``, where the scaled
  sigmoid ``2 / (1 + exp(5 x)) - 1`` of the relative position ``x`` rewards early detection:
  ``x = -1`` at the window's first row (worth exactly ``tp_weight``), ``x -> 0`` at its last row
  (worth ~0). Only the best (that is, the earliest) detection in a window counts; later ones in the
  same window are neither rewarded nor punished.
* A window with no detection costs ``-fn_weight``.
* A detection outside every window is a false positive worth ``fp_weight * sigmoid(x)`` where ``x`` is
  the distance from the end of the previous window in units of that window's width: slightly negative
  right after a window, ``-fp_weight`` once ``x > 3``. Before the first window it is ``-fp_weight``.
* Rows in the probationary period (the first 15% of a file, at most 750 rows) are ignored.
* The raw score of a corpus is summed over its files and normalised as
  ``100 * (S - S_null) / (S_perfect - S_null)``, where the null detector misses every window
  (``S_null = -fn_weight * windows``) and the perfect one scores ``tp_weight`` per window.
* The detector's threshold is the one that maximises the corpus score: NAB sweeps it over the
  anomaly scores. :func:`optimize_threshold` does that sweep exactly, over every distinct score.

Nothing here does I/O except :func:`load_profile`, :func:`load_windows` and :func:`read_series`.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

PROBATION_FRACTION = 0.15
PROBATION_CAP_ROWS = 750  # NAB: 0.15 * 5000
# Beyond three window-widths past a window, a false positive costs the full fp weight.
SIGMOID_SATURATION = 3.0


@dataclass(frozen=True)
class CostProfile:
    """Weights of one NAB application profile (``profiles.json``), all given as positive numbers."""

    tp_weight: float = 1.0
    fp_weight: float = 0.11
    fn_weight: float = 1.0


STANDARD_PROFILE = CostProfile()


@dataclass(frozen=True)
class ScoredFile:
    """What the scorer needs to know about one labelled series."""

    name: str
    scores: FloatArray
    """Anomaly score of every row, in file order."""
    windows: tuple[tuple[int, int], ...]
    """Anomaly windows as inclusive (first row, last row) indices, in time order."""

    @property
    def rows(self) -> int:
        """Number of rows in the series."""
        return len(self.scores)


@dataclass(frozen=True)
class FileResult:
    """Score of one file at one threshold."""

    name: str
    score: float
    null: float
    perfect: float
    tp: int
    fp: int
    fn: int
    windows: int

    @property
    def normalized(self) -> float | None:
        """``100 * (S - S_null) / (S_perfect - S_null)``; ``None`` for a file without windows."""
        span = self.perfect - self.null
        return None if span == 0 else 100.0 * (self.score - self.null) / span


def scaled_sigmoid(x: float) -> float:
    """NAB's scaled sigmoid, in (-1, 1): 2 / (1 + e^(5x)) - 1, and exactly -1 beyond ``x > 3``."""
    if x > SIGMOID_SATURATION:
        return -1.0
    return 2.0 / (1.0 + math.exp(5.0 * x)) - 1.0


def probation_rows(rows: int) -> int:
    """Rows at the start of a file whose detections NAB ignores (15%, at most 750)."""
    return int(min(math.floor(PROBATION_FRACTION * rows), PROBATION_FRACTION * 5000))


def row_weights(
    rows: int, windows: Sequence[tuple[int, int]], profile: CostProfile
) -> tuple[FloatArray, npt.NDArray[np.int64]]:
    """Weight of a detection at each row, and the window each row belongs to (-1: none).

    Args:
        rows: length of the series.
        windows: inclusive (first, last) row indices, in time order, not overlapping.
        profile: cost weights.

    Returns:
        ``(weights, window_of_row)``; a detection at row ``i`` is worth ``weights[i]``
        (positive inside a window, negative outside).
    """
    # NAB divides by the sigmoid at the window start so that the earliest detection is worth tp_weight.
    max_tp = scaled_sigmoid(-1.0)
    weights = np.empty(rows, dtype=np.float64)
    window_of = np.full(rows, -1, dtype=np.int64)
    prev_end: int | None = None
    prev_width = 0
    cursor = 0
    for w_idx, (first, last) in enumerate([*windows, (rows, rows)]):
        # Rows between the previous window (or the file start) and this window are false positives.
        for i in range(cursor, min(first, rows)):
            if prev_end is None:
                weights[i] = -profile.fp_weight
            else:
                # NAB divides by (width - 1); guard the degenerate one-row window.
                x = abs(prev_end - i) / max(prev_width - 1, 1)
                weights[i] = profile.fp_weight * scaled_sigmoid(x)
        if first >= rows:
            break
        width = last - first + 1
        for i in range(first, last + 1):
            # -1 at the first row, -1/width at the last: earlier is better.
            x = -(last - i + 1) / width
            weights[i] = profile.tp_weight * scaled_sigmoid(x) / max_tp
            window_of[i] = w_idx
        prev_end, prev_width, cursor = last, width, last + 1
    return weights, window_of


def _score_curve(
    scored: ScoredFile, profile: CostProfile
) -> tuple[FloatArray, FloatArray, npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Score of one file as a step function of the threshold.

    Returns:
        ``(levels, score, tp, fp, fn)``: ``levels`` are the file's distinct anomaly scores (outside
        probation) in decreasing order; ``score[k]`` is the file score when every row with an
        anomaly score >= ``levels[k - 1]`` is a detection (``score[0]``: no detection at all).
    """
    weights, window_of = row_weights(scored.rows, scored.windows, profile)
    start = probation_rows(scored.rows)
    s = scored.scores[start:]
    w = weights[start:]
    win = window_of[start:]
    order = np.argsort(-s, kind="stable")
    n_windows = len(scored.windows)
    best = np.full(n_windows, -profile.fn_weight)
    total = -profile.fn_weight * n_windows
    fp = 0
    tp = 0
    levels: list[float] = []
    curve = [total]
    tps = [0]
    fps = [0]
    k = 0
    while k < len(order):
        level = s[order[k]]
        # Every row tied at this level becomes a detection at the same time.
        while k < len(order) and s[order[k]] == level:
            i = order[k]
            if win[i] < 0:
                total += w[i]
                fp += 1
            elif w[i] > best[win[i]]:
                if best[win[i]] == -profile.fn_weight:
                    tp += 1
                total += w[i] - best[win[i]]
                best[win[i]] = w[i]
            k += 1
        levels.append(float(level))
        curve.append(total)
        tps.append(tp)
        fps.append(fp)
    tp_arr = np.asarray(tps, dtype=np.int64)
    return (
        np.asarray(levels, dtype=np.float64),
        np.asarray(curve, dtype=np.float64),
        tp_arr,
        np.asarray(fps, dtype=np.int64),
        n_windows - tp_arr,
    )


def score_file(scored: ScoredFile, threshold: float, profile: CostProfile = STANDARD_PROFILE) -> FileResult:
    """Score one file with a fixed threshold (a detection is ``score >= threshold``)."""
    levels, curve, tp, fp, fn = _score_curve(scored, profile)
    # Number of distinct levels at or above the threshold (levels are decreasing).
    k = int(np.searchsorted(-levels, -threshold, side="right"))
    n = len(scored.windows)
    return FileResult(
        name=scored.name,
        score=float(curve[k]),
        null=-profile.fn_weight * n,
        perfect=profile.tp_weight * n,
        tp=int(tp[k]),
        fp=int(fp[k]),
        fn=int(fn[k]),
        windows=n,
    )


@dataclass(frozen=True)
class PreparedFile:
    """A labelled file's per-row detection weights, computed once for many sets of detections.

    Scoring a detector whose detections are not "every row at or above a threshold" (one that
    suppresses repeats after an alert, say) needs the detections themselves; this holds what
    :func:`score_detections` needs to score any number of them quickly.
    """

    name: str
    rows: int
    windows: int
    weights: FloatArray
    window_of: npt.NDArray[np.int64]
    start: int
    """First row after the probationary period."""


def prepare_file(name: str, rows: int, windows: Sequence[tuple[int, int]], profile: CostProfile) -> PreparedFile:
    """Precompute a file's detection weights (see :func:`row_weights`) and probationary period."""
    weights, window_of = row_weights(rows, windows, profile)
    return PreparedFile(name, rows, len(windows), weights, window_of, probation_rows(rows))


def score_detections(
    prepared: PreparedFile, detections: npt.ArrayLike, profile: CostProfile = STANDARD_PROFILE
) -> FileResult:
    """Score one file given the rows a detector flagged, by the same rules as :func:`score_file`.

    Detections in the probationary period are ignored; in a window only the earliest counts; each
    one outside every window costs its false-positive weight.
    """
    rows = np.sort(np.asarray(detections, dtype=np.int64))
    rows = rows[rows >= prepared.start]
    win = prepared.window_of[rows]
    outside = win < 0
    fp_total = float(prepared.weights[rows[outside]].sum())
    hit = win[~outside]
    # Weights fall through a window, so the earliest detection in it is its best.
    best = np.full(prepared.windows, -profile.fn_weight)
    if len(hit):
        first_rows = rows[~outside][np.unique(hit, return_index=True)[1]]
        best[prepared.window_of[first_rows]] = prepared.weights[first_rows]
    tp = len(np.unique(hit))
    return FileResult(
        name=prepared.name,
        score=float(best.sum()) + fp_total,
        null=-profile.fn_weight * prepared.windows,
        perfect=profile.tp_weight * prepared.windows,
        tp=tp,
        fp=int(outside.sum()),
        fn=prepared.windows - tp,
        windows=prepared.windows,
    )


def optimize_threshold(files: Sequence[ScoredFile], profile: CostProfile = STANDARD_PROFILE) -> tuple[float, float]:
    """Find the threshold that maximises the corpus score, as NAB's sweep does.

    Every distinct anomaly score is a candidate, plus one above them all (no detection), so the
    optimum is exact and never worse than the null detector.

    Returns:
        ``(threshold, raw corpus score)``; ties go to the highest threshold.
    """
    curves = [_score_curve(f, profile) for f in files]
    candidates = np.unique(np.concatenate([c[0] for c in curves] + [np.array([np.inf])]))[::-1]
    totals = np.zeros(len(candidates))
    for levels, curve, *_ in curves:
        idx = np.searchsorted(-levels, -candidates, side="right")
        totals += curve[idx]
    best = int(np.argmax(totals))
    return float(candidates[best]), float(totals[best])


def normalized_score(results: Sequence[FileResult]) -> float:
    """Corpus score: ``100 * (sum S - sum S_null) / (sum S_perfect - sum S_null)``."""
    s = sum(r.score for r in results)
    null = sum(r.null for r in results)
    perfect = sum(r.perfect for r in results)
    return 100.0 * (s - null) / (perfect - null) if perfect != null else 0.0


# ----------------------------------------------------------------------------------------- files


def load_profile(path: Path, name: str = "standard") -> CostProfile:
    """Read one profile from NAB's ``profiles.json`` (weights are stored as positive numbers)."""
    matrix = json.loads(path.read_text())[name]["CostMatrix"]
    return CostProfile(
        tp_weight=float(matrix["tpWeight"]),
        fp_weight=float(matrix["fpWeight"]),
        fn_weight=float(matrix["fnWeight"]),
    )


def load_windows(path: Path) -> dict[str, list[tuple[str, str]]]:
    """Read ``combined_windows.json``: relative file name -> [(start, end) timestamps]."""
    raw: Mapping[str, list[list[str]]] = json.loads(path.read_text())
    return {name: [(w[0], w[1]) for w in wins] for name, wins in raw.items()}


def parse_times(stamps: Sequence[str]) -> npt.NDArray[np.datetime64]:
    """NAB timestamps (``YYYY-MM-DD HH:MM:SS[.ffffff]``) as numpy datetimes."""
    return np.array([s.strip().replace(" ", "T") for s in stamps], dtype="datetime64[us]")


def window_rows(times: npt.NDArray[np.datetime64], windows: Sequence[tuple[str, str]]) -> tuple[tuple[int, int], ...]:
    """Convert timestamp windows into inclusive row ranges (rows with start <= t <= end)."""
    out = []
    for start, end in windows:
        t0, t1 = parse_times([start, end])
        first = int(np.searchsorted(times, t0, side="left"))
        last = int(np.searchsorted(times, t1, side="right")) - 1
        if last >= first:
            out.append((first, last))
    return tuple(sorted(out))


def read_series(path: Path) -> tuple[list[str], FloatArray]:
    """Read a NAB data file (``timestamp,value``)."""
    stamps: list[str] = []
    values: list[float] = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            stamps.append(row["timestamp"])
            values.append(float(row["value"]))
    return stamps, np.asarray(values, dtype=np.float64)
