"""The correlate role's engines, without Kafka or any I/O: one per cluster, and the topology filter.

:class:`Correlator` holds one :class:`~pipelines.correlate.engine.Engine` per cluster with its tick
clock, the redelivery dedup (the newest anomaly time per fingerprint, and each partition's position in
the last checkpoint) and the dirty marks of what a checkpoint must write. :class:`TopologyFilter`
picks topology facts out of raw metric batches. The role (:mod:`pipelines.correlate.role`) feeds both;
the offline harnesses (:mod:`evals.correlate`) drive them the same way without a broker.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipelines.correlate.engine import Engine
from pipelines.correlate.model import Action
from pipelines.correlate.topology import DEPLOYMENT_LABELS, GPU_LABELS, MODEL_LABELS, NODE_LABELS, PCI_LABEL, tokens
from pipelines.detect import GPU_METRIC_PREFIX
from services.alerting.config import RoutingConfig
from services.alerting.errors import IncidentNotFound, SilenceError
from services.alerting.labels import alert_fingerprint
from services.alerting.silences import Silence
from services.core.events import FACT_GPU_FAULT, Anomaly

log = logging.getLogger(__name__)

DEFAULT_CLUSTER = "default"
SEEN_RETENTION_S = 86400.0  # how long the newest anomaly time per fingerprint is remembered
RUN_ENDED = frozenset({"succeeded", "failed", "rolled_back", "blocked", "expired", "rejected", "paged", "dry_run"})
"""Run-level statuses that end a remediation run's hold on its incident."""
TOPOLOGY_LABELS = frozenset(
    {*GPU_LABELS, *NODE_LABELS, *MODEL_LABELS, *DEPLOYMENT_LABELS, "gpu", "pod", "namespace", "cluster"}
)


@dataclass
class _Clock:
    """Where an engine's time stood at a wall-clock instant: ticks advance from here."""

    engine_time: float | None
    wall: float


