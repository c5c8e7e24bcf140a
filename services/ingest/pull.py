"""What every pull source shares: delivery to Kafka, bounded fetching, skipped items, cursors, the loop.

The receivers in :mod:`services.ingest.http` wait for others to push; the pull sources of
:mod:`services.ingest.sources` fetch (one module each, registered in :data:`services.ingest.registry.SOURCES`):

- ``scrape`` (:class:`~services.ingest.sources.scrape.Scraper`) GETs Prometheus ``/metrics`` endpoints;
- ``prometheus`` (:class:`~services.ingest.sources.prometheus.PrometheusPuller`) runs PromQL queries
  with ``/api/v1/query_range``, one cursor per query;
- ``loki`` (:class:`~services.ingest.sources.loki.LokiPuller`) follows a LogQL query with Loki's
  ``query_range``, without duplicates or gaps.

Every client normalises with :mod:`services.ingest.normalise` and publishes through the receivers'
:class:`~services.ingest.sink.PublishQueue` (:class:`Delivery` waits for Kafka's acknowledgement),
and a cursor moves only after that acknowledgement: delivery is at-least-once. A bad answer (not 200,
not JSON, not the documented shape, an exposition that does not parse, a body over the size limit) is
logged with what is wrong, written to ``deadletter.v1``, and retried at the next poll; an unreachable
server is logged. A bad *item* of a good answer (a series, value, stream or entry not in the documented
shape, or one the push receiver would refuse) is left out and recorded (:class:`Skipped`): the rest is
published, what was left out is dead-lettered once, and the cursor moves past the page, so one poison
entry cannot stall a cursor forever. Nothing of the kind stops the loop (:func:`run_every`).

With a :class:`CursorStore` (what ``medic ingest pull-prom|pull-loki`` use: a JSON file in the state
directory, :func:`cursor_store`) the cursors outlive the process: a restarted puller resumes where the
last acknowledged range ended instead of ``lookback`` before now, so a restart neither repeats nor
loses data. A cursor older than ``max_catchup_s`` is moved forward with a warning (what lies before it
is skipped).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from services.core.events import DeadLetter, Event
from services.core.settings import Settings
from services.ingest.errors import Overloaded, RejectedInput
from services.ingest.sink import IngestMetrics, Publisher, PublishQueue
from services.ingest.timebounds import TimeCheck

log = logging.getLogger(__name__)

USER_AGENT = "ClusterMedic-ingest"

Clock = Callable[[], float]


class CursorStore:
    """Pull cursors in a JSON file, rewritten atomically (temporary file + rename) at every move.

    ``path=None`` keeps them in memory only. A file that cannot be read starts empty (logged); one that
    cannot be written is logged once and the puller carries on with its in-memory cursors.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._values: dict[str, Any] = {}
        self._write_failed = False
        if path is not None and path.exists():
            try:
                loaded = json.loads(path.read_text(encoding="utf-8"))
                if not isinstance(loaded, dict):
                    raise ValueError("not a JSON object")
                self._values = loaded
            except (OSError, ValueError) as exc:
                log.warning("pull cursors in %s unreadable (%s): starting from the lookback", path, exc)

    def get(self, key: str) -> Any:
        """The stored cursor for ``key``, or None."""
        return self._values.get(key)

    def put(self, key: str, value: Any) -> None:
        """Store ``key``'s cursor (and write the file)."""
        self._values[key] = value
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self._values, sort_keys=True), encoding="utf-8")
            os.replace(tmp, self.path)
            self._write_failed = False
        except OSError as exc:
            if not self._write_failed:
                log.warning(
                    "cannot write pull cursors to %s (%s): a restart will start from the lookback", self.path, exc
                )
            self._write_failed = True


Series = tuple[dict[str, str], list[tuple[float, float]]]


# ---------------------------------------------------------------------------------- delivery


