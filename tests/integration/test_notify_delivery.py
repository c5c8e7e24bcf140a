"""Notify end to end: the real Celery worker and Redis against the local vendor server, and a real
Alertmanager (Debian's binary via infra/local/alertmanager.sh) receiving pushed alerts and silences."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from services.alerting.config import loads_routing
from services.celery_app import configure, ping
from services.core.settings import Settings
from services.notify.ledger import DeliveryLedger
from services.notify.plan import plan
from services.notify.tasks import deliver, enqueue
from tests.conftest import REPO, poll
from tests.unit.test_notify_render import alert, notification
from tests.unit.test_notify_vendor_server import (
    PAGERDUTY,
    ROUTING_KEY,
    WEBHOOK,
    Reply,
    VendorServer,
    vendor_server,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def vendor() -> Iterator[VendorServer]:
    """The local Slack / PagerDuty / webhook stand-in."""
    with vendor_server() as server:
        yield server


def routing(vendor_url: str, am_url: str = "http://127.0.0.1:9") -> Any:
    return loads_routing(f"""
route: {{receiver: page}}
receivers:
  - name: page
    pagerduty_configs: [{{routing_key: "{ROUTING_KEY}", url: "{vendor_url}{PAGERDUTY}"}}]
  - name: hook
    webhook_configs: [{{url: "{vendor_url}{WEBHOOK}"}}]
  - name: am
    alertmanager_configs: [{{url: "{am_url}", resolve_after: 10m}}]
""")


def fresh(receiver: str, **kw: Any) -> Any:
    """A notification with an incident id of its own (so idempotency keys never collide across runs)."""
    return notification([alert(1), alert(2)], receiver=receiver, incident_id=f"inc-{uuid.uuid4().hex[:12]}", **kw)


@pytest.fixture
def app(celery_worker: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    configure(Settings())
    return celery_worker


def test_429_then_500_then_202_is_retried_with_backoff_and_delivered_once(
    app: subprocess.Popen[bytes], vendor: VendorServer
) -> None:
    vendor.script(PAGERDUTY, Reply(429, {"status": "throttle"}, {"Retry-After": "1"}), Reply(500))
    n = fresh("page")
    [task_id] = enqueue(n, routing(vendor.url))
    result = deliver.AsyncResult(task_id).get(timeout=60)
    assert result["status_code"] == 202 and result["external_id"] == n.incident_id
    sent = vendor.to(PAGERDUTY)
    assert [r.status for r in sent] == [429, 500, 202]
    assert all(r.body["dedup_key"] == n.incident_id for r in sent)
    assert sent[1].at - sent[0].at >= 0.9, "Retry-After: 1 was not honoured"
    assert vendor.violations == []
    # delivered exactly once: a copy of the same decision posts nothing
    again = enqueue(n, routing(vendor.url))
    assert deliver.AsyncResult(again[0]).get(timeout=30)["skipped"] == "delivered"
    assert len(vendor.to(PAGERDUTY)) == 3


def test_a_400_is_not_retried(app: subprocess.Popen[bytes], vendor: VendorServer) -> None:
    vendor.script(PAGERDUTY, Reply(400, {"status": "invalid event", "message": "Event object is invalid"}))
    n = fresh("page")
    [task_id] = enqueue(n, routing(vendor.url))
    res = deliver.AsyncResult(task_id)
    poll(lambda: res.ready(), 30, what="the delivery task to finish")
    assert res.state == "FAILURE" and "HTTP 400" in str(res.result)
    job = plan(n, routing(vendor.url))[0]
    ledger = DeliveryLedger(redis.Redis.from_url(Settings().broker_url), dedup_ttl_s=60, claim_lease_s=60)
    assert (ledger.state(job.key) or "").startswith("failed|")
    # nothing more arrives: a ping sent afterwards on the same queue has been answered
    ping.apply_async(queue="notify").get(timeout=30)
    assert len(vendor.to(PAGERDUTY)) == 1


def test_a_redelivered_task_does_not_post_twice(app: subprocess.Popen[bytes], vendor: VendorServer) -> None:
    job = plan(fresh("hook"), routing(vendor.url))[0]
    task_id = str(uuid.uuid4())
    # The same message twice (what the broker does when a worker dies before acking), then a new copy.
    first = deliver.apply_async(args=[job.model_dump(mode="json"), None], queue="notify", task_id=task_id)
    deliver.apply_async(args=[job.model_dump(mode="json"), None], queue="notify", task_id=task_id)
    other = deliver.apply_async(args=[job.model_dump(mode="json"), None], queue="notify")
    assert other.get(timeout=30)["skipped"] in ("delivered", "busy")
    poll(lambda: first.ready(), 30, what="the first copy")
    ping.apply_async(queue="notify").get(timeout=30)
    assert len(vendor.to(WEBHOOK)) == 1
    assert vendor.violations == []


# ----------------------------------------------------------------------------------- Alertmanager

AM_CONFIG = """
route:
  receiver: void
  group_wait: 1h
