"""The diagnostician service: consume ``incidents.v1``, diagnose, store, publish ``diagnoses.v1``.

A consumer-group loop (services.core.consumer; not a Faust agent: diagnosing is request/response work
with a database and, optionally, an LLM call). A crash re-diagnoses at most one poll's incidents
(at-least-once; a repeated diagnosis is a new row, harmless).

Only ``opened`` and ``updated`` events of an incident still open are diagnosed (:func:`diagnosable`): a
mitigated or resolved incident needs no new diagnosis. An ``updated`` event of a mitigated incident
(its remedy verified; alerts of the recovery itself, such as a replacement replica's startup probe,
still joining) proposing a second remedy did harm in the demo: an approved rollback of the deployment
whose lost replica had just been replaced. A member firing again reopens the incident, and it is
diagnosed again. A message that is not an IncidentEvent goes to ``deadletter.v1`` and the loop goes on.
"""

from __future__ import annotations

import logging
import threading
import time

from services.core.bus import KafkaPublisher
from services.core.consumer import consume
from services.core.errors import ClusterMedicError, EventError
from services.core.events import DeadLetter, IncidentEvent
from services.core.settings import Settings
from services.diagnostician.changefeed import ChangeFeed, current_replica_sets
from services.diagnostician.diagnostician import (
    Diagnostician,
    RankerDiagnostician,
    diagnose_incident,
    make_diagnostician,
)
from services.diagnostician.tools import ChangeLog

log = logging.getLogger(__name__)

CONSUMER = "diagnostician"
DIAGNOSED_KINDS = frozenset({"opened", "updated"})


def diagnosable(incident: IncidentEvent) -> bool:
    """Whether an incident event is diagnosed: an opening or an update of an incident still open."""
    return incident.kind in DIAGNOSED_KINDS and incident.labels.get("state", "open") == "open"


def run(
    settings: Settings,
    *,
    diagnostician: Diagnostician | None = None,
    stop: threading.Event | None = None,
    max_messages: int | None = None,
    poll_timeout_ms: int = 500,
) -> int:
    """Consume incidents until ``stop`` is set or ``max_messages`` were handled; return how many were.

    Args:
        settings: Kafka, database and diagnostician settings.
        diagnostician: default :func:`make_diagnostician` of the settings.
        stop: set it to end the loop after the current poll.
        max_messages: end after this many messages (tests, one-shot runs).
        poll_timeout_ms: how long one poll waits for messages.

    Raises:
        InfraNotReady: Kafka is unreachable at start.
    """
    doctor = diagnostician or make_diagnostician(settings)
    stop = stop or threading.Event()
    feed_stop = threading.Event()
    if settings.diagnostician_change_feed:
        start_change_feed(settings, doctor, feed_stop)
    try:
        return consume(
            settings,
            IncidentEvent.topic,
            CONSUMER,
            lambda raw, key, publisher: handle(raw, key, settings, doctor, publisher),
            stop=stop,
            max_messages=max_messages,
            poll_timeout_ms=poll_timeout_ms,
        )
    finally:
        feed_stop.set()


def start_change_feed(settings: Settings, doctor: Diagnostician, stop: threading.Event) -> ChangeFeed | None:
    """Give the diagnostician's ranker a change log fed from the cluster's events (rollout evidence).

    Seeded with each Deployment's current ReplicaSet when the Kubernetes API answers; None when the
    diagnostician has no ranker to feed.
    """
    ranker = doctor if isinstance(doctor, RankerDiagnostician) else getattr(doctor, "ranker", None)
    if not isinstance(ranker, RankerDiagnostician):
        return None
    if ranker.change_log is None:  # a log given by the caller keeps its own seed: no API call
        seed: dict[str, str] = {}
        try:
            from services.ingest.kube import api_client

            seed = current_replica_sets(api_client(settings))
        except Exception as exc:  # no kubeconfig and not in a cluster: rollouts still come from the events
            log.info("no Kubernetes API for the ReplicaSet seed (%s)", exc)
        ranker.change_log = ChangeLog(seed)
    feed = ChangeFeed(settings, ranker.change_log, lookback_s=settings.diagnostician_change_lookback_s)
    feed.start(stop)
    return feed


def handle(raw: bytes, key: bytes | None, settings: Settings, doctor: Diagnostician, publisher: KafkaPublisher) -> None:
    """Diagnose one incidents.v1 message; bad input goes to the dead-letter topic, never raises for it."""
    try:
        incident = IncidentEvent.from_bytes(raw)
    except EventError as exc:
        publisher.publish(
            DeadLetter.of(
                raw=raw,
                source_topic=IncidentEvent.topic,
                error=exc,
                consumer=CONSUMER,
                ts=time.time(),
                source_key=key,
            )
        )
        return
    if not diagnosable(incident):
        return
    try:
        diagnosis = diagnose_incident(incident, settings, diagnostician=doctor, publisher=publisher)
    except ClusterMedicError as exc:
        # the store or the bus failed: log and go on; the incident is re-diagnosed on its next update
        log.error("cannot diagnose %s: %s", incident.incident_id, exc)
        return
    top = diagnosis.hypotheses[0].cause if diagnosis.hypotheses else "none"
    log.info("diagnosed %s: %s in %.1f ms", incident.incident_id, top, diagnosis.latency_ms)
