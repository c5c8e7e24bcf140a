"""The correlate role: Faust agents that feed the correlation engine and act on what it decides.

The engine needs cross-entity state (topology: a GPU, its node, the pods on it and their model), so
its input is re-keyed by cluster and one :class:`~pipelines.correlate.engine.Engine` runs per cluster::

    anomalies.v1 ──► correlate-route ──┐
                                       ├──► correlate.by-cluster.v1 ──► correlate ──► incidents.v1, Postgres,
    telemetry.metrics.v1 ──► correlate-topology ─┘     (key: cluster)        │         notify (Celery)
                                       ▲                                     ▼
                    tick timer ────────┘                  correlate-engine-state (table, key: cluster)

* ``correlate-route`` decodes each anomaly (bad input is dead-lettered) and forwards its raw bytes,
  keyed by ``labels["cluster"]`` (``default`` when absent).
* ``correlate-topology`` reads the metric batches for topology facts only (GPU on node, pod on node,
  pod serves model): a vLLM scrape names pod and model, a DCGM scrape GPU, node and pod. A changed
  fact, or one not repeated for ``topology_refresh_s``, is forwarded. Without these, an SLO burn on a
  surviving replica could not be linked to the XID that killed its sibling. A GPU exporter's batch
  (DCGM, NVML) also forwards its ``pci_bus_id``: which GPU is at which PCI address of the node.
* ``correlate`` applies everything on the internal topic to its cluster's engine and acts on the
  results: an :class:`IncidentEvent` is published on ``incidents.v1`` (key: incident id) and upserted
  into Postgres; a :class:`Notification` goes to the injected ``notify`` callable. Every anomaly it
  decodes is also written to the ``anomalies`` table in micro-batches, for the diagnostician's evidence
  tools, and rows older than ``anomaly_retention_s`` of event time are pruned
  (:class:`~pipelines.correlate.history.AnomalyHistory`).

**Clock.** Engine time is the anomaly's ``ts`` for ingest (so a replay of the same input gives the
same incident ids) and wall time for ticks: a timer computes, per cluster, the engine time of the
last ingest plus the wall time elapsed since, and ticks the engine with it, so group_wait,
group_interval, repeat_interval and auto-resolve fire without new input. The tick travels *through*
the internal topic as a message, like the anomalies: a restarted worker replays ticks and anomalies
in the order the first one saw them, so the interleaving, and with it every incident id, is the same.

**State and acks.** Each engine is checkpointed as JSON (``Engine.to_dict``) into the
``correlate-engine-state`` table, keyed by cluster, at most every ``checkpoint_s`` (and when the
worker stops or loses partitions). The agent consumes with manual acks: an event is acked only once
a checkpoint that includes it is written, and the actions it caused (and its anomaly's history row)
were flushed to Kafka and Postgres first. A worker killed between checkpoints restarts from the last
one and re-applies the events after it; the engine dedups by fingerprint and its incident ids are
deterministic, so the re-application repeats the same actions (an upsert is idempotent;
``incidents.v1`` may carry an event twice, with the same incident id) and nothing is lost or
duplicated.

**Silences** live in Postgres (API, CLI). The agent loads them before it processes anything and polls
every ``silence_poll_s``, adding, replacing and expiring them in every engine.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from pipelines.app import Pipeline
from pipelines.correlate.engine import Engine
from pipelines.correlate.history import AnomalyHistory
from pipelines.correlate.model import Action
from pipelines.correlate.topology import DEPLOYMENT_LABELS, GPU_LABELS, MODEL_LABELS, NODE_LABELS, PCI_LABEL, tokens
from pipelines.detect import GPU_METRIC_PREFIX
from services.alerting.config import RoutingConfig
from services.alerting.errors import IncidentNotFound, SilenceError
from services.alerting.labels import alert_fingerprint
from services.alerting.notification import Notification
from services.alerting.silences import Silence
from services.core.events import FACT_GPU_FAULT, Anomaly, IncidentEvent, RemediationEvent
from services.core.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")

ROUTE_AGENT = "correlate-route"
TOPOLOGY_AGENT = "correlate-topology"
REMEDIATION_AGENT = "correlate-remediations"
CORRELATE_AGENT = "correlate"
BY_CLUSTER_TOPIC = "correlate.by-cluster.v1"
STATE_TABLE = "correlate-engine-state"
DEFAULT_CLUSTER = "default"
SEEN_RETENTION_S = 86400.0  # how long the newest anomaly time per fingerprint is remembered
KIND_HEADER = "clustermedic-kind"
ANOMALY, TICK, TOPOLOGY, MITIGATE = "anomaly", "tick", "topology", "mitigate"
RUN = "run"  # a remediation run began or ended: {"incident_id", "run_id", "status"}
RUN_ENDED = frozenset({"succeeded", "failed", "rolled_back", "blocked", "expired", "rejected", "paged", "dry_run"})
TOPOLOGY_LABELS = frozenset(
    {*GPU_LABELS, *NODE_LABELS, *MODEL_LABELS, *DEPLOYMENT_LABELS, "gpu", "pod", "namespace", "cluster"}
)

Notify = Callable[[Notification], None]
"""Hands one notification decision to the notify stage (called in a worker thread; may block).

