"""A local stand-in for Loki's ``GET /loki/api/v1/query_range`` that checks every request like Loki does.

Loki itself is not installable here, so the pull client is tested against this: it holds log entries,
answers log queries in Loki's JSON format, and refuses what Loki refuses, with Loki's status and a
plain-text reason. Every refusal is also recorded in :attr:`LokiStandIn.violations`, so a client bug
fails its test even when the client copes with the 400 (tests/unit/test_ingest_pull.py checks the
checker).

Loki's documented behaviour encoded here (HTTP API, ``query_range`` for log queries):

* ``query`` is required and must be a LogQL log query: a stream selector ``{name op "value", ...}``
  (ops ``=``, ``!=``, ``=~``, ``!~``) with at least one matcher that does not match the empty string
  (``{app=~".*"}`` is refused), then optional line filters ``|= "x"``, ``!= "x"``, ``|~ "re"``, ``!~ "re"``.
* ``start`` (default one hour ago) is inclusive and ``end`` (default now) exclusive; both nanosecond
  Unix epochs or RFC 3339; ``end`` must be after ``start``; the range at most ``max_query_length``
  (721h).
* ``limit`` (default 100) a positive integer up to ``max_entries_limit_per_query`` (5000).
* ``direction`` ``forward`` or ``backward`` (default), any case. The ``limit`` applies to the
  entries of all streams together: forward returns the oldest ``limit`` entries of the range.
* The answer: ``{"status": "success", "data": {"resultType": "streams", "result": [{"stream": {...},
  "values": [["<ns>", "<line>"], ...]}], "stats": {...}}}``, each stream's values in ``direction`` order.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpx

QUERY_RANGE = "/loki/api/v1/query_range"
MAX_ENTRIES_LIMIT = 5000
MAX_QUERY_LENGTH_NS = 721 * 3600 * 1_000_000_000

_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*')
_FILTER = re.compile(r'\s*(\|=|!=|\|~|!~)\s*"((?:[^"\\]|\\.)*)"\s*')


class LokiError(Exception):
    """A request Loki would refuse: ``status`` and the plain-text reason Loki answers."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class LogQuery:
    """A parsed LogQL log query: label matchers and line filters."""

    matchers: list[tuple[str, str, str]]
    filters: list[tuple[str, str]]

    def selects(self, stream: Mapping[str, str]) -> bool:
        """Whether a stream's labels satisfy every matcher."""
        for name, op, value in self.matchers:
            have = stream.get(name, "")
            ok = {
                "=": have == value,
                "!=": have != value,
                "=~": re.fullmatch(value, have) is not None,
                "!~": re.fullmatch(value, have) is None,
            }[op]
            if not ok:
                return False
        return True

    def keeps(self, line: str) -> bool:
        """Whether a line passes every line filter."""
        for op, value in self.filters:
            ok = {
                "|=": value in line,
                "!=": value not in line,
                "|~": re.search(value, line) is not None,
                "!~": re.search(value, line) is None,
            }[op]
            if not ok:
                return False
        return True


def parse_log_query(text: str) -> LogQuery:
    """Parse the LogQL subset above.

    Raises:
        LokiError: 400 with Loki's kind of message.
    """
    text = text.strip()
    if not text:
        raise LokiError(400, "parse error : syntax error: unexpected $end")
    if not text.startswith("{"):
        raise LokiError(400, f"parse error at line 1, col 1: syntax error: unexpected IDENTIFIER in {text[:40]!r}")
    pos, matchers = 1, []
    while True:
        match = _MATCHER.match(text, pos)
        if not match:
            raise LokiError(400, f"parse error at line 1, col {pos + 1}: syntax error in stream selector")
        name, op, raw = match.groups()
        matchers.append((name, op, json.loads(f'"{raw}"')))
        pos = match.end()
        if text[pos : pos + 1] == ",":
            pos += 1
            continue
        if text[pos : pos + 1] == "}":
            pos += 1
            break
        raise LokiError(400, f"parse error at line 1, col {pos + 1}: syntax error in stream selector")
    filters = []
    while pos < len(text):
        match = _FILTER.match(text, pos)
        if not match:
            raise LokiError(
                400, f"parse error at line 1, col {pos + 1}: this stand-in and log queries take line filters only"
            )
        filters.append((match.group(1), json.loads(f'"{match.group(2)}"')))
        pos = match.end()
    if all(_matches_empty(op, value) for _, op, value in matchers):
        raise LokiError(
            400,
            "parse error : queries require at least one regexp or equality matcher that does not have an "
            'empty-compatible value. For instance, app=~".*" does not meet this requirement, but app=~".+" will',
        )
    return LogQuery(matchers, filters)


