"""Renderers: pure functions from a notification to each vendor's payload, within the vendor's limits."""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

import pytest

from services.alerting.config import NOTIFIER_SEND_RESOLVED_DEFAULT, loads_routing
from services.alerting.notification import Notification
from services.core.events import AlertRef, Diagnosis, Hypothesis, RemediationEvent
from services.core.fingerprint import label_fingerprint
from services.notify.errors import NotifierConfigError, PayloadTooLarge
from services.notify.ledger import idempotency_key
from services.notify.plan import plan
from services.notify.registry import NOTIFIERS, notifier_for, notifier_kinds
from services.notify.render import alertmanager, pagerduty, slack, webhook
from services.notify.render.common import GO_ZERO_TIME, iso, sanitize, truncate
from tests.unit.test_notify_vendor_server import (
    ROUTING_KEY,
    check_blocks,
    check_pagerduty,
    check_postable_alerts,
    check_slack_message,
    check_webhook_v4,
)

T0 = 1_750_000_000.0


def alert(i: int, status: str = "firing", evidence: dict[str, Any] | None = None, **labels: str) -> AlertRef:
    base = {"alertname": "gpu_xid", "node": "gpu-node-1", "UUID": f"GPU-{i:04d}", "gpu": str(i), "severity": "critical"}
    base.update(labels)
    return AlertRef(
        fingerprint=label_fingerprint(base),
        entity=base["UUID"],
        signal=base["alertname"],
        detector="xid_catalog",
        severity="critical",
        status=status,  # type: ignore[arg-type]
        starts_at=T0 - 60 + i,
        labels=base,
        evidence=evidence or {"xid": 79},
    )


def notification(alerts: list[AlertRef], *, status: str = "firing", reason: str = "first", **kw: Any) -> Notification:
    return Notification(
        receiver=kw.get("receiver", "pagerduty-gpu"),
        group_key='{}/{severity="critical"}:{alertname="gpu_xid", node="gpu-node-1"}',
        group_labels={"alertname": "gpu_xid", "node": "gpu-node-1"},
        incident_id=kw.get("incident_id", "inc-0123456789abcdef0123"),
        status=status,  # type: ignore[arg-type]
        reason=reason,  # type: ignore[arg-type]
        alerts=tuple(alerts),
        ts=T0,
    )


# ----------------------------------------------------------------------------------------- Slack


def test_sixty_alerts_fit_slack_limits_and_say_how_many_are_left_out() -> None:
    n = notification([alert(i) for i in range(60)])
    out = slack.render(n, external_url="https://medic.example")
    assert len(out.blocks) <= slack.MAX_BLOCKS
    assert check_slack_message({"text": out.text, "blocks": out.blocks}) == []
    sections = [b for b in out.blocks if b["type"] == "section"]
    assert all(len(b["text"]["text"]) <= 3000 for b in sections)
    assert out.truncated > 0
    note = sections[-1]["text"]["text"]
    assert f"and {out.truncated} more alerts" in note
    shown = sum(1 for b in sections if "fingerprint" in b["text"]["text"])
    assert shown + out.truncated == 60


def test_huge_labels_and_titles_are_cut_not_refused() -> None:
    huge = alert(1, node="n" * 5000, extra="x" * 5000, **{f"l{i}": "v" for i in range(20)})
    n = notification([huge]).model_copy(update={"group_labels": {"node": "n" * 5000}})
    out = slack.render(n)
    assert check_blocks(out.blocks) == []
    header = out.blocks[0]
    assert header["type"] == "header" and len(header["text"]["text"]) == 150
    assert header["text"]["text"].endswith("…")
    assert len(out.text) <= slack.MAX_FALLBACK_TEXT


def test_slack_escapes_mrkdwn_control_characters() -> None:
    out = slack.render(notification([alert(1, node="<!channel> & co <b>x</b> a<b")]))
    text = json.dumps(out.blocks)
    # the broadcast is removed, what is left of &, < and > is escaped as Slack documents
    assert "<!channel>" not in text and "(mention removed) &amp; co x a&lt;b" in text
    assert live_links(out.webhook_body()) == []


