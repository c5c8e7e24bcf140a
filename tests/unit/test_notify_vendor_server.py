"""The vendor stand-in (services/notify/standin.py) checks what the vendors check.

Other tests import the stand-in's names from here, as they did before it moved into the product.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from services.notify.standin import (
    AM_ALERTS,
    PAGERDUTY,
    ROUTING_KEY,
    SLACK_POST,
    SLACK_TOKEN,
    SLACK_UPDATE,
    SLACK_WEBHOOK,
    WEBHOOK,
    Reply,
    Request,
    VendorServer,
    check_blocks,
    check_pagerduty,
    check_postable_alerts,
    check_slack_message,
    check_webhook_v4,
    vendor_server,
)

__all__ = [
    "AM_ALERTS",
    "PAGERDUTY",
    "ROUTING_KEY",
    "SLACK_POST",
    "SLACK_TOKEN",
    "SLACK_UPDATE",
    "SLACK_WEBHOOK",
    "WEBHOOK",
    "Reply",
    "Request",
    "VendorServer",
    "check_blocks",
    "check_pagerduty",
    "check_postable_alerts",
    "check_slack_message",
    "check_webhook_v4",
    "vendor_server",
]


@pytest.fixture
def vendor() -> Iterator[VendorServer]:
    with vendor_server() as server:
        yield server


# ------------------------------------------------------------------------ the checker's own tests

CHECKS: list[tuple[Callable[[Any], list[str]], Any]] = [
    (check_blocks, [{"type": "header", "text": {"type": "plain_text", "text": "x" * 151}}]),
    (check_blocks, [{"type": "section", "text": {"type": "mrkdwn", "text": "x" * 3001}}]),
    (check_blocks, [{"type": "section", "fields": [{"type": "mrkdwn", "text": "f"}] * 11}]),
    (check_blocks, [{"type": "divider"}] * 51),
    (check_webhook_v4, {"version": "3"}),
    (check_postable_alerts, [{"labels": {}}]),
    (lambda b: check_pagerduty(b, 10), {"routing_key": ROUTING_KEY, "event_action": "trigger", "payload": {}}),
]


@pytest.mark.parametrize(("check", "body"), CHECKS)
def test_the_checker_rejects_what_the_vendor_rejects(check: Callable[[Any], list[str]], body: Any) -> None:
    assert check(body)


def test_the_server_answers_scripted_replies_then_the_default(vendor: VendorServer) -> None:
    import httpx

    vendor.script(PAGERDUTY, Reply(429, {}, {"Retry-After": "3"}), Reply(500))
    event = {
        "routing_key": ROUTING_KEY,
        "event_action": "resolve",
        "dedup_key": "inc-1",
    }
    codes = [httpx.post(vendor.url + PAGERDUTY, json=event).status_code for _ in range(3)]
    assert codes == [429, 500, 202]
    assert vendor.violations == []
    bad = httpx.post(vendor.url + PAGERDUTY, json={"event_action": "trigger"})
    assert bad.status_code == 400 and vendor.violations
