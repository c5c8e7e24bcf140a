"""The notifier: the tail of the flow. Diagnoses and remediation runs reach humans.

``medic notifier`` consumes ``incidents.v1``, ``diagnoses.v1`` and ``remediations.v1`` in one
consumer group and enqueues deliveries on the Celery notify stage (:func:`services.notify.tasks.enqueue`),
routed by the same routing tree as the alerts (``infra/config/routing.yaml``): the labels of the
incident's alerts select the routes, as they do in correlate.

* A **diagnosis** notifies the incident's receivers with its root cause, confidence and proposed
  action (and ``notes`` when an action was withheld). One that says what the last one said (same
  cause, confidence to the percent, playbook, level and notes) is recorded, not sent again: the
  diagnostician re-diagnoses every incident update.
* A **remediation event** notifies them with the run's status and step. ``awaiting_approval`` renders
  the Approve/Reject buttons (their values carry the run id only) in the incident's Slack thread.
* A ``paged`` run **pages**: it is routed as if every alert of the incident were critical, so the
  tree's critical route (PagerDuty, ``dedup_key`` = incident id) takes it whatever the alerts'
  severity; the notification says ``firing`` even when the alerts have resolved. A diagnosis that
  arrives while the page is open is routed the same way, so the page gets its root cause.
* The incident's **resolved** event sends a resolved notification to every receiver the notifier
  notified about it (PagerDuty ``resolve`` for what it paged), mute intervals or not: what the
  notifier opened, it closes. Correlate's own notifications resolve what correlate triggered.
* The **resolved** event also asks for the incident's post-incident report
  (:func:`services.reports.tasks.enqueue_report`, the ``reports`` queue), with the receivers notified
  about it: the task posts the report's summary in their Slack threads. A redelivered resolved event
  asks again; the task renders one report per incident version.

Nothing orders one topic against another: the records of one poll are handled in the order they
were produced, and an event that arrives before its incident is kept (:mod:`services.notify.state`)
and notified when the incident arrives. Every notification is stamped
with its event's time (telemetry time), and its idempotency key names the event
(:func:`~services.notify.ledger.idempotency_key`): a redelivered message notifies once.

The consumer never crashes: a message that does not parse goes to ``deadletter.v1`` and the loop
goes on; while Redis or the Celery broker is unreachable the same message is retried with backoff
(at-least-once: the ledger drops the copies).
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis
from kafka import KafkaConsumer
from kafka.errors import KafkaError

from services.alerting.config import RoutingConfig
from services.alerting.notification import Notification
from services.alerting.routes import Route, build_route_tree, time_muted
from services.core.bus import SUBSCRIBER_METADATA_MAX_AGE_MS, KafkaPublisher
from services.core.errors import EventError, InfraNotReady
from services.core.events import AlertRef, DeadLetter, Diagnosis, Event, IncidentEvent, RemediationEvent
from services.core.settings import Settings
from services.notify.config import NotifySettings
from services.notify.state import MAX_PENDING, IncidentState, IncidentStore, RedisIncidentStore

log = logging.getLogger(__name__)

CONSUMER = "notifier"
TOPICS: tuple[str, ...] = (IncidentEvent.topic, Diagnosis.topic, RemediationEvent.topic)
PAGED = "paged"
RETRY_MAX_S = 10.0
"""Longest wait between two attempts at a message while Redis or the Celery broker is down."""


@dataclass(frozen=True)
class Outgoing:
    """One notification the notifier decided on, with what it renders along.

    Attributes:
        notification: the decision for one receiver.
        diagnosis: the incident's diagnosis, when known.
        remediation: the remediation event, when there is one.
        event: digest of the message that caused it (part of the idempotency key).
    """

    notification: Notification
    diagnosis: Diagnosis | None
    remediation: RemediationEvent | None
    event: str


Send = Callable[[Outgoing], None]
RequestReport = Callable[[IncidentEvent, tuple[str, ...]], None]
"""Asks for the report of a resolved incident, with the receivers notified about it."""


def event_digest(event: Event) -> str:
    """A digest of one message: equal for a redelivered copy, different for any other event."""
    return hashlib.sha256(f"{event.topic}\x00{event.model_dump_json()}".encode()).hexdigest()[:24]


def diagnosis_digest(diagnosis: Diagnosis) -> str:
    """What a human reads in a diagnosis: top cause, confidence to the percent, action and notes."""
    best = max(diagnosis.hypotheses, key=lambda h: h.confidence, default=None)
    said = (
        best.cause if best else "",
        f"{best.confidence:.2f}" if best else "",
        diagnosis.proposed_playbook or "",
        str(diagnosis.level),
        *diagnosis.notes,
    )
    return hashlib.sha256("\x00".join(said).encode()).hexdigest()[:24]


class IncidentFollower:
    """The notifier's decisions, one named method per topic (unit-tested without a broker).

    Each method reads the incident's record, hands its notifications to ``send`` and only then stores
    the new record: a crash in between repeats the notifications (the ledger drops the copies) and
    never loses one.

    Args:
        routing: the loaded routing.yaml.
        store: where incident records are kept.
        send: receives each decision (the service enqueues it on Celery).
        report: called with each resolved event and the receivers notified about its incident (the
            service enqueues the report task); None asks for no reports.
    """

    def __init__(
        self, routing: RoutingConfig, store: IncidentStore, send: Send, report: RequestReport | None = None
    ) -> None:
        self.routing = routing
        self.store = store
        self.send = send
        self.report = report
        self.tree = build_route_tree(routing.route)
        self.intervals = routing.named_intervals()

    # ------------------------------------------------------------------------------- topics

    def on_incident(self, event: IncidentEvent) -> None:
        """Record the incident; notify what waited for it; on ``resolved``, resolve what was notified."""
        state = self._state(event.incident_id)
        if state.incident is not None and event.ts < state.incident.ts:
            return  # an older copy overtaken by a later event: the record stays current
        state = state.model_copy(update={"incident": event})
        state = self._replay_pending(state)
        if event.kind == "resolved" and state.receivers:
            routes = self._routes(event, page=True, at=event.ts, muted_too=True)
            routes.update(self._routes(event, page=False, at=event.ts, muted_too=True))
            for receiver in state.receivers:
                if receiver in routes:
                    route, alerts = routes[receiver]
                    n = self._notification(route, alerts, event, status="resolved", reason="resolved", ts=event.ts)
                    self.send(Outgoing(n, state.diagnosis, state.remediation, event_digest(event)))
        if event.kind == "resolved" and self.report is not None:
            self.report(event, state.receivers)
        self.store.put(state)

    def on_diagnosis(self, diagnosis: Diagnosis) -> None:
        """Notify the incident's receivers of a diagnosis that says something new."""
        state = self._state(diagnosis.incident_id)
        if state.diagnosis is not None and diagnosis.ts < state.diagnosis.ts:
            log.info("diagnosis of %s older than the one notified: not sent", diagnosis.incident_id)
            return
        if state.incident is None:
            self.store.put(self._pend(state.model_copy(update={"diagnosis": diagnosis}), diagnosis))
            return
        self.store.put(self._diagnosis(state, diagnosis))

    def on_remediation(self, event: RemediationEvent) -> None:
        """Notify the incident's receivers of a run's progress; a ``paged`` run pages."""
        state = self._state(event.incident_id)
        latest = _later(state.remediation, event)
        if state.incident is None:
            self.store.put(self._pend(state.model_copy(update={"remediation": latest}), event))
            return
        self.store.put(self._remediation(state, event, latest))

    # ------------------------------------------------------------------------------ decisions

    def _diagnosis(self, state: IncidentState, diagnosis: Diagnosis) -> IncidentState:
        assert state.incident is not None
        digest = diagnosis_digest(diagnosis)
        if digest == state.diagnosis_digest:
            return state.model_copy(update={"diagnosis": diagnosis})
        # while a page is open, the page's receivers (PagerDuty) hear the diagnosis too
        page = state.remediation is not None and state.remediation.status == PAGED
        page = page and state.incident.kind != "resolved"
        sent = self._update(
            state.incident, diagnosis, state.remediation, event_digest(diagnosis), diagnosis.ts, page=page
        )
        return state.model_copy(
            update={"diagnosis": diagnosis, "diagnosis_digest": digest, "receivers": _union(state.receivers, sent)}
        )

    def _remediation(self, state: IncidentState, event: RemediationEvent, latest: RemediationEvent) -> IncidentState:
        assert state.incident is not None
        page = event.status == PAGED
        sent = self._update(state.incident, state.diagnosis, event, event_digest(event), event.ts, page=page)
        if page and not any(self.routing.receiver(r).pagerduty_configs for r in sent):
            log.warning(
                "run %s of incident %s pages, but no receiver it routes to has pagerduty_configs",
                event.run_id,
                event.incident_id,
            )
        return state.model_copy(update={"remediation": latest, "receivers": _union(state.receivers, sent)})

    def _update(
        self,
        incident: IncidentEvent,
        diagnosis: Diagnosis | None,
        remediation: RemediationEvent | None,
        event: str,
        ts: float,
        *,
        page: bool = False,
    ) -> list[str]:
        """Send one update per receiver the incident routes to; return the receivers."""
        sent = []
        for receiver, (route, alerts) in self._routes(incident, page=page, at=ts).items():
            if page:
                status = "firing"  # a page is meant: it fires whatever the alerts say now
            elif incident.kind == "resolved" or not any(a.status == "firing" for a in alerts):
                status = "resolved"  # never re-trigger what correlate resolved
            else:
                status = "firing"
            n = self._notification(route, alerts, incident, status=status, reason="update", ts=ts)
            self.send(Outgoing(n, diagnosis, remediation, event))
            sent.append(receiver)
        return sent

    def _routes(
        self, incident: IncidentEvent, *, page: bool, at: float, muted_too: bool = False
    ) -> dict[str, tuple[Route, list[AlertRef]]]:
        """The receivers the incident's alerts route to, each with its first route and its alerts.

        A page routes every alert as critical. Routes inside a mute interval (or outside their active
        ones) at ``at`` are left out unless ``muted_too``.
        """
        found: dict[str, tuple[Route, list[AlertRef]]] = {}
        members: list[tuple[AlertRef | None, dict[str, str]]] = [(a, dict(a.labels)) for a in incident.alerts]
        if not members:
            # an incident without alerts still has a severity and its topology labels
            members = [(None, {**incident.labels, "severity": incident.severity})]
        for alert, labels in members:
            if page:
                labels["severity"] = "critical"
            for route in self.tree.match(labels):
                if not muted_too and time_muted(route, self.intervals, at):
                    continue
                _, listed = found.setdefault(route.receiver, (route, []))
                if alert is not None and alert not in listed:
                    listed.append(alert)
        return found

    @staticmethod
    def _notification(
        route: Route, alerts: list[AlertRef], incident: IncidentEvent, *, status: str, reason: str, ts: float
    ) -> Notification:
        ordered = sorted(alerts, key=lambda a: (a.status != "firing", a.starts_at, a.fingerprint))
        group_labels = route.group_labels(ordered[0].labels) if ordered else {}
        return Notification(
            receiver=route.receiver,
            group_key=route.group_key(group_labels),
            group_labels=group_labels,
            incident_id=incident.incident_id,
            incident_ids=(incident.incident_id,),
            status=status,  # type: ignore[arg-type]
            reason=reason,  # type: ignore[arg-type]
            alerts=tuple(ordered),
            ts=ts,
        )

    # ---------------------------------------------------------------------------- the record

    def _state(self, incident_id: str) -> IncidentState:
        return self.store.get(incident_id) or IncidentState(incident_id=incident_id)

    @staticmethod
    def _pend(state: IncidentState, event: Diagnosis | RemediationEvent) -> IncidentState:
        item = (event.topic, event.model_dump_json())
        if item in state.pending:
            return state  # a redelivered copy waits once
        return state.model_copy(update={"pending": (*state.pending, item)[-MAX_PENDING:]})

    def _replay_pending(self, state: IncidentState) -> IncidentState:
        """Notify, in arrival order, the events that waited for the incident."""
        if not state.pending:
            return state
        # Only pending events set these (the incident was unknown): replay them as they were known then.
        pending = state.pending
        state = state.model_copy(update={"pending": (), "diagnosis": None, "remediation": None})
        for topic, raw in pending:
            if topic == Diagnosis.topic:
                state = self._diagnosis(state, Diagnosis.model_validate_json(raw))
            else:
                event = RemediationEvent.model_validate_json(raw)
                state = self._remediation(state, event, _later(state.remediation, event))
        return state


