"""Which incident events the diagnostician diagnoses (services/diagnostician/service.py: diagnosable)."""

from __future__ import annotations

from typing import Any

from services.core.events import IncidentEvent
from services.diagnostician.service import diagnosable


def event(kind: str, state: str | None) -> IncidentEvent:
    labels = {} if state is None else {"state": state}
    fields: dict[str, Any] = {"kind": kind, "severity": "critical", "title": "t", "labels": labels}
    return IncidentEvent.model_validate({"incident_id": "inc-1", "opened_at": 0.0, "ts": 1.0, **fields})


def test_an_open_incident_is_diagnosed_when_it_opens_and_when_it_changes() -> None:
    assert diagnosable(event("opened", "open")) and diagnosable(event("updated", "open"))
    assert diagnosable(event("updated", None))  # an event from before incidents carried their state


def test_a_mitigated_or_resolved_incident_is_not_diagnosed_again_until_a_member_fires_again() -> None:
    # its remedy was verified: the recovery's own alerts (a replacement's startup probe) must not make
    # the ranker propose a second remedy
    assert not diagnosable(event("updated", "mitigated"))
    assert not diagnosable(event("mitigated", "mitigated")) and not diagnosable(event("resolved", "resolved"))
    assert diagnosable(event("updated", "open"))  # a member fired again: the engine reopened it
