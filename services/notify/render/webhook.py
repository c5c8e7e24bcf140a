"""Alertmanager webhook v4 rendering, so any receiver written for Alertmanager works unchanged.

The shape is Alertmanager's ``webhook_config`` body: ``version "4"``, ``groupKey``,
``truncatedAlerts``, ``status``, ``receiver``, ``groupLabels``, ``commonLabels``,
``commonAnnotations``, ``externalURL`` and ``alerts[]`` of ``status``, ``labels``, ``annotations``,
``startsAt``, ``endsAt`` (Go's zero time while firing), ``generatorURL``, ``fingerprint``.
``max_alerts`` (0: all) cuts the list and counts the rest in ``truncatedAlerts``.

Label values and annotations are sanitized (they came from telemetry; a receiver may well paste them
into a chat), and a diagnosis travels as annotations (``diagnosis``, ``diagnosis_summary`` quoted,
``proposed_playbook``, ``diagnosis_notes``), as :func:`~services.notify.render.common.alert_annotations`
writes them.
"""

from __future__ import annotations

from typing import Any

from services.alerting.notification import Notification
from services.core.events import AlertRef, Diagnosis
from services.notify.render.common import (
    GO_ZERO_TIME,
    alert_annotations,
    common_annotations,
    common_labels,
    iso,
    sanitize,
    sanitize_labels,
)


def alert(
    a: AlertRef, notification: Notification, external_url: str = "", diagnosis: Diagnosis | None = None
) -> dict[str, Any]:
    """One alert of the webhook body.

    A resolved alert's ``endsAt`` is the notification time: the engine does not carry the exact
    resolve time on the alert reference.
    """
    return {
        "status": a.status,
        "labels": sanitize_labels(a.labels),
        "annotations": alert_annotations(a, notification, diagnosis),
        "startsAt": iso(a.starts_at),
        "endsAt": GO_ZERO_TIME if a.status == "firing" else iso(notification.ts),
        "generatorURL": _generator(external_url, notification),
        "fingerprint": sanitize(a.fingerprint, 200),
    }


def render(
    notification: Notification, *, max_alerts: int = 0, external_url: str = "", diagnosis: Diagnosis | None = None
) -> dict[str, Any]:
    """Render the webhook v4 body.

    Args:
        notification: the notification.
        max_alerts: most alerts to include; 0 includes all (Alertmanager's meaning).
        external_url: ClusterMedic's URL (``externalURL``, and the base of ``generatorURL``).
        diagnosis: the incident's diagnosis, added to every alert's annotations.
    """
    n = notification
    alerts = list(n.alerts)
    shown = alerts[:max_alerts] if max_alerts > 0 else alerts
    return {
        "version": "4",
        "groupKey": sanitize(n.group_key, 1000),
        "truncatedAlerts": len(alerts) - len(shown),
        "status": n.status,
        "receiver": sanitize(n.receiver, 200),
        "groupLabels": sanitize_labels(n.group_labels),
        # common labels and annotations over every alert of the group, as Alertmanager computes them
        "commonLabels": common_labels(alerts),
        "commonAnnotations": common_annotations(alerts, n, diagnosis),
        "externalURL": external_url,
        "alerts": [alert(a, n, external_url, diagnosis) for a in shown],
    }


def _generator(external_url: str, n: Notification) -> str:
    if not external_url or not n.incident_id:
        return ""
    return f"{external_url.rstrip('/')}/incidents/{n.incident_id}"
