"""PagerDuty Events API v2: ``POST https://events.pagerduty.com/v2/enqueue`` (URL configurable).

Config (a ``pagerduty_configs`` entry): ``routing_key`` or ``routing_key_file`` (``service_key`` is
the v1 API's and is refused), optional ``url`` (else ``global.pagerduty_url``, else the setting),
``severity``, ``source``, ``component``, ``group``, ``class``, ``client``, ``client_url``,
``description``, ``details``, ``links``, ``images``, ``send_resolved``.

PagerDuty answers 202 when it accepted the event, 400 when the event is invalid (permanent), 429
when rate limited and 5xx on its own trouble (both retried).
"""

from __future__ import annotations

from services.notify.base import DeliveryResult, Message, Notifier
from services.notify.errors import NotifierConfigError
from services.notify.render import pagerduty


class PagerDutyNotifier(Notifier):
    """Triggers, acknowledges and resolves one PagerDuty alert per incident."""

    name = "pagerduty"
    config_kind = "pagerduty_configs"

    def send(self, message: Message) -> DeliveryResult:
        """Enqueue the event (contract on :class:`~services.notify.base.Notifier`)."""
        if self.config.get("service_key") or self.config.get("service_key_file"):
            raise NotifierConfigError("pagerduty: service_key is the Events API v1's; use routing_key (v2)")
        routing_key = self.secret("routing_key")
        url = str(
            self.config.get("url") or self.context.global_config.get("pagerduty_url") or self.settings.pagerduty_url
        )
        body, truncated = pagerduty.render(
            message.notification,
            routing_key=routing_key,
            config=self.config,
            diagnosis=message.diagnosis,
            remediation=message.remediation,
            source=self.settings.source,
            external_url=self.settings.external_url,
        )
        response = self.post_json(url, body, max_bytes=pagerduty.MAX_BODY_BYTES)
        return DeliveryResult(
            notifier=self.name,
            receiver=message.notification.receiver,
            status_code=response.status_code,
            requests=1,
            external_id=str(body["dedup_key"]),
            truncated=truncated,
        )
