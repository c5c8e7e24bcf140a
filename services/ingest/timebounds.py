"""Event time is bounded at ingest: one forged timestamp must not move every timer.

Every timer in the pipeline follows event time (docs/architecture: group_wait, repeat, cooldowns,
detector windows), so a sample stamped a year ahead would leap every clock it reaches, and one from
2001 would be judged against a window long gone. Prometheus (``out of bounds``) and Loki
(``creation_grace_period``, ``reject_old_samples_max_age``) refuse such entries at write time; so do
ClusterMedic's receivers and pull clients, all through :meth:`TimeCheck.admit`.

A :class:`TimeCheck` is made per payload (per request, scrape or pull) from the receiver's wall
clock, so the window is computed once; it counts what it refused and keeps a bounded sample of them
for the dead letter and the answer. Valid neighbours of a refused entry are kept: the caller
publishes them, then dead-letters the refused ones and answers 400 naming the count and the bound,
as Loki does.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Literal

from services.core.settings import Settings

Bound = Literal["too_new", "too_old"]

MAX_EXAMPLES = 20
"""Refused entries kept (with their reason) for the dead letter; the rest are counted only."""


def _iso(ts: float) -> str:
    try:
        return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):  # beyond datetime's years 1..9999
        return f"{ts:.0f} (unix seconds)"


def _duration(seconds: float) -> str:
    if seconds % 86_400 == 0:
        return f"{seconds / 86_400:g}d"
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


class TimeCheck:
    """The event-time window of one payload, and what it refused.

    Args:
        max_future_s: how far ahead of ``now`` an entry may be stamped.
        max_age_s: how far behind ``now`` an entry may be stamped.
        now: the receiver's wall clock (UNIX seconds) when the payload arrived.
    """

    __slots__ = ("_examples", "earliest", "latest", "max_age_s", "max_future_s", "refused", "too_new", "too_old")

    def __init__(self, *, max_future_s: float, max_age_s: float, now: float) -> None:
        self.max_future_s = max_future_s
        self.max_age_s = max_age_s
        self.latest = now + max_future_s
        self.earliest = now - max_age_s
        self.refused = 0
        self.too_new = 0
        self.too_old = 0
        self._examples: list[dict[str, object]] = []

    @classmethod
    def of(cls, settings: Settings, now: float) -> TimeCheck:
        """The window ``settings`` allow (``ingest_max_future_s``, ``ingest_max_age_s``) around ``now``."""
        return cls(max_future_s=settings.ingest_max_future_s, max_age_s=settings.ingest_max_age_s, now=now)

    def bound_of(self, ts: float) -> Bound | None:
        """Which bound ``ts`` (UNIX seconds) breaks, or None when it is inside the window."""
        if ts > self.latest:
            return "too_new"
        if ts < self.earliest or ts != ts:  # NaN compares false everywhere: refuse it as too old
            return "too_old"
        return None

    def admit(self, ts: float, entry: dict[str, object] | None = None) -> bool:
        """Whether an entry stamped ``ts`` may pass; a refused one is counted (and kept as an example).

        This is the one bound check of every receiver and puller.

        Args:
            ts: the entry's timestamp, UNIX seconds.
            entry: what to show of it in the dead letter (name or stream, labels, line), if refused.
        """
        bound = self.bound_of(ts)
        if bound is None:
            return True
        self.refuse(bound, ts, entry)
        return False

    def refuse(self, bound: Bound, ts: float, entry: dict[str, object] | None = None) -> None:
        """Count one refused entry (for callers that already know its bound, as the fast path does)."""
        self.refused += 1
        if bound == "too_new":
            self.too_new += 1
        else:
            self.too_old += 1
        if len(self._examples) < MAX_EXAMPLES:
            self._examples.append({"ts": _iso(ts), "refused": bound, **(entry or {})})

    def message(self, total: int, what: str = "entries") -> str:
        """What the sender reads: how many were refused, which bound, and that the rest were accepted."""
        parts = []
        if self.too_new:
            parts.append(
                f"{self.too_new} stamped more than {_duration(self.max_future_s)} ahead of the receiver's clock"
                f" (after {_iso(self.latest)})"
            )
        if self.too_old:
            parts.append(
                f"{self.too_old} stamped more than {_duration(self.max_age_s)} ago (before {_iso(self.earliest)})"
            )
        first = self._examples[0] if self._examples else {}
        example = f"; first: {json.dumps(first, default=str)[:300]}" if first else ""
        return (
            f"{self.refused} of {total} {what} refused as out of bounds: {' and '.join(parts)};"
            f" the other {total - self.refused} were accepted{example}"
        )

    def deadletter_raw(self, max_bytes: int) -> bytes:
        """The refused entries' examples as JSON, at most ``max_bytes``, for the dead letter."""
        raw = json.dumps(
            {"refused": self.refused, "too_new": self.too_new, "too_old": self.too_old, "examples": self._examples},
            default=str,
        ).encode()
        return raw[:max_bytes]
