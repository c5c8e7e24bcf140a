"""Alertmanager API v2 rendering: ``POST /api/v2/alerts`` takes a list of postable alerts.

Each alert carries ``labels`` (its identity; Alertmanager computes its own fingerprint of them),
``annotations``, ``startsAt``, ``endsAt`` and ``generatorURL``. A firing alert gets
``endsAt = ts + resolve_after`` when the config sets ``resolve_after`` (like Prometheus' own pushes, so
the alert resolves by itself if ClusterMedic goes quiet); without it Alertmanager applies its own
``resolve_timeout``. A resolved alert gets ``endsAt`` = the notification time. Label values and
annotations are sanitized (see :mod:`services.notify.render.common`); the diagnosis, when known,
travels as annotations with the model's summary quoted.
"""

from __future__ import annotations

from typing import Any

from services.alerting.notification import Notification
from services.core.events import Diagnosis
from services.notify.render.common import alert_annotations, iso, sanitize, sanitize_labels


def render(
    notification: Notification,
    *,
    resolve_after_s: float | None = None,
    external_url: str = "",
    diagnosis: Diagnosis | None = None,
) -> list[dict[str, Any]]:
    """Render the JSON list of postable alerts.

    Args:
        notification: the notification.
        resolve_after_s: seconds after ``ts`` a firing alert ends unless pushed again; None: omit.
        external_url: ClusterMedic's URL, the base of ``generatorURL``.
        diagnosis: the incident's diagnosis, added to every alert's annotations.
    """
    n = notification
    generator = f"{external_url.rstrip('/')}/incidents/{n.incident_id}" if external_url and n.incident_id else ""
    out: list[dict[str, Any]] = []
    for a in n.alerts:
        item: dict[str, Any] = {
            # Alertmanager refuses an empty label set; values that are empty mean "no label" anyway
            "labels": {k: v for k, v in sanitize_labels(a.labels).items() if v}
            or {"alertname": sanitize(a.signal, 200), "entity": sanitize(a.entity, 300)},
            "annotations": alert_annotations(a, n, diagnosis),
            "startsAt": iso(a.starts_at),
        }
        if a.status == "resolved":
            item["endsAt"] = iso(max(n.ts, a.starts_at))
        elif resolve_after_s:
            item["endsAt"] = iso(n.ts + resolve_after_s)
        if generator:
            item["generatorURL"] = generator
        out.append(item)
    return out
