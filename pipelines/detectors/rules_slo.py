"""Latency SLO burn-rate rules: multi-window, multi-burn-rate alerts on vLLM's latency histograms.

The scheme is the Google SRE workbook's ("Alerting on SLOs", recommendation 6). A latency SLI is
the share of requests faster than a target: ``good`` is the histogram bucket whose ``le`` is the
target, ``total`` is ``_count`` (or the ``+Inf`` bucket), and both are cumulative counters, so the
detector keeps their increases per time step. For each window pair::

    error_ratio(w) = (total(w) - good(w)) / total(w)        over the last w seconds
    burn_rate(w)   = error_ratio(w) / (1 - objective)       1.0 spends the budget exactly on time

and the pair fires when both its long and its short window burn at least its factor: the long
window shows the budget is really going, the short one that it is still going (so the alert stops
soon after the problem does). The defaults are the workbook's paging pairs for a 30-day budget:

=========== ============ ========== =========================================
long window short window burn rate  meaning
=========== ============ ========== =========================================
1 h         5 min        14.4       2% of the monthly budget in one hour
6 h         30 min       6          5% of the monthly budget in six hours
=========== ============ ========== =========================================

Signals: ``ttft_slo_burn`` (``vllm:time_to_first_token_seconds``) and ``e2e_slo_burn``
(``vllm:e2e_request_latency_seconds``). The detect agent keeps metric-detector state per entity
(per pod for vLLM batches), so the SLO is judged per pod by default (``entity_kind="pod"``, the
model in the labels). ``group_by="model"`` sums every pod of a ``model_name`` into one SLO
(``entity_kind="model"``) when one state sees all of them (a model-keyed stream, a replay, a bench).
Increases are kept in ``step_s`` bins, so a window is exact to within one step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pipelines.detectors.rules_common import (
    Condition,
    CounterTrack,
    EntityKind,
    Snapshot,
    make_anomaly,
    plain,
    snapshots,
    topology_labels,
)
from services.core.events import SEVERITY_RANK, Anomaly, MetricBatch, Severity

DETECTOR_NAME = "slo_burn"

TTFT = "vllm:time_to_first_token_seconds"
E2E = "vllm:e2e_request_latency_seconds"


@dataclass(frozen=True)
class BurnWindow:
    """One long/short window pair and the burn rate both must reach.

    Attributes:
        long_s: the long window, seconds.
        short_s: the short window, seconds (the workbook uses long / 12).
        burn_rate: the burn-rate factor both windows must reach.
        severity: severity of an anomaly this pair raises.
    """

    long_s: float
    short_s: float
    burn_rate: float
    severity: Severity = "critical"


DEFAULT_WINDOWS: tuple[BurnWindow, ...] = (
    BurnWindow(3600.0, 300.0, 14.4, "critical"),
    BurnWindow(21600.0, 1800.0, 6.0, "critical"),
)
"""The SRE workbook's paging pairs; add ``BurnWindow(259200, 21600, 1.0, "warning")`` for tickets."""


@dataclass
class SliWindowState:
    """Increases of one SLI in one group, binned by time, and its alert condition.

    Attributes:
        bins: ``[bin end, good increase, total increase]``, oldest first; a bin holds the
            increases of the scrapes in ``(end - step_s, end]``.
        condition: whether the SLI is burning.
        le: the bucket bound that counts as "good" (the target, or the bound just below it).
        first_ts: when the SLI's history starts (its first scrape).
    """

    bins: list[list[float]] = field(default_factory=list)
    condition: Condition = field(default_factory=Condition)
    le: float | None = None
    first_ts: float | None = None


