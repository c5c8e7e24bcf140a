"""Unit-tier fixtures: no network, no infrastructure, no ``../shared/data``.

Every unit module is collected and every unit test runs with ``CLUSTERMEDIC_SHARED_DATA`` pointing at a
folder that does not exist, on every machine: a unit test that reads the shared public data sets (NVIDIA's
XID catalog, NAB, Nezha, the LLM traces), directly or through a default that loads them, fails here as it
would on a machine without them, instead of passing where the data happens to be. Such a test belongs to
the data tier (tests/data); a test that only needs *an* XID catalog builds a made-up one
(tests/made_up_xids.py). tests/unit/test_tiers.py checks the same rules statically.

:func:`~tests.detector_guard.detectors_emit_only_declared_signals` holds every detector to its declared
signals while the tier runs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.detector_guard import detectors_emit_only_declared_signals  # noqa: F401 (an autouse fixture)

UNIT_TIER = Path(__file__).resolve().parent
NO_SHARED_DATA = "/nonexistent/the-unit-tier-reads-no-shared-data"
"""What ``CLUSTERMEDIC_SHARED_DATA`` is while a unit module is collected or a unit test runs."""


@contextlib.contextmanager
def _without_shared_data(path: Path) -> Iterator[None]:
    # make test runs every tier in one process: only what lies in tests/unit goes without the data
    if not path.resolve().is_relative_to(UNIT_TIER):
        yield
        return
    saved = os.environ.get("CLUSTERMEDIC_SHARED_DATA")
    os.environ["CLUSTERMEDIC_SHARED_DATA"] = NO_SHARED_DATA
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("CLUSTERMEDIC_SHARED_DATA", None)
        else:
            os.environ["CLUSTERMEDIC_SHARED_DATA"] = saved


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    # importing a module and expanding its parametrisations happen here
    with _without_shared_data(collector.path):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[Any]:
    # the whole protocol, not a fixture: module and session fixtures are set up (and torn down) inside it
    with _without_shared_data(item.path):
        return (yield)
