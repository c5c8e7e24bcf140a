"""The notifier registry (one line per notifier) and which notifier serves a routing.yaml config.

Which receiver key a notifier serves is declared on the notifier class (``config_kind``, and ``serves``
where two share a kind); :func:`notifier_for` and :func:`notifier_kinds` are derived from those
declarations. Which keys a receiver in routing.yaml may hold is the routing schema's
(:data:`services.alerting.config.NOTIFIER_SEND_RESOLVED_DEFAULT`, with each one's Alertmanager
``send_resolved`` default); a unit test checks that every key of it has a notifier.
"""

from __future__ import annotations

import functools
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


@functools.cache
def notifier_kinds() -> dict[str, tuple[str, ...]]:
    """Each receiver key the registered notifiers serve, with their registry names (in registry order).

    Raises:
        PluginError: a registered notifier does not load.
    """
    out: dict[str, list[str]] = {}
    for name in NOTIFIERS.names():
        out.setdefault(NOTIFIERS.load(name).config_kind, []).append(name)
    return {kind: tuple(names) for kind, names in out.items()}


def notifier_for(kind: str, config: Mapping[str, Any]) -> str:
    """The registry name of the notifier that serves one ``<kind>`` entry of a receiver.

    Of the notifiers whose ``config_kind`` is ``kind``, the one whose ``serves(config)`` is true
    (``slack_configs``: ``slack_app`` with ``app_token`` / ``app_token_file``, else ``slack_webhook``).

    Raises:
        NotifierConfigError: no notifier serves the kind, or not exactly one serves this entry.
    """
    candidates = notifier_kinds().get(kind)
    if not candidates:
        raise NotifierConfigError(f"no notifier serves {kind!r}; known: {', '.join(sorted(notifier_kinds()))}")
    serving = [name for name in candidates if NOTIFIERS.load(name).serves(config)]
    if len(serving) != 1:
        raise NotifierConfigError(
            f"{kind} entry: {len(serving)} of the notifiers {', '.join(candidates)} serve it (want exactly one)"
        )
    return serving[0]
