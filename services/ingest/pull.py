"""Pull clients: scrape ``/metrics``, Prometheus ``query_range`` and Loki ``query_range`` into Kafka.

The receivers in :mod:`services.ingest.http` wait for others to push; these clients fetch:

- :class:`Scraper` GETs each target's Prometheus text exposition (format 0.0.4) every
  ``ingest_scrape_interval_s``. Samples without their own timestamp get the time the scrape started;
  ``job`` and ``instance`` are set as Prometheus sets them (a scraped label of the same name is kept
  as ``exported_job``/``exported_instance``), so a scraped sample and a remote-written one look alike.
- :class:`PrometheusPuller` runs each configured PromQL query with ``/api/v1/query_range`` on a grid
  of ``step`` seconds. A query's cursor is the last evaluation time pulled; the next range starts one
  step after it, so no evaluation time is pulled twice or skipped, however late a poll runs. A cursor
  far behind is caught up in chunks (Prometheus refuses more than 11,000 points a series).
- :class:`LokiPuller` follows one LogQL log query with ``/loki/api/v1/query_range``,
  ``direction=forward``, paging by ``limit``. Its cursor is the newest entry's nanosecond timestamp
  together with the entries already delivered at exactly that time. The next page (and the next poll)
  starts *at* the cursor, since Loki's ``start`` is inclusive and entries may share a nanosecond; the
  remembered entries are skipped, so there is no duplicate and no gap.

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
directory) the cursors outlive the process: a restarted puller resumes where the last acknowledged
range ended instead of ``lookback`` before now, so a restart neither repeats nor loses data. A cursor
older than ``max_catchup_s`` is moved forward with a warning (what lies before it is skipped).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from services.core.events import DeadLetter, Event, LogRecord
from services.core.settings import Settings
from services.ingest import normalise
from services.ingest.errors import Overloaded, RejectedInput
from services.ingest.sink import IngestMetrics, Publisher, PublishQueue
from services.ingest.timebounds import TimeCheck

log = logging.getLogger(__name__)

USER_AGENT = "ClusterMedic-ingest"
QUERY_RANGE_PATH = "/api/v1/query_range"
LOKI_QUERY_RANGE_PATH = "/loki/api/v1/query_range"
# Prometheus answers 400 above 11,000 points per series; stay clear of it when catching up.
MAX_POINTS_PER_REQUEST = 10_000
# Loki's default max_query_length is 721h: a start older than this would be refused.
LOKI_MAX_RANGE_NS = 720 * 3600 * 1_000_000_000
_SCRAPE_ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"

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


def _check_answer(answer: Answer, what: str, max_bytes: int) -> None:
    if not answer.complete:
        raise RejectedInput(f"{what}: answer is over the {max_bytes}-byte limit", status=413, reason="too_large")
    if answer.status != 200:
        raise RejectedInput(f"{what}: HTTP {answer.status}: {answer.text_error()}", reason=f"http_{answer.status}")


def _json_answer(answer: Answer, what: str) -> dict[str, Any]:
    """The body as a JSON object in Prometheus' API envelope, with ``status == "success"``."""
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


def _http_client(timeout_s: float) -> httpx.Client:
    return httpx.Client(timeout=timeout_s, headers={"User-Agent": USER_AGENT}, follow_redirects=True)


# ------------------------------------------------------------------------------- scrape /metrics


def parse_exposition(text: str, *, scrape_ts: float, target_labels: Mapping[str, str] | None = None) -> list[Series]:
    """Parse Prometheus text exposition (format 0.0.4) into ``(labels with __name__, [(value, ts)])``.

    Args:
        text: the exposition.
        scrape_ts: timestamp (s) of samples that carry none.
        target_labels: labels set on every sample (``job``, ``instance``); a scraped label of the same
            name is renamed ``exported_<name>``, as Prometheus does with ``honor_labels: false``.

    Raises:
        RejectedInput: the text does not parse.
    """
    target_labels = target_labels or {}
    series: list[Series] = []
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = dict(sample.labels)
                for name, value in target_labels.items():
                    if name in labels:
                        labels[f"exported_{name}"] = labels.pop(name)
                    labels[name] = value
                labels["__name__"] = sample.name
                ts = float(sample.timestamp) if sample.timestamp is not None else scrape_ts
                series.append((labels, [(float(sample.value), ts)]))
    # prometheus_client's parser raises these on bad text; OverflowError on a 400-digit timestamp
    except (ValueError, LookupError, TypeError, ArithmeticError) as exc:
        raise RejectedInput(f"exposition does not parse: {exc or type(exc).__name__}", reason="exposition") from exc
    return series