def _later(known: RemediationEvent | None, event: RemediationEvent) -> RemediationEvent:
    return event if known is None or event.ts >= known.ts else known


def _union(have: tuple[str, ...], more: list[str]) -> tuple[str, ...]:
    return have + tuple(r for r in dict.fromkeys(more) if r not in have)


# ----------------------------------------------------------------------------------- the loop


def handle(follower: IncidentFollower, topic: str, raw: bytes, key: bytes | None, publisher: KafkaPublisher) -> None:
    """Apply one message; one that does not parse goes to the dead-letter topic (never raises for it).

    Raises:
        redis.RedisError, OSError, and the Celery broker's connection errors: retry the message.
    """
    parse: dict[str, Callable[[bytes], Event]] = {
        IncidentEvent.topic: IncidentEvent.from_bytes,
        Diagnosis.topic: Diagnosis.from_bytes,
        RemediationEvent.topic: RemediationEvent.from_bytes,
    }
    try:
        event = parse[topic](raw)
    except EventError as exc:
        publisher.publish(
            DeadLetter.of(raw=raw, source_topic=topic, error=exc, consumer=CONSUMER, ts=time.time(), source_key=key)
        )
        return
    if isinstance(event, IncidentEvent):
        follower.on_incident(event)
    elif isinstance(event, Diagnosis):
        follower.on_diagnosis(event)
    elif isinstance(event, RemediationEvent):
        follower.on_remediation(event)