class Correlator:
    """One engine per cluster, their tick clocks, dirty marks and silences; no Kafka, no I/O.

    Args:
        config: the routing config every engine runs.
        clock: a monotonic wall clock in seconds (injected by tests).
        rate: event seconds per wall second between two ingests (a simulation's speed; 1 in production).
    """

    def __init__(self, config: RoutingConfig, clock: Callable[[], float] = time.monotonic, rate: float = 1.0) -> None:
        self.config = config
        self.clock = clock
        self.rate = rate
        self.engines: dict[str, Engine] = {}
        self.dirty: set[str] = set()
        self.silences: list[Silence] = []
        self.positions: dict[str, tuple[int, int]] = {}
        self.seen: dict[str, dict[str, float]] = {}  # cluster -> fingerprint -> newest anomaly ts applied
        self._clocks: dict[str, _Clock] = {}

    def engine(self, cluster: str, saved: bytes | None = None) -> Engine:
        """The cluster's engine, restored from ``saved`` (a checkpoint) the first time it is needed."""
        engine = self.engines.get(cluster)
        if engine is None:
            if saved:
                data = json.loads(saved)
                engine = Engine.from_dict(self.config, data["engine"])
                if data.get("position") is not None:
                    partition, offset = data["position"]
                    self.positions[cluster] = (int(partition), int(offset))
                self.seen[cluster] = {fp: float(ts) for fp, ts in data.get("seen", {}).items()}
                log.info(
                    "restored the %s engine: %d alerts, %d incidents",
                    cluster,
                    len(engine.alerts),
                    len(engine.incidents),
                )
            else:
                engine = Engine(self.config)
            self.engines[cluster] = engine
            self._clocks[cluster] = _Clock(engine.clock, self.clock())
            if self.silences and sync_silences(engine, self.silences, _engine_now(engine)):
                self.dirty.add(cluster)
        return engine

    def ingest(self, cluster: str, anomaly: Anomaly) -> list[Action]:
        """Apply one anomaly at engine time ``anomaly.ts``.

        An anomaly no newer than the last one applied with its fingerprint is dropped: it is a
        redelivery (detect and the route agent deliver at least once) or arrived out of order, and
        applied at the engine's later clock it would re-fire an alert that has moved on since.
        """
        engine = self.engine(cluster)
        seen = self.seen.setdefault(cluster, {})
        fp = alert_fingerprint(anomaly)
        last = seen.get(fp)
        if last is not None and anomaly.ts <= last:
            return []
        seen[fp] = anomaly.ts
        if anomaly.provenance.trusts(FACT_GPU_FAULT):
            engine.topology.learn_pci(anomaly.labels, anomaly.ts, anomaly.entity, anomaly.entity_kind)
        anomaly = self.resolve(cluster, anomaly)
        labels = anomaly.labels
        if labels.get("pod") and any(labels.get(n) for n in (*MODEL_LABELS, *NODE_LABELS)):
            engine.observe_topology(labels, anomaly.ts)
        actions = engine.ingest(anomaly, anomaly.ts)
        self._clocks[cluster] = _Clock(engine.clock, self.clock())
        self.dirty.add(cluster)
        return actions

    def resolve(self, cluster: str, anomaly: Anomaly) -> Anomaly:
        """The anomaly about the GPU it names by node and PCI address, when the cluster's topology knows it.

        A node's kernel log names a GPU by PCI address only (``NVRM: Xid (PCI:0000:3b:00): 48``).
        When a trusted GPU source told the topology which GPU is there (:meth:`Topology.learn_pci
        <pipelines.correlate.topology.Topology.learn_pci>`), the anomaly becomes one about that GPU:
        ``entity`` its UUID, ``entity_kind`` ``gpu``, label ``UUID`` added, the alert's identity (its
        fingerprint) unchanged. It then anchors at the GPU, joins the GPU's incident, and names the GPU
        as a playbook's target. Only an anomaly from a source trusted for GPU faults is resolved: an
        application log quoting an XID line, or a webhook alert labelled with a PCI id, keeps its own
        anchor and can never name a GPU through this mapping. Anything else is returned as it is.
        """
        if not anomaly.provenance.trusts(FACT_GPU_FAULT):
            return anomaly
        topology = self.engine(cluster).topology
        uuid = topology.gpu_by_pci(anomaly.labels, anomaly.evidence, anomaly.entity, anomaly.entity_kind)
        if not uuid:
            return anomaly
        update = {
            "entity": uuid,
            "entity_kind": "gpu",
            "labels": {**anomaly.labels, "UUID": uuid},
            "fingerprint": alert_fingerprint(anomaly),
        }
        return anomaly.model_copy(update=update)

    def tick(self, cluster: str, now: float) -> list[Action]:
        """Fire the cluster's timers due up to engine time ``now``."""
        engine = self.engine(cluster)
        actions = engine.tick(now)
        self.dirty.add(cluster)
        return actions

    def mitigate(self, cluster: str, incident_id: str) -> list[Action]:
        """Mark an incident mitigated (a remediation run succeeded); unknown incidents are ignored."""
        engine = self.engine(cluster)
        try:
            actions = engine.mitigate(incident_id, _engine_now(engine))
        except IncidentNotFound:
            return []  # another cluster's incident, or resolved and forgotten already
        self.dirty.add(cluster)
        return actions

    def run(self, cluster: str, incident_id: str, run_id: str, status: str) -> list[Action]:
        """Follow a remediation run's run-level progress: ``running`` holds its incident open, an end
        releases it, and ``succeeded`` mitigates it first. Unknown incidents are ignored."""
        engine = self.engine(cluster)
        now = _engine_now(engine)
        actions: list[Action] = []
        if status == "succeeded":
            try:
                actions = engine.mitigate(incident_id, now)
            except IncidentNotFound:
                return []  # another cluster's incident, or resolved and forgotten already
        if status == "running" or status in RUN_ENDED:
            actions += engine.acting(incident_id, run_id, status == "running", now)
        self.dirty.add(cluster)
        return actions

    def observe(self, cluster: str, labels: Mapping[str, str], ts: float) -> None:
        """Learn topology facts seen at ``ts`` (a ``pci_bus_id`` among ``labels`` only from a GPU exporter:
        :class:`TopologyFilter` forwards it from no other source)."""
        engine = self.engine(cluster)
        engine.observe_topology(labels, ts)
        engine.topology.learn_pci(labels, ts)
        self.dirty.add(cluster)

    def applied(self, cluster: str, partition: int, offset: int) -> bool:
        """Whether the message at ``partition``/``offset`` is already part of the cluster's state.

        A checkpoint can be written and its events acked, and the worker die before Faust commits
        the offsets: those events come again and must not be applied twice (an occurrence counted
        twice would meet an N-of-M threshold early).
        """
        position = self.positions.get(cluster)
        return position is not None and position[0] == partition and offset <= position[1]

    def advance(self, cluster: str, partition: int, offset: int) -> None:
        """Record that the message at ``partition``/``offset`` was applied to the cluster's engine."""
        self.positions[cluster] = (partition, offset)
        self.dirty.add(cluster)

    def tick_time(self, cluster: str) -> float | None:
        """Engine time to tick the cluster with now: last ingest's engine time plus the wall time since
        (times the clock rate)."""
        at = self._clocks.get(cluster)
        if at is None or at.engine_time is None:
            return None
        return at.engine_time + max(0.0, self.clock() - at.wall) * self.rate

    def event_time(self) -> float | None:
        """The earliest engine clock among the clusters held (None before any): the anomaly history's clock.

        The earliest, so that one cluster's clock running ahead (a forged timestamp) cannot prune the
        history of the others.
        """
        clocks = [engine.clock for engine in self.engines.values() if engine.clock is not None]
        return min(clocks) if clocks else None

    def set_silences(self, silences: Sequence[Silence]) -> None:
        """Make every engine's silences match ``silences`` (the store's)."""
        self.silences = list(silences)
        for cluster, engine in self.engines.items():
            if sync_silences(engine, self.silences, _engine_now(engine)):
                self.dirty.add(cluster)

    def state(self, cluster: str) -> bytes:
        """The cluster's checkpoint as JSON bytes: ``Engine.to_dict()`` and the last message applied."""
        engine = self.engines[cluster]
        seen = self.seen.get(cluster, {})
        if engine.clock is not None:  # forget what is too old to come again
            horizon = engine.clock - max(SEEN_RETENTION_S, self.config.correlation.incidents.retention)
            seen = self.seen[cluster] = {fp: ts for fp, ts in seen.items() if ts >= horizon}
        data = {"engine": engine.to_dict(), "position": self.positions.get(cluster), "seen": seen}
        return json.dumps(data, separators=(",", ":")).encode()

    def forget(self) -> None:
        """Drop every engine (they are restored from the table when next needed)."""
        self.engines.clear()
        self._clocks.clear()
        self.positions.clear()
        self.seen.clear()
        self.dirty.clear()


