"""Feed the live diagnostician's :class:`~services.diagnostician.tools.ChangeLog` (rollouts).

The ``recent_changes`` evidence tool tells a bad rollout from other causes by the Deployment
controller's ``ScalingReplicaSet`` events. The offline evaluation fills its change log from the
simulator; the live service fills it here, from what the cluster reports:

1. :func:`current_replica_sets` asks the Kubernetes API for each Deployment's current ReplicaSet (the
   owned ReplicaSet with the highest ``deployment.kubernetes.io/revision``), what ``kubectl get rs``
   shows. Without it the first scale-up seen of a deployment cannot be told from a rollout. No API
   (outside a cluster, no kubeconfig, no RBAC) is logged and the log starts empty.
2. :class:`ChangeFeed` reads ``telemetry.events.v1`` (the Kubernetes events ``medic ingest watch-k8s``
   publishes) on a thread, from ``lookback_s`` ago, with no consumer group: every diagnostician
   replica sees every change. Messages that are not KubeEvents are skipped here (the detect role
   dead-letters them already); the feed never stops on one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from services.core.errors import EventError
from services.core.events import KubeEvent
from services.core.settings import Settings
from services.diagnostician.tools import ChangeLog

log = logging.getLogger(__name__)

REVISION = "deployment.kubernetes.io/revision"


def current_replica_sets(api: Any) -> dict[str, str]:
    """Deployment name -> its current ReplicaSet, from a kubernetes ``ApiClient`` (``{}`` if unavailable)."""
    from kubernetes import client

    try:
        items = client.AppsV1Api(api).list_replica_set_for_all_namespaces(_request_timeout=10).items
    except Exception as exc:  # no cluster, no permission, API down: diagnose without the seed
        log.warning("cannot list ReplicaSets (%s): rollouts seen before the first scale-up may read as scales", exc)
        return {}
    best: dict[str, tuple[int, str]] = {}
    for rs in items:
        meta = rs.metadata
        if meta is None or not meta.name:
            continue
        owner = next((o.name for o in meta.owner_references or [] if o.kind == "Deployment"), None)
        if owner is None:
            continue
        try:
            revision = int((meta.annotations or {}).get(REVISION, "0"))
        except ValueError:
            revision = 0
        if owner not in best or revision > best[owner][0]:
            best[owner] = (revision, str(meta.name))
    return {deployment: name for deployment, (_, name) in best.items()}


class ChangeFeed:
    """Keeps a :class:`ChangeLog` up to date from ``telemetry.events.v1``.

    Args:
        settings: Kafka address and topic prefix.
        changes: the log to feed (shared with the diagnostician).
        lookback_s: how far back the feed starts, so a restarted diagnostician knows recent rollouts.
    """

    def __init__(self, settings: Settings, changes: ChangeLog, *, lookback_s: float = 3600.0) -> None:
        self.settings = settings
        self.changes = changes
        self.lookback_s = lookback_s
        self.observed = 0
        self.skipped = 0
        self.caught_up = threading.Event()

    def start(self, stop: threading.Event) -> threading.Thread:
        """Run :meth:`run` on a daemon thread."""
        thread = threading.Thread(target=self.run, args=(stop,), name="change-feed", daemon=True)
        thread.start()
        return thread

    def run(self, stop: threading.Event) -> None:
        """Read events until ``stop`` is set; a Kafka error is logged and retried, never raised."""
        while not stop.is_set():
            try:
                self._follow(stop)
            except Exception:
                log.exception("change feed: reading %s failed; retrying", KubeEvent.topic)
                stop.wait(5.0)

    def _follow(self, stop: threading.Event) -> None:
        topic = self.settings.topic(KubeEvent.topic)
        consumer = KafkaConsumer(
            bootstrap_servers=self.settings.bootstrap_servers, group_id=None, enable_auto_commit=False
        )
        try:
            partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
            if not partitions:
                raise EventError(f"topic {topic} has no partitions yet")
            consumer.assign(partitions)
            self._seek(consumer, partitions)
            ends: Mapping[TopicPartition, int] = consumer.end_offsets(partitions)
            while not stop.is_set():
                for records in consumer.poll(timeout_ms=500).values():
                    for record in records:
                        self._observe(record.value)
                if not self.caught_up.is_set() and all(consumer.position(tp) >= ends[tp] for tp in partitions):
                    self.caught_up.set()
        finally:
            consumer.close()

    def _seek(self, consumer: KafkaConsumer, partitions: list[TopicPartition]) -> None:
        since_ms = int((time.time() - self.lookback_s) * 1000)
        found = consumer.offsets_for_times({tp: since_ms for tp in partitions})
        for tp in partitions:
            offset = found.get(tp)
            if offset is None:
                consumer.seek_to_end(tp)
            else:
                consumer.seek(tp, offset.offset)

    def _observe(self, raw: bytes | None) -> None:
        try:
            event = KubeEvent.from_bytes(raw or b"")
        except EventError:
            self.skipped += 1
            return
        if self.changes.observe(event) is not None:
            self.observed += 1