class Scraper:
    """Scrapes Prometheus ``/metrics`` endpoints into ``telemetry.metrics.v1`` (``source="scrape"``).

    Args:
        targets: full URLs of the endpoints (``http://host:port/metrics``).
        delivery: where events and dead letters go.
        job: the ``job`` label given to every sample.
        client: HTTP client (tests pass one with a MockTransport); default: one with ``timeout_s``.
        timeout_s: per-scrape timeout.
        max_bytes: largest exposition read.
        max_samples: most samples per MetricBatch.
        clock: wall clock (seconds), for sample timestamps.

    An exporter that stamps its own samples (the simulator, a federated Prometheus) answers the same
    sample again when it is scraped faster than it updates. As Prometheus does, a sample is sent only
    when it is newer than the last one sent for its series; the repeats are counted in
    ``clustermedic_ingest_duplicates_total``. The memory is the last scrape's series of each target.
    """

    receiver = "scrape"
    max_parallel = 8

    def __init__(
        self,
        targets: Sequence[str],
        delivery: Delivery,
        *,
        job: str = "scrape",
        client: httpx.Client | None = None,
        timeout_s: float = 10.0,
        max_bytes: int = 64 * 1024 * 1024,
        max_samples: int = 1000,
        clock: Clock = time.time,
    ) -> None:
        self.targets = list(targets)
        self._delivery = delivery
        self._job = job
        self._client = client or _http_client(timeout_s)
        self._timeout_s = timeout_s
        self._max_bytes = max_bytes
        self._max_samples = max_samples
        self._clock = clock
        self._last_ts: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}

    def poll(self) -> int:
        """Scrape every target once, several at a time; return how many samples Kafka acknowledged.

        Targets are scraped concurrently (at most :attr:`max_parallel` at once) so that one slow target
        does not delay the others' samples, as each Prometheus scrape loop runs on its own.
        """
        if len(self.targets) <= 1:
            return sum(self.scrape(target) for target in self.targets)
        with ThreadPoolExecutor(min(self.max_parallel, len(self.targets)), thread_name_prefix="scrape") as pool:
            return sum(pool.map(self.scrape, self.targets))

    def scrape(self, url: str) -> int:
        """Scrape one target and publish its samples; never raises for a bad or absent target."""
        metrics = self._delivery.metrics
        started = self._clock()
        try:
            answer = fetch(
                self._client,
                url,
                params={},
                max_bytes=self._max_bytes,
                Accept=_SCRAPE_ACCEPT,
                **{"X-Prometheus-Scrape-Timeout-Seconds": f"{self._timeout_s:g}"},
            )
        except httpx.HTTPError as exc:
            log.warning("scrape %s: cannot fetch: %s", url, exc or type(exc).__name__)
            metrics.requests.labels(self.receiver, "unreachable").inc()
            return 0
        metrics.requests.labels(self.receiver, str(answer.status)).inc()
        try:
            _check_answer(answer, f"scrape {url}", self._max_bytes)
            media = answer.content_type.partition(";")[0].strip().lower()
            if media not in ("", "text/plain"):
                raise RejectedInput(
                    f"scrape {url}: Content-Type {answer.content_type!r}: the scraper reads the text format "
                    "(text/plain; version=0.0.4)",
                    reason="media_type",
                )
            try:
                text = answer.body.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RejectedInput(f"scrape {url}: exposition is not UTF-8: {exc}", reason="exposition") from exc
            try:
                series = parse_exposition(
                    text, scrape_ts=started, target_labels={"job": self._job, "instance": urlsplit(url).netloc}
                )
            except RejectedInput as exc:
                raise RejectedInput(f"scrape {url}: {exc}", reason=exc.reason) from exc
        except RejectedInput as exc:
            self._delivery.deadletter(
                receiver=self.receiver, source=f"scrape:{url}", key=url, raw=answer.body, error=exc
            )
            return 0
        series, seen, repeated = self._newer_only(url, series)
        if repeated:
            metrics.duplicates.labels(self.receiver).inc(repeated)
        check = self._delivery.time_check(started)
        batches, dropped = normalise.metric_batches(series, source="scrape", max_samples=self._max_samples, check=check)
        try:
            self._delivery.publish(batches)
        except Overloaded as exc:
            log.warning("scrape %s: not published, retried next scrape: %s", url, exc)
            metrics.throttled.labels(self.receiver).inc()
            return 0
        self._last_ts[url] = seen  # only once Kafka has them: a throttled scrape is sent again next time
        accepted = sum(len(b.samples) for b in batches)
        self._delivery.refused(
            check, receiver=self.receiver, source=f"scrape:{url}", key=url, total=len(series), what="samples"
        )
        metrics.received.labels(self.receiver).inc(accepted)
        if dropped:
            metrics.dropped.labels(self.receiver).inc(dropped)
        return accepted

    def _newer_only(
        self, url: str, series: list[Series]
    ) -> tuple[list[Series], dict[tuple[tuple[str, str], ...], float], int]:
        """Each series' samples newer than the last one sent, the newest timestamps, and the repeats."""
        before = self._last_ts.get(url, {})
        now: dict[tuple[tuple[str, str], ...], float] = {}
        kept: list[Series] = []
        repeated = 0
        for labels, samples in series:
            key = tuple(sorted(labels.items()))
            last = before.get(key, -math.inf)
            fresh = [(value, ts) for value, ts in samples if ts > last]
            repeated += len(samples) - len(fresh)
            now[key] = max([last, *(ts for _, ts in samples)])
            if fresh:
                kept.append((labels, fresh))
        return kept, now, repeated


