"""Incidents and silences in the real PostgreSQL, through the store, the HTTP API and `medic`."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from services.api.app import create_app
from services.cli import app as cli
from services.core.events import AlertRef, IncidentEvent
from services.store.db import connect, migrate
from services.store.incidents import get_incident, list_incidents, upsert_incident_events
from services.store.silences import create_silence, engine_silences, expire_silence
from tests.api_auth import auth_headers

pytestmark = pytest.mark.integration


def _event(kind: str, ts: float, *, state: str = "open", alerts: int = 1) -> IncidentEvent:
    refs = tuple(
        AlertRef(
            fingerprint=f"fp{i}",
            entity=f"GPU-{i}",
            signal="gpu_xid",
            detector="xid_rules",
            severity="critical",
            starts_at=1000.0 + i,
            labels={"node": "n1"},
            evidence={"xid": 79},
        )
        for i in range(alerts)
    )
    return IncidentEvent(
        incident_id="inc-1",
        kind=kind,
        severity="critical",
        title="gpu_xid on GPU-0",  # type: ignore[arg-type]
        group_key="g",
        labels={"node": "n1", "state": state},
        alerts=refs,
        opened_at=1000.0,
        ts=ts,
    )


def test_incident_upserts_are_idempotent_and_never_go_back_in_time(fresh_database):
    migrate(fresh_database)
    opened, updated = _event("opened", 1000.0), _event("updated", 1010.0, alerts=2)
    resolved = _event("resolved", 1400.0, state="resolved", alerts=2)
    with connect(fresh_database) as conn:
        upsert_incident_events(conn, [opened, updated, resolved])
        upsert_incident_events(conn, [opened, updated])  # a replay after a restart re-sends older versions
        upsert_incident_events(conn, [resolved])
        rows = list_incidents(conn)
        incident = get_incident(conn, "inc-1")
    assert len(rows) == 1 and rows[0].status == "resolved"
    assert incident is not None and incident.resolved_at is not None and incident.resolved_at.timestamp() == 1400.0
    assert [a.entity for a in incident.alerts] == ["GPU-0", "GPU-1"]
    assert all(a.evidence == {"xid": 79} for a in incident.alerts)


def test_silences_through_the_api(fresh_database):
    migrate(fresh_database)
    now = time.time()
    api = TestClient(create_app(fresh_database, clock=lambda: now), headers=auth_headers(fresh_database, "ana"))
    assert api.get("/healthz").json() == {"status": "ok"}

    created = api.post(
        "/api/v1/silences",
        json={"matchers": ['alertname="gpu_xid"'], "duration": "2h", "createdBy": "ana", "comment": "reseat"},
    )
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["state"] == "active" and body["created_by"] == "ana"  # the token's name
    assert api.get("/api/v1/silences", params={"state": "active"}).json()[0]["silence_id"] == body["silence_id"]

    everything = api.post("/api/v1/silences", json={"matchers": ['node=~".*"'], "duration": "1h", "created_by": "x"})
    assert everything.status_code == 400 and "would mute every alert" in everything.json()["detail"]
    bad = api.post("/api/v1/silences", json={"matchers": ['node=~"("'], "duration": "1h", "created_by": "x"})
    assert bad.status_code == 400 and "invalid regex" in bad.json()["detail"]
    no_end = api.post("/api/v1/silences", json={"matchers": ['node="n1"'], "created_by": "x"})
    assert no_end.status_code == 422 and "ends_at" in no_end.text

    expired = api.delete(f"/api/v1/silences/{body['silence_id']}")
    assert expired.status_code == 200 and expired.json()["state"] == "expired"
    assert api.delete("/api/v1/silences/sil-nope").status_code == 404
    assert api.get("/api/v1/incidents/inc-nope").status_code == 404


def test_a_pending_silence_expired_ends_before_it_starts_and_the_engine_sees_it(fresh_database):
    migrate(fresh_database)
    now = time.time()
    with connect(fresh_database) as conn:
        stored = create_silence(conn, matchers=['node="n1"'], starts_at=now + 600, ends_at=now + 3600, created_by="a")
        assert stored.state(now) == "pending"
        gone = expire_silence(conn, stored.silence_id, now=now)
        assert gone.starts_at == gone.ends_at
        # the agent still reads it for a while, so an engine that knew it as pending expires it too
        (seen,) = engine_silences(conn, now=now)
        assert seen.id == stored.silence_id and seen.ends_at == seen.starts_at


def test_medic_silences_and_incidents_commands(fresh_database, monkeypatch):
    migrate(fresh_database)
    monkeypatch.setenv("CLUSTERMEDIC_DATABASE_URL", fresh_database.database_url or "")
    monkeypatch.setenv("COLUMNS", "250")  # rich tables: room for whole ids
    with connect(fresh_database) as conn:
        upsert_incident_events(conn, [_event("opened", 1000.0)])
    runner = CliRunner()

    added = runner.invoke(
        cli,
        [
            "silences",
            "add",
            "--matcher",
            'alertname="gpu_xid"',
            "--duration",
            "2h",
            "--author",
            "ana",
            "--comment",
            "reseating",
        ],
    )
    assert added.exit_code == 0, added.output
    silence_id = added.stdout.strip().splitlines()[0]
    listed = runner.invoke(cli, ["silences", "list", "--state", "active"])
    assert listed.exit_code == 0 and silence_id[:12] in listed.stdout
    expired = runner.invoke(cli, ["silences", "expire", silence_id])
    assert expired.exit_code == 0, expired.output

    incidents = runner.invoke(cli, ["incidents", "list", "--status", "opened"])
    assert incidents.exit_code == 0 and "inc-1" in incidents.stdout
    shown = runner.invoke(cli, ["incidents", "show", "inc-1"])
    assert shown.exit_code == 0 and "GPU-0" in shown.stdout and "xid_rules" in shown.stdout
    assert runner.invoke(cli, ["incidents", "show", "inc-nope"]).exit_code == 1
