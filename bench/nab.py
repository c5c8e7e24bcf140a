"""NAB benchmark of the univariate metric detector (and NAB's windowed Gaussian, as a scorer check).

Usage::

    python -m bench.nab [--data DIR] [--out DIR] [--detector univariate|windowed_gaussian|all]

``--data`` is a folder in NAB's layout: ``data/<category>/*.csv`` (``timestamp,value``),
``labels/combined_windows.json`` and ``labels/combined_labels.json``, and ``profiles.json`` (or
``config/profiles.json``). It defaults to ``<shared data>/nab``. Every series that has an entry in
the windows file is scored; series without one are listed as unlabelled.

Each detector streams every series in micro-batches, exactly as the detect pipeline would, then
the threshold is optimised over the whole corpus and each file is scored with NAB's standard
profile (see :mod:`bench.nabscore`). Output is JSON lines: one per file, then one summary per
detector with the published scores on the same files for comparison. ``--out DIR`` also writes
NAB's results layout, ``DIR/<detector>/<category>/<detector>_<file>.csv`` with the columns
``timestamp,value,anomaly_score,label``.

Anomaly scores are kept to 12 significant digits, as in NAB's published result files (Python 2
wrote floats that way); for the windowed Gaussian, whose published threshold is exactly 1.0, this
is what makes its scores reproduce the published ones file for file.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

if not __package__:  # run as a script (python bench/nab.py): the scorer is imported as bench.nabscore
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.nabscore import (
    STANDARD_PROFILE,
    CostProfile,
    FloatArray,
    ScoredFile,
    load_profile,
    load_windows,
    normalized_score,
    optimize_threshold,
    parse_times,
    read_series,
    score_file,
    window_rows,
)
from pipelines.detectors.univariate import UnivariateState, score
from services.core.errors import ConfigError
from services.core.paths import shared_data_dir

# Published NAB standard-profile scores, normalised on exactly the 17 realAWSCloudwatch files.
PUBLISHED: dict[str, float] = {
    "Numenta HTM": 73.4,
    "CAD OSE": 71.5,
    "ARTime": 69.5,
    "Random Cut Forest": 57.6,
    "Twitter ADVec": 38.5,
    "windowed Gaussian": 31.2,
}
MICRO_BATCH = 128
SIGNIFICANT_DIGITS = 12

Detector = Callable[[FloatArray, FloatArray], FloatArray]


@dataclass(frozen=True)
class Series:
    """One labelled NAB file."""

    name: str  # relative to data/, e.g. "realAWSCloudwatch/grok_asg_anomaly.csv"
    stamps: list[str]
    values: FloatArray
    windows: tuple[tuple[int, int], ...]
    labels: int


def univariate(values: FloatArray, seconds: FloatArray) -> FloatArray:
    """Stream one series through :func:`pipelines.detectors.univariate.score` in micro-batches."""
    state: UnivariateState | None = None
    out = []
    for lo in range(0, len(values), MICRO_BATCH):
        state, part = score(values[lo : lo + MICRO_BATCH], seconds[lo : lo + MICRO_BATCH], state)
        out.append(part)
    return np.concatenate(out) if out else np.zeros(0)


def windowed_gaussian(values: FloatArray, seconds: FloatArray, window: int = 6400, step: int = 100) -> FloatArray:
    """NAB's windowed Gaussian baseline, written from its description.

    The score of a value is one minus its two-sided Gaussian tail probability under the mean and
    standard deviation of the previous values: all of them until ``window`` are held, then the
    window slides forward ``step`` values at a time. The first value scores 0.
    """
    del seconds  # row-based, like NAB's
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


DETECTORS: dict[str, Detector] = {"univariate": univariate, "windowed_gaussian": windowed_gaussian}
# The published entry each detector is meant to reproduce or beat.
REFERENCE: dict[str, str] = {"univariate": "Random Cut Forest", "windowed_gaussian": "windowed Gaussian"}


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


def run(detector: str, corpus: Sequence[Series], profile: CostProfile, out: Path | None) -> list[dict[str, object]]:
    """Score one detector on the corpus; return the per-file rows and the summary row."""
    fn = DETECTORS[detector]
    started = time.perf_counter()
    files = []
    for item in corpus:
        seconds = parse_times(item.stamps).astype("datetime64[s]").astype(np.float64)
        scores = round_significant(fn(item.values, seconds))
        if out is not None:
            write_results(out, detector, item, scores)
        files.append(ScoredFile(item.name, scores, item.windows))
    elapsed = time.perf_counter() - started

    threshold, _ = optimize_threshold(files, profile)
    results = [score_file(f, threshold, profile) for f in files]
    rows: list[dict[str, object]] = []
    for item, res in zip(corpus, results, strict=True):
        norm = res.normalized
        rows.append(
            {
                "kind": "file",
                "detector": detector,
                "file": res.name,
                "score": round(res.score, 4),
                "normalized": None if norm is None else round(norm, 1),
                "tp": res.tp,
                "fp": res.fp,
                "fn": res.fn,
                "windows": res.windows,
                "labels": item.labels,
            }
        )
    ours = normalized_score(results)
    reference = REFERENCE[detector]
    rows.append(
        {
            "kind": "overall",
            "detector": detector,
            "profile": "standard",
            "files": len(results),
            "windows": sum(r.windows for r in results),
            "threshold": threshold,
            "score": round(ours, 2),
            "raw_score": round(sum(r.score for r in results), 4),
            "reference": reference,
            "reference_score": PUBLISHED[reference],
            "delta_vs_reference": round(ours - PUBLISHED[reference], 2),
            "delta_vs_numenta_htm": round(ours - PUBLISHED["Numenta HTM"], 2),
            "published": PUBLISHED,
            "detector_seconds": round(elapsed, 2),
        }
    )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="NAB-layout folder (default: <shared data>/nab)")
    parser.add_argument("--out", type=Path, help="also write NAB results files under this folder")
    parser.add_argument("--detector", choices=[*DETECTORS, "all"], default="all")
    args = parser.parse_args(argv)
    try:
        root = args.data if args.data is not None else shared_data_dir() / "nab"
        if not root.is_dir():
            raise ConfigError(f"NAB folder {root} is absent: pass --data or see shared/data/nab/SOURCE.txt")
        corpus, unlabelled, profile = load_corpus(root)
    except ConfigError as exc:
        print(f"bench.nab: {exc}", file=sys.stderr)
        return 2
    if unlabelled:
        print(json.dumps({"kind": "unlabelled", "files": unlabelled}))
    names = list(DETECTORS) if args.detector == "all" else [args.detector]
    for name in names:
        for row in run(name, corpus, profile, args.out):
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
