"""Slack Block Kit rendering (incoming webhooks and ``chat.postMessage`` / ``chat.update``).

Layout: a header (the title), a summary section with mrkdwn fields, optional diagnosis and
remediation sections (an approval request reuses :func:`services.remediation.slack.approval_blocks`),
a divider, one section per alert, and a context line. Slack's limits are respected by truncating,
never by failing: at most :data:`MAX_BLOCKS` blocks (alerts that do not fit become a visible
"…and N more alerts" section), :data:`MAX_SECTION_TEXT` characters of section text,
:data:`MAX_FIELDS` fields of at most :data:`MAX_FIELD_TEXT` characters, :data:`MAX_HEADER` characters
of header.

Text from telemetry or the model goes through :func:`untrusted` (the shared sanitiser, then Slack's
escaping); the model's summary and evidence are set as a blockquote under a label saying so, and links
never unfurl.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.alerting.notification import Notification
from services.core.events import SEVERITY_RANK, AlertRef, Diagnosis, RemediationEvent
from services.notify.render.common import (
    UNTRUSTED_LABEL,
    alert_line,
    escape_mrkdwn,
    firing,
    iso,
    more_alerts,
    sanitize,
    title,
    truncate,
)
from services.remediation.slack import approval_blocks

MAX_BLOCKS = 50
MAX_SECTION_TEXT = 3000
MAX_FIELDS = 10
MAX_FIELD_TEXT = 2000
MAX_HEADER = 150
MAX_CONTEXT_ELEMENTS = 10
MAX_FALLBACK_TEXT = 3000
"""Top-level ``text``: the notification fallback; Slack advises under 4000 characters."""

Block = dict[str, Any]


@dataclass(frozen=True)
class SlackRender:
    """A rendered Slack message.

    Attributes:
        text: the top-level fallback text (notifications, screen readers).
        blocks: the Block Kit blocks.
        truncated: alerts left out to stay within the block limit.
    """

    text: str
    blocks: list[Block]
    truncated: int

    def webhook_body(self) -> dict[str, Any]:
        """Body of an incoming-webhook POST."""
        return {"text": self.text, "blocks": self.blocks, "unfurl_links": False, "unfurl_media": False}

    def post_body(self, channel: str, thread_ts: str | None = None) -> dict[str, Any]:
        """Body of ``chat.postMessage`` (a reply when ``thread_ts`` is given)."""
        body: dict[str, Any] = {
            "channel": channel,
            "text": self.text,
            "blocks": self.blocks,
            "unfurl_links": False,
            "unfurl_media": False,
        }
        if thread_ts:
            body["thread_ts"] = thread_ts
        return body

    def update_body(self, channel: str, ts: str) -> dict[str, Any]:
        """Body of ``chat.update`` of the message ``ts``."""
        return {"channel": channel, "ts": ts, "text": self.text, "blocks": self.blocks}


def escape(text: str) -> str:
    """Escape the three characters Slack's mrkdwn reserves (``&``, ``<``, ``>``)."""
    return escape_mrkdwn(text)


def untrusted(text: str, limit: int = 1000) -> str:
    """Text from telemetry or the model as inert mrkdwn: sanitized (no link, mention, hidden text), then
    escaped; backticks become quotes so the text cannot close the code span it may sit in."""
    return escape_mrkdwn(sanitize(text, limit)).replace("`", "'")


def blockquote(text: str, limit: int = 1000) -> str:
    """Untrusted text as a Slack blockquote (``>`` at each line start is Slack's quote, not escaped)."""
    return "\n".join(f">{line}" for line in untrusted(text, limit).split("\n"))


def mrkdwn(text: str, limit: int = MAX_SECTION_TEXT) -> dict[str, str]:
    """A mrkdwn text object cut to ``limit`` characters (never empty: Slack rejects empty text)."""
    return {"type": "mrkdwn", "text": truncate(text, limit) or " "}


def section(text: str, fields: list[str] | None = None) -> Block:
    """A section block with at most :data:`MAX_FIELDS` fields, every text within its limit."""
    block: Block = {"type": "section", "text": mrkdwn(text)}
    if fields:
        block["fields"] = [mrkdwn(f, MAX_FIELD_TEXT) for f in fields[:MAX_FIELDS]]
    return block


def render(
    notification: Notification,
    *,
    diagnosis: Diagnosis | None = None,
    remediation: RemediationEvent | None = None,
    external_url: str = "",
) -> SlackRender:
    """Render a notification (and its context) as one Slack message within Block Kit's limits.

    Args:
        notification: the :class:`~services.alerting.notification.Notification`.
        diagnosis: optional diagnosis of the incident.
        remediation: optional latest remediation event; ``awaiting_approval`` adds Approve/Reject buttons.
        external_url: ClusterMedic's URL, linked from the context line.
    """
    n = notification
    head_text = title(n)
    top: list[Block] = [
        {"type": "header", "text": {"type": "plain_text", "text": truncate(head_text, MAX_HEADER), "emoji": True}},
        _summary(n),
    ]
    if diagnosis is not None and diagnosis.hypotheses:
        top.append(_diagnosis(diagnosis))
    if remediation is not None:
        top.extend(_remediation(remediation, diagnosis))
    top.append({"type": "divider"})
    tail = [_context(n, external_url)]

    room = MAX_BLOCKS - len(top) - len(tail)
    alerts = list(n.alerts)
    shown = alerts if len(alerts) <= room else alerts[: max(0, room - 1)]
    left_out = len(alerts) - len(shown)
    body = [_alert(a) for a in shown]
    if left_out:
        # visible in the message itself, not only in a log line
        hidden = alerts[len(shown) :]
        counts = f"{len(firing(hidden))} firing, {len(hidden) - len(firing(hidden))} resolved"
        body.append(section(f"*{more_alerts(left_out)}* ({counts}) not shown: Slack allows {MAX_BLOCKS} blocks"))
    # the fallback text is parsed for mentions too: every part of it is sanitized and escaped
    fallback = escape(f"{head_text}: " + "; ".join(alert_line(a) for a in alerts[:20]))
    if len(alerts) > 20:
        fallback += f" {more_alerts(len(alerts) - 20)}"
    return SlackRender(text=truncate(fallback, MAX_FALLBACK_TEXT), blocks=top + body + tail, truncated=left_out)