def _transient(exc: BaseException) -> bool:
    """Whether trying the same message again may work: Redis or the broker is unreachable."""
    from kombu.exceptions import OperationalError

    return isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OperationalError, ConnectionError, TimeoutError))


def run(
    settings: Settings,
    routing: RoutingConfig,
    *,
    notify_settings: NotifySettings | None = None,
    send: Send | None = None,
    report: RequestReport | None = None,
    stop: threading.Event | None = None,
    max_messages: int | None = None,
    poll_timeout_ms: int = 500,
) -> int:
    """Consume the three topics until ``stop`` is set or ``max_messages`` were handled; return how many.

    Args:
        settings: Kafka (address, topic and group prefixes) and Redis (``broker_url``).
        routing: the routing config (receivers, route tree, time intervals).
        notify_settings: the incident records' TTL and key prefix; default from the environment.
        send: where decisions go; default :func:`services.notify.tasks.enqueue` (Celery must be
            configured, as ``medic notifier`` does).
        report: where a resolved incident's report is asked for; default (with the default ``send``)
            :func:`services.reports.tasks.enqueue_report`. A caller that passes its own ``send`` gets no
            reports unless it passes this too.
        stop: set it to end the loop after the current poll.
        max_messages: end after this many messages (tests, one-shot runs).
        poll_timeout_ms: how long one poll waits.

    Raises:
        InfraNotReady: Kafka is unreachable at start.
    """
    ns = notify_settings or NotifySettings()
    if send is None:
        from services.notify.tasks import enqueue

        def send(out: Outgoing) -> None:
            enqueue(out.notification, routing, diagnosis=out.diagnosis, remediation=out.remediation, event=out.event)

        if report is None:
            from services.reports.tasks import enqueue_report

            def report(event: IncidentEvent, receivers: tuple[str, ...]) -> None:
                enqueue_report(event.incident_id, event.ts, routing, receivers)

    store = RedisIncidentStore(redis.Redis.from_url(settings.broker_url), ns.incident_ttl_s, ns.key_prefix)
    follower = IncidentFollower(routing, store, send, report)
    names = {settings.topic(t): t for t in TOPICS}
    try:
        kafka = KafkaConsumer(
            *names,
            bootstrap_servers=settings.bootstrap_servers,
            group_id=f"{settings.faust_app_id}-{CONSUMER}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            metadata_max_age_ms=SUBSCRIBER_METADATA_MAX_AGE_MS,
        )
    except KafkaError as exc:
        raise InfraNotReady(f"no Kafka broker at {settings.bootstrap_servers}: {exc}") from exc
    stop = stop or threading.Event()
    handled = 0
    try:
        with KafkaPublisher(settings) as publisher:
            # `medic stack` waits for this line: the role is connected and about to take messages
            log.info("ready: %s consumes %s", CONSUMER, ", ".join(names))
            while not stop.is_set() and (max_messages is None or handled < max_messages):
                batches = kafka.poll(timeout_ms=poll_timeout_ms, max_records=50)
                try:
                    # In the order they were produced, across topics (each partition keeps its own order):
                    # a run's event then follows the diagnosis that caused it when one poll holds both.
                    for record in heapq.merge(*batches.values(), key=lambda r: r.timestamp):
                        _handle_until_done(follower, names[record.topic], record.value, record.key, publisher, stop)
                        handled += 1
                except _Stopped:
                    break  # this poll is not committed: its messages are handled again after a restart
                if batches:
                    publisher.flush()
                    kafka.commit()
    finally:
        kafka.close()
    return handled


class _Stopped(Exception):
    """Asked to stop while a message was still waiting for Redis or the broker."""


def _handle_until_done(
    follower: IncidentFollower,
    topic: str,
    raw: bytes,
    key: bytes | None,
    publisher: KafkaPublisher,
    stop: threading.Event,
) -> None:
    """Handle one message, retrying while Redis or the broker is down; dead-letter it on a bug."""
    delay = 0.2
    while True:
        try:
            handle(follower, topic, raw, key, publisher)
            return
        except Exception as exc:  # the loop must outlive anything one message does
            if _transient(exc):
                if stop.is_set():
                    raise _Stopped from exc  # leave the message uncommitted: the next start takes it
                log.error("notifier: %s message failed (retrying in %.1f s): %s", topic, delay, exc)
                stop.wait(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            log.exception("notifier: %s message could not be handled; dead-lettered", topic)
            publisher.publish(
                DeadLetter.of(raw=raw, source_topic=topic, error=exc, consumer=CONSUMER, ts=time.time(), source_key=key)
            )
            return
