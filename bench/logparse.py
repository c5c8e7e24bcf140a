"""Benchmark the log-template miner on the LogHub 2k samples.

Runs the masking and drain3 settings the detector uses (``MINER_SETTINGS`` in
``pipelines/detectors/logtemplates.py``) over every ``<System>_2k.log`` of a LogHub-layout folder and
prints JSON: per system the grouping accuracy and parsing accuracy against the original ground truth
(``<System>/<System>_2k.log_structured.csv``) and the corrected one
(``corrected/<System>/<System>_2k.log_structured_corrected.csv``), the published Drain grouping
accuracy (``published_baselines/logparser_Drain_README_loghub2k.csv``) and whether we reach it.

Usage::

    python bench/logparse.py [--data DIR] [--out DIR]

``--out DIR`` also writes ``<System>_templates.csv`` (columns ``LineId,EventTemplate``) per system.
The ground truth is read only to score the result; parsing sees the raw log lines alone.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.detectors.logtemplates import (
    grouping_accuracy,
    mine_templates,
    parsing_accuracy,
    settings_for,
)
from services.core.errors import ConfigError
from services.core.paths import shared_data_dir

SYSTEMS: tuple[str, ...] = ("HDFS", "Hadoop", "Spark", "Zookeeper", "BGL", "Apache", "OpenSSH", "OpenStack")

# Header layouts, derived from the columns of each structured CSV; the named group Content is the
# message body that is mined. Fields are separated by runs of whitespace.
LOG_FORMATS: dict[str, str] = {
    "HDFS": r"(?P<Date>\d+)\s+(?P<Time>\d+)\s+(?P<Pid>\d+)\s+(?P<Level>\w+)\s+(?P<Component>\S+?):\s+",
    "Hadoop": r"(?P<Date>\S+)\s+(?P<Time>\S+)\s+(?P<Level>\w+)\s+\[(?P<Process>.*?)\]\s+(?P<Component>\S+?):\s+",
    "Spark": r"(?P<Date>\S+)\s+(?P<Time>\S+)\s+(?P<Level>\w+)\s+(?P<Component>\S+?):\s+",
    "Zookeeper": (
        r"(?P<Date>\S+)\s+(?P<Time>\S+)\s+-\s+(?P<Level>\w+)\s+"
        r"\[(?P<Node>.*?):(?P<Component>.*?)@(?P<Id>\d+)\]\s+-\s+"
    ),
    "BGL": (
        r"(?P<Label>\S+)\s+(?P<Timestamp>\S+)\s+(?P<Date>\S+)\s+(?P<Node>\S+)\s+(?P<Time>\S+)\s+"
        r"(?P<NodeRepeat>\S+)\s+(?P<Type>\S+)\s+(?P<Component>\S+)\s+(?P<Level>\S+)\s+"
    ),
    "Apache": r"\[(?P<Time>[^\]]*)\]\s+\[(?P<Level>[^\]]*)\]\s+",
    "OpenSSH": r"(?P<Date>\w+)\s+(?P<Day>\d+)\s+(?P<Time>\S+)\s+(?P<Component>\S+)\s+sshd\[(?P<Pid>\d+)\]:\s+",
    "OpenStack": (
        r"(?P<Logrecord>\S+)\s+(?P<Date>\S+)\s+(?P<Time>\S+)\s+(?P<Pid>\d+)\s+(?P<Level>\w+)\s+"
        r"(?P<Component>\S+)\s+\[(?P<ADDR>.*?)\]\s+"
    ),
}


class FormatMismatchError(ValueError):
    """A log line does not fit its system's header layout."""


def header_regex(system: str) -> re.Pattern[str]:
    """Return the compiled header regex of ``system`` (header fields, then ``Content``)."""
    return re.compile(r"^" + LOG_FORMATS[system] + r"(?P<Content>.*?)\s*$")


def extract_contents(log_path: Path, system: str) -> list[str]:
    """Read a raw LogHub log and return the message body of every line.

    Raises:
        FormatMismatchError: a line does not match the system's layout.
    """
    regex = header_regex(system)
    contents = []
    with log_path.open(encoding="utf-8", errors="replace") as fh:
        for n, raw in enumerate(fh, start=1):
            line = raw.rstrip("\r\n")
            if not line.strip():
                continue
            match = regex.match(line)
            if match is None:
                raise FormatMismatchError(f"{log_path}:{n}: line does not match the {system} layout")
            contents.append(match.group("Content"))
    return contents


def read_truth(path: Path) -> list[dict[str, str]]:
    """Read a structured ground-truth CSV (LineId, ..., Content, EventId, EventTemplate)."""
    with path.open(encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def published_drain(data: Path) -> dict[str, float]:
    """Return the published Drain grouping accuracy per system (logparser README table)."""
    path = data / "published_baselines" / "logparser_Drain_README_loghub2k.csv"
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh))
    return {row[0]: float(row[2]) for row in rows[1:] if len(row) >= 3}