def _summary(n: Notification) -> Block:
    alerts: list[AlertRef] = list(n.alerts)
    worst = max((a.severity for a in alerts), key=lambda s: SEVERITY_RANK.get(s, 0), default="info")
    fields = [
        f"*Status*\n{n.status}",
        f"*Severity*\n{worst}",
        f"*Alerts*\n{len(firing(alerts))} firing, {len(alerts) - len(firing(alerts))} resolved",
        f"*Receiver*\n{untrusted(n.receiver)}",
    ]
    fields += [f"*{untrusted(k, 200)}*\n{untrusted(v)}" for k, v in sorted(n.group_labels.items())]
    incident = f"incident `{untrusted(n.incident_id, 300)}`" if n.incident_id else "no incident yet"
    return section(f"*{n.reason.capitalize()}* notification for {incident}", fields)


def _diagnosis(d: Diagnosis) -> Block:
    best = max(d.hypotheses, key=lambda h: h.confidence)
    text = (
        f"*Diagnosis* ({untrusted(d.diagnostician, 40)}): `{untrusted(best.cause, 200)}`"
        f" at {best.confidence:.0%} confidence"
    )
    if best.summary or best.evidence:
        # the model's (or telemetry's) own words: quoted, labelled, inert
        text += f"\n_{UNTRUSTED_LABEL}:_"
        if best.summary:
            text += "\n" + blockquote(best.summary, 1200)
        for item in best.evidence[:3]:
            text += "\n" + blockquote(f"- {item}", 300)
    others = [h for h in d.hypotheses if h is not best][:3]
    if others:
        text += "\nAlso considered: " + ", ".join(f"`{untrusted(h.cause, 200)}` ({h.confidence:.0%})" for h in others)
    for note in d.notes[:3]:
        text += f"\n*Withheld*: {untrusted(note, 500)}"
    fields = []
    if d.proposed_playbook:
        fields.append(f"*Proposed playbook*\n`{untrusted(d.proposed_playbook, 80)}`")
    if d.level is not None:
        fields.append(f"*Level*\n{d.level}")
    return section(text, fields)


def _remediation(r: RemediationEvent, d: Diagnosis | None) -> list[Block]:
    if r.status == "awaiting_approval":
        params = d.proposed_params if d is not None and d.proposed_playbook == r.playbook else {}
        # targets come from topology labels; shown inert in case a label carried a mention
        shown = {untrusted(str(k), 100): untrusted(str(v), 300) for k, v in params.items()}
        return approval_blocks(untrusted(r.run_id, 100), untrusted(r.playbook, 80), untrusted(r.detail), shown)
    fields = [f"*Playbook*\n`{untrusted(r.playbook, 80)}`", f"*Status*\n{r.status}", f"*Level*\n{r.level}"]
    if r.step:
        fields.append(f"*Step*\n{untrusted(r.step, 200)}")
    if r.approver:
        fields.append(f"*Approver*\n{untrusted(r.approver, 200)}")
    text = f"*Remediation* run `{untrusted(r.run_id, 100)}`" + (f"\n{untrusted(r.detail)}" if r.detail else "")
    return [section(text, fields)]


def _alert(a: AlertRef) -> Block:
    icon = ":red_circle:" if a.status == "firing" else ":large_green_circle:"
    text = (
        f"{icon} *{untrusted(a.signal, 200)}* on `{untrusted(a.entity, 300)}`: {a.severity}, {a.status}"
        f" since {iso(a.starts_at)}\ndetector `{untrusted(a.detector, 200)}`,"
        f" fingerprint `{untrusted(a.fingerprint, 200)}`"
    )
    skip = {"alertname", "entity", "severity", "detector"}
    fields = [f"*{untrusted(k, 200)}*\n{untrusted(v)}" for k, v in sorted(a.labels.items()) if k not in skip and v]
    return section(text, fields)


def _context(n: Notification, external_url: str) -> Block:
    elements = [mrkdwn(f"ClusterMedic · group `{untrusted(n.group_key, 500)}` · {iso(n.ts)}")]
    if external_url and n.incident_id:
        elements.append(mrkdwn(f"<{external_url.rstrip('/')}/incidents/{n.incident_id}|Open the incident>"))
    return {"type": "context", "elements": elements[:MAX_CONTEXT_ELEMENTS]}
