"""The correlate role's work, one named method per thing it does; the Faust agents only loop over them.

:class:`CorrelateRole` routes what arrives (anomalies, topology facts, remediation runs) onto the
cluster-keyed topic, applies each message of that topic to its cluster's engine, acts on the result,
and checkpoints. It reaches Kafka and the engine-state table only through :class:`CorrelatePorts`,
which :func:`pipelines.correlate.agent.register_correlate` implements with Faust; a unit test gives it
an in-memory one and checks the ack/checkpoint protocol without a broker:

* an applied message is acked only by the checkpoint that includes it;
* before that checkpoint writes the engine state, the actions the message caused are out (incident
  events published and upserted, the anomaly history written, the producer flushed);
* after a crash, a redelivered message already in the restored state is acked and not applied again.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pipelines.correlate.correlator import DEFAULT_CLUSTER, RUN_ENDED, Correlator, TopologyFilter
from pipelines.correlate.history import AnomalyHistory
from pipelines.correlate.model import Action
from pipelines.correlate.store import CorrelateStore
from services.alerting.notification import Notification
from services.core.events import Anomaly, Event, IncidentEvent, RemediationEvent

log = logging.getLogger(__name__)

T = TypeVar("T")
E = TypeVar("E", bound=Event)

ROUTE_AGENT = "correlate-route"
TOPOLOGY_AGENT = "correlate-topology"
REMEDIATION_AGENT = "correlate-remediations"
CORRELATE_AGENT = "correlate"
BY_CLUSTER_TOPIC = "correlate.by-cluster.v1"
STATE_TABLE = "correlate-engine-state"
KIND_HEADER = "clustermedic-kind"
ANOMALY, TICK, TOPOLOGY, MITIGATE = "anomaly", "tick", "topology", "mitigate"
RUN = "run"  # a remediation run began or ended: {"incident_id", "run_id", "status"}

Notify = Callable[[Notification], None]
"""Hands one notification decision to the notify stage (called in a worker thread; may block).

The entrypoint that registers the role injects it (``medic pipeline --role correlate`` enqueues on the
Celery notify stage, :func:`services.notify.tasks.enqueue`): the pipeline never imports the notify
service itself."""


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


class CorrelatePorts(Protocol):
    """What the role needs of Kafka and of the engine-state table."""

    async def to_cluster(self, cluster: str, value: bytes, kind: str) -> None:
        """Send a message onto the cluster-keyed topic, with its kind header."""

    async def publish_incident(self, event: IncidentEvent) -> None:
        """Publish an incident event on ``incidents.v1``."""

    async def flush(self) -> None:
        """Wait until everything sent so far is on the broker."""

    def saved_state(self, cluster: str) -> bytes | None:
        """The engine state last checkpointed for a cluster."""

    async def save_state(self, cluster: str, state: bytes) -> None:
        """Checkpoint a cluster's engine state."""

    async def decode(self, cls: type[E], raw: bytes | None, key: bytes | None, *, consumer: str) -> E | None:
        """Decode a message, or dead-letter it and return None."""

    async def dead_letter(
        self, *, raw: bytes, key: bytes | None, source_topic: str, error: BaseException | str, consumer: str
    ) -> None:
        """Send a message that could not be accepted to ``deadletter.v1`` with the reason."""


class Acker(Protocol):
    """The stream a message came from (Faust's ``stream.noack()``): it acks what the role processed."""

    def ack(self, event: Any) -> Awaitable[Any]:
        """Acknowledge one event."""


def message_kind(event: Any) -> str:
    """The kind header of a cluster-topic message (``anomaly`` when it has none)."""
    headers = getattr(event, "headers", None) or getattr(event.message, "headers", None) or ()
    items: Iterable[tuple[str, Any]] = headers.items() if isinstance(headers, Mapping) else headers
    for key, value in items:
        if key == KIND_HEADER:
            return value.decode() if isinstance(value, bytes) else str(value)
    return ANOMALY


