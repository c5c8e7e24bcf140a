"""SLO grader: a deterministic score in [0, 1] per step and per episode.

Per step the score is a weighted mean of five components, each in [0, 1]:

==============  ======  ==========================================================================
component       weight  what it measures
==============  ======  ==========================================================================
availability    0.35    failed / arrived requests vs the SLO error budget (aborts, 5xx, lost in crashes)
latency         0.25    mean TTFT and e2e latency vs SLO; penalty grows with the square of the breach
cost            0.15    SLO cost per 1k generated tokens / actual (1 when at or under target)
health          0.10    worst VRAM pressure (0 at 85%, 1 at 100%, squared), GPUs throttled or broken
disruption      0.15    exp(-sum of disruption weights of actions started this step)
==============  ======  ==========================================================================

The episode grade is the mean step score. Faults' detection and resolution times give MTTD/MTTR.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from services.simulator.scenario import SloSpec

WEIGHTS: dict[str, float] = {"availability": 0.35, "latency": 0.25, "cost": 0.15, "health": 0.10, "disruption": 0.15}


@dataclass
class StepRecord:
    """The inputs of one step's score (the trajectory the grader replays)."""

    t: float
    arrivals: float
    errors: float
    ttft_mean: float
    e2e_mean: float
    gen_tokens: float
    cost_usd: float
    vram_max: float
    throttled_frac: float
    disruption: float


def _breach(value: float, target: float) -> float:
    r = value / target if target > 0 else 0.0
    return 1.0 / (1.0 + 4.0 * max(0.0, r - 1.0) ** 2)


def score_step(rec: StepRecord, slo: SloSpec, tokens_ema: float) -> dict[str, float]:
    """Component scores and the weighted total for one step."""
    # Errors are judged against the availability SLO's error budget: 10x the budget scores ~0.1.
    err_rate = min(1.0, rec.errors / rec.arrivals) if rec.arrivals > 0 else (1.0 if rec.errors > 0 else 0.0)
    budget = max(1e-6, 1.0 - slo.availability)
    avail = 1.0 / (1.0 + 0.1 * (err_rate / budget) ** 2)
    latency = 0.5 * _breach(rec.ttft_mean, slo.ttft_s) + 0.5 * _breach(rec.e2e_mean, slo.e2e_s)
    if rec.cost_usd <= 0:
        cost = 1.0
    else:
        cost = min(1.0, slo.cost_per_1k_tokens * tokens_ema / 1000.0 / rec.cost_usd)
    vram_pen = min(1.0, max(0.0, (rec.vram_max - 0.85) / 0.15)) ** 2
    health = max(0.0, 1.0 - 0.7 * vram_pen - 0.3 * rec.throttled_frac)
    disruption = math.exp(-rec.disruption)
    parts = {"availability": avail, "latency": latency, "cost": cost, "health": health, "disruption": disruption}
    parts["score"] = sum(WEIGHTS[k] * v for k, v in parts.items())
    return parts


class Grade(BaseModel):
    """An episode's grade."""

    model_config = ConfigDict(frozen=True)

    scenario: str
    seed: int
    policy: str = ""
    duration_s: float
    score: float
    components: dict[str, float]
    requests: float
    errors: float
    gen_tokens: float
    cost_usd: float
    faults: list[dict[str, Any]]
    mttd_s: float | None
    mttr_s: float | None

    def to_json(self) -> str:
        """Canonical JSON (sorted keys) so equal grades are equal bytes."""
        return json.dumps(self.model_dump(), sort_keys=True)


class Grader:
    """Accumulates step records and scores.

    Args:
        slo: the targets.
    """

    def __init__(self, slo: SloSpec) -> None:
        self.slo = slo
        self.records: list[StepRecord] = []
        self._sums = dict.fromkeys([*WEIGHTS, "score"], 0.0)
        self._tokens_ema = 0.0
        self.last: dict[str, float] = {}

    def record(self, rec: StepRecord) -> dict[str, float]:
        """Score one step and add it to the episode."""
        self._tokens_ema = 0.9 * self._tokens_ema + 0.1 * rec.gen_tokens if self.records else rec.gen_tokens
        self.records.append(rec)
        parts = score_step(rec, self.slo, self._tokens_ema)
        for k, v in parts.items():
            self._sums[k] += v
        self.last = parts
        return parts

    def mean(self, last_n: int | None = None) -> float:
        """Mean score over the episode (or its last ``last_n`` steps)."""
        if not self.records:
            return 1.0
        if last_n is None:
            return self._sums["score"] / len(self.records)
        return float(np.mean(self.step_scores()[-last_n:]))

    def step_scores(self) -> list[float]:
        """Recompute every step's score (deterministic replay of the records)."""
        return [p["score"] for p in replay(self.records, self.slo)]

    def grade(self, scenario: str, seed: int, policy: str, faults: list[dict[str, Any]]) -> Grade:
        """The episode's :class:`Grade`."""
        n = max(1, len(self.records))
        recs = self.records
        mttd = [f["mttd_s"] for f in faults if f.get("mttd_s") is not None]
        mttr = [f["mttr_s"] for f in faults if f.get("mttr_s") is not None]
        return Grade(
            scenario=scenario,
            seed=seed,
            policy=policy,
            duration_s=float(len(recs)),
            score=round(self._sums["score"] / n, 6),
            components={k: round(self._sums[k] / n, 6) for k in WEIGHTS},
            requests=round(sum(r.arrivals for r in recs), 3),
            errors=round(sum(r.errors for r in recs), 3),
            gen_tokens=round(sum(r.gen_tokens for r in recs), 1),
            cost_usd=round(sum(r.cost_usd for r in recs), 4),
            faults=faults,
            mttd_s=round(float(np.mean(mttd)), 3) if mttd else None,
            mttr_s=round(float(np.mean(mttr)), 3) if mttr else None,
        )

    def save(self, path: Path) -> None:
        """Write the trajectory as JSON lines (one StepRecord per line)."""
        with path.open("w") as fh:
            for r in self.records:
                fh.write(json.dumps(asdict(r), sort_keys=True) + "\n")


def replay(records: list[StepRecord], slo: SloSpec) -> list[dict[str, float]]:
    """Score a recorded trajectory step by step."""
    out: list[dict[str, float]] = []
    ema = 0.0
    for i, r in enumerate(records):
        ema = 0.9 * ema + 0.1 * r.gen_tokens if i else r.gen_tokens
        out.append(score_step(r, slo, ema))
    return out


def load_trajectory(path: Path) -> list[StepRecord]:
    """Read a trajectory written by :meth:`Grader.save`."""
    return [StepRecord(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
