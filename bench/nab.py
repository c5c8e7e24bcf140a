"""NAB benchmark of the univariate metric detector at one setting for every series.

Usage::

    python bench/nab.py [--data DIR] [--out DIR] [--no-gaussian]

``--data`` is a folder in NAB's layout: ``data/<category>/*.csv`` (``timestamp,value``),
``labels/combined_windows.json`` and ``labels/combined_labels.json``, ``profiles.json`` (or
``config/profiles.json``) and ``published_scores.md``. It defaults to ``<shared data>/nab``.

What it does, and prints as one JSON object:

1. Streams every series once, in order, through :func:`pipelines.detectors.univariate.detect` in
   micro-batches, exactly as a live worker would, at the detector's default setting
   (:class:`~pipelines.detectors.univariate.UnivariateConfig`). No setting depends on the file or its
   category. ``fixed`` scores those alerts per category and pooled over every file.
2. ``fit``: the procedure that chose the two fitted values of that setting. Over a fixed grid
   (:data:`NOVELTY_WEIGHTS` x :data:`THRESHOLDS`, both written down before looking at any score), the
   pair that maximises NAB's standard score summed over the files it may see; ties go to the higher
   threshold, then the smaller weight. Run on all the files, it must give the defaults
   (``defaults_match_fit``).
3. ``leave_one_category_out``: the same procedure run six times, each time on five categories; the
   chosen pair is then scored on the sixth. The pooled score of the six left-out runs is the headline.
4. ``published``: the table of ``published_scores.md`` (each published detector at its own published
   threshold), parsed from the file, and the targets checked against it.
5. ``scorer_check``: NAB's windowed Gaussian, written from its description, scored with its own
   optimal threshold; it must reproduce the published row (``bench/nabscore.py`` is the scorer).

``--out DIR`` also writes NAB's results layout for the univariate detector,
``DIR/univariate/<category>/univariate_<file>.csv`` (``timestamp,value,anomaly_score,label``).
Anomaly scores are kept to 12 significant digits, as in NAB's published result files.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

if not __package__:  # run as a script (python bench/nab.py): the scorer is imported as bench.nabscore
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.nabscore import (
    STANDARD_PROFILE,
    CostProfile,
    FileResult,
    FloatArray,
    PreparedFile,
    ScoredFile,
    load_profile,
    load_windows,
    normalized_score,
    optimize_threshold,
    parse_times,
    prepare_file,
    read_series,
    score_detections,
    score_file,
    window_rows,
)
from pipelines.detectors.univariate import UnivariateConfig, UnivariateState, combine, detect, suppress
from services.core.errors import ConfigError
from services.core.paths import shared_data_dir

MICRO_BATCH = 128
SIGNIFICANT_DIGITS = 12

NOVELTY_WEIGHTS: tuple[float, ...] = (0.04, 0.08, 0.16, 0.32)
"""Candidate weights of the novelty component against the record component (factors of two)."""
THRESHOLDS: tuple[float, ...] = tuple(round(m / 10 * 10.0**e, 6) for e in range(-3, 1) for m in range(10, 100))
"""Candidate thresholds: every two-significant-digit value from 0.0010 to 9.9."""

PUBLISHED_POOLED = "all 51 pooled"
TARGET_POOLED = "ARTime"  # the published detector the pooled score at the one setting must beat
TARGET_PER_CATEGORY = "Numenta HTM"  # ...and the one each left-out category must beat


@dataclass(frozen=True)
class Series:
    """One labelled NAB file."""

    name: str  # relative to data/, e.g. "realAWSCloudwatch/grok_asg_anomaly.csv"
    stamps: list[str]
    values: FloatArray
    windows: tuple[tuple[int, int], ...]
    labels: int

    @property
    def category(self) -> str:
        """NAB category: the folder the file is in."""
        return self.name.split("/", 1)[0]


@dataclass(frozen=True)
class Run:
    """One series streamed through the detector: its components, alerts and scores."""

    series: Series
    prepared: PreparedFile
    record: FloatArray
    novelty: FloatArray
    alerts: FloatArray
    scores: FloatArray


def stream(values: FloatArray, seconds: FloatArray, config: UnivariateConfig) -> tuple[FloatArray, ...]:
    """Stream one series through :func:`detect` in micro-batches; return record, novelty, alerts, scores."""
    state = UnivariateState(config=config)
    parts = []
    for lo in range(0, len(values), MICRO_BATCH):
        state, result = detect(values[lo : lo + MICRO_BATCH], seconds[lo : lo + MICRO_BATCH], state)
        parts.append(result)
    return (
        np.concatenate([p.record for p in parts]),
        np.concatenate([p.novelty for p in parts]),
        np.concatenate([p.alerts for p in parts]).astype(np.float64),
        np.concatenate([p.scores for p in parts]),
    )


def windowed_gaussian(values: FloatArray, window: int = 6400, step: int = 100) -> FloatArray:
    """NAB's windowed Gaussian baseline, written from its description.

    The score of a value is one minus its two-sided Gaussian tail probability under the mean and
    standard deviation of the previous values: all of them until ``window`` are held, then the
    window slides forward ``step`` values at a time. The first value scores 0.
    """
    out = np.zeros(len(values))
    held: list[float] = []
    pending: list[float] = []
    mean, std = 0.0, 1.0
    for i, x in enumerate(values.tolist()):
        if held:
            z = abs(x - mean) / std
            out[i] = 1.0 - 0.5 * math.erfc(z / math.sqrt(2.0))
        if len(held) < window:
            held.append(x)
        else:
            pending.append(x)
            if len(pending) < step:
                continue
            held = held[step:] + pending
            pending = []
        mean = float(np.mean(held))
        # A constant window would divide by zero; NAB uses a tiny floor instead.
        std = float(np.std(held)) or 1e-6
    return out


def round_significant(scores: FloatArray, digits: int = SIGNIFICANT_DIGITS) -> FloatArray:
    """Round to ``digits`` significant digits, as NAB's result files store scores."""
    return np.array([float(f"{s:.{digits}g}") for s in scores.tolist()], dtype=np.float64)


