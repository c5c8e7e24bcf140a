"""Helpers every renderer shares: times, titles, truncation, label sets, and the sanitiser.

Untrusted text: everything that came from telemetry (alert labels and evidence, log lines, event
messages, span attributes) or from the LLM (hypothesis summaries and evidence) goes through
:func:`sanitize` before any renderer puts it in a payload, and the model's own words are shown as a
quotation (:func:`quoted`, or a Slack blockquote). Whoever wrote a log line must not be able to ping
``@channel``, plant a link next to an Approve button, or hide text with direction overrides.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

from services.alerting.notification import Notification
from services.core.events import AlertRef, Diagnosis

ELLIPSIS = "…"
GO_ZERO_TIME = "0001-01-01T00:00:00Z"
"""Alertmanager's endsAt for a firing alert in webhook payloads (Go's zero time)."""


def iso(ts: float) -> str:
    """RFC 3339 UTC time with milliseconds, e.g. ``2025-01-31T12:00:00.250Z``."""
    when = dt.datetime.fromtimestamp(ts, tz=dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def truncate(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ending in an ellipsis when cut."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 1)] + ELLIPSIS if limit > 0 else ""


# Characters a reader cannot see or that reorder what they see: C0/C1 controls (newline and tab kept),
# soft hyphen, bidi marks, overrides and isolates, zero-width joiners, word joiners, BOM, interlinear
# annotations and the Unicode tag block (invisible "ASCII smuggling").
_INVISIBLE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f"
    "\u200b-\u200f\u202a-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff9-\ufffb"
    "\U000e0000-\U000e007f]"
)
# Slack's control sequences: <@U123>, <!channel>, <!here>, <!subteam^S1>, <#C123>, <url|label>, <url>
_SLACK_ANGLE = re.compile(r"<([@!#][^<>]*|[a-zA-Z][a-zA-Z0-9+.-]*:[^<>]*)>")
_HTML_COMMENT = re.compile(r"<!--.*?(?:-->|$)", re.DOTALL)
_HTML_TAG = re.compile(r"</?[a-zA-Z][^<>]*>")
_MD_IMAGE = re.compile(r"!\[([^\[\]]*)\]\([^()]*\)")
_MD_LINK = re.compile(r"\[([^\[\]]*)\]\([^()]*\)")
_MD_REFERENCE = re.compile(r"^\s*\[[^\[\]]+\]:\s*\S+", re.MULTILINE)
_URL = re.compile(
    r"(?<![a-z0-9+.-])(?:[a-z][a-z0-9+.-]*://|www\.|(?:mailto|javascript|data|vbscript|file|slack|tel):)[^\s<>\"'`]*",
    re.IGNORECASE,
)
# Domains chat clients turn into links without a scheme (evil.com, user@evil.io): defanged as evil[.]com
_DOMAIN = re.compile(
    r"(?<![a-z0-9-])((?:[a-z0-9-]+\.)+)(com|net|org|io|co|dev|app|ai|xyz|info|biz|me|sh|ly|gg|to|us|uk|ru|cn"
    r"|tk|ws|cc|link|site|online|top|click|zip|mov|example)(?![a-z0-9-])",
    re.IGNORECASE,
)
_PLAIN_MENTION = re.compile(r"(?<![\w@])@(channel|here|everyone)\b", re.IGNORECASE)
_BLANK_LINES = re.compile(r"\n{3,}")
LINK_REMOVED = "(link removed)"
MENTION_REMOVED = "(mention removed)"
MAX_UNTRUSTED = 2000
"""Characters of one untrusted string kept by default."""


def _slack_angle(match: re.Match[str]) -> str:
    inner = match.group(1)
    if inner[0] in "@!#":
        return MENTION_REMOVED
    _, _, label = inner.partition("|")
    return label or LINK_REMOVED


def _strip_once(text: str) -> str:
    text = _INVISIBLE.sub("", text)
    text = _SLACK_ANGLE.sub(_slack_angle, text)
    text = _HTML_COMMENT.sub("", text)
    text = _HTML_TAG.sub("", text)
    text = _MD_IMAGE.sub(lambda m: m.group(1) or "image", text)
    text = _MD_LINK.sub(lambda m: m.group(1), text)
    text = _MD_REFERENCE.sub(LINK_REMOVED, text)
    text = _URL.sub(LINK_REMOVED, text)
    text = _DOMAIN.sub(lambda m: m.group(1).replace(".", "[.]") + m.group(2), text)
    return _PLAIN_MENTION.sub(lambda m: m.group(1), text)


def sanitize(text: Any, limit: int = MAX_UNTRUSTED) -> str:
    """Untrusted text made inert for every notification channel: no live link, mention or hidden text.

    Unicode is NFKC-normalised first (a fullwidth ``<!channel>`` is ``<!channel>``), then invisible
    and direction-changing characters are removed, Slack mentions and broadcasts (``<@U1>``,
    ``<!channel>``, ``<!here>``, ``<!subteam^S1>``, ``<#C1>``) become ``(mention removed)``, Slack links
    keep their label, Markdown links and images keep their text, HTML tags go, bare URLs become
    ``(link removed)``, domains a chat client would link are defanged (``evil[.]com``), and ``@here`` loses
    its ``@``. Repeated until nothing changes, so a removal cannot assemble a new link. Slack's own
    escaping of ``&``, ``<`` and ``>`` is the Slack renderer's last step (:func:`escape_mrkdwn`).

    Args:
        text: anything; non-strings are converted with ``str``.
        limit: the most characters kept (cut with an ellipsis).
    """
    out = unicodedata.normalize("NFKC", text if isinstance(text, str) else str(text))
    out = out[: limit * 4]  # bound the regex work on hostile sizes before cutting to the limit
    for _ in range(8):
        cleaned = _strip_once(out)
        if cleaned == out:
            break
        out = unicodedata.normalize("NFKC", cleaned)
    return truncate(_BLANK_LINES.sub("\n\n", out).strip(), limit)


def sanitize_data(value: Any, limit: int = MAX_UNTRUSTED) -> Any:
    """:func:`sanitize` applied to every string (keys included) of JSON-like data; numbers kept."""
    if isinstance(value, str):
        return sanitize(value, limit)
    if isinstance(value, Mapping):
        return {sanitize(k, 200): sanitize_data(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [sanitize_data(v, limit) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return sanitize(value, limit)


def sanitize_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """A label set with sanitized names and values (label values come from telemetry)."""
    return {sanitize(k, 200): sanitize(v, 1000) for k, v in labels.items()}


def escape_mrkdwn(text: str) -> str:
    """Escape the three characters Slack's mrkdwn reserves (``&``, ``<``, ``>``), as Slack documents."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def quoted(text: Any, limit: int = MAX_UNTRUSTED) -> str:
    """Untrusted text sanitized and set in quotation marks, for plain-text channels (PagerDuty, webhooks)."""
    return f"“{sanitize(text, limit)}”"


UNTRUSTED_LABEL = "untrusted text from the model or telemetry, quoted"


def diagnosis_summary(diagnosis: Diagnosis) -> dict[str, Any]:
    """The diagnosis for a JSON payload: trusted fields plain, the model's words quoted and sanitized.

    ``cause`` is a runbook root cause (the guard admits no other) and ``proposed_playbook`` a registry
    name; ``summary`` and ``evidence`` are the model's or telemetry's words, so they are quoted;
    ``notes`` say why an action was withheld.
    """
    best = max(diagnosis.hypotheses, key=lambda h: h.confidence)
    out: dict[str, Any] = {
        "diagnostician": sanitize(diagnosis.diagnostician, 40),
        "cause": sanitize(best.cause, 200),
        "confidence": best.confidence,
        "summary": quoted(best.summary) if best.summary else "",
        "evidence": [quoted(e, 300) for e in best.evidence[:5]],
        "proposed_playbook": sanitize(diagnosis.proposed_playbook, 80) if diagnosis.proposed_playbook else None,
        "level": diagnosis.level,
        "untrusted": UNTRUSTED_LABEL,
    }
    if diagnosis.notes:
        out["notes"] = [sanitize(note, 500) for note in diagnosis.notes[:5]]
    return out


def diagnosis_annotations(diagnosis: Diagnosis | None) -> dict[str, str]:
    """Annotations that carry the diagnosis on pushed or forwarded alerts (strings only, as annotations are)."""
    if diagnosis is None or not diagnosis.hypotheses:
        return {}
    d = diagnosis_summary(diagnosis)
    out = {"diagnosis": f"{d['cause']} ({d['confidence']:.0%}, {d['diagnostician']})"}
    if d["summary"]:
        out["diagnosis_summary"] = f"{d['summary']} ({UNTRUSTED_LABEL})"
    if d["proposed_playbook"]:
        out["proposed_playbook"] = f"{d['proposed_playbook']} (level {d['level']})"
    if d.get("notes"):
        out["diagnosis_notes"] = "; ".join(d["notes"])
    return out


def more_alerts(n: int) -> str:
    """The visible note that ``n`` alerts were left out."""
    return f"{ELLIPSIS}and {n} more alert{'s' if n != 1 else ''}"


def firing(alerts: Iterable[AlertRef]) -> list[AlertRef]:
    """The firing alerts."""
    return [a for a in alerts if a.status == "firing"]


def title(notification: Notification) -> str:
    """Alertmanager's default title: ``[FIRING:2] gpu_xid gpu-node-1`` or ``[RESOLVED] ...``."""
    n = notification
    head = f"[FIRING:{len(firing(n.alerts))}]" if n.status == "firing" else "[RESOLVED]"
    values = " ".join(v for _, v in sorted(n.group_labels.items()) if v)
    if not values and n.alerts:
        values = n.alerts[0].signal
    return sanitize(f"{head} {values}".strip(), 1000)


def alert_line(alert: AlertRef) -> str:
    """One line about an alert: ``gpu_xid on GPU-1 (critical, firing)``."""
    return sanitize(f"{alert.signal} on {alert.entity} ({alert.severity}, {alert.status})", 500)


def common_labels(alerts: Iterable[AlertRef]) -> dict[str, str]:
    """Labels every alert has with the same value (sanitized: label values come from telemetry)."""
    items: set[tuple[str, str]] | None = None
    for alert in alerts:
        pairs = set(sanitize_labels(alert.labels).items())
        items = pairs if items is None else items & pairs
    return dict(sorted(items or ()))


def alert_annotations(
    alert: AlertRef, notification: Notification, diagnosis: Diagnosis | None = None
) -> dict[str, str]:
    """Alert annotations ClusterMedic sends: a summary, the detector, the incident, the evidence (JSON
    of sanitized values), and the diagnosis when one is given (:func:`diagnosis_annotations`)."""
    out = {
        "summary": alert_line(alert),
        "detector": sanitize(alert.detector, 200),
    }
    if notification.incident_id:
        out["incident_id"] = sanitize(notification.incident_id, 300)
    if alert.evidence:
        evidence = sanitize_data(alert.evidence, 1000)
        out["evidence"] = truncate(json.dumps(evidence, sort_keys=True, default=str, ensure_ascii=False), 4000)
    out.update(diagnosis_annotations(diagnosis))
    return out


def common_annotations(
    alerts: list[AlertRef], notification: Notification, diagnosis: Diagnosis | None = None
) -> dict[str, str]:
    """Annotations every alert has with the same value."""
    result: dict[str, str] | None = None
    for alert in alerts:
        ann = alert_annotations(alert, notification, diagnosis)
        result = ann if result is None else {k: v for k, v in result.items() if ann.get(k) == v}
    return dict(sorted((result or {}).items()))


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact UTF-8 JSON (as the notifiers encode it)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).encode())


def label_text(labels: Mapping[str, str]) -> str:
    """``{a="1", b="2"}`` like Prometheus prints a label set."""
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
