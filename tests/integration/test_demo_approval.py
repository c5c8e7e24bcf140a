"""`medic demo`'s on-call engineer approves a level-2 run through the real API, with a token of its own.

The demo's own code path (services/demo/loop.py: ``oncall_token``, then ``_answer_runs`` posting to
the approve route) against the API app on the real PostgreSQL, without the rest of the closed loop
(tests/integration/test_closed_loop.py runs that).
"""

from __future__ import annotations

import threading
from collections import deque

import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.core.settings import Settings
from services.demo.loop import ONCALL, DemoConfig, _answer_runs, oncall_token
from services.demo.view import RunView
from services.remediation.config import RemediationSettings
from services.remediation.runtime import MemoryEventSink, build_executor
from services.store.db import migrate
from tests.api_auth import bearer
from tests.integration.test_remediation_approvals import RecordingDispatcher, level2

pytestmark = pytest.mark.integration


class View:
    """What _answer_runs reads of the live view: its runs, its lock, its narration."""

    def __init__(self, runs: dict[str, RunView]) -> None:
        self.lock = threading.Lock()
        self.runs = runs
        self.notes: deque[str] = deque()

    def say(self, line: str) -> None:
        self.notes.append(line)


def test_the_demo_approves_through_the_api_as_its_operator_token(fresh_database: Settings) -> None:
    migrate(fresh_database)
    dispatcher = RecordingDispatcher()
    ex = build_executor(fresh_database, RemediationSettings(), dispatcher, events=MemoryEventSink())
    run_id = level2(ex)
    run = ex.store.get_run(run_id)
    assert run is not None
    view = View({run_id: RunView(run_id, run.incident_id, run.playbook, run.level, status="awaiting_approval")})
    token = oncall_token(fresh_database)
    approvals: dict[str, float] = {}
    with TestClient(create_app(fresh_database, executor=lambda: ex), headers=bearer(token)) as api:
        assert api.get("/api/v1/whoami").json() == {"name": ONCALL, "role": "operator", "via": "token"}
        _answer_runs(view, api, approvals, set(), None, DemoConfig())  # type: ignore[arg-type]
        assert run_id in approvals and dispatcher.started == [], "it waits before it approves"
        approvals[run_id] = 1e-9  # the pause is over
        _answer_runs(view, api, approvals, set(), None, DemoConfig())  # type: ignore[arg-type]
    assert f"approved {run_id} through the API: HTTP 200" in view.notes
    approval = ex.store.get_approval(run_id)
    assert approval is not None and (approval.status, approval.approver, approval.channel) == (
        "approved",
        ONCALL,
        "api",
    )
    assert dispatcher.started == [run_id]
    ex.store.close()
