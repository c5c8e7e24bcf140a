"""Helpers every renderer shares: times, titles, truncation, label sets."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from typing import Any

from pipelines.correlate.model import Notification
from services.core.events import AlertRef

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
    return f"{head} {values}".strip()


def alert_line(alert: AlertRef) -> str:
    """One line about an alert: ``gpu_xid on GPU-1 (critical, firing)``."""
    return f"{alert.signal} on {alert.entity} ({alert.severity}, {alert.status})"


def common_labels(alerts: Iterable[AlertRef]) -> dict[str, str]:
    """Labels every alert has with the same value."""
    items: set[tuple[str, str]] | None = None
    for alert in alerts:
        pairs = set(alert.labels.items())
        items = pairs if items is None else items & pairs
    return dict(sorted(items or ()))


def alert_annotations(alert: AlertRef, notification: Notification) -> dict[str, str]:
    """Alert annotations ClusterMedic sends: a summary, the detector, the incident, the evidence (JSON)."""
    out = {
        "summary": alert_line(alert),
        "detector": alert.detector,
    }
    if notification.incident_id:
        out["incident_id"] = notification.incident_id
    if alert.evidence:
        out["evidence"] = truncate(json.dumps(alert.evidence, sort_keys=True, default=str), 4000)
    return out


def common_annotations(alerts: list[AlertRef], notification: Notification) -> dict[str, str]:
    """Annotations every alert has with the same value."""
    result: dict[str, str] | None = None
    for alert in alerts:
        ann = alert_annotations(alert, notification)
        result = ann if result is None else {k: v for k, v in result.items() if ann.get(k) == v}
    return dict(sorted((result or {}).items()))


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact UTF-8 JSON (as the notifiers encode it)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).encode())


def label_text(labels: Mapping[str, str]) -> str:
    """``{a="1", b="2"}`` like Prometheus prints a label set."""
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