class CorrelateRole:
    """The correlate role's state and its steps (the module docstring says how they fit).

    Args:
        correlator: the engines.
        ports: Kafka and the state table (see :class:`CorrelatePorts`).
        store: incidents and the anomaly history out, silences in.
        notify: receives every notification decision.
        history: the anomaly history batcher.
        clock: monotonic wall clock for checkpoint pacing.
        options: timing.
    """

    def __init__(
        self,
        correlator: Correlator,
        ports: CorrelatePorts,
        store: CorrelateStore,
        notify: Notify,
        history: AnomalyHistory,
        clock: Callable[[], float],
        options: CorrelateOptions,
    ) -> None:
        self.correlator = correlator
        self.ports = ports
        self.store = store
        self.notify = notify
        self.history = history
        self.clock = clock
        self.options = options
        self.facts = TopologyFilter(options.topology_refresh_s)
        self.db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="correlate-db")  # one connection, in order
        self.lock = asyncio.Lock()  # apply+emit and checkpoint never interleave
        self.pending: list[tuple[Acker, Any]] = []  # (stream, event) applied and emitted, not yet acked
        self.ticking: set[str] = set()  # clusters with a tick message on its way
        self.loaded = asyncio.Event()
        self.last_checkpoint = clock()

    # ------------------------------------------------------------------ onto the cluster topic

    async def route(self, item: Any) -> None:
        """An anomaly: forward its raw bytes keyed by its ``cluster`` label (bad input is dead-lettered)."""
        anomaly = await self.ports.decode(Anomaly, item.value, item.key, consumer=ROUTE_AGENT)
        if anomaly is not None:
            await self.ports.to_cluster(anomaly.labels.get("cluster") or DEFAULT_CLUSTER, item.value, ANOMALY)

    async def topology(self, raw: bytes | None) -> None:
        """A metric batch: forward the topology fact it states, when new, changed or stale."""
        found = self.facts.facts(raw)
        if found is not None:
            cluster, labels, ts = found
            await self.ports.to_cluster(cluster, json.dumps({"labels": labels, "ts": ts}).encode(), TOPOLOGY)

    async def remediation(self, item: Any) -> None:
        """A run-level remediation event: a run that began acting holds its incident open until it ends;
        one whose verification passed mitigates it. It goes to every cluster (the event names no
        cluster; an engine without the incident ignores it), ordered with the anomalies."""
        event = await self.ports.decode(RemediationEvent, item.value, item.key, consumer=REMEDIATION_AGENT)
        if event is None or event.step or not (event.status == "running" or event.status in RUN_ENDED):
            return
        value = json.dumps({"incident_id": event.incident_id, "run_id": event.run_id, "status": event.status})
        for cluster in sorted(set(self.correlator.engines) | {DEFAULT_CLUSTER}):
            await self.ports.to_cluster(cluster, value.encode(), RUN)

    async def tick(self) -> None:
        """Send each cluster's tick (engine time now) through the topic, one in flight per cluster."""
        for cluster in list(self.correlator.engines):
            now = self.correlator.tick_time(cluster)
            engine = self.correlator.engines.get(cluster)
            if now is None or engine is None or cluster in self.ticking or (engine.clock or 0.0) >= now:
                continue
            self.ticking.add(cluster)
            await self.ports.to_cluster(cluster, json.dumps({"now": now}).encode(), TICK)

    # ---------------------------------------------------------------------------- applying

    async def apply(self, acking: Acker, event: Any) -> None:
        """Apply one cluster-topic message to its cluster's engine and act on the result.

        It is acked later, by the checkpoint that includes it; one already in the restored state
        (redelivered after a crash) is acked at once and not applied again.
        """
        if not self.loaded.is_set():
            await self.load_silences()
        cluster = (event.key or DEFAULT_CLUSTER.encode()).decode("utf-8", "replace")
        kind = message_kind(event)
        partition, offset = event.message.partition, event.message.offset
        correlator = self.correlator
        async with self.lock:
            if cluster not in correlator.engines:
                correlator.engine(cluster, self.ports.saved_state(cluster))
            if correlator.applied(cluster, partition, offset):
                await acking.ack(event)  # in the checkpoint already: its offset was not committed
                return
            actions: list[Action] = []
            if kind == TICK:
                self.ticking.discard(cluster)
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
                anomaly = await self.ports.decode(Anomaly, event.value, event.key, consumer=CORRELATE_AGENT)
                if anomaly is not None:
                    anomaly = correlator.resolve(cluster, anomaly)  # the history row names the GPU too
                    actions = correlator.ingest(cluster, anomaly)
                    self.history.add(anomaly)  # every anomaly, also one the engine drops as a redelivery
            correlator.advance(cluster, partition, offset)
            await self.emit(actions)
            self.pending.append((acking, event))
            if self.history.full():
                await self.store_history()

    async def emit(self, actions: Sequence[Action]) -> None:
        """Publish and upsert the incident events; hand each notification decision to ``notify``."""
        incidents = [a for a in actions if isinstance(a, IncidentEvent)]
        for event in incidents:
            await self.ports.publish_incident(event)
        if incidents:
            await self.in_db(lambda: self.store.save_incidents(incidents), "saving incidents")
        for action in actions:
            if isinstance(action, Notification):
                try:
                    await asyncio.to_thread(self.notify, action)
                except Exception:  # the notify stage owns retries; a bug there must not stop correlation
                    log.exception("notify failed for group %s", action.group_key)

    # ---------------------------------------------------------------------- checkpoints

    def checkpoint_due(self) -> bool:
        """Whether something waits to be checkpointed and ``checkpoint_s`` has passed since the last one."""
        waiting = bool(self.pending or self.correlator.dirty)
        return waiting and self.clock() - self.last_checkpoint >= self.options.checkpoint_s

    async def checkpoint(self) -> None:
        """Make what the pending messages caused durable, then the engine states, then ack them."""
        async with self.lock:
            if not self.pending and not self.correlator.dirty:
                return
            # What the acked events caused must be durable before the state that no longer causes it.
            await self.store_history()
            await self.ports.flush()
            for cluster in sorted(self.correlator.dirty):
                if cluster in self.correlator.engines:
                    await self.ports.save_state(cluster, self.correlator.state(cluster))
            self.correlator.dirty.clear()
            acked, self.pending[:] = list(self.pending), []
            for stream, event in acked:
                await stream.ack(event)
            self.last_checkpoint = self.clock()

    async def store_history(self) -> None:
        """Write the pending anomalies (one round trip) and prune the history when it is due."""
        batch = self.history.take()
        if batch:
            rejected = await self.in_db(lambda: self.store.save_anomalies(batch), "saving anomalies")
            for anomaly, reason in rejected:
                await self.ports.dead_letter(
                    raw=anomaly.to_bytes(),
                    key=anomaly.key().encode(),
                    source_topic=Anomaly.topic,
                    error=f"correlated, but not stored in the anomaly history: {reason}",
                    consumer=CORRELATE_AGENT,
                )
        horizon = self.history.prune_before(self.correlator.event_time())
        if horizon is not None:
            deleted = await self.in_db(lambda: self.store.prune_anomalies(horizon), "pruning anomalies")
            if deleted:
                log.info("pruned %d anomalies older than the retention", deleted)

    # ---------------------------------------------------------------- silences and lifecycle

    async def load_silences(self) -> None:
        """Read the silences once before the first message is applied."""
        self.correlator.set_silences(await self.in_db(self.store.silences, "reading silences"))
        self.loaded.set()

    async def poll_silences(self) -> None:
        """Re-read the silences (API and CLI changes) into every engine."""
        silences = await self.in_db(self.store.silences, "reading silences")
        async with self.lock:
            self.correlator.set_silences(silences)

    async def revoked(self) -> None:
        """Partitions moved to another worker: hand it our latest state, then forget the engines."""
        await self.checkpoint()
        async with self.lock:
            self.correlator.forget()
            self.ticking.clear()

    async def shutdown(self) -> None:
        """Checkpoint and close the store."""
        await self.checkpoint()
        await asyncio.get_running_loop().run_in_executor(self.db, self.store.close)

    async def in_db(self, work: Callable[[], T], what: str) -> T:
        """Run blocking store work on the database thread, retrying until it succeeds."""
        delay = 0.2
        while True:
            try:
                return await asyncio.get_running_loop().run_in_executor(self.db, work)
            except Exception as exc:  # the store may fail in many ways (server gone, lock timeout...): retry all
                log.error("%s failed (retrying in %.1f s): %s", what, delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.options.retry_max_s)
