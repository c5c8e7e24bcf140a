"""The notifier registry (one line per notifier) and which notifier serves a routing.yaml config."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.core.registry import Registry
from services.notify.base import Notifier
from services.notify.errors import NotifierConfigError

NOTIFIERS: Registry[type[Notifier]] = Registry(
    "notifier",
    {
        "slack_webhook": "services.notify.slack_webhook:SlackWebhookNotifier",
        "slack_app": "services.notify.slack_app:SlackAppNotifier",
        "pagerduty": "services.notify.pagerduty:PagerDutyNotifier",
        "webhook": "services.notify.webhook:WebhookNotifier",
        "alertmanager": "services.notify.alertmanager:AlertmanagerNotifier",
    },
    base=Notifier,
)

CONFIG_KINDS = ("slack_configs", "pagerduty_configs", "webhook_configs", "alertmanager_configs")


def notifier_for(kind: str, config: Mapping[str, Any]) -> str:
    """The registry name of the notifier that serves one ``<kind>`` entry of a receiver.

    A ``slack_configs`` entry with ``app_token`` / ``app_token_file`` uses the Web API (threads);
    otherwise its incoming webhook.

    Raises:
        NotifierConfigError: an unknown kind.
    """
    if kind == "slack_configs":
        return "slack_app" if config.get("app_token") or config.get("app_token_file") else "slack_webhook"
    if kind == "pagerduty_configs":
        return "pagerduty"
    if kind == "webhook_configs":
        return "webhook"
    if kind == "alertmanager_configs":
        return "alertmanager"
    raise NotifierConfigError(f"no notifier serves {kind!r}; known: {', '.join(CONFIG_KINDS)}")
