"""The remediator consumes diagnoses.v1: a level-2 proposal waits for approval, a playbook outside the
registry never runs, a redelivered diagnosis is the same run, and garbage is dead-lettered."""

from __future__ import annotations

import time

import pytest

from services.core.bus import KafkaPublisher, ensure_topics, read_raw
from services.core.events import DeadLetter, Diagnosis, Hypothesis
from services.remediation.config import RemediationSettings
from services.remediation.runtime import build_executor
from services.remediation.service import run
from services.store.db import migrate
from tests.api_auth import auth_headers
from tests.integration.test_remediation_harness import RecordingDispatcher

pytestmark = pytest.mark.integration


def _diagnosis(incident: str, playbook: str) -> Diagnosis:
    return Diagnosis(
        incident_id=incident,
        diagnostician="ranker",
        hypotheses=(Hypothesis(cause="gpu_xid_79", confidence=0.9, playbook=playbook, level=2),),
        proposed_playbook=playbook,
        proposed_params={"node": "gpu-node-000"},
        level=2,
        ts=time.time(),
    )


def test_diagnoses_on_the_topic_become_runs_that_respect_levels_and_the_registry(kafka_ready, fresh_database, settings):
    settings = fresh_database.model_copy(update={"topic_prefix": settings.topic_prefix})
    migrate(settings)
    ensure_topics(settings)
    reboot = _diagnosis("inc-svc-1", "reboot_node")
    rogue = _diagnosis("inc-svc-2", "format_all_disks")
    with KafkaPublisher(settings) as publisher:
        publisher.publish(reboot)
        publisher.publish(reboot)  # redelivered
        publisher.publish(rogue)
        publisher.send_raw(Diagnosis.topic, b"inc-svc-3", b"{not json")
    dispatcher = RecordingDispatcher()
    executor = build_executor(settings, RemediationSettings(), dispatcher)

    handled = run(settings, executor, max_messages=4)

    assert handled == 4
    runs = {r.incident_id: r for r in executor.store.list_runs()}
    assert len(executor.store.list_runs()) == 2, "a redelivered diagnosis must be the same run"
    assert runs["inc-svc-1"].status == "awaiting_approval" and runs["inc-svc-1"].playbook == "reboot_node"
    assert runs["inc-svc-2"].status == "blocked"  # dropped: not in the playbook registry
    assert dispatcher.started == [], "nothing may start before approval, and an unknown playbook never"
    letters = [
        DeadLetter.from_bytes(v) for _, _, v in read_raw(settings, [DeadLetter.topic], max_messages=1, timeout_s=10)
    ]
    assert letters and letters[0].raw == b"{not json" and letters[0].consumer == "remediator"


def test_the_api_serves_remediation_runs_and_approvals(fresh_database):
    from fastapi.testclient import TestClient

    from services.api.app import create_app

    migrate(fresh_database)
    dispatcher = RecordingDispatcher()
    executor = build_executor(fresh_database, RemediationSettings(), dispatcher)
    run_id, decision = executor.submit(_diagnosis("inc-api-1", "reboot_node"))
    assert decision.outcome == "await_approval"
    api = TestClient(create_app(fresh_database, executor=lambda: executor), headers=auth_headers(fresh_database, "ana"))

    listed = api.get("/api/v1/remediation/runs").json()
    assert [r["run_id"] for r in listed] == [run_id]
    approved = api.post(f"/api/v1/remediation/runs/{run_id}/approve", json={"comment": "go"})
    assert approved.status_code == 200, approved.text
    assert approved.json()["approver"] == "ana"  # the token's name
    assert dispatcher.started == [run_id], "an approved run starts"
    assert api.post(f"/api/v1/remediation/runs/{run_id}/approve", json={"approver": "bo"}).status_code == 409


def test_a_re_diagnosed_incident_is_one_run_per_remedy_until_that_run_is_over(fresh_database):
    # correlate re-publishes an incident on every update and the diagnostician diagnoses each one:
    # the same remedy for the same target must not become an approval request (or a page) per update
    migrate(fresh_database)
    dispatcher = RecordingDispatcher()
    executor = build_executor(fresh_database, RemediationSettings(), dispatcher)
    first, decision = executor.submit(_diagnosis("inc-dup-1", "reboot_node"))
    assert decision.outcome == "await_approval"
    again, _ = executor.submit(_diagnosis("inc-dup-1", "reboot_node"))  # a later diagnosis: new ts
    assert again == first and len(executor.store.list_runs()) == 1
    other, _ = executor.submit(_diagnosis("inc-dup-2", "reboot_node"))  # another incident is its own run
    assert other != first
    executor.reject(first, approver="ana", channel="test")  # over: a later diagnosis may try again
    retry, decision = executor.submit(_diagnosis("inc-dup-1", "reboot_node"))
    assert retry not in (first, other) and decision.outcome == "await_approval"
    assert len(executor.store.list_runs()) == 3