def score(truth: list[dict[str, str]], predicted: list[str]) -> dict[str, float]:
    """Grouping and parsing accuracy of ``predicted`` templates against one ground truth."""
    if len(truth) != len(predicted):
        raise FormatMismatchError(f"{len(truth)} ground-truth rows but {len(predicted)} parsed lines")
    return {
        "grouping_accuracy": round(grouping_accuracy([r["EventId"] for r in truth], predicted), 4),
        "parsing_accuracy": round(parsing_accuracy([r["EventTemplate"] for r in truth], predicted), 4),
    }


def run_system(
    data: Path, system: str, out: Path | None, baseline: float | None, uniform: bool = False
) -> dict[str, Any]:
    """Parse one system's sample and score it against both ground truths.

    With ``uniform`` the ``"default"`` settings row is used instead of the system's own row.
    """
    folder = data / system
    contents = extract_contents(folder / f"{system}_2k.log", system)
    settings = settings_for("default" if uniform else system)
    started = time.perf_counter()
    predicted = mine_templates(contents, settings)
    elapsed = time.perf_counter() - started

    original = read_truth(folder / f"{system}_2k.log_structured.csv")
    result: dict[str, Any] = {
        "lines": len(contents),
        "templates_predicted": len(set(predicted)),
        "templates_true": len({r["EventId"] for r in original}),
        # Our header regex must reproduce the CSV's Content column; this counts where it does not.
        "content_mismatches": sum(
            1 for c, r in zip(contents, original, strict=False) if c.strip() != r["Content"].strip()
        ),
        "original": score(original, predicted),
        "seconds": round(elapsed, 3),
        "settings": {k: v for k, v in asdict(settings).items() if k != "max_clusters"},
    }
    corrected_path = data / "corrected" / system / f"{system}_2k.log_structured_corrected.csv"
    if corrected_path.is_file():
        result["corrected"] = score(read_truth(corrected_path), predicted)
    if baseline is not None:
        result["published_drain_grouping_accuracy"] = baseline
        result["beats_published"] = result["original"]["grouping_accuracy"] >= baseline
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        with (out / f"{system}_templates.csv").open("w", encoding="utf-8", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["LineId", "EventTemplate"])
            for row, template in zip(original, predicted, strict=True):
                writer.writerow([row["LineId"], template])
    return result


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 4) if values else 0.0


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its JSON; return the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="LogHub-layout folder (default: shared data/loghub)")
    parser.add_argument("--out", type=Path, help="write <System>_templates.csv files here")
    parser.add_argument(
        "--uniform", action="store_true", help="use the 'default' settings row for every system (no per-system tuning)"
    )
    parser.add_argument("--systems", nargs="*", default=list(SYSTEMS), help="subset of systems")
    args = parser.parse_args(argv)

    if args.data is not None:
        data: Path = args.data
    else:
        try:
            data = shared_data_dir() / "loghub"
        except ConfigError as exc:
            print(f"logparse: {exc}", file=sys.stderr)
            return 2
    unknown = [s for s in args.systems if s not in LOG_FORMATS]
    if unknown:
        print(f"logparse: no log format for {', '.join(unknown)}; known: {', '.join(SYSTEMS)}", file=sys.stderr)
        return 2
    missing = [s for s in args.systems if not (data / s / f"{s}_2k.log").is_file()]
    if not data.is_dir() or missing:
        what = "is absent" if not data.is_dir() else f"lacks the samples of {', '.join(missing)}"
        print(
            f"logparse: LogHub data folder {data} {what}; it must hold <System>/<System>_2k.log and "
            "<System>/<System>_2k.log_structured.csv (https://github.com/logpai/loghub); pass --data DIR",
            file=sys.stderr,
        )
        return 2

    baselines = published_drain(data)
    systems: dict[str, Any] = {}
    for system in args.systems:
        try:
            systems[system] = run_system(data, system, args.out, baselines.get(system), args.uniform)
        except FormatMismatchError as exc:
            print(f"logparse: {exc}", file=sys.stderr)
            return 1

    def avg(truth: str, metric: str) -> float:
        return _mean([r[truth][metric] for r in systems.values() if truth in r])

    report = {
        "benchmark": "loghub-2k log parsing (drain3 + ClusterMedic masks)",
        "settings_rows": "default (uniform)" if args.uniform else "per system",
        "systems": systems,
        "average": {
            "original": {m: avg("original", m) for m in ("grouping_accuracy", "parsing_accuracy")},
            "corrected": {m: avg("corrected", m) for m in ("grouping_accuracy", "parsing_accuracy")},
            "published_drain_grouping_accuracy": _mean(
                [r["published_drain_grouping_accuracy"] for r in systems.values() if "beats_published" in r]
            ),
        },
        "beats_published_on": sorted(s for s, r in systems.items() if r.get("beats_published")),
        "below_published_on": sorted(s for s, r in systems.items() if r.get("beats_published") is False),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
