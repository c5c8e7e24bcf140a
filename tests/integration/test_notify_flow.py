"""The tail of the flow through the real Kafka, Redis and a Celery worker: the notifier (medic notifier)
pages a level-3 run on PagerDuty and resolves it with its incident, posts a level-2 run's Approve/Reject
buttons in the incident's Slack thread, shows root cause, confidence and action, notifies a redelivered
diagnosis once, and dead-letters garbage on each topic while it goes on."""

from __future__ import annotations

import subprocess
import time
import uuid
from typing import Any

import pytest
import redis

from services.alerting.config import loads_routing
from services.alerting.notification import Notification
from services.celery_app import configure, ping
from services.core.bus import KafkaPublisher, ensure_topics, read_raw
from services.core.events import AlertRef, DeadLetter, Diagnosis, Hypothesis, IncidentEvent, RemediationEvent
from services.core.settings import Settings
from services.notify.service import run
from services.notify.tasks import enqueue
from services.notify.threads import RedisThreadStore
from tests.conftest import poll
from tests.unit.test_notify_vendor_server import (
    PAGERDUTY,
    ROUTING_KEY,
    SLACK_POST,
    SLACK_TOKEN,
    Request,
    VendorServer,
    vendor_server,
)

pytestmark = pytest.mark.integration

CHANNEL = "#sre-gpu"


@pytest.fixture
def vendor() -> Any:
    with vendor_server() as server:
        yield server


