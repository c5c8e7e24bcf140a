"""Revision comparison: during a rollout, is the new ReplicaSet slower than the one it replaces?

A pod's own history cannot judge a bad release: the new revision's pods start with none. What an SRE
compares is the new pods against the old ones serving the same model at the same time (a canary
analysis). This detector does that over the pod feature vectors (pipelines.features), whose labels name
the Deployment and ReplicaSet (from the pod name) and whose values carry each scrape interval's exact
mean time per output token and to first token (from the histograms' ``_sum`` and ``_count``).

For each pod it keeps the last ``window_s`` of interval means, weighted by their observations. When a
Deployment has pods of more than one ReplicaSet reporting within ``window_s``, each pod of a revision
newer than the oldest (first seen later) is compared with the median of the oldest revision's pods:

===================== ========================================================================= ========
signal                when                                                                      severity
===================== ========================================================================= ========
revision_regression   the pod's mean TPOT >= tpot_ratio x the old revision's median (and at      warning
                      least tpot_min_increase_s more), or its mean TTFT >= ttft_ratio x (and
                      ttft_min_increase_s more), each over at least min_observations, for
                      persistence consecutive scrapes; resolved when a later comparison finds
                      neither (not when the old revision is gone and nothing can be compared)
===================== ========================================================================= ========

Load is not discounted: during a rolling update the old pods carry the replaced pods' share, which makes
them slower, not faster, so the comparison errs towards silence. The state is worker-local (like the
learned detectors'): a detect worker compares the pods of a Deployment that reach it, and refills its
windows from the stream after a restart.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pipelines.detectors.rules_common import make_anomaly, topology_labels
from pipelines.features import FeatureVector
from services.core.events import Anomaly

DETECTOR_NAME = "revision_rules"
SIGNAL = "revision_regression"
# (latency key, feature of the interval mean, feature of its observations)
LATENCIES: tuple[tuple[str, str, str], ...] = (
    ("tpot", "tpot_mean_s", "tpot_observations"),
    ("ttft", "ttft_mean_s", "ttft_observations"),
)


@dataclass
class PodWindow:
    """One pod's recent interval means: latency key -> ``[[ts, mean, observations], ...]``, oldest first."""

    replica_set: str
    last_ts: float
    intervals: dict[str, list[list[float]]] = field(default_factory=dict)
    over: int = 0  # consecutive scrapes found slower than the old revision
    firing: bool = False

    def mean(self, key: str, min_observations: float) -> float | None:
        """Observation-weighted mean of the window, or None with fewer than ``min_observations``."""
        rows = self.intervals.get(key, [])
        n = sum(r[2] for r in rows)
        if n < min_observations or n <= 0:
            return None
        return sum(r[1] * r[2] for r in rows) / n


@dataclass
class RevisionState:
    """Per Deployment: its pods' windows, and when each ReplicaSet was first seen."""

    pods: dict[str, dict[str, PodWindow]] = field(default_factory=dict)
    first_seen: dict[str, dict[str, float]] = field(default_factory=dict)


