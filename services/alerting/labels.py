"""The labels every alert carries and the alert identity derived from them.

An anomaly becomes an alert with its own labels plus five taken from its fields
(:data:`ALERT_LABEL_FIELDS`); silences reason about those five
(:func:`~services.alerting.silences.matches_every_alert`), and the correlation engine identifies an
alert by :func:`alert_fingerprint`.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.core.events import Anomaly
from services.core.fingerprint import label_fingerprint

# The labels every alert carries, each from the Anomaly field named here.
ALERT_LABEL_FIELDS: dict[str, str] = {
    "alertname": "signal",
    "severity": "severity",
    "entity": "entity",
    "entity_kind": "entity_kind",
    "detector": "detector",
}


def alert_labels(anomaly: Anomaly) -> dict[str, str]:
    """An anomaly's labels as an alert's: its own labels (empty values dropped, as Prometheus does)
    plus ``alertname`` (the signal), ``severity``, ``entity``, ``entity_kind`` and ``detector``,
    which win over labels of the same name."""
    labels = {k: v for k, v in anomaly.labels.items() if v != ""}
    labels.update({label: getattr(anomaly, name) for label, name in ALERT_LABEL_FIELDS.items()})
    return dict(sorted(labels.items()))


def alert_fingerprint(anomaly: Anomaly, labels: Mapping[str, str] | None = None) -> str:
    """The identity of the alert an anomaly updates: the producer's fingerprint, else that of its alert
    labels (``labels`` when the caller has built them already).

    The same for the alert's firing and its resolution; a redelivery is told apart by
    :meth:`~services.core.events.Anomaly.delivery_key`, never by this.
    """
    return anomaly.fingerprint or label_fingerprint(alert_labels(anomaly) if labels is None else labels)
