"""Approvals through the API (an operator's token), the CLI and signed Slack buttons (mapped users),
against the real Postgres."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from services.api.app import SLACK_INTERACTIONS_PATH, create_app
from services.auth.tokens import Role
from services.core.events import Diagnosis, Hypothesis
from services.remediation import cli
from services.remediation.config import RemediationSettings
from services.remediation.executor import Executor
from services.remediation.model import Step
from services.remediation.runtime import MemoryEventSink, build_executor
from services.remediation.slack import APPROVE_ACTION, REJECT_ACTION, sign
from services.store.db import migrate
from tests.api_auth import auth_headers, token_for

pytestmark = pytest.mark.integration
SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
# Slack user ids -> token names: U1 is the operator carol, U2 the viewer vic, U3 a name without a token
SLACK_USERS = {"U1": "carol", "U2": "vic", "U3": "nobody"}


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
    token_for(fresh_database, "carol", Role.OPERATOR)
    token_for(fresh_database, "vic", Role.VIEWER)
    remediation = RemediationSettings(slack_signing_secret=SECRET, slack_users=SLACK_USERS)
    api = create_app(fresh_database, clock=clock, executor=lambda: ex, remediation=remediation)
    with TestClient(api, headers=auth_headers(fresh_database, "alice")) as client:
        yield ex, dispatcher, clock, client
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


def slack_body(action: str, run_id: str, user_id: str = "U1") -> bytes:
    payload = {
        "type": "block_actions",
        "user": {"id": user_id, "username": "carol-on-slack"},
        "actions": [{"action_id": action, "value": run_id}],
    }
    return urlencode({"payload": json.dumps(payload)}).encode()


def slack_request(
    client: TestClient, action: str, run_id: str, ts: float, secret: str = SECRET, user_id: str = "U1"
) -> Any:
    body = slack_body(action, run_id, user_id)
    stamp = str(int(ts))
    return client.post(
        SLACK_INTERACTIONS_PATH,
        content=body,
        headers={
            "content-type": "application/x-www-form-urlencoded",
            "x-slack-request-timestamp": stamp,
            "x-slack-signature": sign(secret, stamp, body),
            "authorization": "",  # Slack sends no token of ours
        },
    )


def test_api_approval_starts_the_run_once_and_records_the_approver(setup):
    ex, dispatcher, _, client = setup
    run_id = level2(ex)
    assert dispatcher.started == []
    resp = client.post(f"/api/v1/remediation/runs/{run_id}/approve", json={"approver": "alice", "comment": "ok"})
    assert resp.status_code == 200 and resp.json()["status"] == "approved"
    assert dispatcher.started == [run_id]
    assert client.post(f"/api/v1/remediation/runs/{run_id}/approve", json={"approver": "mallory"}).status_code == 409
    assert dispatcher.started == [run_id]
    detail = client.get(f"/api/v1/remediation/runs/{run_id}").json()
    assert detail["approval"]["approver"] == "alice" and detail["approval"]["channel"] == "api"
    assert [a["action"] for a in detail["audit"]] == ["decided:await_approval", "approved"]


def test_rejected_and_expired_runs_never_start(setup):
    ex, dispatcher, clock, client = setup
    rejected = level2(ex, "gpu-node-001")
    assert (
        client.post(f"/api/v1/remediation/runs/{rejected}/reject", json={"approver": "bob"}).json()["status"]
        == "rejected"
    )
    expired = level2(ex, "gpu-node-002")
    clock.now += ex.config.approvals.ttl_s + 1
    resp = client.post(f"/api/v1/remediation/runs/{expired}/approve", json={"approver": "alice"})
    assert resp.status_code == 409 and "expired" in resp.json()["detail"]
    assert ex.store.get_run(expired).status == "expired"
    assert dispatcher.started == []


def test_slack_button_needs_a_valid_fresh_signature_and_counts_as_the_mapped_operator(setup):
    ex, dispatcher, clock, client = setup
    run_id = level2(ex)
    assert slack_request(client, APPROVE_ACTION, run_id, clock.now, secret="wrong").status_code == 401
    assert slack_request(client, APPROVE_ACTION, run_id, clock.now - 301).status_code == 401
    assert dispatcher.started == []
    resp = slack_request(client, APPROVE_ACTION, run_id, clock.now - 200)
    assert resp.status_code == 200 and "by carol (<@U1>)" in resp.json()["text"]
    approval = ex.store.get_approval(run_id)
    assert (approval.approver, approval.channel) == ("carol", "slack")
    assert dispatcher.started == [run_id]
    other = level2(ex, "gpu-node-001")
    assert slack_request(client, REJECT_ACTION, other, clock.now).status_code == 200
    assert ex.store.get_run(other).status == "rejected"
    audit = client.get("/api/v1/audit", params={"target": run_id}).json()["entries"]
    assert [(e["actor"], e["via"], e["action"], e["outcome"]) for e in audit] == [
        ("carol", "slack", "run.approve", "ok")
    ]


@pytest.mark.parametrize(
    ("user_id", "why"),
    [("U9", "is not a ClusterMedic operator"), ("U2", "a viewer"), ("U3", "has no active ClusterMedic token")],
)
def test_a_slack_user_who_is_not_a_mapped_operator_is_refused_with_a_message(setup, user_id, why):
    ex, dispatcher, clock, client = setup
    run_id = level2(ex)
    resp = slack_request(client, APPROVE_ACTION, run_id, clock.now, user_id=user_id)
    # 200, so that Slack shows the text to the user who clicked (and only to them)
    assert resp.status_code == 200 and resp.json()["response_type"] == "ephemeral"
    assert why in resp.json()["text"] and "nothing was decided" in resp.json()["text"].lower()
    assert ex.store.get_run(run_id).status == "awaiting_approval" and dispatcher.started == []
    (entry,) = client.get("/api/v1/audit", params={"target": run_id}).json()["entries"]
    assert (entry["actor"], entry["outcome"], entry["detail"]["slack_user"]) == (f"slack:{user_id}", "denied", user_id)


def test_a_replayed_slack_click_is_refused_and_a_revoked_operator_can_no_longer_click(setup, fresh_database):
    ex, dispatcher, clock, client = setup
    run_id = level2(ex)
    stamp = str(int(clock.now))
    body = slack_body(REJECT_ACTION, run_id)
    headers = {
        "content-type": "application/x-www-form-urlencoded",
        "x-slack-request-timestamp": stamp,
        "x-slack-signature": sign(SECRET, stamp, body),
    }
    first = client.post(SLACK_INTERACTIONS_PATH, content=body, headers=headers)
    assert first.status_code == 200 and ex.store.get_run(run_id).status == "rejected"
    replayed = client.post(SLACK_INTERACTIONS_PATH, content=body, headers=headers)
    assert replayed.status_code == 401 and "replayed" in replayed.json()["detail"]

    other = level2(ex, "gpu-node-001")
    admin = auth_headers(fresh_database, "root", Role.ADMIN)
    assert client.delete("/api/v1/tokens/carol", headers=admin).status_code == 200
    refused = slack_request(client, APPROVE_ACTION, other, clock.now)
    assert "has no active ClusterMedic token" in refused.json()["text"]
    assert ex.store.get_run(other).status == "awaiting_approval" and dispatcher.started == []


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
    resp = client.post(f"/api/v1/remediation/runs/{first}/approve", json={"approver": "alice"})
    assert resp.status_code == 409 and dispatcher.started == [cordon]
    assert [a["action"] for a in client.get(f"/api/v1/remediation/runs/{first}").json()["audit"]][-1] == "superseded"


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