class Delivery:
    """Hands a pull client's events to the publish queue and waits until Kafka acknowledged them.

    Args:
        queue: the same bounded queue the push receivers use (started by the caller).
        metrics: the ingest metrics the clients count into.
        timeout_s: how long to wait for an acknowledgement (the queue's flush timeout plus a margin).
        deadletter_max_bytes: most bytes of a bad answer kept in its dead letter.
        time_window: makes the event-time window of an answer fetched at a given wall-clock time
            (:meth:`TimeCheck.of` with the settings); None: no bound (tests of other behaviour).
    """

    def __init__(
        self,
        queue: PublishQueue,
        metrics: IngestMetrics,
        *,
        timeout_s: float,
        deadletter_max_bytes: int,
        time_window: Callable[[float], TimeCheck] | None = None,
    ) -> None:
        self.queue = queue
        self.metrics = metrics
        self._timeout_s = timeout_s
        self._keep = deadletter_max_bytes
        self._time_window = time_window

    def time_check(self, now: float) -> TimeCheck | None:
        """The event-time window of an answer fetched at ``now`` (None when unbounded)."""
        return self._time_window(now) if self._time_window is not None else None

    def refused(self, check: TimeCheck | None, *, receiver: str, source: str, key: str, total: int, what: str) -> None:
        """Count and dead-letter the entries ``check`` refused (after their neighbours were published)."""
        if check is None or not check.refused:
            return
        self.metrics.out_of_bounds.labels(receiver, "too_new").inc(check.too_new)
        self.metrics.out_of_bounds.labels(receiver, "too_old").inc(check.too_old)
        error = RejectedInput(f"{source}: {check.message(total, what)}", reason="out_of_bounds")
        self.deadletter(receiver=receiver, source=source, key=key, raw=check.deadletter_raw(self._keep), error=error)

    def skipped(self, skipped: Skipped, *, receiver: str, source: str, key: str, what: str) -> None:
        """Dead-letter what a page left out (after its good items were published), once per page."""
        if not skipped.count:
            return
        first = skipped.examples[0] if skipped.examples else ""
        error = RejectedInput(
            f"{source}: {skipped.count} {what} left out, the rest kept; first: {first}", reason="schema"
        )
        self.deadletter(receiver=receiver, source=source, key=key, raw=skipped.raw(), error=error)

    def publish(self, events: Sequence[Event]) -> None:
        """Publish events and block until Kafka acknowledged every one.

        Raises:
            Overloaded: the queue is full, or Kafka did not acknowledge in time (the caller retries later).
        """
        if not events:
            return
        acked = threading.Event()
        failure: list[BaseException] = []

        def done(error: BaseException | None) -> None:
            if error is not None:
                failure.append(error)
            acked.set()

        if not self.queue.offer(events, done):
            raise Overloaded(
                f"ingest queue is full ({self.queue.weight}/{self.queue.capacity})",
                retry_after_s=self.queue.retry_after_s,
            )
        if not acked.wait(self._timeout_s):
            raise Overloaded("Kafka did not acknowledge in time", retry_after_s=self.queue.retry_after_s)
        if failure:
            raise Overloaded(f"Kafka did not acknowledge: {failure[0]}", retry_after_s=self.queue.retry_after_s)

    def deadletter(self, *, receiver: str, source: str, key: str, raw: bytes, error: RejectedInput) -> None:
        """Log a bad answer, count it and write it to ``deadletter.v1`` (waits for the ack, bounded)."""
        log.warning("%s: %s (dead-lettered)", receiver, error)
        self.metrics.rejected.labels(receiver, error.reason).inc()
        keep = self._keep
        message = (
            str(error) if len(raw) <= keep else f"{error} (dead letter keeps the first {keep} of {len(raw)} bytes)"
        )
        letter = DeadLetter.of(
            raw=raw[:keep], source_topic=source, error=message, consumer="ingest", ts=time.time(), source_key=key
        ).model_copy(update={"error_type": type(error).__name__})
        written = threading.Event()
        if not self.queue.offer_deadletter(letter, lambda _error: written.set()) or not written.wait(self._timeout_s):
            log.warning("%s: could not write the dead letter for %s", receiver, source)


def delivery_for(settings: Settings, publisher: Publisher) -> Delivery:
    """A started publish queue around ``publisher``, wrapped in a :class:`Delivery` (stop ``.queue`` when done)."""
    metrics = IngestMetrics()
    queue = PublishQueue(
        publisher,
        metrics,
        capacity=settings.ingest_queue_capacity,
        flush_timeout_s=settings.ingest_flush_timeout_s,
        retry_after_s=settings.ingest_retry_after_s,
        max_message_bytes=settings.ingest_max_message_bytes,
    )
    queue.start()
    return Delivery(
        queue,
        metrics,
        timeout_s=settings.ingest_flush_timeout_s + 5.0,
        deadletter_max_bytes=settings.ingest_deadletter_max_bytes,
        time_window=lambda now: TimeCheck.of(settings, now),
    )


# ------------------------------------------------------------------------------------ fetching