The entrypoint that registers the role injects it (``medic pipeline --role correlate`` enqueues on the
Celery notify stage, :func:`services.notify.tasks.enqueue`): the pipeline never imports the notify
service itself."""


class CorrelateStore(Protocol):
    """What the agent persists and reads besides Kafka: incidents and the anomaly history out, silences in.

    Every method blocks (the agent calls them in its own database thread) and raises when the store
    is unreachable (the agent retries the same call).
    """

    def save_incidents(self, events: Sequence[IncidentEvent]) -> None:
        """Upsert incident events (and their linked alerts), idempotently, in order."""

    def save_anomalies(self, anomalies: Sequence[Anomaly]) -> list[tuple[Anomaly, str]]:
        """Upsert one batch of anomalies into the history; return those it cannot store, with why."""

    def prune_anomalies(self, older_than: float) -> int:
        """Delete stored anomalies older than ``older_than`` (event time); return how many."""

    def silences(self) -> list[Silence]:
        """Every silence the engines should know: pending, active and recently expired."""

    def close(self) -> None:
        """Release connections."""


@dataclass(frozen=True)
class CorrelateOptions:
    """Timing of the correlate role.

    Attributes:
        tick_s: how often engines are ticked (and a due checkpoint is written when no event arrives).
        checkpoint_s: least time between two checkpoints of the engine states.
        silence_poll_s: how often silences are re-read from the store.
        topology_from_metrics: learn topology facts from ``telemetry.metrics.v1`` too.
        topology_refresh_s: re-send an unchanged topology fact after this much telemetry time, so it
            outlives the engine's ``fact_ttl``.
        retry_max_s: longest wait between two attempts of a failing database write.
        anomaly_batch: write the anomaly history as soon as this many anomalies wait (else at the
            next checkpoint).
        anomaly_prune_s: least event time between two prunes of the anomaly history.
        clock_rate: event seconds a tick adds per wall second since the last ingest (Settings'
            ``correlate_clock_rate``: 1, or a simulation's speed).
    """

    tick_s: float = 1.0
    checkpoint_s: float = 5.0
    silence_poll_s: float = 5.0
    topology_from_metrics: bool = True
    topology_refresh_s: float = 3600.0
    retry_max_s: float = 10.0
    anomaly_batch: int = 500
    anomaly_prune_s: float = 3600.0
    clock_rate: float = 1.0


# ------------------------------------------------------------------------------ engines (no I/O)


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


# ----------------------------------------------------------------------------- store


class PostgresCorrelateStore:
    """:class:`CorrelateStore` on PostgreSQL with one connection, reopened after a failure."""

    def __init__(self, settings: Settings, *, silence_retention_s: float = 3600.0) -> None:
        self.settings = settings
        self.silence_retention_s = silence_retention_s
        self._conn: Any = None

    def _connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            from services.store.db import connect

            self._conn = connect(self.settings)
        return self._conn

    def _run(self, work: Callable[[Any], T]) -> T:
        import psycopg

        try:
            return work(self._connection())
        except psycopg.Error:
            self.close()  # a broken connection is replaced on the next call
            raise

    def save_incidents(self, events: Sequence[IncidentEvent]) -> None:
        from services.store.incidents import upsert_incident_events

        self._run(lambda conn: upsert_incident_events(conn, events))

    def save_anomalies(self, anomalies: Sequence[Anomaly]) -> list[tuple[Anomaly, str]]:
        from services.store.anomalies import write_anomalies

        limit = self.settings.anomaly_evidence_max_bytes
        return self._run(lambda conn: write_anomalies(conn, anomalies, max_evidence_bytes=limit))

    def prune_anomalies(self, older_than: float) -> int:
        from services.store.anomalies import prune_anomalies

        return self._run(lambda conn: prune_anomalies(conn, older_than))

    def silences(self) -> list[Silence]:
        from services.store.silences import engine_silences

        return self._run(lambda conn: engine_silences(conn, now=time.time(), retention_s=self.silence_retention_s))

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


# -------------------------------------------------------------------------------------- agents


def _header(event: Any, name: str) -> str:
    headers = getattr(event, "headers", None) or getattr(event.message, "headers", None) or ()
    items: Iterable[tuple[str, Any]] = headers.items() if isinstance(headers, Mapping) else headers
    for key, value in items:
        if key == name:
            return value.decode() if isinstance(value, bytes) else str(value)
    return ANOMALY


def register_correlate(
    pipeline: Pipeline,
    config: RoutingConfig,
    *,
    notify: Notify,
    store: CorrelateStore | None = None,
    clock: Callable[[], float] = time.monotonic,
    options: CorrelateOptions | None = None,
) -> Correlator:
    """Register the correlate agents, the engine-state table and the timers on ``pipeline``.

    Args:
        pipeline: the Faust app and its topics.
        config: the routing config (``load_routing``).
        notify: receives every notification decision (see :data:`Notify`).
        store: incidents out, silences in; default :class:`PostgresCorrelateStore`.
        clock: monotonic wall clock for ticks and checkpoint pacing.
        options: timing; see :class:`CorrelateOptions`.

    Returns:
        The :class:`Correlator` holding the engines (for inspection in tests and benchmarks).
    """
    opts = options or CorrelateOptions()
    app, topics, settings = pipeline.app, pipeline.topics, pipeline.settings
    store = store or PostgresCorrelateStore(settings)
    correlator = Correlator(config, clock, rate=opts.clock_rate)
    history = AnomalyHistory(settings.anomaly_retention_s, opts.anomaly_batch, opts.anomaly_prune_s)
    by_cluster = app.topic(
        settings.topic(BY_CLUSTER_TOPIC),
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=settings.kafka_partitions,
        internal=True,  # Faust creates it with the pipeline's partition count
    )
    # use_partitioner: a key's changelog partition is the one the producer's partitioner picks for the
    # same key bytes on the by-cluster topic (same count), so checkpoints written from a timer or at
    # shutdown (outside the stream) stay co-partitioned with their cluster.
    table = app.Table(
        STATE_TABLE,
        default=None,
        partitions=settings.kafka_partitions,
        key_type=bytes,  # bytes keys and values travel raw (Faust picks the raw codec for bytes)
        value_type=bytes,
        use_partitioner=True,
    )
    # The correlate agent acks on checkpoints, not per event, so the consumer must not wait for acks
    # when it stops (it would wait forever): the shutdown checkpoint covers those events instead, and
    # the position stored in it makes their redelivery after the restart harmless.
    app.conf.stream_wait_empty = False
    db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="correlate-db")  # one connection, in order
    lock = asyncio.Lock()  # apply+emit and checkpoint never interleave
    pending: list[tuple[Any, Any]] = []  # (stream, event) applied and emitted, not yet acked
    ticking: set[str] = set()  # clusters with a tick message on its way
    loaded = asyncio.Event()
    last_checkpoint = clock()

    async def in_db(work: Callable[[], T], what: str) -> T:
        """Run blocking store work on the database thread, retrying until it succeeds."""
        delay = 0.2
        while True:
            try:
                return await asyncio.get_running_loop().run_in_executor(db, work)
            except Exception as exc:  # the store may fail in many ways (server gone, lock timeout...): retry all
                log.error("%s failed (retrying in %.1f s): %s", what, delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, opts.retry_max_s)

    async def load_silences() -> None:
        correlator.set_silences(await in_db(store.silences, "reading silences"))
        loaded.set()

    async def emit(actions: Sequence[Action]) -> None:
        incidents = [a for a in actions if isinstance(a, IncidentEvent)]
        for event in incidents:
            await topics.incidents.send(key=event.key().encode(), value=event.to_bytes())
        if incidents:
            await in_db(lambda: store.save_incidents(incidents), "saving incidents")
        for action in actions:
            if isinstance(action, Notification):
                try:
                    await asyncio.to_thread(notify, action)
                except Exception:  # the notify stage owns retries; a bug there must not stop correlation
                    log.exception("notify failed for group %s", action.group_key)

    async def store_history() -> None:
        """Write the pending anomalies (one round trip) and prune the history when it is due."""
        batch = history.take()
        if batch:
            rejected = await in_db(lambda: store.save_anomalies(batch), "saving anomalies")
            for anomaly, reason in rejected:
                await pipeline.dead_letter(
                    raw=anomaly.to_bytes(),
                    key=anomaly.key().encode(),
                    source_topic=Anomaly.topic,
                    error=f"correlated, but not stored in the anomaly history: {reason}",
                    consumer=CORRELATE_AGENT,
                )
        horizon = history.prune_before(correlator.event_time())
        if horizon is not None:
            deleted = await in_db(lambda: store.prune_anomalies(horizon), "pruning anomalies")
            if deleted:
                log.info("pruned %d anomalies older than the retention", deleted)

    changelog_known = False

    async def checkpoint() -> None:
        nonlocal last_checkpoint, changelog_known
        async with lock:
            if not pending and not correlator.dirty:
                return
            # What the acked events caused must be durable before the state that no longer causes it.
            await store_history()
            await app.producer.flush()
            if not changelog_known:
                # A changelog topic Faust has just created can be missing from the producer's metadata;
                # the first table write then fails in key_partition (no partitions known) and crashes
                # the agent for good. Wait until the producer knows the topic's partitions.
                producer = app.producer._ensure_producer()  # type: ignore[attr-defined]
                await producer.partitions_for(table.changelog_topic.get_topic_name())
                changelog_known = True
            for cluster in sorted(correlator.dirty):
                if cluster in correlator.engines:
                    table[cluster.encode()] = correlator.state(cluster)
            correlator.dirty.clear()
            acked, pending[:] = list(pending), []
            for stream, event in acked:
                await stream.ack(event)
            last_checkpoint = clock()

    def checkpoint_due() -> bool:
        return bool(pending or correlator.dirty) and clock() - last_checkpoint >= opts.checkpoint_s

    @app.agent(topics.anomalies, name=ROUTE_AGENT)
    async def correlate_route(stream):  # type: ignore[no-untyped-def]
        async for item in stream.events():
            anomaly = await pipeline.decode(Anomaly, item.value, item.key, consumer=ROUTE_AGENT)
            if anomaly is None:
                continue
            cluster = anomaly.labels.get("cluster") or DEFAULT_CLUSTER
            await by_cluster.send(key=cluster.encode(), value=item.value, headers={KIND_HEADER: ANOMALY.encode()})

    if opts.topology_from_metrics:
        facts = TopologyFilter(opts.topology_refresh_s)

        @app.agent(topics.metrics, name=TOPOLOGY_AGENT)
        async def correlate_topology(stream):  # type: ignore[no-untyped-def]
            async for raw in stream:
                found = facts.facts(raw)
                if found is not None:
                    cluster, labels, ts = found
                    value = json.dumps({"labels": labels, "ts": ts}).encode()
                    await by_cluster.send(key=cluster.encode(), value=value, headers={KIND_HEADER: TOPOLOGY.encode()})

    @app.agent(topics.remediations, name=REMEDIATION_AGENT)
    async def correlate_remediations(stream):  # type: ignore[no-untyped-def]
        # a run that began acting holds its incident open until it ends; one whose verification passed
        # mitigates it, and the incident then resolves when its alerts stay clear. The command goes
        # through the cluster topic so it is ordered with the anomalies and replayed like them after a
        # restart.
        async for item in stream.events():
            event = await pipeline.decode(RemediationEvent, item.value, item.key, consumer=REMEDIATION_AGENT)
            if event is None or event.step or not (event.status == "running" or event.status in RUN_ENDED):
                continue
            value = json.dumps(
                {"incident_id": event.incident_id, "run_id": event.run_id, "status": event.status}
            ).encode()
            for cluster in sorted(set(correlator.engines) | {DEFAULT_CLUSTER}):
                await by_cluster.send(key=cluster.encode(), value=value, headers={KIND_HEADER: RUN.encode()})

    @app.agent(by_cluster, name=CORRELATE_AGENT)
    async def correlate(stream):  # type: ignore[no-untyped-def]
        if not loaded.is_set():
            await load_silences()
        acking = stream.noack()
        async for event in acking.events():
            cluster = (event.key or DEFAULT_CLUSTER.encode()).decode("utf-8", "replace")
            kind = _header(event, KIND_HEADER)
            partition, offset = event.message.partition, event.message.offset
            async with lock:
                if cluster not in correlator.engines:
                    correlator.engine(cluster, table.get(cluster.encode()))
                if correlator.applied(cluster, partition, offset):
                    await acking.ack(event)  # in the checkpoint already: its offset was not committed
                    continue
                actions: list[Action] = []
                if kind == TICK:
                    ticking.discard(cluster)
                    actions = correlator.tick(cluster, float(json.loads(event.value)["now"]))
                elif kind == TOPOLOGY:
                    fact = json.loads(event.value)
                    correlator.observe(cluster, fact["labels"], float(fact["ts"]))
                elif kind == RUN:
                    run = json.loads(event.value)
                    actions = correlator.run(cluster, str(run["incident_id"]), str(run["run_id"]), str(run["status"]))
                elif kind == MITIGATE:  # written before runs were followed: replayed after an upgrade
                    actions = correlator.mitigate(cluster, str(json.loads(event.value)["incident_id"]))
                else:
                    anomaly = await pipeline.decode(Anomaly, event.value, event.key, consumer=CORRELATE_AGENT)
                    if anomaly is not None:
                        anomaly = correlator.resolve(cluster, anomaly)  # the history row names the GPU too
                        actions = correlator.ingest(cluster, anomaly)
                        history.add(anomaly)  # every anomaly, also one the engine drops as a redelivery
                correlator.advance(cluster, partition, offset)
                await emit(actions)
                pending.append((acking, event))
                if history.full():
                    await store_history()
            if checkpoint_due():
                await checkpoint()

    @app.timer(interval=opts.tick_s)
    async def correlate_tick() -> None:
        for cluster in list(correlator.engines):
            now = correlator.tick_time(cluster)
            engine = correlator.engines.get(cluster)
            if now is None or engine is None or cluster in ticking or (engine.clock or 0.0) >= now:
                continue
            ticking.add(cluster)
            value = json.dumps({"now": now}).encode()
            await by_cluster.send(key=cluster.encode(), value=value, headers={KIND_HEADER: TICK.encode()})
        if checkpoint_due():
            await checkpoint()

    @app.timer(interval=opts.silence_poll_s)
    async def correlate_silences() -> None:
        silences = await in_db(store.silences, "reading silences")
        async with lock:
            correlator.set_silences(silences)

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # faust types the receiver too narrowly
    async def on_revoked(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        # Another worker takes these clusters over from the table: hand it our latest state.
        await checkpoint()
        async with lock:
            correlator.forget()
            ticking.clear()

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def on_shutdown(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        await checkpoint()
        await asyncio.get_running_loop().run_in_executor(db, store.close)

    return correlator
