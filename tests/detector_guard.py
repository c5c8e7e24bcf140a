"""Holding detectors to their declared signals (the unit and data tiers' conftests apply it).

:func:`detectors_emit_only_declared_signals` holds every detector to its declaration: while a tier runs,
each registered detector's ``detect`` (and the Nezha evaluation's service-metric detector's) is wrapped
(:func:`declared_only`) so that an anomaly whose signal the class does not list in ``signals`` fails the
test that produced it. The detector tests feed each rule its own example input and the offline evaluation
(tests/data) feeds every detector the simulator's faults, so together they check what the detectors emit
in practice. Runbooks are checked against the same declarations (tests/unit/test_runbooks.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest


class UndeclaredSignal(AssertionError):
    """A detector emitted a signal its class does not declare."""


def declared_only(cls: type, detect: Callable[..., Any]) -> Callable[..., Any]:
    """``detect`` that fails on an anomaly whose signal ``cls.signals`` does not list."""

    @functools.wraps(detect)
    def checked(self: Any, batch: Any, state: Any) -> Any:
        new_state, anomalies = detect(self, batch, state)
        undeclared = sorted({a.signal for a in anomalies} - cls.signals)
        if undeclared:
            raise UndeclaredSignal(
                f"{cls.__module__}.{cls.__name__} emitted {undeclared}, which its `signals` does not declare "
                f"({sorted(cls.signals)}): add them there (the runbooks and the signal catalog follow from it)"
            )
        return new_state, anomalies

    return checked


@pytest.fixture(autouse=True, scope="session")
def detectors_emit_only_declared_signals() -> Iterator[None]:
    """Wrap every registered detector's ``detect`` with :func:`declared_only` for the session."""
    from pipelines.detectors.registry import DETECTORS
    from pipelines.detectors.service_metrics import ServiceMetricDetector

    classes = [DETECTORS.load(name) for name in DETECTORS.names()] + [ServiceMetricDetector]
    originals = {cls: cls.__dict__["detect"] for cls in classes}
    for cls, detect in originals.items():
        cls.detect = declared_only(cls, detect)
    try:
        yield
    finally:
        for cls, detect in originals.items():
            cls.detect = detect
