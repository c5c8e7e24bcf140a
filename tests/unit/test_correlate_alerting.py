"""The Alertmanager half of the engine, as timelines: dedup, grouping timers, inhibition, silences,
time intervals, plus flap detection and N-of-M thresholds.

Time is driven explicitly: ``tick(t)`` fires every timer due up to ``t`` at its own due time, so
"none before t=30, one at t=30" is checked exactly, with no sleeps.
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from pipelines.correlate.engine import Engine
from services.alerting.config import loads_routing
from services.alerting.errors import SilenceError
from services.alerting.notification import Notification
from services.alerting.silences import Silence, Silences
from services.core.events import Anomaly
from services.core.fingerprint import label_fingerprint

RECEIVERS = """
receivers:
  - name: sre
    webhook_configs: [{url: "http://hooks.local/sre"}]
  - name: pager
    pagerduty_configs: [{routing_key: x}]
  - name: quiet
    slack_configs: [{channel: "#x"}]
"""


def engine(route: str = "", extra: str = "", resolve_timeout: str = "24h", flap: str = "") -> Engine:
    text = (
        f"global: {{resolve_timeout: {resolve_timeout}}}\n"
        "route:\n  receiver: sre\n  group_by: [alertname]\n  group_wait: 30s\n  group_interval: 5m\n"
        "  repeat_interval: 1h\n"
        + route
        + RECEIVERS
        + extra
        + (flap or "correlation: {flap_detection: {enabled: false}}\n")
    )
    return Engine(loads_routing(text))


def anomaly(
    signal: str = "gpu_xid",
    entity: str = "GPU-1",
    *,
    ts: float = 0.0,
    kind: str = "gpu",
    severity: str = "warning",
    status: str = "firing",
    labels: dict[str, str] | None = None,
    **extra: object,
) -> Anomaly:
    return Anomaly.model_validate(
        {
            "entity": entity,
            "entity_kind": kind,
            "signal": signal,
            "detector": "rules",
            "score": 1.0,
            "threshold": 0.5,
            "severity": severity,
            "status": status,
            "ts": ts,
            "labels": labels or {},
            **extra,
        }
    )


def notes(actions: list) -> list[Notification]:
    return [a for a in actions if isinstance(a, Notification)]


class Timeline:
    """Drive an engine with pushes and ticks; keep every notification with its time."""

    def __init__(self, eng: Engine) -> None:
        self.engine = eng
        self.sent: list[Notification] = []

    def push(self, t: float, a: Anomaly) -> list[Notification]:
        got = notes(self.engine.ingest(a.model_copy(update={"ts": t}), t))
        self.sent += got
        return got

    def tick(self, t: float) -> list[Notification]:
        got = notes(self.engine.tick(t))
        self.sent += got
        return got

    def times(self, reason: str | None = None) -> list[float]:
        return [n.ts for n in self.sent if reason is None or n.reason == reason]


# ---------------------------------------------------------------------------------- alerts


def test_an_alert_without_a_producer_fingerprint_is_identified_by_its_alert_labels():
    eng = engine()
    eng.ingest(anomaly(ts=0, labels={"node": "n1"}), 0)
    (alert,) = eng.alerts.values()
    assert alert.fingerprint == label_fingerprint(alert.labels)
    eng.ingest(anomaly(ts=10, labels={"node": "n1"}, status="resolved"), 10)
    assert list(eng.alerts) == [alert.fingerprint] and alert.status == "resolved" and alert.ends_at == 10


def test_same_fingerprint_updates_one_alert():
    eng = engine()
    eng.ingest(anomaly(ts=0, evidence={"xid": 79, "n": 1}), 0)
    eng.ingest(anomaly(ts=10, evidence={"xid": 79, "n": 2}), 10)
    assert len(eng.alerts) == 1
    (alert,) = eng.alerts.values()
    assert alert.starts_at == 0 and alert.last_seen == 10 and alert.evidence["n"] == 2
    assert alert.labels["alertname"] == "gpu_xid" and alert.labels["entity"] == "GPU-1"
    # a producer-supplied fingerprint decides identity even when labels differ
    eng.ingest(anomaly(ts=20, fingerprint="fp-1", labels={"pod": "a"}), 20)
    eng.ingest(anomaly(ts=30, fingerprint="fp-1", labels={"pod": "b"}), 30)
    assert sorted(eng.alerts) == sorted([alert.fingerprint, "fp-1"])


def test_empty_label_values_are_dropped_like_prometheus():
    eng = engine()
    eng.ingest(anomaly(labels={"pod": "", "node": "n1"}), 0)
    (alert,) = eng.alerts.values()
    assert "pod" not in alert.labels and alert.labels["node"] == "n1"


def test_resolved_anomaly_for_an_unknown_alert_is_ignored():
    eng = engine()
    assert eng.ingest(anomaly(status="resolved"), 0) == []
    assert eng.alerts == {}


# --------------------------------------------------------------------------------- timing


def test_new_group_waits_group_wait_and_batches_what_arrives_meanwhile():
    tl = Timeline(engine())
    assert tl.push(0, anomaly(entity="GPU-1")) == []
    assert tl.push(10, anomaly(entity="GPU-2")) == []
    assert tl.tick(29.999) == []
    (first,) = tl.tick(30)
    assert first.reason == "first" and first.ts == 30 and first.status == "firing"
    assert [a.entity for a in first.alerts] == ["GPU-1", "GPU-2"]
    assert first.group_labels == {"alertname": "gpu_xid"} and first.receiver == "sre"
    assert first.group_key == '{}:{alertname="gpu_xid"}'


def test_later_changes_wait_for_group_interval():
    tl = Timeline(engine())
    tl.push(0, anomaly(entity="GPU-1"))
    tl.tick(30)
    tl.push(40, anomaly(entity="GPU-2"))
    assert tl.tick(329) == []
    (update,) = tl.tick(330)
    assert update.reason == "update" and len(update.alerts) == 2


def test_unchanged_firing_group_is_repeated_after_repeat_interval():
    tl = Timeline(engine())
    tl.push(0, anomaly())
    tl.tick(30)
    assert tl.tick(3629) == []
    (repeat,) = tl.tick(3630)  # 30 + 1h, itself a group_interval boundary
    assert repeat.reason == "repeat"
    tl.tick(7230)
    assert tl.times() == [30, 3630, 7230]


def test_repeat_goes_out_at_the_first_flush_after_repeat_interval():
    eng = engine(route="  routes:\n    - {matchers: ['alertname=\"x\"'], repeat_interval: 50m}\n")
    tl = Timeline(eng)
    tl.push(0, anomaly("x"))
    tl.tick(10_000)
    # flushes at 30 + k*300; 30 + 3000 = 3030 is one of them
    assert tl.times()[:3] == [30, 3030, 6030]


def test_resolved_alert_is_notified_at_the_next_group_interval():
    tl = Timeline(engine())
    tl.push(0, anomaly())
    tl.tick(30)
    assert tl.push(100, anomaly(status="resolved")) == []
    assert tl.tick(329) == []
    (resolved,) = tl.tick(330)
    assert resolved.reason == "resolved" and resolved.status == "resolved"
    assert resolved.alerts[0].status == "resolved"
    # the group is gone afterwards: nothing more, ever
    assert tl.tick(100_000) == [] and tl.engine.groups == {}


def test_alert_resolved_before_group_wait_is_never_notified():
    tl = Timeline(engine())
    tl.push(0, anomaly())
    tl.push(10, anomaly(status="resolved"))
    assert tl.tick(10_000) == []


def test_not_seen_for_resolve_timeout_resolves_by_itself():
    tl = Timeline(engine(resolve_timeout="5m"))
    tl.push(0, anomaly())
    tl.push(200, anomaly())  # seen again: the timeout restarts
    tl.tick(499)
    (alert,) = tl.engine.alerts.values()
    assert alert.status == "firing"
    tl.tick(500)
    assert alert.status == "resolved" and alert.ends_at == 500
    tl.tick(1000)
    assert [(n.ts, n.reason) for n in tl.sent] == [(30, "first"), (630, "resolved")]


def test_partial_resolution_is_an_update_only_for_receivers_that_want_resolved():
    for receiver, expected in (("sre", [(30, "first"), (330, "update")]), ("quiet", [(30, "first")])):
        tl = Timeline(engine(route=f"  routes: [{{receiver: {receiver}}}]\n"))
        tl.push(0, anomaly(entity="GPU-1"))
        tl.push(0, anomaly(entity="GPU-2"))
        tl.tick(30)
        tl.push(100, anomaly(entity="GPU-1", status="resolved"))
        tl.tick(331)
        assert [(n.ts, n.reason) for n in tl.sent] == expected, receiver
        if receiver == "sre":  # the update carries both alerts, the resolved one marked so
            assert [(a.entity, a.status) for a in tl.sent[-1].alerts] == [("GPU-2", "firing"), ("GPU-1", "resolved")]


def test_slack_without_send_resolved_hears_nothing_when_all_resolve():
    tl = Timeline(engine(route="  routes: [{receiver: quiet}]\n"))
    tl.push(0, anomaly())
    tl.tick(30)
    tl.push(60, anomaly(status="resolved"))
    tl.tick(10_000)
    assert tl.times() == [30]


def test_old_alert_in_a_new_group_does_not_wait_again():
    eng = engine()
    # a replayed anomaly that started long before it reached the engine
    (first,) = notes(eng.ingest(anomaly(ts=0.0), 500))
    assert first.ts == 500 and first.alerts[0].starts_at == 0


def test_continue_sends_one_alert_to_two_receivers_with_their_own_timers():
    eng = engine(
        route="  routes:\n"
        "    - {matchers: ['severity=\"critical\"'], receiver: pager, group_wait: 10s, continue: true}\n"
        "    - {receiver: sre}\n"
    )
    tl = Timeline(eng)
    tl.push(0, anomaly(severity="critical"))
    tl.push(0, anomaly(severity="warning"))
    tl.tick(60)
    assert [(n.receiver, n.ts, len(n.alerts)) for n in tl.sent] == [("pager", 10, 1), ("sre", 30, 2)]


def test_group_by_all_labels_makes_one_group_per_alert():
    tl = Timeline(engine(route="  group_by: ['...']\n"))
    tl.push(0, anomaly(entity="GPU-1"))
    tl.push(0, anomaly(entity="GPU-2"))
    sent = tl.tick(30)
    assert len(sent) == 2 and all(len(n.alerts) == 1 for n in sent)
    assert sent[0].group_labels["entity"] in ("GPU-1", "GPU-2")


# ------------------------------------------------------------------------------ inhibition

INHIBIT = """
inhibit_rules:
  - source_matchers: ['alertname="node_not_ready"']
    target_matchers: ['alertname!="node_not_ready"', 'node!=""']
    equal: [node]
