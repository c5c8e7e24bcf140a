"""``loki``: a LogQL log query followed with Loki's ``query_range`` into ``telemetry.logs.v1``.

:class:`LokiPuller` follows one LogQL log query with ``/loki/api/v1/query_range``,
``direction=forward``, paging by ``limit``. Its cursor is the newest entry's nanosecond timestamp
together with the entries already delivered at exactly that time. The next page (and the next poll)
starts *at* the cursor, since Loki's ``start`` is inclusive and entries may share a nanosecond; the
remembered entries are skipped, so there is no duplicate and no gap. Entries are normalised exactly
as the Loki push receiver normalises them. Delivery, dead letters, cursors and the loop are the pull
sources' (:mod:`services.ingest.pull`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx

from services.core.errors import ConfigError
from services.core.events import LogRecord
from services.ingest import normalise
from services.ingest.errors import Overloaded, RejectedInput
from services.ingest.pull import (
    Clock,
    CursorStore,
    Delivery,
    Skipped,
    check_answer,
    cursor_store,
    fetch,
    http_client,
    json_answer,
)
from services.ingest.source import Option, PullSource
from services.ingest.timebounds import TimeCheck

log = logging.getLogger(__name__)

LOKI_QUERY_RANGE_PATH = "/loki/api/v1/query_range"
# Loki's default max_query_length is 721h: a start older than this would be refused.
LOKI_MAX_RANGE_NS = 720 * 3600 * 1_000_000_000


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
        self._client = client or http_client(timeout_s)
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
            check_answer(answer, what, self._max_bytes)
            return loki_entries(json_answer(answer, what), what=what, skipped=skipped, limits=self._limits), skipped
        except RejectedInput as exc:
            self._delivery.deadletter(
                receiver=self.receiver, source=f"pull:{self.url}", key=self.query, raw=answer.body, error=exc
            )
            return None


class LokiSource(PullSource):
    """``medic ingest pull-loki``: a :class:`LokiPuller` following ``ingest_loki_query``."""

    name = "loki"
    command = "pull-loki"
    summary = "Follow a LogQL query with Loki's query_range into telemetry.logs.v1 (no duplicates, no gaps)."
    options: ClassVar[tuple[Option, ...]] = (
        Option("url", str, "ingest_loki_url", "Loki base URL (default: ingest_loki_url)."),
        Option("query", str, "ingest_loki_query", "LogQL log query to follow (default: ingest_loki_query)."),
        Option("limit", int, "ingest_loki_limit", "Entries per query_range page (default: ingest_loki_limit)."),
        Option("interval", float, "ingest_pull_interval_s", "Seconds between polls (default: ingest_pull_interval_s)."),
    )

    def check(self) -> None:
        if not self.settings.ingest_loki_url:
            raise ConfigError("pull-loki needs --url (or CLUSTERMEDIC_INGEST_LOKI_URL)")

    @property
    def interval_s(self) -> float:
        return self.settings.ingest_pull_interval_s

    def build(self, delivery: Delivery) -> LokiPuller:
        settings = self.settings
        assert settings.ingest_loki_url is not None  # check() refused it otherwise
        return LokiPuller(
            settings.ingest_loki_url,
            settings.ingest_loki_query,
            delivery,
            limit=settings.ingest_loki_limit,
            lookback_s=settings.ingest_pull_interval_s,
            max_bytes=settings.ingest_max_decompressed_bytes,
            cursors=cursor_store(settings, self.command),
            max_catchup_s=settings.ingest_pull_max_catchup_s,
        )
