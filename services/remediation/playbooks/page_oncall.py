"""Page a human; never act."""

from __future__ import annotations

from pydantic import Field

from services.remediation.playbook import Playbook, PlaybookParams


class PageOncallParams(PlaybookParams):
    """Parameters of :class:`PageOncallPlaybook`."""

    summary: str = ""
    severity: str = Field(default="critical", pattern="^(info|warning|critical)$")


class PageOncallPlaybook(Playbook):
    """Page the on-call engineer with the diagnosis; change nothing.

    Use when the required action is "contact support" (hardware RMA), when no playbook fits, or when
    the circuit breaker has stopped automatic remediation. The page goes out through the notify service
    from the ``paged`` remediation event.
    """

    name = "page_oncall"
    level = 3
    Params = PageOncallParams
