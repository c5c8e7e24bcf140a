"""Alertmanager API v2 through the real PostgreSQL, for what amtool does not exercise (issue 18, item 2):
alert groups, replacing a silence by id, the audit row of a silence whose body names another author,
and the refusals a Grafana or hand-written client gets (unknown silence, bad matcher, past end)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.auth.tokens import Role
from services.core.events import IncidentEvent
from services.core.settings import Settings
from services.store.db import connect, migrate
from services.store.incidents import upsert_incident_events
from tests.api_auth import auth_headers
from tests.integration.test_amtool import alert, seed_alerts

pytestmark = pytest.mark.integration


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


def postable(*matchers: tuple[str, str], hours: float = 1.0, **extra: Any) -> dict[str, Any]:
    """A ``postableSilence`` of equality matchers, starting now."""
    now = time.time()
    return {
        "matchers": [{"name": n, "value": v, "isRegex": False, "isEqual": True} for n, v in matchers],
        "startsAt": iso(now),
        "endsAt": iso(now + hours * 3600),
        "createdBy": "someone-else",
        "comment": "test",
        **extra,
    }


@pytest.fixture
def api(fresh_database: Settings) -> Iterator[tuple[TestClient, dict[str, dict[str, str]]]]:
    migrate(fresh_database)
    seed_alerts(fresh_database)
    heads = {
        "viewer": auth_headers(fresh_database, "vic", Role.VIEWER),
        "operator": auth_headers(fresh_database, "olga", Role.OPERATOR),
        "admin": auth_headers(fresh_database, "ada", Role.ADMIN),
    }
    with TestClient(create_app(fresh_database)) as client:
        yield client, heads


def test_alert_groups_follow_the_routing_tree(api: tuple[TestClient, dict[str, dict[str, str]]]) -> None:
    client, heads = api
    groups = client.get("/api/v2/alerts/groups", headers=heads["viewer"]).json()
    by = {(g["receiver"]["name"], tuple(sorted(g["labels"].items()))): g for g in groups}
    # the critical route (continue: true) pages, then the catch-all slack route groups by alertname and node
    page = by[("pagerduty-gpu", (("alertname", "gpu_xid"), ("node", "node-1")))]
    assert [a["fingerprint"] for a in page["alerts"]] == ["fp-xid"]
    assert ("slack-sre", (("alertname", "gpu_xid"), ("node", "node-1"))) in by
    thermal = by[("slack-sre", (("alertname", "gpu_thermal"), ("node", "node-3")))]
    assert thermal["alerts"][0]["status"]["inhibitedBy"] == ["fp-down3"]
    only_pages = client.get("/api/v2/alerts/groups", params={"receiver": "pagerduty.*"}, headers=heads["viewer"])
    assert {g["receiver"]["name"] for g in only_pages.json()} == {"pagerduty-gpu"}
    unmuted = client.get("/api/v2/alerts/groups", params={"inhibited": "false"}, headers=heads["viewer"]).json()
    assert "fp-hot3" not in {a["fingerprint"] for g in unmuted for a in g["alerts"]}


def test_a_resolved_alert_leaves_the_list(
    fresh_database: Settings, api: tuple[TestClient, dict[str, dict[str, str]]]
) -> None:
    client, heads = api
    before = {a["fingerprint"] for a in client.get("/api/v2/alerts", headers=heads["viewer"]).json()}
    assert "fp-hot2" in before
    with connect(fresh_database) as conn:
        rows = conn.execute("SELECT incident_id FROM alerts WHERE fingerprint = 'fp-hot2'").fetchall()
    assert rows == [("inc-a",)]
    now = time.time() + 1
    resolved = alert("fp-hot2", "gpu_thermal", "GPU-2", "node-2", "warning").model_copy(update={"status": "resolved"})
    with connect(fresh_database) as conn:
        upsert_incident_events(
            conn,
            [
                IncidentEvent(
                    incident_id="inc-c",
                    kind="opened",
                    severity="warning",
                    title="hot",
                    alerts=(resolved,),
                    opened_at=now,
                    ts=now,
                )
            ],
        )
    after = {a["fingerprint"] for a in client.get("/api/v2/alerts", headers=heads["viewer"]).json()}
    assert after == before - {"fp-hot2"}  # its latest row, in another incident, says it resolved


def test_posting_a_silence_with_an_id_replaces_it_and_the_author_is_the_caller(
    api: tuple[TestClient, dict[str, dict[str, str]]],
) -> None:
    client, heads = api
    first = client.post("/api/v2/silences", json=postable(("node", "node-2")), headers=heads["operator"])
    assert first.status_code == 200, first.text
    old = first.json()["silenceID"]
    second = client.post(
        "/api/v2/silences", json=postable(("node", "node-2"), hours=2, id=old), headers=heads["operator"]
    )
    assert second.status_code == 200, second.text
    new = second.json()["silenceID"]
    assert new != old
    assert client.get(f"/api/v2/silence/{old}", headers=heads["viewer"]).json()["status"]["state"] == "expired"
    replacement = client.get(f"/api/v2/silence/{new}", headers=heads["viewer"]).json()
    assert replacement["status"]["state"] == "active" and replacement["createdBy"] == "olga"
    audit = client.get("/api/v1/audit", params={"action": "silence.create"}, headers=heads["admin"]).json()
    assert {e["detail"].get("claimed_created_by") for e in audit["entries"]} == {"someone-else"}
    assert {e["actor"] for e in audit["entries"]} == {"olga"}
    # the filter matches a silence's equality matchers as labels
    found = client.get("/api/v2/silences", params={"filter": 'node="node-2"'}, headers=heads["viewer"]).json()
    assert [s["id"] for s in found] == [new, old]  # active before expired, as Alertmanager orders them
    assert client.get("/api/v2/silences", params={"filter": "node=node-9"}, headers=heads["viewer"]).json() == []


def test_refusals_say_why(api: tuple[TestClient, dict[str, dict[str, str]]]) -> None:
    client, heads = api
    op = heads["operator"]
    assert client.get("/api/v2/silence/sil-nope", headers=heads["viewer"]).status_code == 404
    assert client.delete("/api/v2/silence/sil-nope", headers=op).status_code == 404
    assert client.post("/api/v2/silences", json=postable(("node", "n"), id="sil-nope"), headers=op).status_code == 404
    past = client.post("/api/v2/silences", json=postable(("node", "n"), hours=-1), headers=op)
    assert past.status_code == 400 and "past" in past.text
    bad = postable(("node", "n"))
    bad["matchers"][0].update(isRegex=True, value="(")
    assert client.post("/api/v2/silences", json=bad, headers=op).status_code == 400
    assert client.get("/api/v2/alerts", params={"filter": "node=~("}, headers=heads["viewer"]).status_code == 400
    assert client.get("/api/v2/alerts", params={"receiver": "("}, headers=heads["viewer"]).status_code == 400
    assert client.post("/api/v2/silences", json=postable(("node", "n")), headers=heads["viewer"]).status_code == 403
