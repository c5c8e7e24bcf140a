"""Alertmanager webhook v4 rendering, so any receiver written for Alertmanager works unchanged.

The shape is Alertmanager's ``webhook_config`` body: ``version "4"``, ``groupKey``,
``truncatedAlerts``, ``status``, ``receiver``, ``groupLabels``, ``commonLabels``,
``commonAnnotations``, ``externalURL`` and ``alerts[]`` of ``status``, ``labels``, ``annotations``,
``startsAt``, ``endsAt`` (Go's zero time while firing), ``generatorURL``, ``fingerprint``.
``max_alerts`` (0: all) cuts the list and counts the rest in ``truncatedAlerts``.
"""

from __future__ import annotations

from typing import Any

from pipelines.correlate.model import Notification
from services.core.events import AlertRef
from services.notify.render.common import GO_ZERO_TIME, alert_annotations, common_annotations, common_labels, iso


def alert(a: AlertRef, notification: Notification, external_url: str = "") -> dict[str, Any]:
    """One alert of the webhook body.

    A resolved alert's ``endsAt`` is the notification time: the engine does not carry the exact
    resolve time on the alert reference.
    """
    return {
        "status": a.status,
        "labels": dict(a.labels),
        "annotations": alert_annotations(a, notification),
        "startsAt": iso(a.starts_at),
        "endsAt": GO_ZERO_TIME if a.status == "firing" else iso(notification.ts),
        "generatorURL": _generator(external_url, notification),
        "fingerprint": a.fingerprint,
    }


def render(notification: Notification, *, max_alerts: int = 0, external_url: str = "") -> dict[str, Any]:
    """Render the webhook v4 body.

    Args:
        notification: the notification.
        max_alerts: most alerts to include; 0 includes all (Alertmanager's meaning).
        external_url: ClusterMedic's URL (``externalURL``, and the base of ``generatorURL``).
    """
    n = notification
    alerts = list(n.alerts)
    shown = alerts[:max_alerts] if max_alerts > 0 else alerts
    return {
        "version": "4",
        "groupKey": n.group_key,
        "truncatedAlerts": len(alerts) - len(shown),
        "status": n.status,
        "receiver": n.receiver,
        "groupLabels": dict(n.group_labels),
        # common labels and annotations over every alert of the group, as Alertmanager computes them
        "commonLabels": common_labels(alerts),
        "commonAnnotations": common_annotations(alerts, n),
        "externalURL": external_url,
        "alerts": [alert(a, n, external_url) for a in shown],
    }


def _generator(external_url: str, n: Notification) -> str:
    if not external_url or not n.incident_id:
        return ""
    return f"{external_url.rstrip('/')}/incidents/{n.incident_id}"
