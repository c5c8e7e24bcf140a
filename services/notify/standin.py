"""A local stand-in for Slack, PagerDuty and webhook receivers that checks every request.

Used by `medic demo` (its notifications go here, never to a real vendor) and by the tests.

:class:`VendorServer` is an ``http.server`` on 127.0.0.1 (random port, own thread). Each request is
validated against the vendor's documented schema (required fields, types, limits); a violation is
recorded and answered the way the vendor answers invalid input (400), so a notifier bug fails its
test twice over. Tests can script the next answers of a path (202/200, 429 with Retry-After, 500, 400).
The tests at the bottom check the checker itself.

Documented rules encoded here:
* Slack Block Kit: at most 50 blocks; header plain_text 1..150 chars; section text 1..3000 chars,
  at most 10 fields of 1..2000 chars; context 1..10 elements; ``block_id`` at most 255 chars.
* Slack ``chat.postMessage``: Bearer token, ``channel``, ``text`` or ``blocks``; ``chat.update``:
  ``channel`` and ``ts`` too. Answers ``{"ok": true, "channel", "ts"}``.
* PagerDuty Events API v2: ``routing_key`` (32 chars), ``event_action`` in trigger/acknowledge/resolve,
  ``dedup_key`` at most 255 chars; for trigger a ``payload`` with ``summary`` (1..1024), ``source``,
  ``severity`` in critical/error/warning/info, RFC 3339 ``timestamp``, ``custom_details`` an object;
  the body at most 512 KB. Answers 202 ``{"status": "success", "dedup_key"}``.
* Alertmanager webhook v4 and API v2 postable alerts: the fields and types Alertmanager sends / takes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SLACK_WEBHOOK = "/slack/webhook/T000/B000/XXXX"
SLACK_POST = "/slack/api/chat.postMessage"
SLACK_UPDATE = "/slack/api/chat.update"
PAGERDUTY = "/pagerduty/v2/enqueue"
WEBHOOK = "/hooks/incidents"
AM_ALERTS = "/am/api/v2/alerts"
ROUTING_KEY = "R0123456789ABCDEF0123456789ABCDE"
SLACK_TOKEN = "xoxb-test-token"


@dataclass
class Reply:
    """A scripted answer."""

    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Request:
    """A request the server received."""

    path: str
    headers: dict[str, str]
    body: Any
    size: int
    at: float
    status: int = 0


def _str(value: Any, where: str, errors: list[str], *, lo: int = 0, hi: int | None = None) -> None:
    if not isinstance(value, str):
        errors.append(f"{where}: expected a string, got {type(value).__name__}")
        return
    if len(value) < lo:
        errors.append(f"{where}: shorter than {lo}")
    if hi is not None and len(value) > hi:
        errors.append(f"{where}: {len(value)} chars, over {hi}")


def _str_map(value: Any, where: str, errors: list[str]) -> None:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        errors.append(f"{where}: expected a map of strings")


def _rfc3339(value: Any, where: str, errors: list[str]) -> None:
    try:
        dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        errors.append(f"{where}: not an RFC 3339 time: {value!r}")


def _text_object(obj: Any, where: str, errors: list[str], hi: int) -> None:
    if not isinstance(obj, dict) or obj.get("type") not in ("mrkdwn", "plain_text"):
        errors.append(f"{where}: not a text object")
        return
    _str(obj.get("text"), f"{where}.text", errors, lo=1, hi=hi)


def check_blocks(blocks: Any) -> list[str]:
    """Block Kit limits (the subset ClusterMedic uses, plus actions)."""
    errors: list[str] = []
    if not isinstance(blocks, list):
        return ["blocks: expected a list"]
    if len(blocks) > 50:
        errors.append(f"blocks: {len(blocks)} blocks, over 50")
    for i, block in enumerate(blocks):
        where = f"blocks[{i}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if "block_id" in block:
            _str(block["block_id"], f"{where}.block_id", errors, hi=255)
        if kind == "header":
            if block.get("text", {}).get("type") != "plain_text":
                errors.append(f"{where}: header text must be plain_text")
            _str(block.get("text", {}).get("text"), f"{where}.text", errors, lo=1, hi=150)
        elif kind == "section":
            if "text" not in block and "fields" not in block:
                errors.append(f"{where}: section needs text or fields")
            if "text" in block:
                _text_object(block["text"], f"{where}.text", errors, 3000)
            fields = block.get("fields", [])
            if len(fields) > 10:
                errors.append(f"{where}.fields: {len(fields)} fields, over 10")
            for j, f in enumerate(fields):
                _text_object(f, f"{where}.fields[{j}]", errors, 2000)
        elif kind == "context":
            elements = block.get("elements", [])
            if not 1 <= len(elements) <= 10:
                errors.append(f"{where}: context needs 1..10 elements")
            for j, e in enumerate(elements):
                _text_object(e, f"{where}.elements[{j}]", errors, 3000)
        elif kind == "actions":
            if not 1 <= len(block.get("elements", [])) <= 25:
                errors.append(f"{where}: actions needs 1..25 elements")
        elif kind != "divider":
            errors.append(f"{where}: unexpected block type {kind!r}")
    return errors


def check_slack_message(body: Any) -> list[str]:
    """A Slack message body: text and/or blocks."""
    if not isinstance(body, dict):
        return ["body: expected an object"]
    errors: list[str] = []
    if "text" not in body and "blocks" not in body:
        errors.append("body: needs text or blocks")
    if "text" in body:
        _str(body["text"], "text", errors, hi=40000)
    if "blocks" in body:
        errors += check_blocks(body["blocks"])
    return errors


def check_pagerduty(body: Any, size: int) -> list[str]:
    """An Events API v2 event."""
    if size > 512 * 1024:
        return [f"body: {size} bytes, over 512 KB"]
    if not isinstance(body, dict):
        return ["body: expected an object"]
    errors: list[str] = []
    _str(body.get("routing_key"), "routing_key", errors, lo=32, hi=32)
    if body.get("event_action") not in ("trigger", "acknowledge", "resolve"):
        errors.append(f"event_action: invalid {body.get('event_action')!r}")
    if "dedup_key" in body:
        _str(body["dedup_key"], "dedup_key", errors, lo=1, hi=255)
    elif body.get("event_action") != "trigger":
        errors.append("dedup_key: required for acknowledge and resolve")
    payload = body.get("payload")
    if body.get("event_action") == "trigger" or payload is not None:
        if not isinstance(payload, dict):
            return [*errors, "payload: required object"]
        _str(payload.get("summary"), "payload.summary", errors, lo=1, hi=1024)
        _str(payload.get("source"), "payload.source", errors, lo=1)
        if payload.get("severity") not in ("critical", "error", "warning", "info"):
            errors.append(f"payload.severity: invalid {payload.get('severity')!r}")
        if "timestamp" in payload:
            _rfc3339(payload["timestamp"], "payload.timestamp", errors)
        for key in ("component", "group", "class"):
            if key in payload:
                _str(payload[key], f"payload.{key}", errors)
        if "custom_details" in payload and not isinstance(payload["custom_details"], dict):
            errors.append("payload.custom_details: expected an object")
    for i, link in enumerate(body.get("links", [])):
        _str(link.get("href"), f"links[{i}].href", errors, lo=1)
    return errors


def check_webhook_v4(body: Any) -> list[str]:
    """Alertmanager's webhook v4 body."""
    if not isinstance(body, dict):
        return ["body: expected an object"]
    errors: list[str] = []
    if body.get("version") != "4":
        errors.append("version: must be '4'")
    for key in ("groupKey", "receiver", "externalURL"):
        _str(body.get(key), key, errors)
    if body.get("status") not in ("firing", "resolved"):
        errors.append("status: firing or resolved")
    if not isinstance(body.get("truncatedAlerts"), int) or body["truncatedAlerts"] < 0:
        errors.append("truncatedAlerts: non-negative integer")
    for key in ("groupLabels", "commonLabels", "commonAnnotations"):
        _str_map(body.get(key), key, errors)
    alerts = body.get("alerts")
    if not isinstance(alerts, list):
        return [*errors, "alerts: expected a list"]
    for i, a in enumerate(alerts):
        if a.get("status") not in ("firing", "resolved"):
            errors.append(f"alerts[{i}].status: firing or resolved")
        _str_map(a.get("labels"), f"alerts[{i}].labels", errors)
        _str_map(a.get("annotations"), f"alerts[{i}].annotations", errors)
        _rfc3339(a.get("startsAt"), f"alerts[{i}].startsAt", errors)
        _rfc3339(a.get("endsAt"), f"alerts[{i}].endsAt", errors)
        _str(a.get("generatorURL"), f"alerts[{i}].generatorURL", errors)
        _str(a.get("fingerprint"), f"alerts[{i}].fingerprint", errors, lo=1)
    return errors