"""


def test_node_down_inhibits_pod_alerts_on_that_node_only():
    tl = Timeline(engine(route="  group_by: [node]\n", extra=INHIBIT))
    tl.push(0, anomaly("node_not_ready", "gpu-node-1", kind="node", severity="critical", labels={"node": "gpu-node-1"}))
    tl.push(1, anomaly("pod_crashloop", "vllm-a", kind="pod", labels={"node": "gpu-node-1", "pod": "vllm-a"}))
    tl.push(2, anomaly("pod_crashloop", "vllm-b", kind="pod", labels={"node": "gpu-node-2", "pod": "vllm-b"}))
    sent = tl.tick(32)
    by_node = {n.group_labels["node"]: [a.signal for a in n.alerts] for n in sent}
    assert by_node == {"gpu-node-1": ["node_not_ready"], "gpu-node-2": ["pod_crashloop"]}
    # the node comes back: the pod alert on it is no longer muted and goes out at the next interval
    tl.push(
        100,
        anomaly(
            "node_not_ready",
            "gpu-node-1",
            kind="node",
            severity="critical",
            labels={"node": "gpu-node-1"},
            status="resolved",
        ),
    )
    (update,) = tl.tick(330)
    assert {(a.signal, a.status) for a in update.alerts} == {
        ("pod_crashloop", "firing"),
        ("node_not_ready", "resolved"),
    }


def test_a_source_that_matches_the_target_side_does_not_inhibit_itself_or_its_twin():
    rule = """
