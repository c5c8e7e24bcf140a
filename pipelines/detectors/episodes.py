"""When a per-scrape score becomes one anomaly: warm-up, persistence and re-arming.

A learned detector scores every scrape; the on-call engineer wants one anomaly per abnormal episode.
An entity's first ``warmup`` scrapes are never judged (a replica loading its model looks like nothing
the baseline saw); an episode starts after ``persistence`` consecutive scrapes over the threshold and
ends only after ``rearm`` consecutive scrapes under it, so a score hovering around the line does not
page again and again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class EpisodePolicy:
    """The three counts, in scrapes."""

    warmup: int = 8
    persistence: int = 2
    rearm: int = 20


@dataclass
class Episode:
    """One entity's counters (JSON-safe through ``to_dict``/``from_dict``)."""

    seen: int = 0
    streak: int = 0
    calm: int = 0
    firing: bool = False

    def update(self, over: bool, policy: EpisodePolicy) -> bool:
        """Record one scrape's verdict; return True when it starts a new episode (raise an anomaly)."""
        self.seen += 1
        if over:
            self.streak += 1
            self.calm = 0
        else:
            self.streak = 0
            self.calm += 1
            if self.firing and self.calm >= policy.rearm:
                self.firing = False
        if not self.firing and self.seen > policy.warmup and self.streak >= policy.persistence:
            self.firing = True
            return True
        return False

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Episode:
        """Inverse of :meth:`to_dict`."""
        return cls(int(data["seen"]), int(data["streak"]), int(data["calm"]), bool(data["firing"]))