@dataclass
class SloGroup:
    """One SLO's state (a model, or a pod with ``group_by="pod"``).

    Attributes:
        counters: ``pod|metric|good`` or ``pod|metric|total`` -> the cumulative counter's track.
        slis: signal -> its binned increases and condition.
        labels: topology labels of the group, from its latest scrape.
    """

    counters: dict[str, CounterTrack] = field(default_factory=dict)
    slis: dict[str, SliWindowState] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class SloBurnState:
    """The detector's state: one :class:`SloGroup` per model (or pod)."""

    groups: dict[str, SloGroup] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return the state as JSON-compatible values."""
        return plain(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SloBurnState:
        """Rebuild a state written by :meth:`to_dict`."""
        return cls(
            groups={
                key: SloGroup(
                    counters={k: CounterTrack.from_dict(v) for k, v in g.get("counters", {}).items()},
                    slis={
                        k: SliWindowState(
                            bins=[[float(x) for x in b] for b in v.get("bins", [])],
                            condition=Condition.from_dict(v.get("condition", {})),
                            le=v.get("le"),
                            first_ts=v.get("first_ts"),
                        )
                        for k, v in g.get("slis", {}).items()
                    },
                    labels={str(k): str(v) for k, v in g.get("labels", {}).items()},
                )
                for key, g in data.get("groups", {}).items()
            }
        )


def burn_rate(good: float, total: float, objective: float) -> float:
    """Return how fast a window spends the error budget (1.0: exactly on schedule; 0 with no requests).

    Args:
        good: requests that met the target in the window.
        total: all requests in the window.
        objective: the SLO, e.g. 0.999.
    """
    if total <= 0:
        return 0.0
    return ((total - good) / total) / (1.0 - objective)


def good_bucket(samples: Sequence[Any], target_s: float) -> tuple[float, float] | None:
    """Return ``(le, cumulative count)`` of the largest bucket bound <= the target, if any.

    A target between two bounds is judged at the lower one, which counts a few fast-enough requests
    as slow: the alert errs early, never late. Choose targets on bucket bounds to avoid it.
    """
    best: tuple[float, float] | None = None
    for sample in samples:
        raw = sample.labels.get("le", "")
        try:
            le = float(raw)
        except ValueError:
            continue
        if math.isinf(le) or le > target_s * (1 + 1e-9):
            continue
        if best is None or le > best[0]:
            best = (le, sample.value)
    return best


@dataclass(frozen=True)
class SloBurnDetector:
    """Multi-window, multi-burn-rate alerts on TTFT and end-to-end latency SLOs.

    Attributes:
        objective: share of requests that must meet the target (default 0.99; 0.999 makes a
            handful of slow requests page at low traffic).
        ttft_target_s: time-to-first-token target, seconds; ``None`` disables (default 5).
        e2e_target_s: end-to-end latency target, seconds; ``None`` disables (default 30).
        windows: the window pairs (default :data:`DEFAULT_WINDOWS`: 1h/5m at 14.4x, 6h/30m at 6x).
        step_s: width of the bins increases are kept in, seconds (default 60).
        min_requests: fewest requests in a long window for its pair to fire (default 50).
        group_by: ``"pod"`` (one SLO per pod) or ``"model"`` (one per ``model_name``, summed over
            the pods one state sees) (default ``"pod"``: the detect agent keeps state per pod).
        pad_unobserved: judge a window longer than the SLI's history as if the time before the
            history had burnt exactly on budget (burn rate 1) (default True). A "6 hour" burn rate
            over the first 40 minutes of a pod's life is otherwise a 40-minute burn rate held to a
            threshold meant for six hours, and pages on any busy half hour; padded, a new pod that
            serves only slow requests (burn 100) still fires the 1 h pair after about 8 minutes.
        emit_resolved: send a ``resolved`` anomaly when no pair fires any more (default True).
    """

    name: ClassVar[str] = DETECTOR_NAME
    consumes: ClassVar[type] = MetricBatch
    signals: ClassVar[frozenset[str]] = frozenset({"ttft_slo_burn", "e2e_slo_burn"})

    objective: float = 0.99
    ttft_target_s: float | None = 5.0
    e2e_target_s: float | None = 30.0
    windows: tuple[BurnWindow, ...] = DEFAULT_WINDOWS
    step_s: float = 60.0
    min_requests: float = 50.0
    group_by: Literal["model", "pod"] = "pod"
    pad_unobserved: bool = True
    emit_resolved: bool = True

    def __post_init__(self) -> None:
        if not 0.0 < self.objective < 1.0:
            raise ValueError(f"objective {self.objective} must lie strictly between 0 and 1")
        if self.step_s <= 0 or not self.windows:
            raise ValueError("step_s must be positive and windows non-empty")

    def initial_state(self) -> SloBurnState:
        """Return an empty state."""
        return SloBurnState()

    def slis(self) -> list[tuple[str, str, float]]:
        """Return the enabled SLIs as ``(signal, histogram name, target seconds)``."""
        out = []
        if self.ttft_target_s is not None:
            out.append(("ttft_slo_burn", TTFT, self.ttft_target_s))
        if self.e2e_target_s is not None:
            out.append(("e2e_slo_burn", E2E, self.e2e_target_s))
        return out

    def detect(self, batch: Sequence[Any], state: SloBurnState) -> tuple[SloBurnState, list[Anomaly]]:
        """Fold a micro-batch of vLLM scrapes into the SLO windows and evaluate the burn rates.

        Every pod scraped at one timestamp is folded in before its group is evaluated, so a model
        served by many pods is judged on all of them.

        Args:
            batch: :class:`~services.core.events.MetricBatch` items from vLLM (others are ignored).
            state: the state returned by the previous call (or :meth:`initial_state`).

        Returns:
            The updated state (changed in place) and the anomalies.
        """
        anomalies: list[Anomaly] = []
        dirty: dict[str, float] = {}
        current_ts: float | None = None
        for snap in snapshots(batch, entity_label="pod"):
            if current_ts is not None and snap.ts != current_ts:
                anomalies.extend(self._evaluate_all(state, dirty))
                dirty = {}
            current_ts = snap.ts
            key = self._fold(snap, state)
            if key is not None:
                dirty[key] = snap.ts
        anomalies.extend(self._evaluate_all(state, dirty))
        return state, anomalies

    # -- folding

    def _fold(self, snap: Snapshot, state: SloBurnState) -> str | None:
        """Add one pod scrape's histogram increases to its group; return the group key."""
        labels: dict[str, str] | None = None
        for _, metric, _ in self.slis():
            found = snap.samples.get(f"{metric}_bucket") or snap.samples.get(f"{metric}_count")
            if found:
                labels = found[0].labels
                break
        if labels is None:
            return None
        pod = snap.entity
        key = pod if self.group_by == "pod" else (labels.get("model_name") or pod)
        group = state.groups.setdefault(key, SloGroup())
        group.labels = topology_labels(labels)
        if self.group_by == "model":
            group.labels.pop("pod", None)  # a model's SLO spans pods
        for signal, metric, target in self.slis():
            buckets = snap.samples.get(f"{metric}_bucket", [])
            good = good_bucket(buckets, target)
            count = snap.value(f"{metric}_count")
            if count is None:
                count = next((s.value for s in buckets if s.labels.get("le") == "+Inf"), None)
            if good is None or count is None:
                continue
            good_inc = self._increase(group, f"{pod}|{metric}|good", good[1], snap.ts)
            total_inc = self._increase(group, f"{pod}|{metric}|total", count, snap.ts)
            sli = group.slis.setdefault(signal, SliWindowState())
            sli.le = good[0]
            self._add(sli, snap.ts, min(good_inc, total_inc), total_inc)
        return key

    @staticmethod
    def _increase(group: SloGroup, key: str, value: float, ts: float) -> float:
        # Window 0: the track keeps only its last value; windows live in the SLI's bins.
        return group.counters.setdefault(key, CounterTrack()).update(value, ts, 0.0)

    def _add(self, sli: SliWindowState, ts: float, good: float, total: float) -> None:
        if sli.first_ts is None or ts < sli.first_ts:
            sli.first_ts = ts
        # An increase seen at ``ts`` happened since the previous scrape: file it in the bin that
        # ends at or after ``ts``, so a window (now - w, now] holds exactly the scrapes inside it.
        end = math.ceil(ts / self.step_s) * self.step_s
        if sli.bins and sli.bins[-1][0] == end:
            sli.bins[-1][1] += good
            sli.bins[-1][2] += total
        elif not sli.bins or end > sli.bins[-1][0]:
            sli.bins.append([end, good, total])
        else:  # a late scrape: file it in its own bin
            for b in sli.bins:
                if b[0] == end:
                    b[1] += good
                    b[2] += total
                    break
            else:
                sli.bins.append([end, good, total])
                sli.bins.sort(key=lambda b: b[0])
        horizon = max(w.long_s for w in self.windows)
        cut = ts - horizon
        if sli.bins and sli.bins[0][0] <= cut:
            sli.bins = [b for b in sli.bins if b[0] > cut]

    def window_totals(self, sli: SliWindowState, now: float, window_s: float) -> tuple[float, float]:
        """Return (good, total) increases of the bins overlapping the window ``(now - window_s, now]``."""
        start = now - window_s
        good = total = 0.0
        for b in sli.bins:
            if start < b[0] and b[0] - self.step_s < now:
                good += b[1]
                total += b[2]
        return good, total

    @staticmethod
    def coverage(sli: SliWindowState, now: float) -> float:
        """Seconds of history the SLI has up to ``now``."""
        return 0.0 if sli.first_ts is None else max(0.0, now - sli.first_ts)

    def _padded(self, burn: float, seen_s: float, window_s: float) -> float:
        """The burn rate of a window whose unobserved part is counted as on budget (burn rate 1)."""
        if not self.pad_unobserved or seen_s >= window_s:
            return burn
        seen = max(0.0, seen_s)
        return (burn * seen + 1.0 * (window_s - seen)) / window_s

    # -- evaluation

    def _evaluate_all(self, state: SloBurnState, dirty: dict[str, float]) -> list[Anomaly]:
        out: list[Anomaly] = []
        for key, ts in dirty.items():
            group = state.groups[key]
            for signal, metric, target in self.slis():
                sli = group.slis.get(signal)
                if sli is not None:
                    anomaly = self._evaluate(key, group, sli, signal, metric, target, ts)
                    if anomaly is not None:
                        out.append(anomaly)
        return out

    def _evaluate(
        self, key: str, group: SloGroup, sli: SliWindowState, signal: str, metric: str, target: float, ts: float
    ) -> Anomaly | None:
        rows: list[dict[str, Any]] = []
        firing: list[tuple[BurnWindow, float]] = []
        for w in self.windows:
            long_good, long_total = self.window_totals(sli, ts, w.long_s)
            short_good, short_total = self.window_totals(sli, ts, w.short_s)
            seen = self.coverage(sli, ts)
            long_burn = self._padded(burn_rate(long_good, long_total, self.objective), seen, w.long_s)
            short_burn = self._padded(burn_rate(short_good, short_total, self.objective), seen, w.short_s)
            fires = long_total >= self.min_requests and long_burn >= w.burn_rate and short_burn >= w.burn_rate
            rows.append(
                {
                    "long_s": w.long_s,
                    "short_s": w.short_s,
                    "burn_rate_threshold": w.burn_rate,
                    "long_burn_rate": long_burn,
                    "short_burn_rate": short_burn,
                    "long_requests": long_total,
                    "long_slow": long_total - long_good,
                    "short_requests": short_total,
                    "short_slow": short_total - short_good,
                    "history_s": min(seen, w.long_s),
                    "firing": fires,
                }
            )
            if fires:
                firing.append((w, long_burn))
        change = sli.condition.update(bool(firing), ts, 1)
        if change is None or (change == "resolve" and not self.emit_resolved):
            return None
        if firing:
            window, score = max(firing, key=lambda f: (SEVERITY_RANK[f[0].severity], f[0].burn_rate))
            severity, threshold = window.severity, window.burn_rate
        else:
            score = max(r["long_burn_rate"] for r in rows)
            threshold = min(w.burn_rate for w in self.windows)
            severity = max((w.severity for w in self.windows), key=lambda s: SEVERITY_RANK[s])
        pods = sorted({k.split("|", 1)[0] for k in group.counters if f"|{metric}|" in k})
        evidence: dict[str, Any] = {
            "sli": metric,
            "objective": self.objective,
            "error_budget": 1.0 - self.objective,
            "target_s": target,
            "good_le": sli.le,
            "windows": rows,
            "pods": pods,
        }
        kind: EntityKind = "pod" if self.group_by == "pod" or key not in _models(group) else "model"
        return make_anomaly(
            detector=DETECTOR_NAME,
            signal=signal,
            entity=key,
            entity_kind=kind,
            score=score,
            threshold=threshold,
            severity=severity,
            ts=ts,
            labels=dict(group.labels),
            evidence=evidence,
            status="resolved" if change == "resolve" else "firing",
        )


def _models(group: SloGroup) -> set[str]:
    model = group.labels.get("model")
    return {model} if model else set()
