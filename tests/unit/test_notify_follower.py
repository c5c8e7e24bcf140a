"""The notifier's decisions (services/notify/service.IncidentFollower) without a broker: routing by the
incident's alerts, pages routed as critical, resolve of what it notified, redeliveries, and events that
arrive before their incident."""

from __future__ import annotations

from typing import Any

from services.alerting.config import loads_routing
from services.core.events import AlertRef, Diagnosis, Hypothesis, IncidentEvent, RemediationEvent
from services.notify.plan import plan
from services.notify.render import pagerduty, slack
from services.notify.service import IncidentFollower, Outgoing
from services.notify.state import MemoryIncidentStore
from tests.unit.test_notify_render import alert

T0 = 1_760_000_000.0
ROUTING = loads_routing("""
route:
  receiver: chat
  group_by: [alertname, node]
  routes:
    - matchers: ['severity="critical"']
      receiver: page
      continue: true
    - matchers: ['alertname="kv_cache_saturation"']
      receiver: serving
receivers:
  - name: chat
    slack_configs: [{app_token: xoxb-t, channel: "#sre", send_resolved: true}]
  - name: serving
    slack_configs: [{app_token: xoxb-t, channel: "#serving", send_resolved: true}]
  - name: page
    pagerduty_configs: [{routing_key: R0123456789ABCDEF0123456789ABCDE}]
""")


def warning(i: int = 1, status: str = "firing", **labels: str) -> AlertRef:
    a = alert(i, status=status, alertname="kv_cache_saturation", severity="warning", **labels)
    return a.model_copy(update={"severity": "warning", "signal": "kv_cache_saturation"})


def incident(kind: str = "opened", *alerts: AlertRef, iid: str = "inc-1", ts: float = T0) -> IncidentEvent:
    return IncidentEvent(
        incident_id=iid,
        kind=kind,  # type: ignore[arg-type]
        severity=max((a.severity for a in alerts), default="warning"),  # type: ignore[arg-type]
        title="t",
        alerts=alerts,
        opened_at=T0,
        ts=ts,
    )


def diagnosis(cause: str = "kv_cache_exhaustion", confidence: float = 0.82, ts: float = T0 + 5, **kw: Any) -> Diagnosis:
    return Diagnosis(
        incident_id=kw.pop("iid", "inc-1"),
        diagnostician="ranker",
        hypotheses=(Hypothesis(cause=cause, confidence=confidence, summary="KV cache full", playbook="scale_out"),),
        proposed_playbook=kw.pop("playbook", "scale_out"),
        level=kw.pop("level", 2),
        ts=ts,
        **kw,
    )


def run_event(status: str, ts: float, step: str = "", iid: str = "inc-1", level: int = 2) -> RemediationEvent:
    return RemediationEvent(
        incident_id=iid,
        run_id=f"run-{iid}",
        playbook="scale_out",
        step=step,
        status=status,  # type: ignore[arg-type]
        level=level,
        ts=ts,
    )


def follower() -> tuple[IncidentFollower, list[Outgoing]]:
    sent: list[Outgoing] = []
    return IncidentFollower(ROUTING, MemoryIncidentStore(), sent.append), sent


def receivers(sent: list[Outgoing]) -> list[str]:
    return [o.notification.receiver for o in sent]


def test_a_diagnosis_is_routed_by_the_incidents_alerts_and_carries_cause_confidence_and_action() -> None:
    f, sent = follower()
    f.on_incident(incident("opened", warning()))
    assert sent == [], "correlate notifies the incident itself; the notifier only records it"
    f.on_diagnosis(diagnosis())
    assert receivers(sent) == ["serving"]
    out = sent[0]
    assert out.notification.incident_id == "inc-1" and out.notification.status == "firing"
    assert out.notification.ts == T0 + 5, "stamped with the diagnosis's event time"
    assert out.notification.group_labels == {"alertname": "kv_cache_saturation", "node": "gpu-node-1"}
    text = str(slack.render(out.notification, diagnosis=out.diagnosis, remediation=out.remediation).blocks)
    assert "kv_cache_exhaustion" in text and "82% confidence" in text and "scale_out" in text


