"""Every dependency installs by hash (issue 16: secrets and supply chain).

`make install` runs ``uv pip sync --require-hashes requirements.lock`` after installing uv itself with
``pip install --require-hashes -r infra/bootstrap-requirements.txt``: a file whose hash is not locked is
refused. These tests keep the lock files in the shape that makes that possible (``make lock``
regenerates requirements.lock with ``--generate-hashes``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from services.core.paths import REPO_ROOT

PIN = re.compile(r"^([A-Za-z0-9_.\-\[\]]+)==(\S+)")
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


def requirements(path: Path) -> dict[str, list[str]]:
    """Each pinned requirement's hashes (a requirement spans its line and the continuation lines)."""
    out: dict[str, list[str]] = {}
    current = ""
    for line in path.read_text().splitlines():
        if line.startswith("#") or not line.strip() or line.lstrip().startswith("# via"):
            continue
        match = PIN.match(line)
        if match:
            current = match.group(1).lower()
            out[current] = []
        elif not (line.startswith(" ") and current):
            raise AssertionError(f"{path.name}: not a pinned requirement: {line!r}")
        out[current].extend(HASH.findall(line))
    return out


@pytest.mark.parametrize("name", ["requirements.lock", "infra/bootstrap-requirements.txt"])
def test_every_locked_package_is_pinned_with_its_hashes(name: str) -> None:
    locked = requirements(REPO_ROOT / name)
    assert locked, f"{name} pins nothing"
    unhashed = sorted(pkg for pkg, hashes in locked.items() if not hashes)
    assert unhashed == [], f"{name}: no --hash for {unhashed}; regenerate with `make lock`"


def test_the_lock_pins_the_torch_the_project_requires() -> None:
    assert "torch" in requirements(REPO_ROOT / "requirements.lock")
    pinned = re.search(r"^torch==(\S+)", (REPO_ROOT / "requirements.lock").read_text(), re.M)
    assert pinned is not None and pinned.group(1) == "2.13.0"


def test_install_refuses_files_whose_hash_is_not_locked() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "uv pip sync -q --require-hashes" in makefile
    assert "pip install -q --require-hashes -r infra/bootstrap-requirements.txt" in makefile
    assert "--generate-hashes -o requirements.lock" in makefile  # `make lock` keeps them
