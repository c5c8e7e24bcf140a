"""Holding detectors to their declared signals (tests/unit/conftest.py applies it to the unit tier)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


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