def test_slack_shows_diagnosis_and_reuses_the_approval_buttons() -> None:
    d = Diagnosis(
        incident_id="inc-0123456789abcdef0123",
        diagnostician="ranker",
        hypotheses=(Hypothesis(cause="gpu_xid_79_fallen_off_bus", confidence=0.91, summary="GPU fell off the bus"),),
        proposed_playbook="drain_node",
        proposed_params={"node": "gpu-node-1"},
        level=2,
        ts=T0,
    )
    r = RemediationEvent(
        incident_id=d.incident_id, run_id="run-1", playbook="drain_node", status="awaiting_approval", level=2, ts=T0
    )
    out = slack.render(notification([alert(1)]), diagnosis=d, remediation=r)
    assert check_blocks(out.blocks) == []
    assert any("gpu_xid_79_fallen_off_bus" in json.dumps(b) for b in out.blocks)
    actions = [b for b in out.blocks if b["type"] == "actions"]
    assert [e["value"] for e in actions[0]["elements"]] == ["run-1", "run-1"]
    assert '"node": "gpu-node-1"' in json.dumps(out.blocks).replace('\\"', '"')


def test_slack_app_bodies_thread_and_update() -> None:
    out = slack.render(notification([alert(1)]))
    assert out.post_body("#sre", thread_ts="1.2")["thread_ts"] == "1.2"
    assert "thread_ts" not in out.post_body("#sre")
    assert out.update_body("C1", "1.2") == {"channel": "C1", "ts": "1.2", "text": out.text, "blocks": out.blocks}


# ------------------------------------------------------------------------------------- PagerDuty


def test_pagerduty_event_uses_the_incident_as_dedup_key_and_maps_status() -> None:
    n = notification([alert(1), alert(2)])
    body, cut = pagerduty.render(n, routing_key=ROUTING_KEY, config={"severity": "critical"}, external_url="https://m")
    assert check_pagerduty(body, len(json.dumps(body))) == []
    assert body["dedup_key"] == n.incident_id and body["event_action"] == "trigger" and cut == 0
    assert body["payload"]["severity"] == "critical"
    assert body["payload"]["source"] == "gpu-node-1"
    assert body["payload"]["class"] == "gpu_xid"
    assert body["links"][0]["href"] == f"https://m/incidents/{n.incident_id}"
    assert len(body["payload"]["custom_details"]["alerts"]) == 2
    resolved = notification([alert(1, status="resolved")], status="resolved", reason="resolved")
    assert pagerduty.render(resolved, routing_key=ROUTING_KEY)[0]["event_action"] == "resolve"
    approved = RemediationEvent(
        incident_id=n.incident_id, run_id="r", playbook="p", status="approved", level=2, approver="slack:ann", ts=T0
    )
    assert pagerduty.render(n, routing_key=ROUTING_KEY, remediation=approved)[0]["event_action"] == "acknowledge"


def test_pagerduty_summary_is_cut_to_1024_and_bad_config_severity_falls_back() -> None:
    n = notification([alert(1)])
    body, _ = pagerduty.render(n, routing_key=ROUTING_KEY, config={"description": "d" * 5000, "severity": "sev1"})
    assert len(body["payload"]["summary"]) == 1024 and body["payload"]["severity"] == "critical"


def test_pagerduty_body_over_512_kb_shrinks_custom_details() -> None:
    big = {f"log{k}": "x" * 2_000 for k in range(20)}
    n = notification([alert(i, evidence=big) for i in range(400)])
    body, cut = pagerduty.render(n, routing_key=ROUTING_KEY)
    size = len(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())
    assert size <= pagerduty.MAX_BODY_BYTES
    assert check_pagerduty(body, size) == []
    details = body["payload"]["custom_details"]
    assert all("evidence" not in a for a in details["alerts"])
    assert details["incident_id"] == n.incident_id
    # 400 alerts without evidence still fit, so nothing was cut; with more, the list is cut visibly
    assert cut == 0
    many = notification([alert(i, **{f"extra{k}": "y" * 1000 for k in range(3)}) for i in range(400)])
    body, cut = pagerduty.render(many, routing_key=ROUTING_KEY)
    assert cut > 0 and body["payload"]["custom_details"]["truncated_alerts"] == cut
    assert f"and {cut} more alerts" in body["payload"]["custom_details"]["note"]


