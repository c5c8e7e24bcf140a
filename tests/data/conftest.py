"""Data-tier fixtures: the tests that read the shared public data sets in place.

``../shared/data`` (or ``$CLUSTERMEDIC_SHARED_DATA``) holds NVIDIA's XID catalog, the Nezha RCA data,
the LLM request traces and the other public sets; the project never copies them (not even a few rows
into a fixture). Every test here reads them, directly or through what loads them by default (the XID
detector, the simulator's XID faults, the runbook checks), so every test here fails, never skips, when
they are absent, naming the folder and what to do. ``make test`` runs this tier; ``make test-unit``
does not (tests/unit needs none of it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.detectors.xid_catalog import XidCatalog
from services.core.errors import ConfigError
from services.core.paths import shared_data_dir
from tests.detector_guard import detectors_emit_only_declared_signals  # noqa: F401 (an autouse fixture)


@pytest.fixture(autouse=True, scope="session")
def shared_data() -> Path:
    """The shared data folder; every data-tier test fails with what to do when it is absent."""
    try:
        return shared_data_dir()
    except ConfigError as exc:
        absent = str(exc)
    pytest.fail(f"the data tier (tests/data) reads the shared public data sets: {absent}", pytrace=False)


@pytest.fixture(scope="session")
def nvidia_xid_catalog(shared_data: Path) -> XidCatalog:
    """NVIDIA's XID catalog with gpud's policy, read from ``shared_data/xid``."""
    try:
        return XidCatalog.load(shared_data / "xid")
    except ConfigError as exc:
        absent = str(exc)
    pytest.fail(absent, pytrace=False)