inhibit_rules:
  - source_matchers: ['severity=~"warning|critical"']
    target_matchers: ['severity=~"warning|critical"']
    equal: [node]
"""
    tl = Timeline(engine(extra=rule))
    tl.push(0, anomaly("a", "GPU-1", labels={"node": "n1"}))
    tl.push(0, anomaly("a", "GPU-2", labels={"node": "n1"}))
    (sent,) = tl.tick(30)
    assert len(sent.alerts) == 2


def test_resolved_source_does_not_inhibit():
    tl = Timeline(engine(route="  group_by: [node]\n", extra=INHIBIT))
    tl.push(0, anomaly("node_not_ready", "n1", kind="node", labels={"node": "n1"}))
    tl.push(5, anomaly("node_not_ready", "n1", kind="node", labels={"node": "n1"}, status="resolved"))
    tl.push(6, anomaly("pod_crashloop", "p", kind="pod", labels={"node": "n1", "pod": "p"}))
    (sent,) = tl.tick(30)
    assert [(a.signal, a.status) for a in sent.alerts] == [("pod_crashloop", "firing"), ("node_not_ready", "resolved")]


# -------------------------------------------------------------------------------- silences


def test_silence_mutes_until_it_expires():
    tl = Timeline(engine())
    tl.engine.silences.add(
        Silence.of(
            ['alertname="gpu_xid"', 'entity=~"GPU-1"'],
            starts_at=0,
            ends_at=600,
            created_by="ana",
            comment="reseating GPU-1",
        )
    )
    tl.push(0, anomaly(entity="GPU-1"))
    assert tl.tick(599) == []  # flushed at 30, 330: muted
    (first,) = tl.tick(630)  # the flush after the silence ended
    assert first.reason == "first" and first.ts == 630


def test_expiring_a_silence_early_unmutes_at_the_next_flush():
    tl = Timeline(engine())
    silence = tl.engine.silences.add(Silence.of(['entity="GPU-1"'], starts_at=0, ends_at=86400))
    tl.push(0, anomaly(entity="GPU-1"))
    tl.tick(100)
    tl.engine.silences.expire(silence.id, 100)
    assert tl.tick(329) == []
    assert [n.ts for n in tl.tick(330)] == [330]


def test_silences_store():
    store = Silences()
    pending = store.add(Silence.of(['node="n1"'], starts_at=100, ends_at=200))
    assert pending.id.startswith("sil-")
    assert store.add(Silence.of(['node="n1"'], starts_at=100, ends_at=200)).id == pending.id  # idempotent
    assert store.get(pending.id).state(50) == "pending"
    assert store.matches({"node": "n1"}, 50) == [] and store.matches({"node": "n1"}, 150) == [pending.id]
    assert store.matches({"node": "n2"}, 150) == []
    assert [s.id for s in store.list(150, "active")] == [pending.id]
    expired = store.expire(pending.id, 50)  # pending: ends before it starts
    assert expired.state(150) == "expired" and store.matches({"node": "n1"}, 150) == []
    store.gc(50 + 121 * 3600)
    assert len(store) == 0
    again = Silences.from_dict(Silences([Silence.of(['a=~"b.*"'], starts_at=0, ends_at=1, id="s1")]).to_dict())
    assert again.get("s1").matchers[0].op == "=~"


@pytest.mark.parametrize(
    ("matchers", "start", "end", "message"),
    [
        ([], 0, 1, "at least one matcher"),
        (['a=~".*"', 'b=""'], 0, 1, "must not match the empty string"),
        (['a="b"'], 5, 5, "end after it starts"),
    ],
)
def test_invalid_silences_are_refused(matchers, start, end, message):
    with pytest.raises(SilenceError, match=message):
        Silences().add(Silence.of(matchers, starts_at=start, ends_at=end))
    with pytest.raises(SilenceError, match="no silence"):
        Silences().expire("nope", 0)
    with pytest.raises(SilenceError, match="invalid matcher"):
        Silence.of(['a=~"("'], starts_at=0, ends_at=1)


# ----------------------------------------------------------------------------- flapping

FLAP = "correlation: {flap_detection: {enabled: true, window: 10m, high: 4, low: 1}}\n"


def flap_timeline(flap: str) -> Timeline:
    tl = Timeline(engine(route="  group_interval: 45s\n", flap=flap))
    for i in range(60):  # flips every 10 s for 10 minutes, ends resolved
        tl.push(i * 10, anomaly(status="firing" if i % 2 == 0 else "resolved"))
        if i == 30:
            (alert,) = tl.engine.alerts.values()
            tl.mid_flap = alert.ref()  # type: ignore[attr-defined]
    tl.tick(3600)
    return tl


def test_flapping_signal_pages_once():
    tl = flap_timeline(FLAP)
    assert [(n.ts, n.reason) for n in tl.sent] == [(30, "first"), (1200, "resolved")]
    # while it flaps the alert is held firing, and its evidence says why
    assert tl.mid_flap.status == "firing" and tl.mid_flap.evidence["flapping"] is True  # type: ignore[attr-defined]


def test_same_signal_without_flap_detection_pages_again_and_again():
    tl = flap_timeline("correlation: {flap_detection: {enabled: false}}\n")
    firing = [n.ts for n in tl.sent if n.reason == "first"]
    assert firing[:4] == [30, 110, 190, 270] and len(firing) == 8


def test_flapping_has_hysteresis():
    eng = engine(flap=FLAP)
    for i in range(5):  # 4 changes in 40 s: flapping
        eng.ingest(anomaly(status="firing" if i % 2 == 0 else "resolved", ts=i * 10), i * 10)
    (alert,) = eng.alerts.values()
    assert alert.flapping and alert.status == "firing" and alert.raw_status == "firing"
    eng.ingest(anomaly(status="resolved", ts=50), 50)  # underlying resolved, held firing
    assert alert.status == "firing"
    # changes at 10..50 age out of the 10 min window; leaving needs <= 1 left: at 40 + 600
    eng.tick(639.9)
    assert alert.flapping
    eng.tick(640)
    assert not alert.flapping and alert.status == "resolved"


# -------------------------------------------------------------------------------- N of M

NOFM = "  routes:\n    - {matchers: ['alertname=\"log_new_template\"'], min_occurrences: 3, occurrence_window: 5m}\n"


def test_alert_becomes_active_after_n_occurrences_in_m():
    tl = Timeline(engine(route=NOFM))
    tl.push(0, anomaly("log_new_template"))
    tl.push(60, anomaly("log_new_template"))
    assert tl.tick(119) == []
    (first,) = tl.push(120, anomaly("log_new_template"))
    # it started at t=0, more than group_wait ago: no second wait
    assert first.ts == 120 and first.reason == "first"


def test_occurrences_spread_wider_than_the_window_never_activate():
    tl = Timeline(engine(route=NOFM))
    for t in (0, 200, 400, 600, 800):  # never 3 within 5 minutes
        tl.push(t, anomaly("log_new_template"))
    tl.tick(2000)
    assert tl.sent == [] and tl.engine.incidents == {}


def test_other_routes_are_not_held_by_one_routes_threshold():
    tl = Timeline(engine(route=NOFM))
    tl.push(0, anomaly("gpu_xid"))
    assert [n.ts for n in tl.tick(30)] == [30]


# -------------------------------------------------------------------------- time intervals

NIGHTS = """
time_intervals:
  - name: nights
    time_intervals: [{times: [{start_time: "22:00", end_time: "24:00"}]}]
  - name: office
    time_intervals: [{weekdays: ["monday:friday"], times: [{start_time: "09:00", end_time: "17:00"}]}]
"""


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo("UTC")).timestamp()


def test_mute_time_interval_holds_notifications_until_it_ends():
    tl = Timeline(engine(route="  routes: [{mute_time_intervals: [nights]}]\n", extra=NIGHTS))
    t0 = at("2024-05-06T21:59:50")
    tl.push(t0, anomaly())
    assert tl.tick(at("2024-05-06T23:59:59")) == []  # flushes at 22:00:20, 22:05:20 ... muted
    (first,) = tl.tick(at("2024-05-07T00:10:00"))
    assert first.ts == at("2024-05-07T00:00:20") and first.reason == "first"


def test_active_time_interval_sends_only_inside_it():
    tl = Timeline(engine(route="  routes: [{active_time_intervals: [office]}]\n", extra=NIGHTS))
    tl.push(at("2024-05-04T12:00:00"), anomaly())  # Saturday
    for hour in range(0, 45, 4):  # still firing all weekend
        tl.push(at("2024-05-04T12:00:00") + hour * 3600, anomaly())
    assert tl.tick(at("2024-05-06T08:59:00")) == []
    (first,) = tl.tick(at("2024-05-06T09:05:00"))
    assert first.ts == at("2024-05-06T09:00:30")  # first flush at or after Monday 09:00