# ------------------------------------------------------------------------- Prometheus query_range


def _ms_text(ms: int) -> str:
    """Milliseconds as the exact decimal seconds string Prometheus takes (no float rounding)."""
    return f"{ms // 1000}.{ms % 1000:03d}"


def matrix_series(
    data: Mapping[str, Any], *, default_name: str, what: str, skipped: Skipped | None = None
) -> list[Series]:
    """The series of a ``query_range`` ``data`` object (``resultType`` matrix).

    A series without ``__name__`` (the result of ``rate()``, ``sum()``, ...) is named ``default_name``.
    A series or value not in the documented shape is left out and recorded in ``skipped``.

    Raises:
        RejectedInput: not a matrix.
    """
    if data.get("resultType") != "matrix":
        raise RejectedInput(f"{what}: resultType {data.get('resultType')!r}, expected 'matrix'", reason="schema")
    skipped = skipped if skipped is not None else Skipped()
    series: list[Series] = []
    for i, item in enumerate(data["result"]):
        metric = item.get("metric") if isinstance(item, dict) else None
        values = item.get("values", []) if isinstance(item, dict) else None
        if not isinstance(metric, dict) or not all(isinstance(v, str) for v in metric.values()):
            skipped.add(f"result[{i}].metric must map label names to strings: {str(item)[:80]}")
            continue
        if not isinstance(values, list):
            skipped.add(f"result[{i}].values must be a list: {str(values)[:80]}")
            continue
        samples: list[tuple[float, float]] = []
        for j, pair in enumerate(values):
            try:
                ts, text = pair
                if not isinstance(ts, int | float) or isinstance(ts, bool) or not isinstance(text, str):
                    raise TypeError
                samples.append((float(text), float(ts)))
            except (TypeError, ValueError, OverflowError):  # OverflowError: a 400-digit timestamp
                skipped.add(f'result[{i}].values[{j}] is not [<unix seconds>, "<value>"]: {str(pair)[:80]}')
        labels = dict(metric)
        labels["__name__"] = labels.get("__name__") or default_name
        series.append((labels, samples))
    return series


