"""From a notification decision to deliveries: one per notifier config of the receiver.

The correlation engine decides per receiver; here each integration of that receiver applies its own
``send_resolved`` (docs/correlation.md): without it, resolved alerts are left out, and a notification
with nothing firing left is not sent at all.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from services.alerting.config import NOTIFIER_SEND_RESOLVED_DEFAULT, RoutingConfig
from services.alerting.notification import Notification
from services.notify.ledger import idempotency_key
from services.notify.registry import notifier_for


class Delivery(BaseModel):
    """One notification to one integration: what a ``clustermedic.notify.deliver`` task carries.

    Attributes:
        notifier: registry name of the notifier.
        integration: where the config is in routing.yaml, e.g. ``pagerduty-gpu/webhook_configs[0]``.
        config: the notifier config as written (secrets stay ``*_file`` references, read by the worker).
        global_config: routing.yaml's ``global`` block.
        notification: the notification, its alerts filtered by ``send_resolved``.
        key: the idempotency key.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    notifier: str
    integration: str
    config: dict[str, Any]
    global_config: dict[str, Any] = {}
    notification: Notification
    key: str


def plan(notification: Notification, routing: RoutingConfig, *, event: str = "") -> list[Delivery]:
    """The deliveries a notification makes, in routing.yaml order.

    Args:
        notification: the decision.
        routing: the loaded routing.yaml.
        event: what caused a notifier decision (see :func:`~services.notify.ledger.idempotency_key`).

    Raises:
        KeyError: the notification names a receiver routing.yaml does not define.
    """
    receiver = routing.receiver(notification.receiver)
    glob = routing.global_.model_dump(exclude_none=True, exclude={"resolve_timeout"})
    out: list[Delivery] = []
    for kind in NOTIFIER_SEND_RESOLVED_DEFAULT:  # the receiver keys routing.yaml holds, in schema order
        for i, config in enumerate(getattr(receiver, kind)):
            sent = notification
            if not config.get("send_resolved", NOTIFIER_SEND_RESOLVED_DEFAULT[kind]):
                firing = tuple(a for a in notification.alerts if a.status == "firing")
                if not firing:
                    continue
                sent = notification.model_copy(update={"alerts": firing, "status": "firing"})
            integration = f"{receiver.name}/{kind}[{i}]"
            out.append(
                Delivery(
                    notifier=notifier_for(kind, config),
                    integration=integration,
                    config=dict(config),
                    global_config=glob,
                    notification=sent,
                    key=idempotency_key(notification, integration, event),
                )
            )
    return out