class RevisionDetector:
    """Compares a rolling update's new ReplicaSet with the old one (see the module docstring).

    Args:
        window_s: how far back a pod's interval means count, and how recent a pod's last scrape must be
            for it to take part.
        tpot_ratio / tpot_min_increase_s: how much slower per output token is a regression.
        ttft_ratio / ttft_min_increase_s: how much slower to the first token is a regression.
        min_observations: least tokens (TPOT) or requests (TTFT) behind a mean on either side.
        persistence: consecutive slower scrapes before it fires.
    """

    name: ClassVar[str] = DETECTOR_NAME
    consumes: ClassVar[type] = FeatureVector
    signals: ClassVar[frozenset[str]] = frozenset({SIGNAL})

    def __init__(
        self,
        window_s: float = 60.0,
        tpot_ratio: float = 1.3,
        tpot_min_increase_s: float = 0.005,
        ttft_ratio: float = 1.5,
        ttft_min_increase_s: float = 0.1,
        min_observations: float = 20.0,
        persistence: int = 2,
    ) -> None:
        self.window_s = window_s
        self.rules = {"tpot": (tpot_ratio, tpot_min_increase_s), "ttft": (ttft_ratio, ttft_min_increase_s)}
        self.min_observations = min_observations
        self.persistence = persistence

    def initial_state(self) -> RevisionState:
        return RevisionState()

    def detect(self, batch: Sequence[FeatureVector], state: RevisionState) -> tuple[RevisionState, list[Anomaly]]:
        anomalies: list[Anomaly] = []
        for vector in sorted(batch, key=lambda v: v.ts):
            deployment, replica_set = vector.labels.get("deployment"), vector.labels.get("replica_set")
            if vector.entity_class != "pod" or not deployment or not replica_set:
                continue
            pods = state.pods.setdefault(deployment, {})
            seen = state.first_seen.setdefault(deployment, {})
            seen.setdefault(replica_set, vector.ts)
            window = pods.get(vector.entity)
            if window is None or window.replica_set != replica_set:
                window = pods[vector.entity] = PodWindow(replica_set, vector.ts)
            self._remember(window, vector)
            self._forget_stale(deployment, state, vector.ts)
            anomaly = self._judge(vector, window, pods, seen)
            if anomaly is not None:
                anomalies.append(anomaly)
        return state, anomalies

    def _remember(self, window: PodWindow, vector: FeatureVector) -> None:
        window.last_ts = vector.ts
        for key, mean_feature, count_feature in LATENCIES:
            mean, n = vector.values.get(mean_feature), vector.values.get(count_feature, 0.0)
            rows = window.intervals.setdefault(key, [])
            if mean is not None and n > 0:
                rows.append([vector.ts, mean, n])
            rows[:] = [r for r in rows if vector.ts - r[0] < self.window_s]

    def _forget_stale(self, deployment: str, state: RevisionState, now: float) -> None:
        pods = state.pods[deployment]
        for pod in [p for p, w in pods.items() if now - w.last_ts > 2 * self.window_s]:
            del pods[pod]
        live = {w.replica_set for w in pods.values()}
        seen = state.first_seen[deployment]
        for replica_set in [r for r in seen if r not in live]:
            del seen[replica_set]

    def _judge(
        self, vector: FeatureVector, window: PodWindow, pods: dict[str, PodWindow], seen: dict[str, float]
    ) -> Anomaly | None:
        live = {p: w for p, w in pods.items() if vector.ts - w.last_ts <= self.window_s}
        oldest = min({w.replica_set for w in live.values()}, key=lambda r: (seen[r], r))
        slower: dict[str, dict[str, float]] = {}
        compared = False
        if window.replica_set != oldest:
            for key, (ratio, min_increase) in self.rules.items():
                mine = window.mean(key, self.min_observations)
                theirs = [
                    m
                    for w in live.values()
                    if w.replica_set == oldest and (m := w.mean(key, self.min_observations)) is not None
                ]
                if mine is None or not theirs:
                    continue
                compared = True
                baseline = statistics.median(theirs)
                if mine >= ratio * baseline and mine - baseline >= min_increase:
                    slower[key] = {"new": round(mine, 4), "old": round(baseline, 4), "ratio": round(mine / baseline, 2)}
        if not compared:
            # no old revision left to compare with (the rollout finished, or was rolled back and this pod is
            # the old one now): nothing is known either way, so a firing regression stays as it is
            return None
        window.over = window.over + 1 if slower else 0
        if slower and not window.firing and window.over >= self.persistence:
            window.firing = True
            return self._anomaly(vector, window, oldest, slower, "firing")
        if not slower and window.firing:
            window.firing = False
            return self._anomaly(vector, window, oldest, slower, "resolved")
        return None

    def _anomaly(
        self,
        vector: FeatureVector,
        window: PodWindow,
        old_replica_set: str,
        slower: dict[str, dict[str, float]],
        status: Any,
    ) -> Anomaly:
        worst = max((s["ratio"] for s in slower.values()), default=1.0)
        threshold = min(self.rules[k][0] for k in slower) if slower else self.rules["tpot"][0]
        return make_anomaly(
            detector=DETECTOR_NAME,
            signal=SIGNAL,
            entity=vector.entity,
            entity_kind="pod",
            score=worst,
            threshold=threshold,
            severity="warning",
            ts=vector.ts,
            labels=topology_labels(vector.labels),
            evidence={
                "replica_set": window.replica_set,
                "old_replica_set": old_replica_set,
                "slower": slower,
                "window_s": self.window_s,
            },
            status=status,
        )