@pytest.fixture
def app(celery_worker: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    configure(Settings())
    return celery_worker


def routing(url: str) -> Any:
    # routing.yaml's shape: critical pages and continues to Slack, everything else reaches Slack
    return loads_routing(f"""
route:
  receiver: slack-sre
  group_by: [alertname, node]
  routes:
    - matchers: ['severity="critical"']
      receiver: pagerduty-gpu
      continue: true
    - receiver: slack-sre
receivers:
  - name: slack-sre
    slack_configs:
      - {{app_token: "{SLACK_TOKEN}", channel: "{CHANNEL}", app_url: "{url}{SLACK_POST}", send_resolved: true}}
  - name: pagerduty-gpu
    pagerduty_configs: [{{routing_key: "{ROUTING_KEY}", url: "{url}{PAGERDUTY}"}}]
""")


def kv_alert(node: str, status: str = "firing") -> AlertRef:
    labels = {"alertname": "kv_cache_saturation", "severity": "warning", "node": node, "pod": f"vllm-{node}"}
    return AlertRef(
        fingerprint=f"fp-{node}",
        entity=f"vllm-{node}",
        signal="kv_cache_saturation",
        detector="serving_rules",
        severity="warning",
        status=status,  # type: ignore[arg-type]
        starts_at=time.time() - 60,
        labels=labels,
    )


def incident(iid: str, node: str, kind: str = "opened", status: str = "firing") -> IncidentEvent:
    return IncidentEvent(
        incident_id=iid,
        kind=kind,  # type: ignore[arg-type]
        severity="warning",
        title=f"kv_cache_saturation on vllm-{node}",
        alerts=(kv_alert(node, status),),
        opened_at=time.time() - 60,
        ts=time.time(),
    )


def diagnosis(iid: str, playbook: str, level: int) -> Diagnosis:
    return Diagnosis(
        incident_id=iid,
        diagnostician="ranker",
        hypotheses=(
            Hypothesis(cause="kv_cache_exhaustion", confidence=0.82, summary="KV cache full", playbook=playbook),
            Hypothesis(cause="traffic_burst", confidence=0.31),
        ),
        proposed_playbook=playbook,
        proposed_params={"deployment": "vllm"},
        level=level,
        ts=time.time(),
    )


def run_event(iid: str, run_id: str, status: str, playbook: str, level: int) -> RemediationEvent:
    return RemediationEvent(
        incident_id=iid,
        run_id=run_id,
        playbook=playbook,
        status=status,  # type: ignore[arg-type]
        level=level,
        ts=time.time(),
    )


def about(vendor: VendorServer, iid: str) -> list[Request]:
    """Slack posts about one incident (its id is in the summary section)."""
    return [r for r in vendor.to(SLACK_POST) if iid in str(r.body.get("blocks"))]


def pages(vendor: VendorServer, iid: str) -> list[dict[str, Any]]:
    return [r.body for r in vendor.to(PAGERDUTY) if r.body.get("dedup_key") == iid]


def test_pages_are_triggered_and_resolved_approvals_post_buttons_in_the_thread_and_garbage_is_dead_lettered(
    kafka_ready: None, settings: Settings, app: subprocess.Popen[bytes], vendor: VendorServer
) -> None:
    settings = settings.model_copy(update={"faust_app_id": f"test-notifier-{uuid.uuid4().hex[:8]}"})
    ensure_topics(settings)
    config = routing(vendor.url)
    tag = uuid.uuid4().hex[:8]
    approve_inc, page_inc = f"inc-approve-{tag}", f"inc-page-{tag}"
    approve_run, page_run = f"run-approve-{tag}", f"run-page-{tag}"

    def notifier(count: int) -> None:
        assert run(settings, config, max_messages=count, poll_timeout_ms=200) >= count

    # 1. garbage on every topic, then two incidents: one to approve, one that pages
    with KafkaPublisher(settings) as bus:
        bus.send_raw(IncidentEvent.topic, b"x", b"{not json")
        bus.send_raw(Diagnosis.topic, b"x", b'{"incident_id": "inc-x"}')
        bus.send_raw(RemediationEvent.topic, b"x", b"\xff\xfe")
        bus.publish(incident(approve_inc, f"node-a-{tag}"))
        first = diagnosis(approve_inc, "scale_out", 2)
        bus.publish(first)
        bus.publish(first)  # redelivered
        bus.publish(incident(page_inc, f"node-p-{tag}"))
        bus.publish(diagnosis(page_inc, "page_oncall", 3))
        bus.publish(run_event(page_inc, page_run, "paged", "page_oncall", 3))
    notifier(9)

    def page_with(key: str) -> list[dict[str, Any]]:
        return [p for p in pages(vendor, page_inc) if key in p["payload"]["custom_details"]]

    # a warning incident pages once its run is level 3; the page carries the run and the root cause
    # (whichever of the two topics the notifier read first: a diagnosis while paged updates the page)
    paged = poll(lambda: page_with("remediation"), 60, what="the PagerDuty trigger of the paged run")[0]
    assert paged["event_action"] == "trigger" and paged["routing_key"] == ROUTING_KEY
    run_shown = paged["payload"]["custom_details"]["remediation"]
    assert run_shown["status"] == "paged" and run_shown["run_id"] == page_run
    cause = poll(lambda: page_with("diagnosis"), 60, what="the root cause on the page")[0]["payload"]["custom_details"]
    assert cause["diagnosis"]["cause"] == "kv_cache_exhaustion" and cause["diagnosis"]["confidence"] == 0.82
    assert cause["diagnosis"]["proposed_playbook"] == "page_oncall" and cause["diagnosis"]["level"] == 3
    # the diagnosis in the thread: root cause, confidence and the proposed action
    parent = poll(lambda: about(vendor, approve_inc), 60, what="the diagnosis in Slack")[0]
    shown = str(parent.body["blocks"])
    assert "kv_cache_exhaustion" in shown and "82% confidence" in shown and "scale_out" in shown
    assert "thread_ts" not in parent.body, "the first message about an incident is its thread"

    # 2. the remediator asks for approval: the buttons arrive in that thread, carrying the run id only
    with KafkaPublisher(settings) as bus:
        bus.publish(run_event(approve_inc, approve_run, "awaiting_approval", "scale_out", 2))
    notifier(1)
    buttons = poll(
        lambda: [r for r in about(vendor, approve_inc) if "actions" in str(r.body["blocks"])], 60, what="the buttons"
    )[0]
    thread = RedisThreadStore(redis.Redis.from_url(Settings().broker_url), 60).get(CHANNEL, approve_inc)
    assert thread is not None and buttons.body["thread_ts"] == thread.ts
    (actions,) = [b for b in buttons.body["blocks"] if b["type"] == "actions"]
    assert [(e["action_id"], e["value"]) for e in actions["elements"]] == [
        ("remediation_approve", approve_run),
        ("remediation_reject", approve_run),
    ]

    # 3. correlate's next notification about the incident carries the diagnosis and the run too
    group = incident(approve_inc, f"node-a-{tag}")
    update = Notification(
        receiver="slack-sre",
        group_key=f"{{}}/{tag}",
        group_labels={"alertname": "kv_cache_saturation"},
        incident_id=approve_inc,
        status="firing",
        reason="repeat",
        alerts=group.alerts,
        ts=time.time(),
    )
    enqueue(update, config)
    repeat = poll(
        lambda: [r for r in about(vendor, approve_inc) if "Repeat" in str(r.body["blocks"])], 60, what="the repeat"
    )[0]
    assert "kv_cache_exhaustion" in str(repeat.body["blocks"]) and "remediation_approve" in str(repeat.body["blocks"])

    # 4. the paged incident resolves: PagerDuty gets the resolve of the same dedup_key
    with KafkaPublisher(settings) as bus:
        bus.publish(incident(page_inc, f"node-p-{tag}", kind="resolved", status="resolved"))
    notifier(1)
    sent = poll(
        lambda: [p for p in pages(vendor, page_inc) if p["event_action"] == "resolve"] and pages(vendor, page_inc),
        60,
        what="the resolve",
    )
    assert {p["event_action"] for p in sent[:-1]} == {"trigger"} and sent[-1]["event_action"] == "resolve"

    # every request was valid, and the redelivered diagnosis was notified once
    ping.apply_async(queue="notify").get(timeout=30)
    assert vendor.violations == []
    diag_posts = [r for r in about(vendor, approve_inc) if "Update" in str(r.body["blocks"])]
    assert len(diag_posts) == 2, "one diagnosis, one approval request"
    letters = [
        DeadLetter.from_bytes(v) for _, _, v in read_raw(settings, [DeadLetter.topic], max_messages=3, timeout_s=15)
    ]
    assert sorted(letter.source_topic for letter in letters) == sorted(
        [IncidentEvent.topic, Diagnosis.topic, RemediationEvent.topic]
    )
    assert {letter.consumer for letter in letters} == {"notifier"}
