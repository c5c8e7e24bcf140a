"""Unit-tier fixtures.

:func:`detectors_emit_only_declared_signals` holds every detector to its declaration: while the unit tier
runs, each registered detector's ``detect`` (and the Nezha evaluation's service-metric detector's) is
wrapped (:func:`tests.detector_guard.declared_only`) so that an anomaly whose signal the class does not
list in ``signals`` fails the test that produced it. The detector tests feed each rule its own example
input and the offline evaluation feeds every detector the simulator's faults, so together they check what
the detectors emit in practice. Runbooks are checked against the same declarations
(tests/unit/test_runbooks.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pipelines.detectors.registry import DETECTORS
from pipelines.detectors.service_metrics import ServiceMetricDetector
from tests.detector_guard import declared_only


@pytest.fixture(autouse=True, scope="session")
def detectors_emit_only_declared_signals() -> Iterator[None]:
    classes = [DETECTORS.load(name) for name in DETECTORS.names()] + [ServiceMetricDetector]
    originals = {cls: cls.__dict__["detect"] for cls in classes}
    for cls, detect in originals.items():
        cls.detect = declared_only(cls, detect)
    try:
        yield
    finally:
        for cls, detect in originals.items():
            cls.detect = detect