receivers:
  - name: void
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    """A real Alertmanager on a free loopback port; fails (never skips) when it cannot start."""
    port = _free_port()
    config = tmp_path / "alertmanager.yml"
    config.write_text(AM_CONFIG)
    env = {
        **os.environ,
        "CLUSTERMEDIC_ALERTMANAGER_PORT": str(port),
        "CLUSTERMEDIC_ALERTMANAGER_CONFIG": str(config),
        "CLUSTERMEDIC_STATE_DIR": str(tmp_path / "state"),
    }
    script = str(REPO / "infra" / "local" / "alertmanager.sh")
    started = subprocess.run(["bash", script, "start"], env=env, capture_output=True, text=True, timeout=120)
    if started.returncode != 0:
        pytest.fail(f"alertmanager did not start: {started.stderr}")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        subprocess.run(["bash", script, "stop"], env=env, capture_output=True, timeout=60)


def test_pushed_alerts_reach_alertmanager_and_its_silences_hold(
    app: subprocess.Popen[bytes], alertmanager: str
) -> None:
    node = f"gpu-node-{uuid.uuid4().hex[:6]}"
    n = notification([alert(1, node=node), alert(2, node=node)], receiver="am", incident_id=f"inc-{node}")
    n = n.model_copy(update={"ts": time.time()})
    [task_id] = enqueue(n, routing("http://unused", alertmanager))
    assert deliver.AsyncResult(task_id).get(timeout=60)["status_code"] == 200

    def ours(**params: str) -> list[dict[str, Any]]:
        got = httpx.get(f"{alertmanager}/api/v2/alerts", params={"filter": f'node="{node}"', **params}, timeout=5)
        got.raise_for_status()
        return list(got.json())

    alerts = poll(lambda: len(ours()) == 2 and ours(), 20, what="the pushed alerts in Alertmanager")
    assert {a["fingerprint"] for a in alerts} == {a.fingerprint for a in n.alerts}
    assert all(a["annotations"]["incident_id"] == n.incident_id for a in alerts)
    assert all(a["status"]["state"] == "active" for a in alerts)

    silence = {
        "matchers": [
            {"name": "node", "value": node, "isRegex": False, "isEqual": True},
            {"name": "gpu", "value": "1", "isRegex": False, "isEqual": True},
        ],
        "startsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 5)),
        "endsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600)),
        "createdBy": "clustermedic-tests",
        "comment": "GPU 1 is being replaced",
    }
    created = httpx.post(f"{alertmanager}/api/v2/silences", json=silence, timeout=5)
    assert created.status_code == 200, created.text
    silence_id = created.json()["silenceID"]

    def silenced() -> list[dict[str, Any]]:
        return [a for a in ours(silenced="true", active="false") if a["status"]["state"] == "suppressed"]

    muted = poll(lambda: silenced(), 20, what="Alertmanager to mark the alert suppressed")
    assert [a["labels"]["gpu"] for a in muted] == ["1"]
    assert muted[0]["status"]["silencedBy"] == [silence_id]
    # a later push of the same alerts keeps the silence; the unsilenced alert stays active
    later = n.model_copy(update={"ts": n.ts + 30, "reason": "repeat"})
    [again] = enqueue(later, routing("http://unused", alertmanager))
    deliver.AsyncResult(again).get(timeout=60)
    assert [a["labels"]["gpu"] for a in silenced()] == ["1"]
    assert [a["labels"]["gpu"] for a in ours(silenced="false")] == ["2"]
