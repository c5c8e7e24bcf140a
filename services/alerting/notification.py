"""The notify stage's decision, :class:`Notification`: what the correlation engine (and the notifier)
hand to the notify stage, and what every notifier renders."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from services.core.events import AlertRef

Status = Literal["firing", "resolved"]
NotifyReason = Literal["first", "update", "repeat", "resolved"]


class Notification(BaseModel):
    """The notify stage's decision: send this group's alerts to this receiver, and why.

    Attributes:
        receiver: receiver name from routing.yaml.
        group_key: the aggregation group (route id and group labels).
        group_labels: the ``group_by`` labels of the group.
        incident_id: the incident of the group's alerts (the earliest opened, when they are several).
        incident_ids: every incident the alerts belong to.
        status: ``firing`` when any alert fires, else ``resolved``.
        reason: ``first`` (nothing firing was notified before), ``update`` (alerts added or resolved),
            ``repeat`` (unchanged, repeat_interval passed) or ``resolved`` (everything resolved).
        alerts: the alerts to send (muted ones left out; resolved ones only if the receiver wants them).
        ts: engine time of the decision.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    receiver: str
    group_key: str
    group_labels: dict[str, str]
    incident_id: str
    incident_ids: tuple[str, ...] = ()
    status: Status
    reason: NotifyReason
    alerts: tuple[AlertRef, ...]
    ts: float