def test_pagerduty_refuses_when_even_the_minimal_event_is_too_big() -> None:
    with pytest.raises(PayloadTooLarge):
        pagerduty.render(notification([alert(1)]), routing_key=ROUTING_KEY, config={"client": "c" * 600_000})


def test_pagerduty_dedup_key_without_incident_is_stable_and_short() -> None:
    n = notification([alert(1)], incident_id="")
    assert pagerduty.dedup_key(n) == pagerduty.dedup_key(n) and len(pagerduty.dedup_key(n)) <= 255


# --------------------------------------------------------------------------- webhook, Alertmanager


def test_webhook_v4_shape_and_max_alerts() -> None:
    n = notification([alert(1), alert(2, status="resolved"), alert(3)])
    body = webhook.render(n, max_alerts=2, external_url="https://medic.example")
    assert check_webhook_v4(body) == []
    assert set(body) == {
        "version",
        "groupKey",
        "truncatedAlerts",
        "status",
        "receiver",
        "groupLabels",
        "commonLabels",
        "commonAnnotations",
        "externalURL",
        "alerts",
    }
    assert body["version"] == "4" and body["truncatedAlerts"] == 1 and len(body["alerts"]) == 2
    assert body["commonLabels"] == {"alertname": "gpu_xid", "node": "gpu-node-1", "severity": "critical"}
    firing, resolved = body["alerts"]
    assert firing["endsAt"] == GO_ZERO_TIME and resolved["endsAt"] == iso(T0)
    assert firing["fingerprint"] == alert(1).fingerprint
    assert firing["generatorURL"].endswith(n.incident_id)
    assert webhook.render(n)["truncatedAlerts"] == 0


def test_alertmanager_postable_alerts() -> None:
    n = notification([alert(1), alert(2, status="resolved")])
    body = alertmanager.render(n, resolve_after_s=300)
    assert check_postable_alerts(body) == []
    assert body[0]["endsAt"] == iso(T0 + 300) and body[1]["endsAt"] == iso(T0)
    assert "endsAt" not in alertmanager.render(n)[0]


def test_truncate_and_iso() -> None:
    assert truncate("abcdef", 4) == "abc…" and truncate("abc", 3) == "abc"
    assert iso(0.25) == "1970-01-01T00:00:00.250Z"


# -------------------------------------------------------------------------- registry and planning


def test_every_registered_notifier_loads() -> None:
    assert NOTIFIERS.names() == ["alertmanager", "pagerduty", "slack_app", "slack_webhook", "webhook"]
    for name in NOTIFIERS:
        assert NOTIFIERS.load(name).name == name
    assert notifier_for("slack_configs", {"app_token_file": "/x"}) == "slack_app"
    assert notifier_for("slack_configs", {"api_url": "https://hooks"}) == "slack_webhook"


def test_every_receiver_key_of_the_routing_schema_has_its_notifier_and_no_notifier_serves_another_key() -> None:
    # the notifiers declare their kind (config_kind); routing.yaml's schema lists the keys it parses
    assert set(notifier_kinds()) == set(NOTIFIER_SEND_RESOLVED_DEFAULT)
    assert notifier_kinds()["slack_configs"] == ("slack_app", "slack_webhook")
    assert notifier_for("webhook_configs", {"url": "http://x"}) == "webhook"
    with pytest.raises(NotifierConfigError, match="no notifier serves 'email_configs'; known: alertmanager_configs"):
        notifier_for("email_configs", {})


ROUTING = """
global: {pagerduty_url: "http://pd.local/v2/enqueue"}
route: {receiver: page}
receivers:
  - name: page
    slack_configs: [{api_url: "http://s", send_resolved: false}]
    pagerduty_configs: [{routing_key: "k"}]
    webhook_configs: [{url: "http://w", max_alerts: 1}]
    alertmanager_configs: [{url: "http://am"}]
  - name: nobody
"""


def test_plan_gives_one_delivery_per_config_and_applies_send_resolved() -> None:
    routing = loads_routing(ROUTING)
    n = notification([alert(1), alert(2, status="resolved")], receiver="page")
    jobs = plan(n, routing)
    assert [j.notifier for j in jobs] == ["slack_webhook", "pagerduty", "webhook", "alertmanager"]
    assert len({j.key for j in jobs}) == 4
    assert [a.status for a in jobs[0].notification.alerts] == ["firing"]
    assert len(jobs[1].notification.alerts) == 2
    assert jobs[1].global_config == {"pagerduty_url": "http://pd.local/v2/enqueue"}
    done = notification([alert(1, status="resolved")], status="resolved", reason="resolved", receiver="page")
    assert [j.notifier for j in plan(done, routing)] == ["pagerduty", "webhook", "alertmanager"]
    assert plan(notification([alert(1)], receiver="nobody"), routing) == []