class PrometheusPuller:
    """Pulls PromQL queries with ``query_range`` into ``telemetry.metrics.v1`` (``source="query_range"``).

    Args:
        base_url: Prometheus' base URL (``http://prometheus:9090``).
        queries: name -> PromQL; the name is the metric name of series that have no ``__name__``.
        delivery: where events and dead letters go.
        step_s: evaluation step (rounded to milliseconds); evaluation times are multiples of it.
        lookback_s: how far back a query's first poll starts.
        client: HTTP client (tests pass one with a MockTransport).
        timeout_s: per-request timeout (also sent as Prometheus' ``timeout`` parameter).
        max_bytes: largest answer read.
        max_samples: most samples per MetricBatch.
        max_points: most evaluation times per request.
        clock: wall clock (seconds).
        cursors: where cursors are kept across restarts (default: memory only).
        max_catchup_s: a stored cursor older than this is moved forward to it (with a warning).
    """

    receiver = "query_range"

    def __init__(
        self,
        base_url: str,
        queries: Mapping[str, str],
        delivery: Delivery,
        *,
        step_s: float = 15.0,
        lookback_s: float = 300.0,
        client: httpx.Client | None = None,
        timeout_s: float = 30.0,
        max_bytes: int = 64 * 1024 * 1024,
        max_samples: int = 1000,
        max_points: int = MAX_POINTS_PER_REQUEST,
        clock: Clock = time.time,
        cursors: CursorStore | None = None,
        max_catchup_s: float = 6 * 3600.0,
    ) -> None:
        self.url = base_url.rstrip("/") + QUERY_RANGE_PATH
        self._store = cursors or CursorStore(None)
        self._max_catchup_ms = round(max_catchup_s * 1000)
        self.queries = dict(queries)
        self._delivery = delivery
        self.step_ms = max(1, round(step_s * 1000))
        self._lookback_ms = round(lookback_s * 1000)
        self._client = client or _http_client(timeout_s)
        self._timeout_s = timeout_s
        self._max_bytes = max_bytes
        self._max_samples = max_samples
        self._max_points = max(1, max_points)
        self._clock = clock
        self.cursors: dict[str, int] = {}
        """Per query name: the last evaluation time pulled and acknowledged, in ms (set at the first poll)."""

    def poll(self) -> int:
        """Pull every query up to now; return how many samples Kafka acknowledged."""
        return sum(self.pull(name) for name in self.queries)

    def pull(self, name: str) -> int:
        """Pull one query from one step after its cursor up to the last step boundary before now.

        Never raises for a bad answer or an unreachable server: the cursor stays, the next poll retries.
        """
        now_ms = int(self._clock() * 1000)
        end = now_ms - now_ms % self.step_ms
        if name not in self.cursors:
            self.cursors[name] = self._first_cursor(name, end)
        start = self.cursors[name] + self.step_ms
        total = 0
        while start <= end:
            chunk_end = min(end, start + (self._max_points - 1) * self.step_ms)
            published = self._pull_range(name, start, chunk_end)
            if published is None:
                break
            total += published
            self.cursors[name] = chunk_end
            self._store.put(self._key(name), chunk_end)
            start = chunk_end + self.step_ms
        self._delivery.metrics.lag.labels(f"prometheus:{name}").set(max(0.0, (now_ms - self.cursors[name]) / 1000))
        return total

    def _key(self, name: str) -> str:
        # a changed query, step or server starts afresh rather than resume someone else's cursor
        return f"prometheus {self.url} {name} step={self.step_ms}ms {self.queries[name]}"

    def _first_cursor(self, name: str, end: int) -> int:
        """The stored cursor (bounded by ``max_catchup_s``), else as if everything up to lookback was pulled."""
        stored = self._store.get(self._key(name))
        oldest = end - self._max_catchup_ms // self.step_ms * self.step_ms - self.step_ms
        if isinstance(stored, int):
            if stored >= oldest:
                return stored
            log.warning(
                "query_range %s: stored cursor %s is older than the catch-up limit; skipping to %s",
                name,
                _ms_text(stored),
                _ms_text(oldest),
            )
            return oldest
        return end - self._lookback_ms // self.step_ms * self.step_ms - self.step_ms

    def _pull_range(self, name: str, start_ms: int, end_ms: int) -> int | None:
        """Fetch and publish one range; None when it failed (logged, maybe dead-lettered)."""
        metrics = self._delivery.metrics
        what = f"query_range {name}"
        params = {
            "query": self.queries[name],
            "start": _ms_text(start_ms),
            "end": _ms_text(end_ms),
            "step": _ms_text(self.step_ms),
            "timeout": f"{self._timeout_s:g}s",
        }
        try:
            answer = fetch(self._client, self.url, params=params, max_bytes=self._max_bytes)
        except httpx.HTTPError as exc:
            log.warning("%s: cannot reach %s: %s", what, self.url, exc or type(exc).__name__)
            metrics.requests.labels(self.receiver, "unreachable").inc()
            return None
        metrics.requests.labels(self.receiver, str(answer.status)).inc()
        skipped = Skipped()
        try:
            _check_answer(answer, what, self._max_bytes)
            series = matrix_series(_json_answer(answer, what), default_name=name, what=what, skipped=skipped)
        except RejectedInput as exc:
            self._delivery.deadletter(
                receiver=self.receiver, source=f"pull:{self.url}", key=name, raw=answer.body, error=exc
            )
            return None
        check = self._delivery.time_check(self._clock())
        total = sum(len(samples) for _labels, samples in series)
        batches, dropped = normalise.metric_batches(
            series, source="query_range", max_samples=self._max_samples, check=check
        )
        try:
            self._delivery.publish(batches)
        except Overloaded as exc:
            log.warning("%s: not published, retried next poll: %s", what, exc)
            metrics.throttled.labels(self.receiver).inc()
            return None
        accepted = sum(len(b.samples) for b in batches)
        # refused points are not asked for again: the cursor moves past them like past the others
        self._delivery.refused(
            check, receiver=self.receiver, source=f"pull:{self.url}", key=name, total=total, what="samples"
        )
        # left-out series and values are not asked for again either: asked again, they would be left out again
        self._delivery.skipped(skipped, receiver=self.receiver, source=f"pull:{self.url}", key=name, what="values")
        metrics.received.labels(self.receiver).inc(accepted)
        if dropped:
            metrics.dropped.labels(self.receiver).inc(dropped)
        return accepted


