"""No setting of the detectors is keyed by a benchmark's data: one configuration serves every series and log.

The detectors meet metrics and logs from systems nobody tuned them for, so a parameter chosen per NAB
file, per NAB category or per LogHub system would make the benchmark figures say nothing about them.
The names are read from the data sets themselves (so a file added there is checked too) and searched
for, as whole words and in any case, in the detector packages and the shipped configuration.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from services.core.paths import REPO_ROOT

SEARCHED = ("pipelines", "infra/config")
SUFFIXES = frozenset({".py", ".yaml", ".yml", ".json", ".toml", ".ini", ".cfg"})


def _names(shared_data: Path) -> dict[str, str]:
    """Every NAB category, NAB file stem and LogHub system, each with where it comes from."""
    nab = shared_data / "nab" / "data"
    loghub = shared_data / "loghub"
    for folder in (nab, loghub):
        if not folder.is_dir():
            pytest.fail(f"{folder} is absent: the check needs the data set's names", pytrace=False)
    names: dict[str, str] = {}
    for category in sorted(p for p in nab.iterdir() if p.is_dir()):
        names[category.name] = "NAB category"
        for csv in sorted(category.glob("*.csv")):
            names[csv.stem] = f"NAB file {category.name}/{csv.name}"
    for system in sorted(p for p in loghub.iterdir() if (p / f"{p.name}_2k.log").is_file()):
        names[system.name] = "LogHub system"
    return names


def _searched_files() -> list[Path]:
    files = [
        path
        for root in SEARCHED
        for path in sorted((REPO_ROOT / root).rglob("*"))
        if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts
    ]
    assert files, f"nothing to search under {SEARCHED}"
    return files


def test_the_names_cover_every_category_and_system(shared_data: Path) -> None:
    kinds = list(_names(shared_data).values())
    assert kinds.count("NAB category") == 6
    assert sum(k.startswith("NAB file") for k in kinds) == 51
    assert kinds.count("LogHub system") == 8


def test_no_detector_setting_names_a_benchmark_file_category_or_system(shared_data: Path) -> None:
    names = _names(shared_data)
    pattern = re.compile(
        r"(?<![A-Za-z0-9_])("
        + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
        + r")(?![A-Za-z0-9_])",
        re.IGNORECASE,
    )
    found = []
    for path in _searched_files():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
            for match in pattern.finditer(line):
                kind = next(v for k, v in names.items() if k.lower() == match.group(1).lower())
                found.append(f"{path.relative_to(REPO_ROOT)}:{number}: {match.group(1)!r} ({kind})")
    assert not found, "detector code or configuration names benchmark data:\n" + "\n".join(found)