def load_corpus(root: Path) -> tuple[list[Series], list[str], CostProfile]:
    """Read every labelled series of a NAB-layout folder.

    Returns:
        ``(series, unlabelled file names, standard profile)``.

    Raises:
        ConfigError: the folder, its data or its windows file is missing.
    """
    data_dir = root / "data"
    windows_path = root / "labels" / "combined_windows.json"
    if not data_dir.is_dir():
        raise ConfigError(f"NAB data folder {data_dir} is absent (expected data/<category>/*.csv)")
    if not windows_path.is_file():
        raise ConfigError(f"NAB windows file {windows_path} is absent")
    windows = load_windows(windows_path)
    labels_path = root / "labels" / "combined_labels.json"
    labels: dict[str, list[str]] = json.loads(labels_path.read_text()) if labels_path.is_file() else {}
    profile = STANDARD_PROFILE
    for candidate in (root / "profiles.json", root / "config" / "profiles.json"):
        if candidate.is_file():
            profile = load_profile(candidate)
            break

    series: list[Series] = []
    unlabelled: list[str] = []
    for path in sorted(data_dir.glob("*/*.csv")):
        name = path.relative_to(data_dir).as_posix()
        if name not in windows:
            unlabelled.append(name)
            continue
        stamps, values = read_series(path)
        rows = window_rows(parse_times(stamps), windows[name])
        series.append(Series(name, stamps, values, rows, len(labels.get(name, []))))
    if not series:
        raise ConfigError(f"no labelled series under {data_dir}")
    return series, unlabelled, profile