# ------------------------------------------------------------------------------- Loki query_range


@dataclass(frozen=True)
class LokiEntry:
    """One log entry of a Loki ``streams`` answer."""

    ns: int
    stream: dict[str, str]
    line: str
    metadata: dict[str, Any] | None = None

    @property
    def identity(self) -> str:
        """What makes an entry unique to Loki: stream, timestamp and line (Loki drops exact repeats)."""
        return json.dumps([sorted(self.stream.items()), self.ns, self.line])


def loki_entries(
    data: Mapping[str, Any], *, what: str, skipped: Skipped | None = None, limits: normalise.Limits | None = None
) -> list[LokiEntry]:
    """The entries of a Loki ``query_range`` ``data`` object (``resultType`` streams), oldest first.

    A stream or entry not in the documented shape, or one the push receiver would refuse (a stream
    without labels, a line or labels over ``limits``), is left out and recorded in ``skipped``.

    Raises:
        RejectedInput: a metric (matrix) answer.
    """
    kind = data.get("resultType")
    if kind != "streams":
        hint = ": pull-loki follows log queries, not metric queries" if kind == "matrix" else ""
        raise RejectedInput(f"{what}: resultType {kind!r}, expected 'streams'{hint}", reason="schema")
    skipped = skipped if skipped is not None else Skipped()
    limits = limits or normalise.Limits()
    entries: list[LokiEntry] = []
    for i, item in enumerate(data["result"]):
        stream = item.get("stream") if isinstance(item, dict) else None
        values = item.get("values") if isinstance(item, dict) else None
        try:
            if not isinstance(stream, dict) or not all(isinstance(v, str) for v in stream.values()):
                raise RejectedInput(f"result[{i}].stream must map label names to strings")
            if not stream:
                raise RejectedInput(f"result[{i}].stream has no labels (the push receiver refuses it too)")
            if not isinstance(values, list):
                raise RejectedInput(f"result[{i}].values must be a list")
            limits.check_label_dict(stream, f"result[{i}].stream")
        except RejectedInput as exc:
            skipped.add(f"{exc}: {str(item)[:80]}")
            continue
        for j, value in enumerate(values):
            if (
                not isinstance(value, list)
                or len(value) not in (2, 3)
                or not isinstance(value[0], str)
                or not value[0].isascii()
                or not value[0].isdigit()
                or len(value[0]) > 20  # 2^64 ns is 20 digits; int() of 5,000 digits raises
                or not isinstance(value[1], str)
                or (len(value) == 3 and not isinstance(value[2], dict))
            ):
                skipped.add(f'result[{i}].values[{j}] is not ["<unix ns>", "<line>"]: {str(value)[:80]}')
                continue
            try:
                limits.check_line(value[1], f"result[{i}].values[{j}]")
            except RejectedInput as exc:
                skipped.add(str(exc))
                continue
            metadata = value[2] if len(value) == 3 else None
            entries.append(LokiEntry(int(value[0]), dict(stream), value[1], metadata))
    entries.sort(key=lambda e: e.ns)  # stable: each stream's own order is kept
    return entries