@dataclass
class Answer:
    """One HTTP answer, read up to a size bound."""

    url: str
    status: int
    content_type: str
    body: bytes
    complete: bool

    def text_error(self) -> str:
        """A short, printable excerpt of the body for error messages."""
        return self.body[:300].decode("utf-8", "replace").strip()


def fetch(client: httpx.Client, url: str, *, params: Mapping[str, str], max_bytes: int, **headers: str) -> Answer:
    """GET ``url`` and read at most ``max_bytes`` (after Content-Encoding); ``complete`` says whether it all fit.

    Raises:
        httpx.HTTPError: the server could not be reached or the connection broke.
    """
    body = bytearray()
    with client.stream("GET", url, params=params, headers=headers) as response:
        for chunk in response.iter_bytes():
            body.extend(chunk)
            if len(body) > max_bytes:
                return Answer(str(response.url), response.status_code, "", bytes(body), complete=False)
        content_type = response.headers.get("content-type", "")
        return Answer(str(response.url), response.status_code, content_type, bytes(body), complete=True)


def check_answer(answer: Answer, what: str, max_bytes: int) -> None:
    """Refuse an answer that was cut at the size limit or is not a 200.

    Raises:
        RejectedInput: with the reason the dead letter and the metric carry.
    """
    if not answer.complete:
        raise RejectedInput(f"{what}: answer is over the {max_bytes}-byte limit", status=413, reason="too_large")
    if answer.status != 200:
        raise RejectedInput(f"{what}: HTTP {answer.status}: {answer.text_error()}", reason=f"http_{answer.status}")


def json_answer(answer: Answer, what: str) -> dict[str, Any]:
    """The ``data`` of the body: a JSON object in Prometheus' API envelope (Loki's too), ``status == "success"``.

    Raises:
        RejectedInput: not JSON, not an object, not a success, or no ``data.result`` list.
    """
    try:
        payload = json.loads(answer.body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise RejectedInput(f"{what}: answer is not JSON: {exc}", reason="json") from exc
    if not isinstance(payload, dict):
        raise RejectedInput(f"{what}: answer is not a JSON object", reason="schema")
    if payload.get("status") != "success":
        raise RejectedInput(
            f"{what}: status {payload.get('status')!r}: {payload.get('errorType', '')} {payload.get('error', '')}",
            reason="api_error",
        )
    warnings = payload.get("warnings")
    for warning in warnings if isinstance(warnings, list) else ():
        log.info("%s: server warning: %s", what, str(warning)[:500])
    data = payload.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("result"), list):
        raise RejectedInput(f'{what}: answer has no "data.result" list', reason="schema")
    return data


@dataclass
class Skipped:
    """Items of an answer left out because they are not in the documented shape; the rest are kept.

    One bad series or entry must not hold back its page: the page's good items are published, the
    cursor moves past the page, and what was left out is dead-lettered once (:meth:`Delivery.skipped`).
    """

    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, message: str) -> None:
        """Record one item left out, with what is wrong with it (kept for the first 20)."""
        self.count += 1
        if len(self.examples) < 20:
            self.examples.append(message[:300])

    def raw(self) -> bytes:
        """What the dead letter keeps."""
        return json.dumps({"skipped": self.count, "examples": self.examples}).encode("utf-8", "backslashreplace")


def http_client(timeout_s: float) -> httpx.Client:
    """The HTTP client a source uses unless it is given one (tests pass one with a MockTransport)."""
    return httpx.Client(timeout=timeout_s, headers={"User-Agent": USER_AGENT}, follow_redirects=True)


def cursor_store(settings: Settings, command: str) -> CursorStore:
    """The command's cursors file in the state directory: a restart resumes where the last run stopped."""
    return CursorStore(settings.state_dir / f"ingest-{command}-cursors.json")


# ------------------------------------------------------------------------------------- the loop


def run_every(poll: Callable[[], object], interval_s: float, stop: threading.Event, *, name: str) -> None:
    """Call ``poll`` every ``interval_s`` seconds until ``stop`` is set; an exception is logged, never raised.

    The interval is measured from the start of one poll to the start of the next; a poll that runs
    longer than the interval is followed by the next one at once.
    """
    while not stop.is_set():
        started = time.monotonic()
        try:
            poll()
        except Exception:  # a bug in one poll must not end the service; the next poll runs as planned
            log.exception("%s: poll failed", name)
        stop.wait(max(0.0, interval_s - (time.monotonic() - started)))