def check_postable_alerts(body: Any) -> list[str]:
    """Alertmanager API v2 ``postableAlerts``."""
    if not isinstance(body, list):
        return ["body: expected a list"]
    errors: list[str] = []
    for i, a in enumerate(body):
        if not isinstance(a, dict) or not a.get("labels"):
            errors.append(f"[{i}].labels: required, non-empty")
            continue
        _str_map(a["labels"], f"[{i}].labels", errors)
        if "annotations" in a:
            _str_map(a["annotations"], f"[{i}].annotations", errors)
        for key in ("startsAt", "endsAt"):
            if key in a:
                _rfc3339(a[key], f"[{i}].{key}", errors)
        extra = set(a) - {"labels", "annotations", "startsAt", "endsAt", "generatorURL"}
        if extra:
            errors.append(f"[{i}]: unknown fields {sorted(extra)}")
    return errors


class VendorServer:
    """The local vendor stand-in (see the module docstring)."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.violations: list[str] = []
        self._scripts: dict[str, list[Reply]] = {}
        self._lock = threading.Lock()
        self._ts = itertools.count(1)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    def start(self) -> VendorServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def script(self, path: str, *replies: Reply) -> None:
        """Answer the next requests to ``path`` with these replies, then the default success."""
        with self._lock:
            self._scripts.setdefault(path, []).extend(replies)

    def to(self, path: str) -> list[Request]:
        """Requests received on ``path``."""
        with self._lock:
            return [r for r in self.requests if r.path == path]

    def _validate(self, path: str, headers: dict[str, str], body: Any, size: int) -> list[str]:
        errors: list[str] = []
        if not headers.get("content-type", "").startswith("application/json"):
            errors.append(f"content-type: {headers.get('content-type')!r}, expected application/json")
        if path.startswith("/slack/api/"):
            if headers.get("authorization") != f"Bearer {SLACK_TOKEN}":
                errors.append("authorization: missing or wrong Bearer token")
            if not isinstance(body, dict) or not body.get("channel"):
                errors.append("channel: required")
            if path == SLACK_UPDATE:
                _str(body.get("ts") if isinstance(body, dict) else None, "ts", errors, lo=1)
            if isinstance(body, dict) and "thread_ts" in body:
                _str(body["thread_ts"], "thread_ts", errors, lo=1)
            return errors + check_slack_message(body)
        if path.startswith("/slack/webhook/"):
            return errors + check_slack_message(body)
        if path == PAGERDUTY:
            return errors + check_pagerduty(body, size)
        if path == WEBHOOK:
            return errors + check_webhook_v4(body)
        if path == AM_ALERTS:
            return errors + check_postable_alerts(body)
        return [*errors, f"unknown path {path}"]

    def _default(self, path: str, body: Any) -> Reply:
        if path.startswith("/slack/api/"):
            ts = f"{1700000000 + next(self._ts)}.000100" if path == SLACK_POST else body.get("ts")
            return Reply(200, {"ok": True, "channel": "C0TEST", "ts": ts})
        if path.startswith("/slack/webhook/"):
            return Reply(200, "ok")
        if path == PAGERDUTY:
            return Reply(202, {"status": "success", "message": "Event processed", "dedup_key": body.get("dedup_key")})
        return Reply(200, {})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                errors = server._validate(self.path, headers, body, len(raw))
                req = Request(self.path, headers, body, len(raw), time.monotonic())
                with server._lock:
                    server.requests.append(req)
                    server.violations += [f"{self.path}: {e}" for e in errors]
                    scripted = server._scripts.get(self.path)
                    reply = scripted.pop(0) if scripted else None
                if errors:
                    reply = Reply(400, {"status": "invalid event", "errors": errors})
                reply = reply or server._default(self.path, body)
                req.status = reply.status
                data = reply.body if isinstance(reply.body, (bytes, str)) else json.dumps(reply.body)
                data = data.encode() if isinstance(data, str) else data
                self.send_response(reply.status)
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        return Handler


@contextlib.contextmanager
def vendor_server() -> Iterator[VendorServer]:
    """A started :class:`VendorServer`, stopped afterwards."""
    server = VendorServer().start()
    try:
        yield server
    finally:
        server.stop()
