"""The bounded queue between the receivers and Kafka, and the ingest service's own metrics.

Receivers never talk to Kafka themselves: they hand a job (the events of one request) to
:class:`PublishQueue`, which one thread drains. The thread publishes everything queued, then flushes
once (waits for the broker's acks), then completes every job in that round. Publishing many jobs per
flush is what makes throughput independent of the number of requests (group commit).

A publisher that can flush asynchronously (:class:`PipelinedPublisher`, such as
:class:`services.ingest.aiopublisher.AioKafkaPublisher`) lets the thread publish the next round while
Kafka acknowledges the previous ones, up to ``rounds_in_flight`` rounds; a job still completes only
once Kafka acknowledged its round, and its weight stays counted until then.

The queue is bounded by *weight*: a MetricBatch weighs its sample count, every other event weighs
one. A job that does not fit is refused at once (the receiver answers 503 with ``Retry-After``), so
memory stays bounded however slow Kafka is. Dead letters have their own small allowance so that a
flood of bad input cannot starve good input, and good input cannot keep bad input from being recorded.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.core.events import DeadLetter, Event, MetricBatch
from services.ingest.errors import Overloaded

log = logging.getLogger(__name__)


class Publisher(Protocol):
    """What the queue needs from a publisher; :class:`services.core.bus.KafkaPublisher` is one."""

    def publish(self, event: Event, *, topic: str | None = None) -> None:
        """Queue one event for its topic."""

    def flush(self, timeout_s: float = 30.0) -> None:
        """Block until every queued event is acknowledged (raise when it is not)."""

    def close(self) -> None:
        """Flush and release the connection."""


@runtime_checkable
class RawPublisher(Publisher, Protocol):
    """A publisher that also takes bytes already serialised (both Kafka publishers are)."""

    def send_raw(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Queue ``value`` for the topic of base name ``topic``."""


@runtime_checkable
class PipelinedPublisher(Publisher, Protocol):
    """A publisher whose flush can complete later, so the next round can be published meanwhile."""

    def flush_async(self, acked: Callable[[BaseException | None], None], timeout_s: float = 30.0) -> None:
        """Send what is queued; call ``acked(None)`` once acknowledged, ``acked(error)`` otherwise."""


class IngestMetrics:
    """The ingest service's own Prometheus metrics, in a registry of their own (served at /metrics)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "clustermedic_ingest_requests",
            "Requests received, by receiver and HTTP status",
            ["receiver", "code"],
            registry=r,
        )
        self.received = Counter(
            "clustermedic_ingest_received",
            "Items accepted (samples, log lines, alerts, events)",
            ["receiver"],
            registry=r,
        )
        self.rejected = Counter(
            "clustermedic_ingest_rejected",
            "Payloads rejected as bad input, by reason",
            ["receiver", "reason"],
            registry=r,
        )
        self.dropped = Counter(
            "clustermedic_ingest_dropped_samples",
            "Samples dropped because JSON cannot carry their value (NaN staleness markers, infinities)",
            ["receiver"],
            registry=r,
        )
        self.out_of_bounds = Counter(
            "clustermedic_ingest_out_of_bounds",
            "Entries refused because their timestamp is outside the event-time window (too_new, too_old)",
            ["receiver", "bound"],
            registry=r,
        )
        self.duplicates = Counter(
            "clustermedic_ingest_duplicates",
            "Redelivered items skipped (Alertmanager, watch relists)",
            ["receiver"],
            registry=r,
        )
        self.throttled = Counter(
            "clustermedic_ingest_throttled",
            "Payloads refused with 503 because the queue was full or Kafka slow",
            ["receiver"],
            registry=r,
        )
        self.published = Counter(
            "clustermedic_ingest_published", "Events acknowledged by Kafka, by topic", ["topic"], registry=r
        )
        self.publish_errors = Counter(
            "clustermedic_ingest_publish_errors", "Publish rounds Kafka did not acknowledge", registry=r
        )
        self.unserialisable = Counter(
            "clustermedic_ingest_unserialisable",
            "Accepted records that could not be serialised for Kafka and were dead-lettered on their own",
            registry=r,
        )
        self.oversized = Counter(
            "clustermedic_ingest_oversized",
            "Accepted records larger than ingest_max_message_bytes, dead-lettered on their own",
            registry=r,
        )
        self.deadletters_lost = Counter(
            "clustermedic_ingest_deadletters_lost",
            "Dead letters not written (their allowance was full)",
            registry=r,
        )
        self.queued = Gauge(
            "clustermedic_ingest_queue_weight", "Weight (samples + other events) waiting for a Kafka ack", registry=r
        )
        self.capacity = Gauge("clustermedic_ingest_queue_capacity", "Bound of the queue weight", registry=r)
        self.latency = Histogram(
            "clustermedic_ingest_publish_latency_seconds",
            "From receipt of a payload to Kafka's acknowledgement of all its events",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.lag = Gauge(
            "clustermedic_ingest_pull_lag_seconds",
            "How far a pull source's cursor is behind now",
            ["source"],
            registry=r,
        )


def weight_of(event: Event) -> int:
    """Queue weight of an event: a MetricBatch's sample count, else 1."""
    if not isinstance(event, MetricBatch):
        return 1
    count = getattr(event, "sample_count", None)
    return max(1, count if isinstance(count, int) else len(event.samples))


