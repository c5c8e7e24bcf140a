"""Through the real PostgreSQL: the API's bootstrap token and listener gauge, and silences that would
mute every alert (refused without ``all``, recorded with it from an admin) through the HTTP API and
`medic silences add`. tests/integration/test_api_auth.py covers stored tokens, roles and the audit log."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from services.api.app import SLACK_INTERACTIONS_PATH, create_app
from services.auth.tokens import Role
from services.cli import app as cli
from services.core.exposure import Listener
from services.core.settings import Settings
from services.store.db import connect, migrate
from services.store.silences import list_silences
from tests.api_auth import auth_headers

pytestmark = pytest.mark.integration


def test_the_bootstrap_token_is_an_admin_named_bootstrap(fresh_database: Settings) -> None:
    migrate(fresh_database)
    settings = fresh_database.model_copy(update={"api_token": "api-t0k"})
    good = {"Authorization": "Bearer api-t0k"}
    body = {"matchers": ['alertname="GpuXid"'], "duration": "1h", "created_by": "ana"}
    with TestClient(create_app(settings)) as api:
        for method, path in [
            ("GET", "/api/v1/incidents"),
            ("GET", "/api/v1/silences"),
            ("POST", "/api/v1/silences"),
            ("DELETE", "/api/v1/silences/sil-1"),
            ("GET", "/api/v1/remediation/runs"),
            ("POST", "/api/v1/remediation/runs/run-1/approve"),
        ]:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "api-t0k"}):
                answer = api.request(method, path, json=body, headers=headers)
                assert answer.status_code == 401, (method, path, headers)
                assert answer.headers["WWW-Authenticate"].startswith('Bearer realm="clustermedic"')
        assert api.get("/healthz").status_code == 200
        assert 'clustermedic_insecure_listener{role="api"} 0.0' in api.get("/metrics").text
        # the Slack button carries Slack's signature, not our token: it reaches the signature check
        slack = api.post(SLACK_INTERACTIONS_PATH, content=b"payload=%7B%7D")
        assert slack.status_code == 401 and "signing secret" in slack.text
        assert api.get("/api/v1/whoami", headers=good).json() == {
            "name": "bootstrap",
            "role": "admin",
            "via": "bootstrap",
        }
        created = api.post("/api/v1/silences", json=body, headers=good)
        assert created.status_code == 201 and created.json()["created_by"] == "bootstrap"  # not the body's "ana"
        assert len(api.get("/api/v1/silences", headers=good).json()) == 1
    with connect(settings) as conn:
        assert len(list_silences(conn, now=time.time())) == 1  # only the authenticated one was stored


def test_api_metrics_show_an_insecure_listener(fresh_database: Settings) -> None:
    migrate(fresh_database)
    exposed = Listener("api", "0.0.0.0", 8080, None, insecure=True)
    with TestClient(create_app(fresh_database, listener=exposed)) as api:
        assert 'clustermedic_insecure_listener{role="api"} 1.0' in api.get("/metrics").text
        # --insecure lets it start before any token exists; it opens nothing
        assert api.get("/api/v1/incidents").status_code == 401
        viewer = auth_headers(fresh_database, "vic", Role.VIEWER)
        assert api.get("/api/v1/incidents", headers=viewer).json() == []


@pytest.mark.parametrize("matchers", [['alertname=~".+"'], ['alertname=~".*"', 'x!="nonexistent"'], ['severity!="x"']])
def test_api_refuses_a_silence_that_mutes_every_alert_without_all(
    fresh_database: Settings, matchers: list[str]
) -> None:
    migrate(fresh_database)
    now = time.time()
    api = TestClient(create_app(fresh_database, clock=lambda: now), headers=auth_headers(fresh_database, "ana"))
    refused = api.post("/api/v1/silences", json={"matchers": matchers, "duration": "1h", "createdBy": "ana"})
    assert refused.status_code == 400
    assert "would mute every alert" in refused.json()["detail"] and '"all": true' in refused.json()["detail"]
    assert api.get("/api/v1/silences").json() == []

    narrow = api.post(
        "/api/v1/silences", json={"matchers": ['node=~"gpu-node-0[0-3]"'], "duration": "1h", "createdBy": "ana"}
    )
    assert narrow.status_code == 201 and "mutes every alert" not in narrow.json()["comment"]


def test_api_records_a_confirmed_mute_all_silence_from_an_admin_only(fresh_database: Settings) -> None:
    migrate(fresh_database)
    now = time.time()
    app = create_app(fresh_database, clock=lambda: now)
    api = TestClient(app, headers=auth_headers(fresh_database, "ana", Role.ADMIN))
    body = {
        "matchers": ['alertname=~".+"'],
        "duration": "30m",
        "createdBy": "someone-else",
        "comment": "maintenance",
        "all": True,
    }
    operator = TestClient(app, headers=auth_headers(fresh_database, "otto", Role.OPERATOR))
    denied = operator.post("/api/v1/silences", json=body)
    assert denied.status_code == 403 and "needs the admin role" in denied.json()["detail"]
    created = api.post("/api/v1/silences", json=body)
    assert created.status_code == 201, created.text
    stored = created.json()
    assert stored["state"] == "active"
    assert stored["comment"] == "maintenance [mutes every alert: confirmed by ana via api (--all)]"
    # an empty matcher list is refused by the schema whatever "all" says: write alertname=~".+"
    empty = api.post("/api/v1/silences", json={**body, "matchers": []})
    assert empty.status_code == 422


def test_medic_silences_add_refuses_a_mute_all_silence_without_all(
    fresh_database: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate(fresh_database)
    monkeypatch.setenv("CLUSTERMEDIC_DATABASE_URL", fresh_database.database_url or "")
    runner = CliRunner()
    args = ["silences", "add", "--matcher", 'alertname=~".+"', "--duration", "1h", "--author", "ana"]
    refused = runner.invoke(cli, args)
    assert refused.exit_code == 1
    assert "would mute every alert" in refused.output and "--all" in refused.output
    with connect(fresh_database) as conn:
        assert list_silences(conn, now=time.time()) == []

    confirmed = runner.invoke(cli, [*args, "--all", "--comment", "cluster move"])
    assert confirmed.exit_code == 0, confirmed.output
    narrow = runner.invoke(cli, ["silences", "add", "--matcher", 'alertname="GpuXid"', "--author", "ana"])
    assert narrow.exit_code == 0, narrow.output
    with connect(fresh_database) as conn:
        comments = sorted(s.comment for s in list_silences(conn, now=time.time()))
    assert comments == ["", "cluster move [mutes every alert: confirmed by ana via cli (--all)]"]


def test_healthz_tells_anyone_up_or_down_never_why(fresh_database: Settings) -> None:
    migrate(fresh_database)
    with TestClient(create_app(fresh_database)) as api:
        assert (api.get("/healthz").status_code, api.get("/healthz").json()) == (200, {"status": "ok"})
    # a server that is not there: the connection error names its host, port and user
    gone = fresh_database.model_copy(
        update={"database_url": "postgresql://medic_canary_user:s3cret@127.0.0.1:1/canary_db?connect_timeout=2"}
    )
    with TestClient(create_app(gone)) as api:
        answer = api.get("/healthz")
    assert (answer.status_code, answer.json()) == (503, {"status": "down"})
    assert not any(word in answer.text for word in ("canary", "s3cret", "127.0.0.1", "5432", ":1"))
