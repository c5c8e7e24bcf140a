"""Approvals through the API, the CLI and signed Slack buttons, against the real Postgres."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any
from urllib.parse import urlencode

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from services.core.events import Diagnosis, Hypothesis
from services.remediation import cli
from services.remediation.api import create_router
from services.remediation.config import RemediationSettings
from services.remediation.executor import Executor
from services.remediation.model import Step
from services.remediation.runtime import MemoryEventSink, build_executor
from services.remediation.slack import APPROVE_ACTION, REJECT_ACTION, sign
from services.store.db import migrate

pytestmark = pytest.mark.integration
SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


class RecordingDispatcher:
    def __init__(self) -> None:
        self.started: list[str] = []

    def execute(self, run_id: str) -> None:
        self.started.append(run_id)

    def chain(self, run_id: str, token: str, position: int, phase: str, plan: list[Step], time_scale: float) -> None:
        raise AssertionError("not expected")

    def rollback(self, run_id: str, token: str) -> None:
        raise AssertionError("not expected")


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def setup(fresh_database):
    migrate(fresh_database)
    dispatcher = RecordingDispatcher()
    ex = build_executor(fresh_database, RemediationSettings(), dispatcher, events=MemoryEventSink())
    clock = Clock()
    ex.clock = clock
    api = FastAPI()
    api.include_router(create_router(lambda: ex, slack_signing_secret=SECRET, clock=clock))
    yield ex, dispatcher, clock, TestClient(api)
    ex.store.close()


def level2(ex: Executor, node: str = "gpu-node-000") -> str:
    diag = Diagnosis(
        incident_id=f"inc-{uuid.uuid4().hex[:6]}",
        diagnostician="llm",
        hypotheses=(Hypothesis(cause="gpu_xid_79", confidence=0.8),),
        proposed_playbook="reboot_node",
        proposed_params={"node": node},
        ts=time.time(),
    )
    run_id, decision = ex.submit(diag)
    assert decision.outcome == "await_approval"
    return run_id


def slack_request(client: TestClient, action: str, run_id: str, ts: float, secret: str = SECRET) -> Any:
    payload = {
        "type": "block_actions",
        "user": {"id": "U1", "username": "carol"},
        "actions": [{"action_id": action, "value": run_id}],
    }
    body = urlencode({"payload": json.dumps(payload)}).encode()
    stamp = str(int(ts))
    return client.post(
        "/remediation/slack/interactions",
        content=body,
        headers={
            "content-type": "application/x-www-form-urlencoded",
            "x-slack-request-timestamp": stamp,
            "x-slack-signature": sign(secret, stamp, body),
        },
    )


def test_api_approval_starts_the_run_once_and_records_the_approver(setup):
    ex, dispatcher, _, client = setup
    run_id = level2(ex)
    assert dispatcher.started == []
    resp = client.post(f"/remediation/runs/{run_id}/approve", json={"approver": "alice", "comment": "ok"})
    assert resp.status_code == 200 and resp.json()["status"] == "approved"
    assert dispatcher.started == [run_id]
    assert client.post(f"/remediation/runs/{run_id}/approve", json={"approver": "mallory"}).status_code == 409
    assert dispatcher.started == [run_id]
    detail = client.get(f"/remediation/runs/{run_id}").json()
    assert detail["approval"]["approver"] == "alice" and detail["approval"]["channel"] == "api"
    assert [a["action"] for a in detail["audit"]] == ["decided:await_approval", "approved"]


def test_rejected_and_expired_runs_never_start(setup):
    ex, dispatcher, clock, client = setup
    rejected = level2(ex, "gpu-node-001")
    assert client.post(f"/remediation/runs/{rejected}/reject", json={"approver": "bob"}).json()["status"] == "rejected"
    expired = level2(ex, "gpu-node-002")
    clock.now += ex.config.approvals.ttl_s + 1
    resp = client.post(f"/remediation/runs/{expired}/approve", json={"approver": "alice"})
    assert resp.status_code == 409 and "expired" in resp.json()["detail"]
    assert ex.store.get_run(expired).status == "expired"
    assert dispatcher.started == []


def test_slack_button_needs_a_valid_fresh_signature(setup):
    ex, dispatcher, clock, client = setup
    run_id = level2(ex)
    assert slack_request(client, APPROVE_ACTION, run_id, clock.now, secret="wrong").status_code == 401
    assert slack_request(client, APPROVE_ACTION, run_id, clock.now - 301).status_code == 401
    assert dispatcher.started == []
    resp = slack_request(client, APPROVE_ACTION, run_id, clock.now - 200)
    assert resp.status_code == 200 and "slack:carol" in resp.json()["text"]
    assert ex.store.get_approval(run_id).approver == "slack:carol"
    assert dispatcher.started == [run_id]
    other = level2(ex, "gpu-node-001")
    assert slack_request(client, REJECT_ACTION, other, clock.now).status_code == 200
    assert ex.store.get_run(other).status == "rejected"


def test_medic_approve_cli(setup, monkeypatch):
    ex, dispatcher, _, _ = setup
    run_id = level2(ex)
    monkeypatch.setattr(cli, "_executor", lambda: ex)
    result = CliRunner().invoke(cli.app, ["approve", run_id, "--approver", "dave"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["status"] == "approved"
    assert ex.store.get_approval(run_id).channel == "cli" and dispatcher.started == [run_id]
    again = CliRunner().invoke(cli.app, ["approve", run_id, "--approver", "dave"])
    assert again.exit_code == 1


def test_a_request_the_incident_no_longer_needs_is_withdrawn_and_cannot_be_approved(setup):
    # the first diagnosis of an incident asks to reboot the node; with more alerts it proposes a cordon
    ex, dispatcher, clock, client = setup
    first = level2(ex)
    incident = ex.store.get_run(first).incident_id
    same = Diagnosis(
        incident_id=incident,
        diagnostician="llm",
        hypotheses=(Hypothesis(cause="gpu_xid_79", confidence=0.8),),
        proposed_playbook="reboot_node",
        proposed_params={"node": "gpu-node-000"},
        ts=clock.now,
    )
    assert ex.submit(same)[0] == first and ex.store.get_run(first).status == "awaiting_approval"
    clock.now += 5
    changed = same.model_copy(update={"proposed_playbook": "cordon_node", "ts": clock.now})
    cordon, decision = ex.submit(changed)
    assert decision.outcome == "execute" and dispatcher.started == [cordon]
    withdrawn = ex.store.get_run(first)
    assert (
        withdrawn.status == "expired"
        and withdrawn.detail == f"superseded: the diagnosis of {incident} now proposes cordon_node"
    )
    assert ex.store.get_approval(first).status == "expired"
    resp = client.post(f"/remediation/runs/{first}/approve", json={"approver": "alice"})
    assert resp.status_code == 409 and dispatcher.started == [cordon]
    assert [a["action"] for a in client.get(f"/remediation/runs/{first}").json()["audit"]][-1] == "superseded"


def test_a_near_tie_of_two_causes_leaves_the_request_to_the_engineer(setup):
    # re-diagnosed with more alerts, the rollout's cause and another sit within noise of each other:
    # the request stays; once the other is rated more than twice as likely, it is withdrawn
    ex, _, clock, _ = setup
    first = level2(ex)
    incident = ex.store.get_run(first).incident_id

    def diagnosis(other: float, mine: float) -> Diagnosis:
        clock.now += 5
        return Diagnosis(
            incident_id=incident,
            diagnostician="ranker",
            hypotheses=(
                Hypothesis(cause="gpu_xid_79", confidence=other, playbook="cordon_node", level=1),
                Hypothesis(cause="gpu_xid_79_reboot", confidence=mine, playbook="reboot_node", level=2),
            ),
            proposed_playbook="cordon_node",
            proposed_params={"node": "gpu-node-000"},
            ts=clock.now,
        )

    ex.submit(diagnosis(0.30, 0.25))
    assert ex.store.get_run(first).status == "awaiting_approval"
    ex.submit(diagnosis(0.40, 0.15))
    withdrawn = ex.store.get_run(first)
    assert withdrawn.status == "expired" and withdrawn.detail.startswith("superseded:")


def test_a_re_diagnosis_proposing_the_remedy_in_hand_returns_that_run_even_within_its_cooldown(setup):
    # the cordon the first diagnosis started puts its node in cooldown; the incident's next
    # announcements propose the same cordon: they are that run, not one blocked run each
    ex, dispatcher, clock, _ = setup

    def cordon() -> Diagnosis:
        clock.now += 30
        return Diagnosis(
            incident_id="inc-gpu-lost",
            diagnostician="ranker",
            hypotheses=(Hypothesis(cause="gpu_xid_79", confidence=0.7, playbook="cordon_node", level=1),),
            proposed_playbook="cordon_node",
            proposed_params={"node": "gpu-node-000"},
            level=1,
            ts=clock.now,
        )

    first, decision = ex.submit(cordon())
    assert decision.outcome == "execute" and dispatcher.started == [first]
    assert ex.store.transition(first, ["proposed"], "running", now=clock.now, started=True)
    again, decision = ex.submit(cordon())
    assert decision.outcome == "blocked" and any("cooldown" in r for r in decision.reasons)
    assert any("in flight" in r for r in decision.reasons)  # one remedy at a time per incident
    assert again == first and [r.run_id for r in ex.store.list_runs()] == [first]
