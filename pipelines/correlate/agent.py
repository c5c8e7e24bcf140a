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

**Code.** This module wires Faust: the topics, the state table, the agents and timers, each a thin
loop over one method of :class:`~pipelines.correlate.role.CorrelateRole`, which does the work and
reaches Kafka only through :class:`FaustPorts`. The engines without I/O are in
:mod:`pipelines.correlate.correlator`, the PostgreSQL store in :mod:`pipelines.correlate.store`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pipelines.app import Pipeline, PipelinePorts
from pipelines.correlate.correlator import Correlator
from pipelines.correlate.history import AnomalyHistory
from pipelines.correlate.role import (
    BY_CLUSTER_TOPIC,
    CORRELATE_AGENT,
    KIND_HEADER,
    REMEDIATION_AGENT,
    ROUTE_AGENT,
    STATE_TABLE,
    TOPOLOGY_AGENT,
    CorrelateOptions,
    CorrelateRole,
    Notify,
)
from pipelines.correlate.store import CorrelateStore, PostgresCorrelateStore
from services.alerting.config import RoutingConfig
from services.core.events import IncidentEvent


class FaustPorts(PipelinePorts):
    """:class:`~pipelines.correlate.role.CorrelatePorts` on the Faust app: the cluster topic, the
    state table, the producer."""

    def __init__(self, pipeline: Pipeline, by_cluster: Any, table: Any) -> None:
        super().__init__(pipeline)
        self.by_cluster = by_cluster
        self.table = table
        self._changelog_known = False

    async def to_cluster(self, cluster: str, value: bytes, kind: str) -> None:
        await self.by_cluster.send(key=cluster.encode(), value=value, headers={KIND_HEADER: kind.encode()})

    async def publish_incident(self, event: IncidentEvent) -> None:
        await self.pipeline.topics.incidents.send(key=event.key().encode(), value=event.to_bytes())

    async def flush(self) -> None:
        app = self.pipeline.app
        await app.producer.flush()
        if not self._changelog_known:
            # A changelog topic Faust has just created can be missing from the producer's metadata; the
            # first table write then fails in key_partition (no partitions known) and crashes the agent
            # for good. Wait until the producer knows the topic's partitions.
            producer = app.producer._ensure_producer()  # type: ignore[attr-defined]
            await producer.partitions_for(self.table.changelog_topic.get_topic_name())
            self._changelog_known = True

    def saved_state(self, cluster: str) -> bytes | None:
        saved: bytes | None = self.table.get(cluster.encode())
        return saved

    async def save_state(self, cluster: str, state: bytes) -> None:
        self.table[cluster.encode()] = state


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
        notify: receives every notification decision (see :data:`~pipelines.correlate.role.Notify`).
        store: incidents out, silences in; default :class:`~pipelines.correlate.store.PostgresCorrelateStore`.
        clock: monotonic wall clock for ticks and checkpoint pacing.
        options: timing; see :class:`~pipelines.correlate.role.CorrelateOptions`.

    Returns:
        The :class:`~pipelines.correlate.correlator.Correlator` holding the engines (for inspection in
        tests and benchmarks).
    """
    opts = options or CorrelateOptions()
    app, topics, settings = pipeline.app, pipeline.topics, pipeline.settings
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
    role = CorrelateRole(
        Correlator(config, clock, rate=opts.clock_rate),
        FaustPorts(pipeline, by_cluster, table),
        store or PostgresCorrelateStore(settings),
        notify,
        AnomalyHistory(settings.anomaly_retention_s, opts.anomaly_batch, opts.anomaly_prune_s),
        clock,
        opts,
    )

    @app.agent(topics.anomalies, name=ROUTE_AGENT)
    async def correlate_route(stream):  # type: ignore[no-untyped-def]
        async for item in stream.events():
            await role.route(item)

    if opts.topology_from_metrics:

        @app.agent(topics.metrics, name=TOPOLOGY_AGENT)
        async def correlate_topology(stream):  # type: ignore[no-untyped-def]
            async for raw in stream:
                await role.topology(raw)

    @app.agent(topics.remediations, name=REMEDIATION_AGENT)
    async def correlate_remediations(stream):  # type: ignore[no-untyped-def]
        async for item in stream.events():
            await role.remediation(item)

    @app.agent(by_cluster, name=CORRELATE_AGENT)
    async def correlate(stream):  # type: ignore[no-untyped-def]
        acking = stream.noack()
        async for event in acking.events():
            await role.apply(acking, event)
            if role.checkpoint_due():
                await role.checkpoint()

    @app.timer(interval=opts.tick_s)
    async def correlate_tick() -> None:
        await role.tick()
        if role.checkpoint_due():
            await role.checkpoint()

    @app.timer(interval=opts.silence_poll_s)
    async def correlate_silences() -> None:
        await role.poll_silences()

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # faust types the receiver too narrowly
    async def on_revoked(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        await role.revoked()

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def on_shutdown(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        await role.shutdown()

    return role.correlator
