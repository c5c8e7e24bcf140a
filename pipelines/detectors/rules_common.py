"""Building blocks shared by the rule detectors (``rules_*.py``).

Rules read Prometheus-style samples and Kubernetes events, so they share four needs:

* **topology labels**: DCGM exporter writes the node as ``Hostname`` (older) or ``hostname`` (newer);
  :func:`topology_labels` accepts both and adds one ``node`` label, plus ``model`` for vLLM's
  ``model_name``, so the correlator can walk GPU → node → pod → model without knowing exporters;
* **counters**: DCGM and vLLM counters are cumulative. :class:`CounterTrack` turns them into
  increases and treats a drop as a reset (driver reload, pod restart): it re-baselines and counts
  nothing for that step, so a reset never raises an alarm on its own;
* **sustained conditions**: :class:`Condition` fires once when a condition has held for N samples
  and resolves when it clears, so a saturated cache makes one anomaly, not one per scrape;
* **anomalies**: :func:`make_anomaly` sets the fingerprint, a stable hash of
  (detector, signal, entity): the alert's identity in the correlator, the same when it resolves.

Everything here is plain data (numbers, strings, lists, dicts) so a detector's state goes to JSON
with :func:`plain` and comes back with the ``from_dict`` helpers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from services.core.events import Anomaly, MetricBatch, Sample, Severity
from services.core.fingerprint import fingerprint as core_fingerprint

EntityKind = Literal["gpu", "node", "pod", "model", "service", "other"]
Transition = Literal["fire", "resolve"]

# Labels that describe a series, not where it runs; never copied into an anomaly's labels.
_SERIES_LABELS = frozenset({"le", "finished_reason", "__name__", "quantile"})
_HOST_LABELS = ("Hostname", "hostname", "node", "kubernetes_node", "instance_node")


def plain(value: Any) -> Any:
    """A JSON-ready copy of rule state: dataclasses become dicts, lists, tuples and dicts are copied.

    What :func:`dataclasses.asdict` returns for these states, without its ``deepcopy`` of every leaf:
    the leaves here are numbers, strings and None, which need no copy. A detect worker checkpoints
    every entity's state every few scrapes, so this runs often.
    """
    fields = getattr(type(value), "__dataclass_fields__", None)
    if fields is not None:
        return {name: plain(getattr(value, name)) for name in fields}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    return value


def fingerprint(detector: str, signal: str, entity: str) -> str:
    """Return the stable identity of an anomaly: a hash of (detector, signal, entity)."""
    return core_fingerprint(detector, signal, entity)


def node_of(labels: dict[str, str]) -> str:
    """Return the node a series runs on: ``Hostname`` or ``hostname`` (DCGM), else ``node``; or ''."""
    for key in _HOST_LABELS:
        value = labels.get(key, "")
        if value:
            return value
    return ""


def topology_labels(labels: dict[str, str]) -> dict[str, str]:
    """Return a series' labels fit for an anomaly: non-empty, topology first.

    Adds ``node`` (from ``Hostname``/``hostname``) and ``model`` (from vLLM's ``model_name``) when
    known; drops series-only labels such as ``le`` and ``finished_reason``.
    """
    out = {k: v for k, v in labels.items() if v and k not in _SERIES_LABELS}
    node = node_of(labels)
    if node:
        out["node"] = node
    if labels.get("model_name"):
        out["model"] = labels["model_name"]
    return out


def make_anomaly(
    *,
    detector: str,
    signal: str,
    entity: str,
    entity_kind: EntityKind,
    score: float,
    threshold: float,
    severity: Severity,
    ts: float,
    labels: dict[str, str],
    evidence: dict[str, Any],
    status: Literal["firing", "resolved"] = "firing",
) -> Anomaly:
    """Build an :class:`Anomaly` with the fingerprint of (detector, signal, entity)."""
    return Anomaly(
        entity=entity,
        entity_kind=entity_kind,
        signal=signal,
        detector=detector,
        score=float(score),
        threshold=float(threshold),
        severity=severity,
        status=status,
        ts=ts,
        labels=labels,
        evidence=evidence,
        fingerprint=fingerprint(detector, signal, entity),
    )


# ------------------------------------------------------------------------------------ grouping


@dataclass
class Finding:
    """One rule's verdict on one snapshot: a condition firing or resolving, with its evidence."""

    signal: str
    transition: Transition
    score: float
    threshold: float
    severity: Severity
    evidence: dict[str, Any]


def findings_to_anomalies(
    findings: Iterable[Finding],
    *,
    detector: str,
    entity: str,
    entity_kind: EntityKind,
    ts: float,
    labels: dict[str, str],
    emit_resolved: bool,
) -> list[Anomaly]:
    """Turn a snapshot's findings into anomalies (resolutions only when the detector reports them)."""
    return [
        make_anomaly(
            detector=detector,
            signal=f.signal,
            entity=entity,
            entity_kind=entity_kind,
            score=f.score,
            threshold=f.threshold,
            severity=f.severity,
            ts=ts,
            labels=labels,
            evidence=f.evidence,
            status="resolved" if f.transition == "resolve" else "firing",
        )
        for f in findings
        if f.transition == "fire" or emit_resolved
    ]


@dataclass(frozen=True)
class Snapshot:
    """Every sample one entity reported at one timestamp (one scrape).

    Attributes:
        entity: the GPU UUID, pod or node the samples describe.
        ts: the samples' timestamp.
        samples: metric name -> the samples of that name (several for labelled series).
    """

    entity: str
    ts: float
    samples: dict[str, list[Sample]]

    def value(self, *names: str) -> float | None:
        """Return the first sample's value of the first of ``names`` present, else ``None``."""
        for name in names:
            found = self.samples.get(name)
            if found:
                return found[0].value
        return None

    def labels(self) -> dict[str, str]:
        """Return the labels of the snapshot's first sample (DCGM and vLLM repeat them on every series)."""
        for found in self.samples.values():
            if found:
                return found[0].labels
        return {}


def snapshots(batch: Iterable[Any], entity_label: str | None = None) -> Iterator[Snapshot]:
    """Split metric batches into per-entity, per-timestamp snapshots, oldest first per entity.

    Items that are not :class:`MetricBatch` are skipped, so a detector can be handed a mixed batch.

    Args:
        batch: the micro-batch.
        entity_label: a label naming the entity (``UUID`` for DCGM, ``pod`` for vLLM); the
            batch's ``entity`` is used where the label is absent or empty.
    """
    items = batch if isinstance(batch, Sequence) else list(batch)
    if len(items) == 1 and isinstance(items[0], MetricBatch):
        # the usual case: each rule detector is handed the same single scrape; group it once
        last: dict[str | None, tuple[MetricBatch, list[Snapshot]]] = _LAST.__dict__.setdefault("grouped", {})
        cached = last.get(entity_label)
        if cached is None or cached[0] is not items[0]:
            cached = (items[0], list(_group(items, entity_label)))
            last[entity_label] = cached
        yield from cached[1]
        return
    yield from _group(items, entity_label)


# per thread, entity label -> (the last single MetricBatch grouped, its snapshots). MetricBatch is frozen
# and the entry holds a reference to it, so the same object means the same samples. Detectors only read
# snapshots.
_LAST = threading.local()


def _group(batch: Iterable[Any], entity_label: str | None) -> Iterator[Snapshot]:
    grouped: dict[tuple[str, float], dict[str, list[Sample]]] = {}
    for item in batch:
        if not isinstance(item, MetricBatch):
            continue
        for sample in item.samples:
            entity = (sample.labels.get(entity_label, "") if entity_label else "") or item.entity
            grouped.setdefault((entity, sample.ts), {}).setdefault(sample.name, []).append(sample)
    for (entity, ts), samples in sorted(grouped.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        yield Snapshot(entity, ts, samples)


# ------------------------------------------------------------------------------------ counters


@dataclass
class CounterTrack:
    """A cumulative counter turned into increases, with the increases of a sliding window.

    A drop in value is a reset (driver reload, GPU reset, pod restart): the track re-baselines on
    the new value and counts no increase for that step, so a reset is never an alarm. The first
    sample only sets the baseline: errors counted before the detector started are history.

    Attributes:
        last: the latest value, ``None`` before the first sample.
        last_ts: timestamp of the latest value.
        points: ``[ts, increase]`` for each step with a positive increase inside the window.
        resets: drops seen so far.
    """

    last: float | None = None
    last_ts: float = 0.0
    points: list[list[float]] = field(default_factory=list)
    resets: int = 0

    def update(self, value: float, ts: float, window_s: float) -> float:
        """Fold in one sample and return its increase (0 for the first sample, a reset or a stale one).

        Args:
            value: the counter's value.
            ts: the sample's timestamp.
            window_s: how far back :meth:`window_increase` looks.
        """
        if self.last is not None and ts <= self.last_ts:
            return 0.0  # a late or repeated sample: the counter has already moved on
        if self.last is None:
            increase = 0.0
        elif value < self.last:
            increase = 0.0
            self.resets += 1
        else:
            increase = value - self.last
        self.last = value
        self.last_ts = ts
        if increase > 0:
            self.points.append([ts, increase])
        self.prune(ts, window_s)
        return increase

    def prune(self, now: float, window_s: float) -> None:
        """Forget increases older than the window ending at ``now``."""
        start = now - window_s
        if self.points and self.points[0][0] <= start:
            self.points = [p for p in self.points if p[0] > start]

    def window_increase(self) -> float:
        """Return the counter's increase over the window (resets excluded)."""
        return float(sum(p[1] for p in self.points))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CounterTrack:
        """Rebuild a track from :func:`plain` output."""
        return cls(
            last=data.get("last"),
            last_ts=float(data.get("last_ts", 0.0)),
            points=[[float(t), float(v)] for t, v in data.get("points", [])],
            resets=int(data.get("resets", 0)),
        )


@dataclass
class Condition:
    """A condition that must hold for N consecutive samples to fire, and resolves when it clears.

    Attributes:
        streak: consecutive samples the condition has held.
        since: timestamp of the first sample of the current streak.
        active: whether it has fired and not yet resolved.
        fired_ts: when it last fired.
    """

    streak: int = 0
    since: float | None = None
    active: bool = False
    fired_ts: float | None = None

    def update(self, holds: bool, ts: float, samples: int, stays: bool | None = None) -> Transition | None:
        """Fold in one evaluation; return ``"fire"`` or ``"resolve"`` on a change, else ``None``.

        Args:
            holds: whether the firing condition holds at this sample.
            ts: the sample's timestamp.
            samples: consecutive samples needed to fire.
            stays: whether an active condition stays active (defaults to ``holds``): lets a rule
                fire on "high and growing" but stay firing while merely "high".
        """
        if self.active:
            keep = holds if stays is None else stays
            if keep:
                self.streak += 1
                return None
            self.streak, self.since, self.active = 0, None, False
            return "resolve"
        if not holds:
            self.streak, self.since = 0, None
            return None
        self.streak += 1
        if self.since is None:
            self.since = ts
        if self.streak >= samples:
            self.active = True
            self.fired_ts = ts
            return "fire"
        return None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Condition:
        """Rebuild a condition from :func:`plain` output."""
        return cls(
            streak=int(data.get("streak", 0)),
            since=data.get("since"),
            active=bool(data.get("active", False)),
            fired_ts=data.get("fired_ts"),
        )


def held_back(last_fired: dict[str, float], key: str, ts: float, hold_s: float) -> bool:
    """Return True when ``key`` fired less than ``hold_s`` before ``ts`` (a repeat to suppress).

    Otherwise record ``ts`` as its latest firing and return False.
    """
    previous = last_fired.get(key)
    if previous is not None and ts - previous < hold_s:
        return True
    last_fired[key] = ts
    return False


def forget_older(last_fired: dict[str, float], now: float, hold_s: float) -> None:
    """Drop hold records that can no longer suppress anything, so the state stays small."""
    for key in [k for k, t in last_fired.items() if now - t >= hold_s]:
        del last_fired[key]
