"""Generic webhook in Alertmanager's webhook v4 shape, so receivers written for Alertmanager work.

Config (a ``webhook_configs`` entry): ``url`` or ``url_file``, ``max_alerts`` (0: all),
``send_resolved``, and optionally ``http_config.authorization`` (``type``, default ``Bearer``, with
``credentials`` or ``credentials_file``) or ``http_config.bearer_token`` / ``bearer_token_file``.
Any 2xx is success; 429 and 5xx are retried; other answers are permanent.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.notify.base import DeliveryResult, Message, Notifier, read_secret
from services.notify.errors import NotifierConfigError
from services.notify.render import webhook


class WebhookNotifier(Notifier):
    """POSTs the webhook v4 body to a URL."""

    name = "webhook"
    config_kind = "webhook_configs"

    def headers(self) -> dict[str, str]:
        """The Authorization header the config's ``http_config`` asks for, if any."""
        http = self.config.get("http_config") or {}
        if not isinstance(http, Mapping):
            raise NotifierConfigError("webhook: http_config must be a mapping")
        auth = http.get("authorization")
        if isinstance(auth, Mapping) and (auth.get("credentials") or auth.get("credentials_file")):
            return {
                "Authorization": f"{auth.get('type') or 'Bearer'} {read_secret(auth, 'credentials', who=self.name)}"
            }
        if http.get("bearer_token") or http.get("bearer_token_file"):
            return {"Authorization": f"Bearer {read_secret(http, 'bearer_token', who=self.name)}"}
        return {}

    def send(self, message: Message) -> DeliveryResult:
        """POST the v4 body (contract on :class:`~services.notify.base.Notifier`)."""
        url = self.secret("url")
        try:
            max_alerts = int(self.config.get("max_alerts") or 0)
        except (TypeError, ValueError):
            raise NotifierConfigError(
                f"webhook: max_alerts must be an integer, got {self.config.get('max_alerts')!r}"
            ) from None
        body = webhook.render(
            message.notification,
            max_alerts=max_alerts,
            external_url=self.settings.external_url,
            diagnosis=message.diagnosis,
        )
        response = self.post_json(url, body, headers=self.headers())
        return DeliveryResult(
            notifier=self.name,
            receiver=message.notification.receiver,
            status_code=response.status_code,
            requests=1,
            truncated=int(body["truncatedAlerts"]),
        )
