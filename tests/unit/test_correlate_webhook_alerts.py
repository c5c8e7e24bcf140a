"""Alertmanager webhook alerts from the JSON body, through normalise, into the correlation engine, as a
timeline: an alert's firing and its resolution share one identity (so the resolution resolves it, and
its incident, at once), while every delivery has its own key (so a redelivery is still a no-op).

Times are the alert's own (startsAt, endsAt); ``engine.ingest(a, a.ts)`` and ``tick(t)`` drive the
engine exactly as the correlate role does, with no broker and no sleeps.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest

from pipelines.correlate.correlator import Correlator
from pipelines.correlate.engine import Engine
from services.alerting.config import loads_routing
from services.alerting.notification import Notification
from services.core.events import Anomaly, IncidentEvent
from services.core.fingerprint import label_fingerprint
from services.ingest.normalise import alertmanager_webhook

T0 = dt.datetime(2026, 11, 29, 10, 0, tzinfo=dt.UTC).timestamp()
RESOLVE_TIMEOUT_S = 300.0
LABELS = {
    "alertname": "GpuXidError",
    "severity": "critical",
    "UUID": "GPU-5f1c2a7e-0d3b-4c1e-9a55-1b2c3d4e5f60",
    "Hostname": "gpu-node-1",
    "xid": "79",
}
# resolve_after 0s: an incident resolves the moment its last member does
ROUTING = f"""
global: {{resolve_timeout: {RESOLVE_TIMEOUT_S:.0f}s}}
route:
  receiver: sre
  group_by: [alertname]
  group_wait: 30s
  group_interval: 5m
  repeat_interval: 1h
receivers:
  - name: sre
    webhook_configs: [{{url: "http://hooks.local/sre"}}]
correlation:
  flap_detection: {{enabled: false}}
  incidents: {{resolve_after: 0s}}
"""


def _rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat().replace("+00:00", "Z")


def webhook(status: str, *, ends_at: float | None = None, fingerprint: str | None = "a1b2c3d4e5f60718") -> bytes:
    """One alert, started at T0, as Alertmanager POSTs it (endsAt is Go's zero time while firing)."""
    alert: dict[str, object] = {
        "status": status,
        "labels": LABELS,
        "annotations": {"summary": "XID 79 on GPU 3 of gpu-node-1"},
        "startsAt": _rfc3339(T0),
        "endsAt": _rfc3339(ends_at) if ends_at is not None else "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus:9090/graph",
    }
    if fingerprint is not None:
        alert["fingerprint"] = fingerprint
    return json.dumps(
        {
            "version": "4",
            "groupKey": '{}:{alertname="GpuXidError"}',
            "status": status,
            "receiver": "clustermedic",
            "alerts": [alert],
        }
    ).encode()


def one(body: bytes) -> Anomaly:
    (anomaly,) = alertmanager_webhook(body)
    return anomaly


def incident_events(actions: list) -> list[IncidentEvent]:
    return [a for a in actions if isinstance(a, IncidentEvent)]


def notifications(actions: list) -> list[Notification]:
    return [a for a in actions if isinstance(a, Notification)]


@pytest.mark.parametrize("sent_fingerprint", ["a1b2c3d4e5f60718", None], ids=["alertmanager", "no-fingerprint"])
def test_alertmanager_firing_then_resolved_resolves_the_alert_and_the_incident_at_once(
    sent_fingerprint: str | None,
) -> None:
    engine = Engine(loads_routing(ROUTING))
    firing = one(webhook("firing", fingerprint=sent_fingerprint))
    resolved_at = T0 + 120.0  # well before resolve_timeout (T0 + 300)
    resolved = one(webhook("resolved", ends_at=resolved_at, fingerprint=sent_fingerprint))
    expected = "alertmanager:" + (sent_fingerprint or label_fingerprint(LABELS))
    assert firing.fingerprint == resolved.fingerprint == expected
    assert (firing.ts, resolved.ts) == (T0, resolved_at)

    # t=0: the alert fires and opens an incident; t=30: group_wait is over, the first notification
    opened = incident_events(engine.ingest(firing, firing.ts))
    assert [e.kind for e in opened] == ["opened"]
    incident_id = opened[0].incident_id
    assert [n.reason for n in notifications(engine.tick(T0 + 30))] == ["first"]
    assert [e.kind for e in incident_events(engine.tick(T0 + 60))] == []

    # t=120: the resolved form of the same alert resolves it, and its incident, at that instant
    actions = engine.ingest(resolved, resolved.ts)
    (alert,) = engine.alerts.values()
    assert alert.fingerprint == expected
    assert (alert.status, alert.ends_at, alert.resolved_at) == ("resolved", resolved_at, resolved_at)
    # the incident hears that its member resolved, then resolves (resolve_after 0s)
    assert [(e.kind, e.incident_id, e.ts) for e in incident_events(actions)] == [
        ("updated", incident_id, resolved_at),
        ("resolved", incident_id, resolved_at),
    ]
    assert [a.status for a in incident_events(actions)[-1].alerts] == ["resolved"]
    assert engine.incidents[incident_id].resolved_at == resolved_at

    # resolve_timeout passing later changes nothing; the next group flush tells the receiver
    later = engine.tick(T0 + RESOLVE_TIMEOUT_S + 60)
    assert incident_events(later) == []
    assert [(n.reason, n.ts) for n in notifications(later)] == [("resolved", T0 + 30 + 300)]
    assert [a.status for a in notifications(later)[0].alerts] == ["resolved"]


def test_a_redelivered_webhook_is_one_delivery_and_its_resolution_is_another() -> None:
    firing, again = one(webhook("firing")), one(webhook("firing"))
    resolved = one(webhook("resolved", ends_at=T0 + 120))
    # what the ingest receiver remembers to skip redeliveries (HA peers, repeat_interval)
    assert firing.delivery_key() == again.delivery_key() == firing.dedup_key != ""
    assert resolved.delivery_key() != firing.delivery_key()

    # the correlate role: a redelivery is dropped, the resolution is applied
    correlator = Correlator(loads_routing(ROUTING), clock=lambda: 0.0)
    assert incident_events(correlator.ingest("c1", firing))[0].kind == "opened"
    assert correlator.ingest("c1", again) == []
    (alert,) = correlator.engine("c1").alerts.values()
    assert alert.occurrences == [T0]
    kinds = [e.kind for e in incident_events(correlator.ingest("c1", resolved))]
    assert kinds == ["updated", "resolved"] and alert.status == "resolved" and alert.ends_at == T0 + 120


def test_an_alert_that_fires_again_after_resolving_is_a_new_delivery_of_the_same_alert() -> None:
    first = one(webhook("firing"))
    refired = alertmanager_webhook(webhook("firing").replace(_rfc3339(T0).encode(), _rfc3339(T0 + 600).encode()))[0]
    assert refired.fingerprint == first.fingerprint
    assert refired.dedup_key != first.dedup_key
