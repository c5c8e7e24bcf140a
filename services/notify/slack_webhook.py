"""Slack incoming webhook: ``POST <api_url>`` with ``{text, blocks}``.

Config (a ``slack_configs`` entry): ``api_url`` or ``api_url_file`` (else ``global.slack_api_url`` /
``slack_api_url_file``), ``send_resolved``. Incoming webhooks post to the channel chosen when the
webhook was created and cannot thread or edit; use ``app_token`` (the Slack app notifier) for
one thread per incident. Slack answers ``200 ok``, or 4xx with a plain-text error
(``invalid_payload``, ``channel_not_found``...), 429 with ``Retry-After``, 5xx.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.notify.base import DeliveryResult, Message, Notifier, read_secret
from services.notify.errors import NotifierConfigError
from services.notify.render import slack


def has_app_token(config: Mapping[str, Any]) -> bool:
    """Whether a ``slack_configs`` entry names a bot token (the Web API), not an incoming webhook."""
    return bool(config.get("app_token") or config.get("app_token_file"))


class SlackWebhookNotifier(Notifier):
    """Posts Block Kit messages to a Slack incoming webhook."""

    name = "slack_webhook"
    config_kind = "slack_configs"

    @classmethod
    def serves(cls, config: Mapping[str, Any]) -> bool:
        """A ``slack_configs`` entry without an app token posts to its incoming webhook."""
        return not has_app_token(config)

    def url(self) -> str:
        """The webhook URL: the config's, else routing.yaml's global one.

        Raises:
            NotifierConfigError: none is configured.
        """
        if self.config.get("api_url") or self.config.get("api_url_file"):
            return self.secret("api_url")
        glob = self.context.global_config
        if glob.get("slack_api_url") or glob.get("slack_api_url_file"):
            return read_secret(glob, "slack_api_url", who=self.name)
        raise NotifierConfigError("slack_webhook: no api_url, api_url_file or global slack_api_url")

    def send(self, message: Message) -> DeliveryResult:
        """Post the rendered message (see :class:`~services.notify.base.Notifier` for the contract)."""
        rendered = slack.render(
            message.notification,
            diagnosis=message.diagnosis,
            remediation=message.remediation,
            external_url=self.settings.external_url,
        )
        response = self.post_json(self.url(), rendered.webhook_body())
        return DeliveryResult(
            notifier=self.name,
            receiver=message.notification.receiver,
            status_code=response.status_code,
            requests=1,
            truncated=rendered.truncated,
        )