Done = Callable[[BaseException | None], None]


@dataclass
class _Job:
    events: Sequence[Event]
    weight: int
    received_at: float
    done: Done | None
    deadletter: bool = False
    topics: list[str] = field(default_factory=list)


class PublishQueue:
    """A bounded queue of events drained by one publisher thread (see the module docstring).

    Args:
        publisher: where events go; flushed once per round.
        metrics: counters and gauges to update.
        capacity: most total weight queued or in flight.
        deadletter_capacity: most dead letters queued or in flight.
        flush_timeout_s: how long one round waits for Kafka's acks before failing its jobs.
        retry_after_s: the ``Retry-After`` a refused sender is given.
        round_weight: most weight published per flush (bounds a round's latency).
        rounds_in_flight: most rounds awaiting Kafka's acks at once, with a :class:`PipelinedPublisher`
            (any other publisher has one: its flush blocks).
        max_message_bytes: a record that serialises to more is dead-lettered on its own instead of
            failing its round at the broker (``ingest_max_message_bytes``); None: no check.
    """

    def __init__(
        self,
        publisher: Publisher,
        metrics: IngestMetrics,
        *,
        capacity: int,
        deadletter_capacity: int = 1000,
        flush_timeout_s: float = 10.0,
        retry_after_s: int = 5,
        round_weight: int = 50_000,
        rounds_in_flight: int = 4,
        max_message_bytes: int | None = None,
    ) -> None:
        self._publisher = publisher
        self._max_message_bytes = max_message_bytes
        self._send_raw = publisher.send_raw if isinstance(publisher, RawPublisher) else None
        self._metrics = metrics
        self.capacity = capacity
        self._dl_capacity = deadletter_capacity
        self._flush_timeout_s = flush_timeout_s
        self.retry_after_s = retry_after_s
        self._round_weight = round_weight
        self._jobs: deque[_Job] = deque()
        self._weight = 0
        self._dl_pending = 0
        self._cond = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._flush_async = publisher.flush_async if isinstance(publisher, PipelinedPublisher) else None
        self._rounds_in_flight = rounds_in_flight if self._flush_async is not None else 1
        self._slots = threading.Semaphore(self._rounds_in_flight)
        metrics.capacity.set(capacity)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the publisher thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ingest-publisher", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Publish what is queued, then stop the thread and close the publisher."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        self._publisher.close()

    @property
    def weight(self) -> int:
        """Weight queued or in flight now."""
        return self._weight

    # ------------------------------------------------------------------ submitting

    def offer(self, events: Sequence[Event], done: Done | None = None, *, received_at: float | None = None) -> bool:
        """Queue a job unless it does not fit; ``done(error)`` runs on the publisher thread once acked.

        A job heavier than the whole capacity is still taken when the queue is empty, so no payload
        within the size limits is refused forever.
        """
        weight = sum(weight_of(e) for e in events)
        with self._cond:
            if self._closing or (self._weight and self._weight + weight > self.capacity):
                return False
            self._jobs.append(_Job(events, weight, received_at or time.monotonic(), done))
            self._weight += weight
            self._metrics.queued.set(self._weight)
            self._cond.notify()
        return True

    def offer_deadletter(self, letter: DeadLetter, done: Done | None = None) -> bool:
        """Queue a dead letter within its own allowance; count it as lost when that is full."""
        with self._cond:
            if self._closing or self._dl_pending >= self._dl_capacity:
                self._metrics.deadletters_lost.inc()
                return False
            self._jobs.append(_Job([letter], 0, time.monotonic(), done, deadletter=True))
            self._dl_pending += 1
            self._cond.notify()
        return True

    async def submit(self, events: Sequence[Event], *, received_at: float | None = None) -> None:
        """Queue events and wait until Kafka acknowledged all of them.

        Raises:
            Overloaded: the queue is full, or Kafka did not acknowledge within the flush timeout.
        """
        if not events:
            return
        future = self._future()
        if not self.offer(events, self._resolver(future), received_at=received_at):
            raise Overloaded(
                f"ingest queue is full ({self._weight}/{self.capacity}); retry later",
                retry_after_s=self.retry_after_s,
            )
        await self._wait(future, "events")

    async def submit_deadletter(self, letter: DeadLetter) -> bool:
        """Queue a dead letter and wait for its ack; False when it could not be written."""
        future = self._future()
        if not self.offer_deadletter(letter, self._resolver(future)):
            return False
        try:
            await self._wait(future, "dead letter")
        except Overloaded:
            return False
        return True

    def _future(self) -> asyncio.Future[None]:
        return asyncio.get_running_loop().create_future()

    @staticmethod
    def _resolver(future: asyncio.Future[None]) -> Done:
        loop = future.get_loop()

        def settle(error: BaseException | None) -> None:
            if future.done():
                return
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

        def done(error: BaseException | None) -> None:
            loop.call_soon_threadsafe(settle, error)

        return done

    async def _wait(self, future: asyncio.Future[None], what: str) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(future), self._flush_timeout_s + 5.0)
        except TimeoutError as exc:
            raise Overloaded(f"Kafka did not acknowledge the {what} in time", retry_after_s=self.retry_after_s) from exc
        except Overloaded:
            raise
        except Exception as exc:
            raise Overloaded(f"Kafka did not acknowledge the {what}: {exc}", retry_after_s=self.retry_after_s) from exc

    # ------------------------------------------------------------------ the publisher thread

    def _take_round(self) -> list[_Job]:
        with self._cond:
            while not self._jobs and not self._closing:
                self._cond.wait()
            taken: list[_Job] = []
            weight = 0
            while self._jobs and (not taken or weight + self._jobs[0].weight <= self._round_weight):
                job = self._jobs.popleft()
                taken.append(job)
                weight += job.weight
            return taken

    def _run(self) -> None:
        while True:
            self._slots.acquire()  # released when the round completes; jobs gather meanwhile
            jobs = self._take_round()
            if not jobs:  # closing and drained: wait for the rounds still in flight
                self._slots.release()
                for _ in range(self._rounds_in_flight):
                    self._slots.acquire()
                return
            try:
                for job in jobs:
                    for event in job.events:
                        self._publish_one(event)
                if self._flush_async is not None:
                    self._flush_async(self._completer(jobs), self._flush_timeout_s)
                    continue
                self._publisher.flush(self._flush_timeout_s)
            except Exception as exc:  # any publisher failure fails this round's jobs; senders retry
                self._complete(jobs, exc)
                continue
            self._complete(jobs, None)

    def _publish_one(self, event: Event) -> None:
        """Publish one event; one the broker could never take is dead-lettered alone, not with its round.

        A record can parse and still fail to serialise (a JSON ``\\ud800`` escape is a lone surrogate,
        which UTF-8 cannot encode), or serialise to more than the broker takes in one message
        (``max_message_bytes``). Raised from here either would fail every job of the round, and the
        senders' retries would fail again forever. Broker errors still fail the round: they are
        :class:`~services.core.errors.InfraError`, not ``ValueError``.
        """
        try:
            value = event.to_bytes()
            key = event.key().encode()
        except (ValueError, UnicodeError) as exc:  # pydantic's serialisation error is a ValueError
            self._metrics.unserialisable.inc()
            raw = repr(event).encode("utf-8", "backslashreplace")
            self._deadletter_alone(event, raw, f"cannot serialise the record: {exc}")
            return
        limit = self._max_message_bytes
        if limit is not None and len(value) > limit:
            self._metrics.oversized.inc()
            error = (
                f"record of {len(value)} bytes is over the {limit}-byte message limit"
                " (CLUSTERMEDIC_INGEST_MAX_MESSAGE_BYTES, under the broker's message.max.bytes)"
            )
            self._deadletter_alone(event, value, error)
            return
        if self._send_raw is not None:
            self._send_raw(event.topic, key, value)  # serialised once
        else:
            self._publisher.publish(event)

    def _deadletter_alone(self, event: Event, raw: bytes, error: str) -> None:
        log.warning("dead-lettering a %s on its own: %s", type(event).__name__, error[:300])
        self._publisher.publish(
            DeadLetter.of(
                raw=raw[:65_536],
                source_topic=event.topic,
                error=error[:1000],
                consumer="ingest",
                ts=time.time(),
                source_key=_safe_key(event),
            )
        )

    def _completer(self, jobs: list[_Job]) -> Done:
        def acked(error: BaseException | None) -> None:
            self._complete(jobs, error)

        return acked

    def _complete(self, jobs: list[_Job], error: BaseException | None) -> None:
        """Release a round's weight, record its outcome and run its jobs' callbacks."""
        try:
            if error is not None:
                log.warning("publish round of %d jobs failed: %s", len(jobs), error)
                self._metrics.publish_errors.inc()
            now = time.monotonic()
            with self._cond:
                for job in jobs:
                    if job.deadletter:
                        self._dl_pending -= 1
                    self._weight -= job.weight
                self._metrics.queued.set(self._weight)
            if error is None:
                published: dict[str, int] = {}
                for job in jobs:
                    if not job.deadletter:
                        self._metrics.latency.observe(now - job.received_at)
                    for event in job.events:
                        published[event.topic] = published.get(event.topic, 0) + 1
                for topic, count in published.items():
                    self._metrics.published.labels(topic).inc(count)
            for job in jobs:
                if job.done is not None:
                    try:
                        job.done(error)
                    except Exception:  # a callback's bug must not stop publishing
                        log.exception("job completion callback failed")
        finally:
            self._slots.release()


def _safe_key(event: Event) -> str:
    """The event's key, made encodable (the key may hold the very text that could not be serialised)."""
    try:
        key = event.key()
    except Exception:  # a key that cannot even be computed still must not fail the round
        return ""
    return key.encode("utf-8", "backslashreplace").decode("ascii", "replace")[:500]