def test_idempotency_key_is_per_receiver_integration_incident_reason_and_ts() -> None:
    n = notification([alert(1)])
    key = idempotency_key(n, "r/webhook_configs[0]")
    assert key == idempotency_key(n.model_copy(), "r/webhook_configs[0]")
    assert key != idempotency_key(n, "r/webhook_configs[1]")
    assert key != idempotency_key(n.model_copy(update={"reason": "update"}), "r/webhook_configs[0]")
    assert key != idempotency_key(n.model_copy(update={"ts": T0 + 1}), "r/webhook_configs[0]")


# ------------------------------------------------------------------------- untrusted text, quoted

# What would be live in Slack, PagerDuty or a chat a webhook forwards to: Slack control sequences,
# URLs, Markdown links and images, HTML, broadcasts, linkable domains and hidden characters.
_LIVE = re.compile(
    # Slack and HTML only act on a complete <...>; a lone "<" is text (and Slack's is escaped anyway)
    r"<[@!#][^<>]*>|<[a-z][a-z0-9+.-]*:[^<>]*>|<[a-z/!][^<>]*>"
    r"|[a-z][a-z0-9+.-]*://|www\.|\b(?:mailto|javascript|data|vbscript|file|slack|tel):"
    r"|\]\(|!\[|(?<![\w@])@(?:channel|here|everyone)\b"
    r"|(?<![a-z0-9-])[a-z0-9-]+\.(?:com|net|org|io|co|dev|app|ai|xyz|info|biz|me|sh|ly|gg|to|us|uk|ru|cn|tk|ws|cc"
    r"|link|site|online|top|click|zip|mov|example)(?![a-z0-9-])"
    r"|[\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff\U000e0000-\U000e007f]",
    re.IGNORECASE,
)


def live_links(payload: Any, allowed: tuple[str, ...] = ()) -> list[str]:
    """Every string in a rendered payload that still holds a live link, mention or hidden character.

    Args:
        payload: the JSON-like body a notifier would send.
        allowed: substrings that are ClusterMedic's own links (removed before checking).
    """
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            text = value
            for ok in allowed:
                text = text.replace(ok, "")
            for candidate in (text, unicodedata.normalize("NFKC", text)):
                match = _LIVE.search(candidate)
                if match:
                    found.append(candidate[max(0, match.start() - 40) : match.end() + 40])
                    break
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(k)
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    walk(payload)
    return found


NASTY = [
    "<!channel> approve now",
    "<!here|here> <!everyone> <@U024BE7LH> <@W123|bob> <!subteam^SAZ94GDB8|@oncall> <#C024BE7LR|ops>",
    "see <https://evil.example/pwn|the runbook> or <http://10.0.0.1/x> or <mailto:a@evil.com|mail>",
    "bare https://evil.com/a?b=1 and www.evil.org and evil.io/login and sre@evil.co",
    "[the runbook](https://evil.com) ![pixel](https://evil.com/p.png) [ref]: https://evil.com",
    '<a href="https://evil.com">click</a><img src=x onerror=alert(1)><script>x()</script><!-- hidden -->',
    "@channel @here @everyone reboot everything",
    "\uff1c\uff01\uff43\uff48\uff41\uff4e\uff4e\uff45\uff4c\uff1e"  # fullwidth <!channel>
    " \uff48\uff54\uff54\uff50\uff53\uff1a\uff0f\uff0fevil.com",
    "zero\u200bwidth \u202eedon_toober\u202c \u2066isolate\u2069 \U000e0041\U000e0042 tags",
    "<!chan<b>nel> [x](<https://evil.com|y>) <<!here>> <htt<i>ps://evil.com|z>",
    "javascript:alert(1) data:text/html,<b>x</b> slack://open tel:+15551234",
    "*bold* _it_ ~strike~ `code` ```fence``` > quote & <b> -> x",
]