def _engine_now(engine: Engine) -> float:
    return engine.clock if engine.clock is not None else time.time()


def sync_silences(engine: Engine, wanted: Sequence[Silence], now: float) -> bool:
    """Add, replace or expire the engine's silences so they match ``wanted``; return whether any changed.

    A silence expired before it started has ``ends_at == starts_at``, which the engine's store refuses
    to add: it is expired in the engine instead (or ignored if the engine never had it).
    """
    changed = False
    ids = set()
    for silence in wanted:
        ids.add(silence.id)
        try:
            current: Silence | None = engine.silences.get(silence.id)
        except SilenceError:
            current = None
        if current is not None and current == silence:
            continue
        if silence.ends_at <= silence.starts_at:
            if current is not None and current.state(now) != "expired":
                engine.silences.expire(silence.id, now)
                changed = True
            continue
        try:
            engine.silences.add(silence)
        except SilenceError as exc:
            log.warning("silence %s is invalid and was not applied: %s", silence.id, exc)
            continue
        changed = True
    for current in engine.silences.list(now):
        if current.id not in ids and current.state(now) != "expired":
            engine.silences.expire(current.id, now)
            changed = True
    return changed


@dataclass
class TopologyFilter:
    """Picks topology facts out of metric batches and passes on only changed or stale ones.

    Attributes:
        refresh_s: forward an unchanged fact again after this much telemetry time.
    """

    refresh_s: float = 3600.0
    _seen: dict[str, tuple[str, float]] = field(default_factory=dict)

    def facts(self, raw: bytes | None) -> tuple[str, dict[str, str], float] | None:
        """``(cluster, labels, ts)`` to forward for one raw MetricBatch, or None.

        Undecodable input is ignored here (the detect role dead-letters it).
        """
        try:
            batch = json.loads(raw or b"")
            samples = batch.get("samples") or []
            first = samples[0]
            labels = {k: str(v) for k, v in (first.get("labels") or {}).items() if k in TOPOLOGY_LABELS and v}
            pci = (first.get("labels") or {}).get(PCI_LABEL)
            if pci and _gpu_exporter(batch):
                labels[PCI_LABEL] = str(pci)
            ts = float(first.get("ts", 0.0))
            entity = str(batch.get("entity", ""))
        except (ValueError, TypeError, AttributeError, IndexError, KeyError):
            return None
        if sum(1 for level in tokens(labels).values() if level) < 2:
            return None  # one level alone states no fact
        signature = json.dumps(labels, sort_keys=True)
        last = self._seen.get(entity)
        if last is not None and last[0] == signature and ts - last[1] < self.refresh_s:
            return None
        self._seen[entity] = (signature, ts)
        return labels.get("cluster") or DEFAULT_CLUSTER, labels, ts


def _gpu_exporter(batch: Mapping[str, Any]) -> bool:
    """Whether a raw MetricBatch is a GPU exporter's (NVML reader, DCGM fields): the rule of
    :func:`pipelines.detect.metric_provenance` for a source trusted for GPU facts."""
    samples = batch.get("samples") or ()
    return batch.get("source") == "nvml" or any(str(s.get("name", "")).startswith(GPU_METRIC_PREFIX) for s in samples)