def parse_published(path: Path) -> dict[str, dict[str, float]]:
    """Read the Markdown table of ``published_scores.md``: detector -> column -> score.

    Raises:
        ConfigError: the file is absent or holds no table.
    """
    if not path.is_file():
        raise ConfigError(f"published scores {path} are absent")
    header: list[str] | None = None
    table: dict[str, dict[str, float]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not all(re.fullmatch(r":?-+:?", c) for c in cells):
            table[cells[0]] = {col: float(v) for col, v in zip(header[1:], cells[1:], strict=True)}
    if not table:
        raise ConfigError(f"no score table in {path}")
    return table


def published_row(table: dict[str, dict[str, float]], name: str) -> tuple[str, dict[str, float]]:
    """The row of the published detector whose name starts with ``name`` (``Numenta HTM (numenta)``)."""
    for detector, row in table.items():
        if detector == name or detector.startswith(name + " "):
            return detector, row
    raise ConfigError(f"published scores have no row for {name!r}")


def write_results(out: Path, detector: str, item: Series, scores: FloatArray) -> None:
    """Write one NAB results file: ``out/<detector>/<category>/<detector>_<file>.csv``."""
    category, file_name = item.name.rsplit("/", 1)
    target = out / detector / category / f"{detector}_{file_name}"
    target.parent.mkdir(parents=True, exist_ok=True)
    in_window = np.zeros(len(item.values), dtype=int)
    for first, last in item.windows:
        in_window[first : last + 1] = 1
    lines = ["timestamp,value,anomaly_score,label"]
    lines += [
        f"{t},{v!r},{s!r},{lab}"
        for t, v, s, lab in zip(item.stamps, item.values.tolist(), scores.tolist(), in_window.tolist(), strict=True)
    ]
    target.write_text("\n".join(lines) + "\n")


def summarise(results: Sequence[FileResult], categories: Iterable[str]) -> dict[str, Any]:
    """Per category and pooled: normalised score, TP/FP/FN windows and files."""
    out: dict[str, Any] = {}
    for category in categories:
        part = [r for r in results if r.name.startswith(category + "/")]
        windows = sum(r.windows for r in part)
        out[category] = {
            "score": round(normalized_score(part), 2) if windows else None,
            "raw_score": round(sum(r.score for r in part), 4),
            "files": len(part),
            "windows": windows,
            "tp": sum(r.tp for r in part),
            "fp": sum(r.fp for r in part),
            "fn": sum(r.fn for r in part),
        }
    out["pooled"] = round(normalized_score(results), 2)
    return out


class Fitter:
    """The fitting procedure: the grid pair with the best NAB score over the files it may see.

    Every file's raw score is computed once for each (weight, threshold) of the grid, with alerts
    from :func:`~pipelines.detectors.univariate.combine` and
    :func:`~pipelines.detectors.univariate.suppress`, the very functions the live detector runs.
    """

    def __init__(self, runs: Sequence[Run], suppress_rows: int, profile: CostProfile) -> None:
        self.runs = runs
        self.profile = profile
        self.suppress_rows = suppress_rows
        self.raw = np.zeros((len(NOVELTY_WEIGHTS), len(THRESHOLDS), len(runs)))
        for w, weight in enumerate(NOVELTY_WEIGHTS):
            for f, run in enumerate(runs):
                combined = combine(run.record, run.novelty, weight)
                for t, threshold in enumerate(THRESHOLDS):
                    self.raw[w, t, f] = self._score(run, combined, threshold).score

    def result(self, index: int, weight: float, threshold: float) -> FileResult:
        """One file scored at one grid pair."""
        run = self.runs[index]
        return self._score(run, combine(run.record, run.novelty, weight), threshold)

    def _score(self, run: Run, combined: FloatArray, threshold: float) -> FileResult:
        alerts, _ = suppress(combined, threshold, self.suppress_rows)
        return score_detections(run.prepared, np.flatnonzero(alerts), self.profile)

    def fit(self, categories: Iterable[str]) -> tuple[float, float, float]:
        """Best ``(weight, threshold, raw score)`` over the files of ``categories``.

        Ties go to the higher threshold (fewer alerts), then to the smaller weight.
        """
        chosen = set(categories)
        mask = np.array([r.series.category in chosen for r in self.runs])
        totals = self.raw[:, :, mask].sum(axis=2)
        best = totals.max()
        # Prefer the highest threshold among the ties, then the smallest weight.
        for t in range(len(THRESHOLDS) - 1, -1, -1):
            for w in range(len(NOVELTY_WEIGHTS)):
                if totals[w, t] >= best - 1e-9:
                    return NOVELTY_WEIGHTS[w], THRESHOLDS[t], float(totals[w, t])
        raise AssertionError("unreachable: the maximum is in the grid")


def run_univariate(
    corpus: Sequence[Series], profile: CostProfile, out: Path | None, config: UnivariateConfig
) -> tuple[list[Run], float]:
    """Stream every series through the live detector; return the runs and the seconds it took."""
    runs: list[Run] = []
    elapsed = 0.0
    for item in corpus:
        seconds = parse_times(item.stamps).astype("datetime64[s]").astype(np.float64)
        started = time.perf_counter()
        record, novelty, alerts, scores = stream(item.values, seconds, config)
        elapsed += time.perf_counter() - started
        scores = round_significant(scores)
        if out is not None:
            write_results(out, "univariate", item, scores)
        prepared = prepare_file(item.name, len(item.values), item.windows, profile)
        runs.append(Run(item, prepared, record, novelty, alerts, scores))
    return runs, elapsed


def evaluate(
    corpus: Sequence[Series], profile: CostProfile, root: Path, out: Path | None, gaussian: bool
) -> dict[str, Any]:
    """Everything the bench prints (see the module docstring)."""
    config = UnivariateConfig()
    categories = sorted({s.category for s in corpus})
    runs, elapsed = run_univariate(corpus, profile, out, config)
    rows = sum(len(s.values) for s in corpus)

    # 1. The live detector's own alerts at its one setting.
    live = [score_detections(r.prepared, np.flatnonzero(r.alerts), profile) for r in runs]
    fixed = summarise(live, categories)

    # 2. The procedure that chose the setting, on every file.
    fitter = Fitter(runs, config.suppress, profile)
    weight, threshold, _ = fitter.fit(categories)

    # 3. Leave one category out.
    loco: dict[str, Any] = {}
    left_out: list[FileResult] = []
    for category in categories:
        w, t, _ = fitter.fit(c for c in categories if c != category)
        part = [fitter.result(i, w, t) for i, r in enumerate(runs) if r.series.category == category]
        left_out += part
        windows = sum(p.windows for p in part)
        loco[category] = {
            "fitted_on": [c for c in categories if c != category],
            "novelty_weight": w,
            "threshold": t,
            "score": round(normalized_score(part), 2) if windows else None,
            "raw_score": round(sum(p.score for p in part), 4),
            "tp": sum(p.tp for p in part),
            "fp": sum(p.fp for p in part),
            "fn": sum(p.fn for p in part),
        }
    loco_pooled = round(normalized_score(left_out), 2)

    # 4. The published table and the targets.
    table = parse_published(root / "published_scores.md")
    target_name, target_row = published_row(table, TARGET_POOLED)
    htm_name, htm_row = published_row(table, TARGET_PER_CATEGORY)
    per_category_target = {
        c: {
            "loco": loco[c]["score"],
            htm_name: htm_row[c],
            "met": loco[c]["score"] is not None and loco[c]["score"] > htm_row[c],
        }
        for c in categories
        if c in htm_row
    }
    ranking = sorted(
        [*((name, row[PUBLISHED_POOLED]) for name, row in table.items()), ("ClusterMedic univariate", fixed["pooled"])],
        key=lambda item: -item[1],
    )

    report: dict[str, Any] = {
        "benchmark": "NAB standard profile, one setting for every series",
        "files": len(corpus),
        "windows": sum(len(s.windows) for s in corpus),
        "config": asdict(config),
        "fixed": fixed,
        "fit": {
            "procedure": (
                f"grid novelty_weight in {list(NOVELTY_WEIGHTS)} x threshold in every two-significant-digit "
                f"value {THRESHOLDS[0]}..{THRESHOLDS[-1]} ({len(THRESHOLDS)} values); the pair with the best "
                "NAB standard score summed over the files fitted on; ties: higher threshold, then smaller "
                f"weight; alerts suppressed for {config.suppress} rows after each alert"
            ),
            "on_all_files": {"novelty_weight": weight, "threshold": threshold},
            "defaults_match_fit": (weight, threshold) == (config.novelty_weight, config.threshold),
            "fixed_by_design_not_fitted": {
                "embed": config.embed,
                "history": config.history,
                "reference": config.reference,
                "record_span": config.record_span,
                "warmup": config.warmup,
                "discord_warmup": config.discord_warmup,
                "suppress": config.suppress,
            },
        },
        "leave_one_category_out": {"categories": loco, "pooled": loco_pooled},
        "published": table,
        "targets": {
            f"pooled at the one setting > {target_name}": {
                "ours": fixed["pooled"],
                target_name: target_row[PUBLISHED_POOLED],
                "met": fixed["pooled"] > target_row[PUBLISHED_POOLED],
            },
            f"leave-one-category-out > {htm_name} on every category": {
                "per_category": per_category_target,
                "met": all(v["met"] for v in per_category_target.values()),
            },
            f"leave-one-category-out pooled vs {target_name}": {
                "ours": loco_pooled,
                target_name: target_row[PUBLISHED_POOLED],
                "met": loco_pooled > target_row[PUBLISHED_POOLED],
            },
        },
        "ranking_pooled": [{"detector": n, "score": s} for n, s in ranking],
        "per_file": [{"file": r.name, "tp": r.tp, "fp": r.fp, "fn": r.fn, "score": round(r.score, 3)} for r in live],
        "detector_seconds": round(elapsed, 2),
        "rows_per_second": round(rows / elapsed) if elapsed else None,
    }
    if gaussian:
        report["scorer_check"] = _gaussian_check(corpus, profile, table, categories)
    return report


def _gaussian_check(
    corpus: Sequence[Series], profile: CostProfile, table: dict[str, dict[str, float]], categories: list[str]
) -> dict[str, Any]:
    """The windowed Gaussian at its optimal threshold, beside its published row."""
    files = [ScoredFile(s.name, round_significant(windowed_gaussian(s.values)), s.windows) for s in corpus]
    threshold, _ = optimize_threshold(files, profile)
    results = [score_file(f, threshold, profile) for f in files]
    ours = summarise(results, categories)
    name, row = published_row(table, "windowed Gaussian")
    measured = {c: ours[c]["score"] for c in categories if c in row}
    measured[PUBLISHED_POOLED] = ours["pooled"]
    return {
        "detector": name,
        "threshold": threshold,
        "measured": measured,
        "published": row,
        "max_abs_difference": round(max(abs(measured[c] - row[c]) for c in row), 2),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="NAB-layout folder (default: <shared data>/nab)")
    parser.add_argument("--out", type=Path, help="also write NAB results files under this folder")
    parser.add_argument("--no-gaussian", action="store_true", help="skip the windowed-Gaussian scorer check")
    args = parser.parse_args(argv)
    try:
        root = args.data if args.data is not None else shared_data_dir() / "nab"
        if not root.is_dir():
            raise ConfigError(f"NAB folder {root} is absent: pass --data or see shared/data/nab/SOURCE.txt")
        corpus, unlabelled, profile = load_corpus(root)
        report = evaluate(corpus, profile, root, args.out, gaussian=not args.no_gaussian)
    except ConfigError as exc:
        print(f"bench.nab: {exc}", file=sys.stderr)
        return 2
    if unlabelled:
        report["unlabelled"] = unlabelled
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
