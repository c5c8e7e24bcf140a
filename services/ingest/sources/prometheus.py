"""``prometheus``: PromQL queries pulled with Prometheus' ``query_range`` into ``telemetry.metrics.v1``.

:class:`PrometheusPuller` runs each configured PromQL query with ``/api/v1/query_range`` on a grid of
``step`` seconds. A query's cursor is the last evaluation time pulled; the next range starts one step
after it, so no evaluation time is pulled twice or skipped, however late a poll runs. A cursor far
behind is caught up in chunks (Prometheus refuses more than 11,000 points a series). Delivery, dead
letters, cursors and the loop are the pull sources' (:mod:`services.ingest.pull`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import httpx

from services.core.errors import ConfigError
from services.ingest import normalise
from services.ingest.errors import Overloaded, RejectedInput
from services.ingest.pull import (
    Clock,
    CursorStore,
    Delivery,
    Series,
    Skipped,
    check_answer,
    cursor_store,
    fetch,
    http_client,
    json_answer,
)
from services.ingest.source import Option, PullSource

log = logging.getLogger(__name__)

QUERY_RANGE_PATH = "/api/v1/query_range"
# Prometheus answers 400 above 11,000 points per series; stay clear of it when catching up.
MAX_POINTS_PER_REQUEST = 10_000


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
        self._client = client or http_client(timeout_s)
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
            check_answer(answer, what, self._max_bytes)
            series = matrix_series(json_answer(answer, what), default_name=name, what=what, skipped=skipped)
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


def parse_queries(items: list[str]) -> dict[str, str]:
    """``--query NAME=PROMQL`` items as the ``ingest_prometheus_queries`` mapping.

    Raises:
        ConfigError: an item without ``=``, or with an empty name or query.
    """
    queries: dict[str, str] = {}
    for item in items:
        name, sep, promql = item.partition("=")
        if not sep or not name.strip() or not promql.strip():
            raise ConfigError(f"--query {item!r} is not NAME=PROMQL")
        queries[name.strip()] = promql.strip()
    return queries


class PrometheusSource(PullSource):
    """``medic ingest pull-prom``: a :class:`PrometheusPuller` over ``ingest_prometheus_queries``."""

    name = "prometheus"
    command = "pull-prom"
    summary = "Pull PromQL queries from Prometheus with query_range into telemetry.metrics.v1, resuming per query."
    options: ClassVar[tuple[Option, ...]] = (
        Option("url", str, "ingest_prometheus_url", "Prometheus base URL (default: ingest_prometheus_url)."),
        Option(
            "query",
            list[str],
            "ingest_prometheus_queries",
            "NAME=PROMQL to pull; repeat for several (default: ingest_prometheus_queries).",
            parse=parse_queries,
        ),
        Option("step", float, "ingest_pull_step_s", "query_range step in seconds (default: ingest_pull_step_s)."),
        Option("interval", float, "ingest_pull_interval_s", "Seconds between polls (default: ingest_pull_interval_s)."),
    )

    def check(self) -> None:
        if not self.settings.ingest_prometheus_url or not self.settings.ingest_prometheus_queries:
            raise ConfigError("pull-prom needs --url and at least one --query NAME=PROMQL (or their settings)")

    @property
    def interval_s(self) -> float:
        return self.settings.ingest_pull_interval_s

    def build(self, delivery: Delivery) -> PrometheusPuller:
        settings = self.settings
        assert settings.ingest_prometheus_url is not None  # check() refused it otherwise
        return PrometheusPuller(
            settings.ingest_prometheus_url,
            settings.ingest_prometheus_queries,
            delivery,
            step_s=settings.ingest_pull_step_s,
            lookback_s=settings.ingest_pull_interval_s,
            max_bytes=settings.ingest_max_decompressed_bytes,
            max_samples=settings.ingest_max_samples_per_batch,
            cursors=cursor_store(settings, self.command),
            max_catchup_s=settings.ingest_pull_max_catchup_s,
        )
