"""Microsoft Teams incoming webhook: ``POST <webhook_url>`` with an Office 365 connector ``MessageCard``.

Config (an ``msteams_configs`` entry, Alertmanager's key): ``webhook_url`` or ``webhook_url_file``,
``title``, ``send_resolved``. Teams answers 200 with ``1``; 429 and 5xx are retried by the notify task,
other answers are permanent (the base class classifies them).
"""

from __future__ import annotations

from typing import Any

from services.alerting.notification import Notification
from services.core.events import Diagnosis
from services.notify.base import DeliveryResult, Message, Notifier

MAX_FACTS = 20  # a card stays readable; the rest are counted in the text
COLOURS = {"firing": "d63333", "resolved": "2eb886"}


def render(notification: Notification, *, title: str = "", diagnosis: Diagnosis | None = None) -> dict[str, Any]:
    """The ``MessageCard`` for one notification (pure)."""
    alerts = notification.alerts
    facts = [{"name": f"{a.severity} {a.signal}", "value": f"{a.entity} ({a.status})"} for a in alerts[:MAX_FACTS]]
    text = f"Incident {notification.incident_id}: {len(alerts)} alert(s), {notification.reason}."
    if len(alerts) > MAX_FACTS:
        text += f" {len(alerts) - MAX_FACTS} more not shown."
    if diagnosis is not None and diagnosis.hypotheses:
        best = diagnosis.hypotheses[0]
        text += f" Likely cause: {best.cause} ({best.confidence:.0%})."
    return {
        "@type": "MessageCard",
        "@context": "https://schema.org/extensions",
        "themeColor": COLOURS[notification.status],
        "summary": f"[{notification.status.upper()}] {notification.incident_id}",
        "title": title or f"[{notification.status.upper()}] ClusterMedic: {notification.receiver}",
        "text": text,
        "sections": [{"facts": facts}],
    }


class TeamsNotifier(Notifier):
    """Posts a MessageCard to a Teams channel's incoming webhook."""

    name = "msteams"
    config_kind = "msteams_configs"

    def send(self, message: Message) -> DeliveryResult:
        """POST the card (contract on :class:`~services.notify.base.Notifier`)."""
        card = render(message.notification, title=str(self.config.get("title") or ""), diagnosis=message.diagnosis)
        response = self.post_json(self.secret("webhook_url"), card, max_bytes=28_000)  # Teams' card limit
        return DeliveryResult(
            notifier=self.name,
            receiver=message.notification.receiver,
            status_code=response.status_code,
            requests=1,
        )