def log_records(
    entries: Iterable[LokiEntry], check: TimeCheck | None = None, limits: normalise.Limits | None = None
) -> list[LogRecord]:
    """Normalise entries exactly as the Loki push receiver does (through :func:`normalise.loki_json`).

    Entries stamped outside ``check``'s window are left out and counted there.

    Raises:
        RejectedInput: an entry the push receiver would refuse too (a stream without labels).
    """
    streams: dict[str, dict[str, Any]] = {}
    for entry in entries:
        key = json.dumps(sorted(entry.stream.items()))
        stream = streams.setdefault(key, {"stream": entry.stream, "values": []})
        value: list[Any] = [str(entry.ns), entry.line]
        if entry.metadata is not None:
            value.append(entry.metadata)
        stream["values"].append(value)
    records = normalise.loki_json(json.dumps({"streams": list(streams.values())}).encode(), check, limits)
    return sorted(records, key=lambda r: r.ts)  # stable: each stream's own order is kept


class LokiPuller:
    """Follows a LogQL query with Loki's ``query_range`` into ``telemetry.logs.v1``.

    Args:
        base_url: Loki's base URL (``http://loki:3100``).
        query: a LogQL log query (stream selector with optional filters), not a metric query.
        delivery: where events and dead letters go.
        limit: most entries per request (Loki's ``limit``; within its ``max_entries_limit_per_query``).
        lookback_s: how far back the first poll starts.
        client: HTTP client (tests pass one with a MockTransport).
        timeout_s: per-request timeout.
        max_bytes: largest answer read.
        tenant: ``X-Scope-OrgID`` for a multi-tenant Loki; empty: none sent.
        clock: wall clock (seconds).
        cursors: where the cursor is kept across restarts (default: memory only).
        max_catchup_s: a stored cursor older than this is moved forward to it (with a warning).
        limits: line and label limits of the push receiver (``ingest_max_*``); an entry over them is
            left out and dead-lettered, its neighbours kept.
    """

    receiver = "loki_pull"

    def __init__(
        self,
        base_url: str,
        query: str,
        delivery: Delivery,
        *,
        limit: int = 1000,
        lookback_s: float = 300.0,
        client: httpx.Client | None = None,
        timeout_s: float = 30.0,
        max_bytes: int = 64 * 1024 * 1024,
        tenant: str = "",
        clock: Clock = time.time,
        cursors: CursorStore | None = None,
        max_catchup_s: float = 6 * 3600.0,
        limits: normalise.Limits | None = None,
    ) -> None:
        self._limits = limits or normalise.Limits()
        self.url = base_url.rstrip("/") + LOKI_QUERY_RANGE_PATH
        self._store = cursors or CursorStore(None)
        self._store_key = f"loki {self.url} {tenant} {query}"
        self._max_catchup_ns = int(max_catchup_s * 1e9)
        self.query = query
        self._delivery = delivery
        self.limit = max(1, limit)
        self._lookback_ns = int(lookback_s * 1e9)
        self._client = client or _http_client(timeout_s)
        self._max_bytes = max_bytes
        self._headers = {"X-Scope-OrgID": tenant} if tenant else {}
        self._clock = clock
        self.cursor_ns: int | None = None
        """Timestamp of the newest entry delivered (or where the first poll starts)."""
        self.seen_at_cursor: set[str] = set()
        """Identities of the entries delivered whose timestamp is exactly ``cursor_ns``."""

    def poll(self) -> int:
        """Read every entry from the cursor up to now, page by page; return how many Kafka acknowledged.

        Never raises for a bad answer or an unreachable server: the cursor stays, the next poll retries.
        """
        end_ns = int(self._clock() * 1e9)
        if self.cursor_ns is None:
            self._first_cursor(end_ns)
            assert self.cursor_ns is not None
        if self.cursor_ns < end_ns - LOKI_MAX_RANGE_NS:  # everything before was read; keep the range legal
            self.cursor_ns, self.seen_at_cursor = end_ns - LOKI_MAX_RANGE_NS, set()
        total = 0
        while self.cursor_ns < end_ns:
            page = self._page(self.cursor_ns, end_ns)
            if page is None:
                break
            entries, skipped = page
            fresh = [e for e in entries if not (e.ns == self.cursor_ns and e.identity in self.seen_at_cursor)]
            check = self._delivery.time_check(end_ns / 1e9)
            try:
                records = log_records(fresh, check, self._limits)
            except RejectedInput:  # one entry the receiver refuses: find it, keep its neighbours
                check = self._delivery.time_check(end_ns / 1e9)
                records = []
                for entry in fresh:
                    try:
                        records.extend(log_records([entry], check, self._limits))
                    except RejectedInput as exc:
                        skipped.add(f"{exc}: {entry.line[:80]!r}")
                records.sort(key=lambda r: r.ts)
            try:
                self._delivery.publish(records)
            except Overloaded as exc:
                log.warning("Loki query_range: not published, retried next poll: %s", exc)
                self._delivery.metrics.throttled.labels(self.receiver).inc()
                break
            refused = check.refused if check is not None else 0
            total += len(fresh) - refused
            self._delivery.metrics.received.labels(self.receiver).inc(len(fresh) - refused)
            self._delivery.refused(
                check,
                receiver=self.receiver,
                source=f"pull:{self.url}",
                key=self.query,
                total=len(fresh),
                what="entries",
            )
            # left out of the page: dead-lettered once, and passed like the refused ones
            self._delivery.skipped(
                skipped, receiver=self.receiver, source=f"pull:{self.url}", key=self.query, what="entries"
            )
            self._advance(fresh)  # past the refused entries too: asked for again, they would be refused again
            if len(entries) + skipped.count < self.limit:
                break  # the window is drained
            if not fresh:
                # a full page of entries already delivered: more than `limit` entries share one nanosecond,
                # and forward paging by timestamp cannot get past them
                log.warning(
                    "Loki query_range: %d or more entries at %d ns; any beyond the first %d are skipped",
                    self.limit,
                    self.cursor_ns,
                    self.limit,
                )
                self.cursor_ns, self.seen_at_cursor = self.cursor_ns + 1, set()
        self._delivery.metrics.lag.labels("loki").set(max(0.0, (end_ns - self.cursor_ns) / 1e9))
        self._store.put(self._store_key, {"ns": self.cursor_ns, "seen": sorted(self.seen_at_cursor)})
        return total

    def _first_cursor(self, end_ns: int) -> None:
        """The stored cursor (bounded by ``max_catchup_s``), else ``lookback`` before now."""
        stored = self._store.get(self._store_key)
        oldest = end_ns - self._max_catchup_ns
        if isinstance(stored, dict) and isinstance(stored.get("ns"), int):
            if stored["ns"] >= oldest:
                self.cursor_ns, self.seen_at_cursor = stored["ns"], set(stored.get("seen") or ())
                return
            log.warning(
                "Loki query_range: stored cursor is older than the catch-up limit; entries before %d ns are skipped",
                oldest,
            )
            self.cursor_ns, self.seen_at_cursor = oldest, set()
            return
        self.cursor_ns, self.seen_at_cursor = end_ns - self._lookback_ns, set()

    def _advance(self, delivered: Sequence[LokiEntry]) -> None:
        if not delivered:
            return
        newest = delivered[-1].ns
        at_newest = {e.identity for e in delivered if e.ns == newest}
        if newest == self.cursor_ns:
            self.seen_at_cursor |= at_newest
        else:
            self.cursor_ns, self.seen_at_cursor = newest, at_newest
        self._store.put(self._store_key, {"ns": self.cursor_ns, "seen": sorted(self.seen_at_cursor)})

    def _page(self, start_ns: int, end_ns: int) -> tuple[list[LokiEntry], Skipped] | None:
        """One request ``[start_ns, end_ns)``: its entries and what it left out; None when it failed (logged)."""
        metrics = self._delivery.metrics
        what = "Loki query_range"
        params = {
            "query": self.query,
            "start": str(start_ns),
            "end": str(end_ns),
            "limit": str(self.limit),
            "direction": "forward",
        }
        try:
            answer = fetch(self._client, self.url, params=params, max_bytes=self._max_bytes, **self._headers)
        except httpx.HTTPError as exc:
            log.warning("%s: cannot reach %s: %s", what, self.url, exc or type(exc).__name__)
            metrics.requests.labels(self.receiver, "unreachable").inc()
            return None
        metrics.requests.labels(self.receiver, str(answer.status)).inc()
        skipped = Skipped()
        try:
            _check_answer(answer, what, self._max_bytes)
            return loki_entries(_json_answer(answer, what), what=what, skipped=skipped, limits=self._limits), skipped
        except RejectedInput as exc:
            self._delivery.deadletter(
                receiver=self.receiver, source=f"pull:{self.url}", key=self.query, raw=answer.body, error=exc
            )
            return None


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
