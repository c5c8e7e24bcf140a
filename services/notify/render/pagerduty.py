"""PagerDuty Events API v2 rendering (``POST /v2/enqueue``).

``dedup_key`` is the incident id, so every notification about an incident updates one PagerDuty
alert: ``trigger`` while anything fires, ``resolve`` once all is resolved, ``acknowledge`` when a
human approved a remediation. Limits: ``summary`` at most :data:`MAX_SUMMARY` characters, ``dedup_key``
at most :data:`MAX_DEDUP_KEY`, the whole body under :data:`MAX_BODY_BYTES`: ``custom_details`` is
shrunk step by step (evidence dropped, alerts cut with a visible count) until it fits.

Text from telemetry or the model is sanitized (:func:`~services.notify.render.common.sanitize`): no
link or mention survives into the summary or ``custom_details``, and the diagnosis's summary and
evidence are quoted (:func:`~services.notify.render.common.diagnosis_summary`). The routing config's
own ``links``, ``images`` and ``details`` are the operator's and are sent as written.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Literal

from services.alerting.notification import Notification
from services.core.events import SEVERITY_RANK, Diagnosis, RemediationEvent
from services.notify.errors import PayloadTooLarge
from services.notify.render.common import (
    alert_line,
    common_labels,
    diagnosis_summary,
    firing,
    iso,
    json_size,
    more_alerts,
    sanitize,
    sanitize_data,
    sanitize_labels,
    title,
    truncate,
)

MAX_SUMMARY = 1024
MAX_DEDUP_KEY = 255
MAX_BODY_BYTES = 512 * 1024
SEVERITIES = ("critical", "error", "warning", "info")
EventAction = Literal["trigger", "acknowledge", "resolve"]
# ClusterMedic severities to PagerDuty's (PagerDuty's "error" has no counterpart here)
_SEVERITY = {"critical": "critical", "warning": "warning", "info": "info"}


def dedup_key(notification: Notification) -> str:
    """The incident id; a group-key digest when the alerts have no incident yet."""
    if notification.incident_id:
        return notification.incident_id[:MAX_DEDUP_KEY]
    return "group-" + hashlib.sha256(notification.group_key.encode()).hexdigest()[:32]


def event_action(notification: Notification, remediation: RemediationEvent | None = None) -> EventAction:
    """``resolve`` when all is resolved, ``acknowledge`` when a human approved the fix, else ``trigger``."""
    if notification.status == "resolved":
        return "resolve"
    if remediation is not None and remediation.status == "approved" and remediation.approver:
        return "acknowledge"
    return "trigger"


def render(
    notification: Notification,
    *,
    routing_key: str,
    config: Mapping[str, Any] | None = None,
    diagnosis: Diagnosis | None = None,
    remediation: RemediationEvent | None = None,
    source: str = "clustermedic",
    external_url: str = "",
    max_bytes: int = MAX_BODY_BYTES,
) -> tuple[dict[str, Any], int]:
    """Render an Events API v2 event.

    Args:
        notification: the notification.
        routing_key: the integration's routing key.
        config: the ``pagerduty_configs`` entry: ``severity``, ``source``, ``component``, ``group``,
            ``class``, ``client``, ``client_url``, ``description``, ``details``, ``links``, ``images``.
        diagnosis: optional diagnosis, added to ``custom_details``.
        remediation: optional remediation event, added to ``custom_details``.
        source: ``payload.source`` when the config has none.
        external_url: ClusterMedic's URL, linked from ``links`` and used as ``client_url``.
        max_bytes: the body limit.

    Returns:
        The body and the number of alerts left out of ``custom_details`` to fit.

    Raises:
        PayloadTooLarge: not even the minimal body fits (a config with huge static fields).
    """
    cfg = dict(config or {})
    n = notification
    action = event_action(n, remediation)
    body: dict[str, Any] = {"routing_key": routing_key, "event_action": action, "dedup_key": dedup_key(n)}
    if cfg.get("client") or external_url:
        body["client"] = str(cfg.get("client") or "ClusterMedic")
    client_url = str(cfg.get("client_url") or external_url)
    if client_url:
        body["client_url"] = client_url
    links = [dict(link) for link in cfg.get("links") or [] if isinstance(link, Mapping) and link.get("href")]
    if external_url and n.incident_id:
        links.insert(0, {"href": f"{external_url.rstrip('/')}/incidents/{n.incident_id}", "text": "ClusterMedic"})
    if links:
        body["links"] = links
    images = [dict(i) for i in cfg.get("images") or [] if isinstance(i, Mapping) and i.get("src")]
    if images:
        body["images"] = images

    alerts = list(n.alerts)
    worst = max((a.severity for a in alerts), key=lambda s: SEVERITY_RANK.get(s, 0), default="warning")
    severity = str(cfg.get("severity") or _SEVERITY.get(worst, "warning"))
    if severity not in SEVERITIES:
        severity = _SEVERITY.get(worst, "warning")
    summary = str(cfg.get("description") or "") or _summary(n)
    payload: dict[str, Any] = {
        "summary": truncate(summary, MAX_SUMMARY),
        "source": str(cfg.get("source") or sanitize(_source(n), 255) or source),
        "severity": severity,
        "timestamp": iso(n.ts),
    }
    labels = common_labels(alerts)
    component = cfg.get("component") or labels.get("entity_kind") or ""
    group = cfg.get("group") or labels.get("node") or labels.get("Hostname") or labels.get("namespace") or ""
    klass = cfg.get("class") or labels.get("alertname") or ""
    for key, value in (("component", component), ("group", group), ("class", klass)):
        if value:
            payload[key] = sanitize(value, 255)
    body["payload"] = payload

    static = (
        {str(k): v for k, v in (cfg.get("details") or {}).items()} if isinstance(cfg.get("details"), Mapping) else {}
    )
    details = _details(n, alerts, diagnosis, remediation, static, with_evidence=True)
    payload["custom_details"] = details
    if json_size(body) <= max_bytes:
        return body, 0
    # Too big: drop per-alert evidence first (the bulk), then cut the alert list in halves.
    details = _details(n, alerts, diagnosis, remediation, static, with_evidence=False)
    payload["custom_details"] = details
    keep = len(alerts)
    while json_size(body) > max_bytes and keep > 0:
        keep //= 2
        details = _details(n, alerts[:keep], diagnosis, remediation, static, with_evidence=False)
        details["truncated_alerts"] = len(alerts) - keep
        details["note"] = more_alerts(len(alerts) - keep) + " left out to stay under PagerDuty's 512 KB"
        payload["custom_details"] = details
    if json_size(body) > max_bytes:
        payload["custom_details"] = {"note": "details left out to stay under PagerDuty's 512 KB"}
    if json_size(body) > max_bytes:
        raise PayloadTooLarge(f"pagerduty: even the minimal event is {json_size(body)} bytes (limit {max_bytes})")
    return body, len(alerts) - keep


def _summary(n: Notification) -> str:
    head = title(n)
    fire = firing(n.alerts)
    first = alert_line(fire[0] if fire else n.alerts[0]) if n.alerts else ""
    rest = f" (+{len(n.alerts) - 1} more)" if len(n.alerts) > 1 else ""
    return f"{head}: {first}{rest}" if first else head


def _source(n: Notification) -> str:
    labels = common_labels(n.alerts)
    return labels.get("node") or labels.get("Hostname") or labels.get("hostname") or labels.get("entity") or ""


def _details(
    n: Notification,
    alerts: list[Any],
    diagnosis: Diagnosis | None,
    remediation: RemediationEvent | None,
    static: dict[str, Any],
    *,
    with_evidence: bool,
) -> dict[str, Any]:
    details: dict[str, Any] = dict(static)
    details.update(
        incident_id=n.incident_id,
        group_key=sanitize(n.group_key, 1000),
        group_labels=sanitize_labels(n.group_labels),
        reason=n.reason,
        firing=len(firing(n.alerts)),
        resolved=len(n.alerts) - len(firing(n.alerts)),
        alerts=[
            {
                "summary": alert_line(a),
                "fingerprint": sanitize(a.fingerprint, 200),
                "starts_at": iso(a.starts_at),
                "labels": sanitize_labels(a.labels),
                **({"evidence": sanitize_data(a.evidence, 1000)} if with_evidence and a.evidence else {}),
            }
            for a in alerts
        ],
    )
    if diagnosis is not None and diagnosis.hypotheses:
        details["diagnosis"] = diagnosis_summary(diagnosis)
    if remediation is not None:
        details["remediation"] = {
            "run_id": sanitize(remediation.run_id, 200),
            "playbook": sanitize(remediation.playbook, 80),
            "status": remediation.status,
            "step": sanitize(remediation.step, 200),
            "approver": sanitize(remediation.approver, 200),
            "detail": sanitize(remediation.detail, 2000),
        }
    return details