@pytest.mark.parametrize("text", NASTY)
def test_sanitize_leaves_no_live_link_mention_or_hidden_text(text: str) -> None:
    clean = sanitize(text)
    assert live_links([clean]) == [], clean
    assert sanitize(clean) == clean, "sanitizing twice changes nothing"


def test_sanitize_keeps_the_readable_text_and_ordinary_telemetry() -> None:
    assert sanitize("see <https://evil.example/pwn|the runbook>") == "see the runbook"
    assert sanitize("[the runbook](https://evil.com)") == "the runbook"
    assert sanitize("ping <!channel>") == "ping (mention removed)"
    assert sanitize("go to https://evil.com now") == "go to (link removed) now"
    assert sanitize("evil.com") == "evil[.]com"
    ordinary = "vllm:kv_cache_usage_perc=0.99 on llama-70b-0 (h100-a-02, GPU-5) v1.2.3 a < b & c > d"
    assert sanitize(ordinary) == ordinary
    assert len(sanitize("x" * 100_000, 500)) == 500


def nasty_diagnosis() -> Diagnosis:
    return Diagnosis(
        incident_id="inc-0123456789abcdef0123",
        diagnostician="llm",
        hypotheses=(
            Hypothesis(
                cause="kv_cache_exhaustion",
                confidence=0.8,
                summary="KV cache full. " + " ".join(NASTY),
                evidence=tuple(NASTY),
            ),
        ),
        proposed_playbook="scale_replicas",
        proposed_params={"deployment": "llama-70b", "namespace": "serving"},
        level=1,
        notes=("XID text in an application log; not a trusted source <!here>",),
        ts=T0,
    )


def test_every_renderer_quotes_the_models_words_and_leaves_nothing_live() -> None:
    d = nasty_diagnosis()
    alerts = [alert(1, team="<!channel>", summary=NASTY[3], evidence={"line": NASTY[4], "msg": NASTY[0]})]
    n = notification(alerts, receiver="<@U1> team")
    r = RemediationEvent(
        incident_id=d.incident_id,
        run_id="run-1",
        playbook="scale_replicas",
        status="awaiting_approval",
        level=2,
        detail=NASTY[2],
        ts=T0,
    )
    rendered = {
        "slack": slack.render(n, diagnosis=d, remediation=r).webhook_body(),
        "pagerduty": pagerduty.render(n, routing_key=ROUTING_KEY, diagnosis=d, remediation=r)[0],
        "webhook": webhook.render(n, diagnosis=d),
        "alertmanager": alertmanager.render(n, diagnosis=d),
    }
    for vendor, body in rendered.items():
        assert live_links(body) == [], vendor
        assert "KV cache full." in json.dumps(body, ensure_ascii=False), vendor
    # the model's words are a labelled quotation, never plain prose of ClusterMedic's
    blocks = json.dumps(rendered["slack"]["blocks"], ensure_ascii=False)
    assert "untrusted text from the model or telemetry, quoted" in blocks and "\\n>KV cache full." in blocks
    assert "*Withheld*: XID text in an application log" in blocks
    pd = rendered["pagerduty"]["payload"]["custom_details"]["diagnosis"]
    assert pd["summary"].startswith("“KV cache full.") and pd["summary"].endswith("”")
    assert pd["cause"] == "kv_cache_exhaustion" and pd["notes"][0].startswith("XID text in an application log")
    annotations = rendered["webhook"]["alerts"][0]["annotations"]
    assert annotations["diagnosis"].startswith("kv_cache_exhaustion")
    assert annotations["diagnosis_summary"].startswith("“KV cache full.")
    assert rendered["alertmanager"][0]["annotations"]["diagnosis_summary"] == annotations["diagnosis_summary"]
    assert check_blocks(rendered["slack"]["blocks"]) == []
    assert check_webhook_v4(rendered["webhook"]) == [] and check_postable_alerts(rendered["alertmanager"]) == []


def test_clustermedics_own_incident_link_stays_live() -> None:
    out = slack.render(notification([alert(1)]), external_url="https://medic.example")
    assert "<https://medic.example/incidents/inc-0123456789abcdef0123|Open the incident>" in json.dumps(out.blocks)
    assert live_links(out.webhook_body(), allowed=("<https://medic.example/incidents/",)) == []