def test_a_diagnosis_that_says_nothing_new_is_not_sent_again_and_a_redelivery_keeps_its_key() -> None:
    f, sent = follower()
    f.on_incident(incident("opened", warning()))
    f.on_diagnosis(diagnosis())
    f.on_diagnosis(diagnosis(ts=T0 + 30))  # re-diagnosed after an incident update: same words
    assert len(sent) == 1
    f.on_diagnosis(diagnosis(cause="bad_rollout", confidence=0.6, ts=T0 + 60))
    assert len(sent) == 2
    withheld = diagnosis(cause="bad_rollout", confidence=0.6, ts=T0 + 90, playbook=None, notes=("not corroborated",))
    f.on_diagnosis(withheld)
    assert len(sent) == 3, "an action withdrawn with a note is news"
    # the same message twice gives the same deliveries (the ledger posts it once)
    g, again = follower()
    g.on_incident(incident("opened", warning()))
    g.on_diagnosis(diagnosis())
    keys = [j.key for o in sent[:1] for j in plan(o.notification, ROUTING, event=o.event)]
    assert keys == [j.key for o in again for j in plan(o.notification, ROUTING, event=o.event)]


def test_a_paged_run_pages_even_a_warning_incident_then_its_resolve_reaches_pagerduty() -> None:
    f, sent = follower()
    f.on_incident(incident("opened", warning()))
    f.on_remediation(run_event("paged", T0 + 10, level=3))
    assert receivers(sent) == ["page", "serving"]
    page = sent[0].notification
    body, _ = pagerduty.render(page, routing_key="R" * 32, remediation=sent[0].remediation)
    assert body["event_action"] == "trigger" and body["dedup_key"] == "inc-1"
    assert body["payload"]["custom_details"]["remediation"]["status"] == "paged"
    assert [a.severity for a in page.alerts] == ["warning"], "the alerts are shown as they are"
    sent.clear()
    f.on_incident(incident("resolved", warning(status="resolved"), ts=T0 + 400))
    assert receivers(sent) == ["page", "serving"]
    assert all(o.notification.status == "resolved" and o.notification.reason == "resolved" for o in sent)
    body, _ = pagerduty.render(sent[0].notification, routing_key="R" * 32)
    assert body["event_action"] == "resolve" and body["dedup_key"] == "inc-1"


def test_a_resolved_incident_the_notifier_never_notified_sends_nothing() -> None:
    f, sent = follower()
    f.on_incident(incident("opened", warning()))
    f.on_incident(incident("resolved", warning(status="resolved"), ts=T0 + 400))
    assert sent == []


def test_an_update_after_the_alerts_resolved_never_retriggers_pagerduty() -> None:
    f, sent = follower()
    crit = alert(1, status="resolved")
    f.on_incident(incident("mitigated", crit))
    f.on_remediation(run_event("succeeded", T0 + 10, level=1))
    assert receivers(sent) == ["page"]
    body, _ = pagerduty.render(sent[0].notification, routing_key="R" * 32, remediation=sent[0].remediation)
    assert body["event_action"] == "resolve"


def test_awaiting_approval_renders_the_buttons_with_the_run_id_only() -> None:
    f, sent = follower()
    f.on_incident(incident("opened", warning()))
    f.on_diagnosis(diagnosis())
    f.on_remediation(run_event("awaiting_approval", T0 + 6))
    out = sent[-1]
    blocks = slack.render(out.notification, diagnosis=out.diagnosis, remediation=out.remediation).blocks
    (actions,) = [b for b in blocks if b["type"] == "actions"]
    assert [(e["action_id"], e["value"]) for e in actions["elements"]] == [
        ("remediation_approve", "run-inc-1"),
        ("remediation_reject", "run-inc-1"),
    ]


def test_events_that_arrive_before_their_incident_are_notified_when_it_arrives() -> None:
    f, sent = follower()
    f.on_diagnosis(diagnosis())
    f.on_remediation(run_event("awaiting_approval", T0 + 6))
    f.on_remediation(run_event("awaiting_approval", T0 + 6))  # redelivered while waiting
    assert sent == []
    f.on_incident(incident("opened", warning()))
    assert [(o.notification.receiver, o.remediation is not None) for o in sent] == [
        ("serving", False),
        ("serving", True),
    ]
    assert sent[1].diagnosis is not None and sent[1].remediation is not None
    assert sent[1].remediation.status == "awaiting_approval"


def test_every_remediation_step_is_an_update_with_its_status_and_step() -> None:
    f, sent = follower()
    f.on_incident(incident("opened", warning()))
    f.on_remediation(run_event("running", T0 + 7, step="scale"))
    text = str(slack.render(sent[0].notification, remediation=sent[0].remediation).blocks)
    assert "running" in text and "scale" in text and "scale_out" in text