def _matches_empty(op: str, value: str) -> bool:
    if op == "=":
        return value == ""
    if op == "=~":
        return re.fullmatch(value, "") is not None
    return True  # negative matchers never select on their own


def parse_time(text: str, name: str) -> int:
    """A Loki timestamp parameter (nanosecond epoch or RFC 3339) as nanoseconds.

    Raises:
        LokiError: 400 when it is neither.
    """
    if text.isascii() and text.isdigit():
        return int(text)
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise LokiError(400, f'invalid parameter "{name}": cannot parse "{text}" to a valid timestamp') from exc
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


@dataclass
class LokiStandIn:
    """Holds log entries and answers ``query_range`` for them as Loki would (see the module docstring).

    Attributes:
        requests: the query parameters of every request, in order.
        violations: why each refused request was refused.
        scripted: answers ``(status, content type, body)`` to give instead of the real one, next first.
    """

    entries: list[tuple[dict[str, str], int, str]] = field(default_factory=list)
    requests: list[dict[str, str]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    scripted: deque[tuple[int, str, bytes]] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def push(self, stream: Mapping[str, str], ns: int, line: str) -> None:
        """Store one entry (an exact repeat of stream, time and line is dropped, as Loki does)."""
        with self._lock:
            entry = (dict(stream), ns, line)
            if entry not in self.entries:
                self.entries.append(entry)

    def answer(self, path: str, params: Mapping[str, str]) -> tuple[int, str, bytes]:
        """The status, content type and body Loki would give for a GET of ``path`` with ``params``."""
        with self._lock:
            self.requests.append(dict(params))
            if path != QUERY_RANGE:
                return 404, "text/plain", b"404 page not found\n"
            if self.scripted:
                return self.scripted.popleft()
            try:
                body = self._query_range(params)
            except LokiError as exc:
                self.violations.append(str(exc))
                return exc.status, "text/plain; charset=utf-8", f"{exc}\n".encode()
        return 200, "application/json; charset=UTF-8", json.dumps(body).encode()

    def _query_range(self, params: Mapping[str, str]) -> dict[str, Any]:
        query = parse_log_query(params.get("query", ""))
        now = time.time_ns()
        start = parse_time(params["start"], "start") if "start" in params else now - 3600 * 1_000_000_000
        end = parse_time(params["end"], "end") if "end" in params else now
        if end <= start:
            raise LokiError(400, "end timestamp must not be before or equal to start time")
        if end - start > MAX_QUERY_LENGTH_NS:
            raise LokiError(400, "the query time range exceeds the limit (query length: too long, limit: 721h)")
        raw_limit = params.get("limit", "100")
        if not raw_limit.isdigit() or int(raw_limit) <= 0:
            raise LokiError(400, f'invalid parameter "limit": {raw_limit!r} must be a positive integer')
        limit = int(raw_limit)
        if limit > MAX_ENTRIES_LIMIT:
            raise LokiError(400, f"max entries limit per query exceeded, limit > max_entries_limit ({limit} > 5000)")
        direction = params.get("direction", "backward").lower()
        if direction not in ("forward", "backward"):
            raise LokiError(400, f'invalid parameter "direction": {params["direction"]!r}')
        chosen = [
            (stream, ns, line)
            for stream, ns, line in self.entries
            if start <= ns < end and query.selects(stream) and query.keeps(line)
        ]
        chosen.sort(key=lambda e: e[1], reverse=direction == "backward")
        chosen = chosen[:limit]
        streams: dict[str, dict[str, Any]] = {}
        for stream, ns, line in chosen:
            key = json.dumps(sorted(stream.items()))
            streams.setdefault(key, {"stream": stream, "values": []})["values"].append([str(ns), line])
        return {
            "status": "success",
            "data": {
                "resultType": "streams",
                "result": list(streams.values()),
                "stats": {"summary": {"totalEntriesReturned": len(chosen)}},
            },
        }

    # ------------------------------------------------------------------ transports

    def transport(self) -> httpx.MockTransport:
        """An httpx transport that answers from this stand-in (unit tests, no network)."""

        def handle(request: httpx.Request) -> httpx.Response:
            params = dict(request.url.params.multi_items())
            status, content_type, body = self.answer(request.url.path, params)
            return httpx.Response(status, content=body, headers={"Content-Type": content_type})

        return httpx.MockTransport(handle)

    @contextlib.contextmanager
    def serve(self) -> Iterator[str]:
        """Serve this stand-in over HTTP on a free loopback port; yields the base URL."""
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                status, content_type, body = standin.answer(parts.path, dict(parse_qsl(parts.query)))
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()
            server.server_close()
