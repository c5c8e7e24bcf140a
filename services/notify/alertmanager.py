"""Forward alerts to another Alertmanager: ``POST <url>/api/v2/alerts`` with postable alerts.

Config (an ``alertmanager_configs`` entry, ClusterMedic's own kind): ``url`` or ``url_file`` (the
Alertmanager's base URL, e.g. ``http://alertmanager:9093``; a URL already ending in ``/api/v2/alerts``
is used as is), optional ``resolve_after`` (seconds, or a duration such as ``5m``: the ``endsAt`` of
a firing alert, so it resolves if ClusterMedic stops pushing), ``send_resolved`` (default true).
Alertmanager answers 200 when it took the alerts and 400 when one is invalid.
"""

from __future__ import annotations

from services.alerting.durations import parse_duration
from services.notify.base import DeliveryResult, Message, Notifier
from services.notify.errors import NotifierConfigError
from services.notify.render import alertmanager

API_PATH = "/api/v2/alerts"


class AlertmanagerNotifier(Notifier):
    """Pushes the notification's alerts into an Alertmanager."""

    name = "alertmanager"
    config_kind = "alertmanager_configs"

    def resolve_after(self) -> float | None:
        """The configured ``resolve_after`` in seconds, or None."""
        value = self.config.get("resolve_after")
        if value in (None, ""):
            return None
        try:
            return float(value) if isinstance(value, (int, float)) else float(parse_duration(str(value)))
        except (TypeError, ValueError) as exc:
            raise NotifierConfigError(f"alertmanager: bad resolve_after {value!r}: {exc}") from exc

    def send(self, message: Message) -> DeliveryResult:
        """POST the alerts (contract on :class:`~services.notify.base.Notifier`)."""
        base = self.secret("url").rstrip("/")
        url = base if base.endswith(API_PATH) else base + API_PATH
        body = alertmanager.render(
            message.notification,
            resolve_after_s=self.resolve_after(),
            external_url=self.settings.external_url,
            diagnosis=message.diagnosis,
        )
        response = self.post_json(url, body)
        return DeliveryResult(
            notifier=self.name, receiver=message.notification.receiver, status_code=response.status_code, requests=1
        )
