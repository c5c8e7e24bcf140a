"""Notifiers against the local vendor server: what is sent, and which failures are retryable."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.notify.base import Message, NotifyContext, retry_after
from services.notify.config import NotifySettings
from services.notify.errors import NotifierConfigError, PermanentDelivery, RetryableDelivery
from services.notify.registry import NOTIFIERS
from services.notify.threads import MemoryThreadStore
from tests.unit.test_notify_render import alert, notification
from tests.unit.test_notify_vendor_server import (
    PAGERDUTY,
    ROUTING_KEY,
    SLACK_POST,
    SLACK_TOKEN,
    SLACK_UPDATE,
    SLACK_WEBHOOK,
    WEBHOOK,
    Reply,
    VendorServer,
    vendor_server,
)


@pytest.fixture
def vendor() -> Iterator[VendorServer]:
    """The local Slack / PagerDuty / webhook stand-in."""
    with vendor_server() as server:
        yield server


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client() as client:
        yield client


def make(name: str, config: dict[str, Any], http: httpx.Client, threads: MemoryThreadStore | None = None) -> Any:
    ctx = NotifyContext(settings=NotifySettings(timeout_s=5), http=http, threads=threads or MemoryThreadStore())
    return NOTIFIERS.load(name)(config, ctx)


MSG = Message(notification=notification([alert(i) for i in range(60)]))


def test_every_notifier_sends_a_valid_request(vendor: VendorServer, http: httpx.Client, tmp_path: Path) -> None:
    key_file = tmp_path / "pd-key"
    key_file.write_text(ROUTING_KEY + "\n")
    cases = [
        ("slack_webhook", {"api_url": vendor.url + SLACK_WEBHOOK}),
        ("slack_app", {"app_token": SLACK_TOKEN, "channel": "#sre", "app_url": vendor.url + SLACK_POST}),
        ("pagerduty", {"routing_key_file": str(key_file), "url": vendor.url + PAGERDUTY}),
        ("webhook", {"url": vendor.url + WEBHOOK, "max_alerts": 10}),
    ]
    for name, config in cases:
        result = make(name, config, http).send(MSG)
        assert result.status_code in (200, 202), name
    assert vendor.violations == []
    assert vendor.to(PAGERDUTY)[0].body["routing_key"] == ROUTING_KEY
    assert vendor.to(WEBHOOK)[0].body["truncatedAlerts"] == 50


@pytest.mark.parametrize(
    ("reply", "error", "wait"),
    [
        (Reply(429, {}, {"Retry-After": "7"}), RetryableDelivery, 7.0),
        (Reply(500), RetryableDelivery, None),
        (Reply(503, {}, {"Retry-After": "bogus"}), RetryableDelivery, None),
        (Reply(400, {"status": "invalid event"}), PermanentDelivery, None),
        (Reply(403), PermanentDelivery, None),
    ],
)
def test_pagerduty_answers_map_to_retryable_or_permanent(
    vendor: VendorServer, http: httpx.Client, reply: Reply, error: type[Exception], wait: float | None
) -> None:
    vendor.script(PAGERDUTY, reply)
    notifier = make("pagerduty", {"routing_key": ROUTING_KEY, "url": vendor.url + PAGERDUTY}, http)
    with pytest.raises(error) as caught:
        notifier.send(MSG)
    assert not isinstance(caught.value, RetryableDelivery) or caught.value.retry_after == wait
    assert caught.value.status_code == reply.status  # type: ignore[attr-defined]


def test_connection_refused_is_retryable(http: httpx.Client) -> None:
    with pytest.raises(RetryableDelivery):
        make("webhook", {"url": "http://127.0.0.1:9/hook"}, http).send(MSG)


def test_missing_or_unreadable_secrets_are_permanent(http: httpx.Client, tmp_path: Path) -> None:
    with pytest.raises(NotifierConfigError):
        make("pagerduty", {"routing_key_file": str(tmp_path / "missing")}, http).send(MSG)
    with pytest.raises(NotifierConfigError):
        make("slack_webhook", {}, http).send(MSG)
    with pytest.raises(NotifierConfigError):
        make("pagerduty", {"service_key": "v1"}, http).send(MSG)


def test_slack_app_keeps_one_thread_per_incident(vendor: VendorServer, http: httpx.Client) -> None:
    threads = MemoryThreadStore()
    config = {"app_token": SLACK_TOKEN, "channel": "#sre", "app_url": vendor.url + SLACK_POST}
    notifier = make("slack_app", config, http, threads)
    first = notifier.send(Message(notification=notification([alert(1)])))
    parent = vendor.to(SLACK_POST)[0].body
    assert "thread_ts" not in parent and first.external_id
    notifier.send(Message(notification=notification([alert(1), alert(2)], reason="update")))
    reply = vendor.to(SLACK_POST)[1].body
    assert reply["thread_ts"] == first.external_id and reply["channel"] == "C0TEST"
    assert vendor.to(SLACK_UPDATE) == []
    resolved = notification([alert(1, status="resolved")], status="resolved", reason="resolved")
    result = notifier.send(Message(notification=resolved))
    assert result.requests == 2
    update = vendor.to(SLACK_UPDATE)[0].body
    assert update["ts"] == first.external_id and "RESOLVED" in update["blocks"][0]["text"]["text"]
    assert vendor.to(SLACK_POST)[2].body["thread_ts"] == first.external_id
    assert vendor.violations == []
    # another incident gets its own parent
    notifier.send(Message(notification=notification([alert(9)], incident_id="inc-other")))
    assert "thread_ts" not in vendor.to(SLACK_POST)[3].body


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (Reply(200, {"ok": False, "error": "ratelimited"}, {"Retry-After": "2"}), RetryableDelivery),
        (Reply(429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "2"}), RetryableDelivery),
        (Reply(200, {"ok": False, "error": "channel_not_found"}), PermanentDelivery),
        (Reply(200, {"ok": False, "error": "invalid_auth"}), PermanentDelivery),
    ],
)
def test_slack_ok_false_is_a_failure(
    vendor: VendorServer, http: httpx.Client, reply: Reply, error: type[Exception]
) -> None:
    vendor.script(SLACK_POST, reply)
    config = {"app_token": SLACK_TOKEN, "channel": "#sre", "app_url": vendor.url + SLACK_POST}
    with pytest.raises(error) as caught:
        make("slack_app", config, http).send(MSG)
    if isinstance(caught.value, RetryableDelivery):
        assert caught.value.retry_after == 2.0


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after("12") == 12.0
    assert retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0
    assert retry_after(None) is None and retry_after("soon") is None
