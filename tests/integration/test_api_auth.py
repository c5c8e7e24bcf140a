"""Authentication and authorisation of every API route (issue 18, item 1), through the real PostgreSQL.

Each attack closed here: a route reachable without a token (every route of the app is enumerated, so a
route added later cannot be forgotten), a viewer approving a run or silencing, a body naming someone
else as the approver or the author, a revoked token still accepted, a write that leaves no audit row,
and a token written to a log.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute, APIWebSocketRoute, iter_route_contexts
from fastapi.testclient import TestClient
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.websockets import WebSocketDisconnect
from typer.testing import CliRunner

from services.api.app import API_OPEN_PATHS, SLACK_INTERACTIONS_PATH, create_app
from services.auth.http import check_api_listener, route_role
from services.auth.tokens import Role, hash_token
from services.cli import app as cli
from services.core.exposure import UnsafeListener
from services.core.settings import Settings
from services.remediation.config import RemediationSettings
from services.remediation.runtime import MemoryEventSink, build_executor
from services.store.db import connect, migrate
from tests.api_auth import auth_headers, bearer, token_for
from tests.conftest import REPO, free_port, poll
from tests.integration.test_remediation_approvals import Clock, RecordingDispatcher, level2

pytestmark = pytest.mark.integration

# A token of the right shape that was never issued, and one that is not even shaped like a token.
FORGED = "cmt_0123456789ab_" + "A" * 43
GARBAGE = "not-a-token"
# FastAPI's own pages: served to any authenticated caller, whatever the role.
FRAMEWORK_PATHS = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
# The role each route needs, as docs/api.md says. A route missing here must still declare one.
ROLES = {
    ("GET", "/api/v1/incidents"): Role.VIEWER,
    ("GET", "/api/v1/incidents/{incident_id}"): Role.VIEWER,
    ("POST", "/api/v1/silences"): Role.OPERATOR,
    ("GET", "/api/v1/silences"): Role.VIEWER,
    ("GET", "/api/v1/silences/{silence_id}"): Role.VIEWER,
    ("DELETE", "/api/v1/silences/{silence_id}"): Role.OPERATOR,
    ("GET", "/api/v1/remediation/runs"): Role.VIEWER,
    ("GET", "/api/v1/remediation/runs/{run_id}"): Role.VIEWER,
    ("POST", "/api/v1/remediation/runs/{run_id}/approve"): Role.OPERATOR,
    ("POST", "/api/v1/remediation/runs/{run_id}/reject"): Role.OPERATOR,
    ("GET", "/api/v1/remediation/kill-switch"): Role.VIEWER,
    ("PUT", "/api/v1/remediation/kill-switch"): Role.ADMIN,
    ("GET", "/api/v1/whoami"): Role.VIEWER,
    ("GET", "/api/v1/tokens"): Role.ADMIN,
    ("POST", "/api/v1/tokens"): Role.ADMIN,
    ("DELETE", "/api/v1/tokens/{name_or_id}"): Role.ADMIN,
    ("GET", "/api/v1/audit"): Role.OPERATOR,
    ("GET", "/api/v2/silences"): Role.VIEWER,
    ("POST", "/api/v2/silences"): Role.OPERATOR,
    ("GET", "/api/v2/silence/{silence_id}"): Role.VIEWER,
    ("DELETE", "/api/v2/silence/{silence_id}"): Role.OPERATOR,
    ("GET", "/api/v2/alerts"): Role.VIEWER,
    ("GET", "/api/v2/alerts/groups"): Role.VIEWER,
    ("GET", "/api/v2/status"): Role.VIEWER,
}


@pytest.fixture
def world(fresh_database: Settings):
    """The API over a real executor (recording dispatcher), and a token of each role."""
    migrate(fresh_database)
    dispatcher = RecordingDispatcher()
    ex = build_executor(fresh_database, RemediationSettings(), dispatcher, events=MemoryEventSink())
    clock = Clock()
    ex.clock = clock
    app = create_app(fresh_database, clock=clock, executor=lambda: ex)
    heads = {
        "viewer": auth_headers(fresh_database, "vic", Role.VIEWER),
        "operator": auth_headers(fresh_database, "olga", Role.OPERATOR),
        "admin": auth_headers(fresh_database, "ada", Role.ADMIN),
    }
    with TestClient(app) as client:
        yield app, client, heads, ex, dispatcher
    ex.store.close()


def concrete(path: str) -> str:
    """A request path for a route template: every parameter filled in."""
    return re.sub(r"\{[^}]+\}", "x", path)


def requests_for(app: FastAPI) -> list[tuple[str, str, Any]]:
    """``(method, path, route)`` for every route of the app (included routers' with their prefixes,
    mounts and websockets too); ``route`` is the route as declared, with its dependencies."""
    out: list[tuple[str, str, Any]] = []
    for context in iter_route_contexts(app.routes):
        route, path = context.original_route, str(context.path)
        if isinstance(route, WebSocketRoute | APIWebSocketRoute):
            out.append(("WEBSOCKET", concrete(path), route))
        elif isinstance(route, Mount):
            out.append(("GET", concrete(path) + "/x", route))
        elif isinstance(route, APIRoute | Route):
            out.extend((method, concrete(path), route) for method in sorted(context.methods or {"GET"}))
        else:
            raise AssertionError(f"a route of a kind this test does not know: {route!r}")
    return out


def declared_roles(app: FastAPI) -> dict[tuple[str, str], Role | None]:
    """``(method, path template) -> role`` of every APIRoute."""
    return {
        (method, str(context.path)): route_role(context.original_route)
        for context in iter_route_contexts(app.routes)
        if isinstance(context.original_route, APIRoute)
        for method in context.methods or ()
    }


def test_every_route_but_the_open_ones_needs_a_token(world) -> None:
    app, client, _, _, _ = world
    assert API_OPEN_PATHS == {"/healthz", "/metrics", SLACK_INTERACTIONS_PATH}
    seen_open = set()
    undeclared = []
    for method, path, route in requests_for(app):
        if path in API_OPEN_PATHS:
            seen_open.add(path)
            continue
        if isinstance(route, APIRoute) and route_role(route) is None:
            undeclared.append(f"{method} {path}")
        elif not isinstance(route, APIRoute) and path not in FRAMEWORK_PATHS:
            undeclared.append(f"{method} {path} (not an APIRoute: who may use it?)")
        for headers in ({}, bearer(FORGED), bearer(GARBAGE), {"Authorization": f"Basic {FORGED}"}):
            if method == "WEBSOCKET":
                with pytest.raises(WebSocketDisconnect) as closed, client.websocket_connect(path, headers=headers):
                    pass
                assert closed.value.code == 1008, path
                continue
            answer = client.request(method, path, headers=headers, json={})
            assert answer.status_code == 401, (method, path, headers, answer.text)
            assert answer.headers["WWW-Authenticate"].startswith('Bearer realm="clustermedic"')
            assert method == "HEAD" or answer.json()["detail"] in (
                "invalid token",
                "authentication required: send Authorization: Bearer <token> (medic token create)",
            )
    assert undeclared == [], "routes that declare no role (add auth: Viewer | Operator | Admin):\n" + "\n".join(
        undeclared
    )
    assert seen_open == API_OPEN_PATHS
    declared = declared_roles(app)
    assert {k: v for k, v in declared.items() if k in ROLES} == ROLES
    # a path that matches no route is refused the same way: nothing says which routes exist
    assert client.get("/api/v1/nothing-here").status_code == 401


def test_a_viewer_reads_but_gets_403_for_every_write(world) -> None:
    _, client, heads, ex, dispatcher = world
    run_id = level2(ex)
    viewer = heads["viewer"]
    assert client.get("/api/v1/remediation/runs", headers=viewer).status_code == 200
    assert client.get("/api/v1/whoami", headers=viewer).json() == {"name": "vic", "role": "viewer", "via": "token"}
    approve = client.post(f"/api/v1/remediation/runs/{run_id}/approve", headers=viewer, json={"approver": "olga"})
    assert approve.status_code == 403
    assert approve.json()["detail"] == "this needs the operator role; 'vic' has viewer"
    assert 'error="insufficient_scope"' in approve.headers["WWW-Authenticate"]
    assert ex.store.get_run(run_id).status == "awaiting_approval" and dispatcher.started == []
    silence = {"matchers": ['alertname="x"'], "duration": "1h"}
    for method, path, body in [
        ("POST", f"/api/v1/remediation/runs/{run_id}/reject", None),
        ("POST", "/api/v1/silences", silence),
        ("DELETE", "/api/v1/silences/sil-1", None),
        ("DELETE", "/api/v2/silence/sil-1", None),
        ("PUT", "/api/v1/remediation/kill-switch", {"enabled": True}),
        ("POST", "/api/v1/tokens", {"name": "evil", "role": "admin"}),
        ("GET", "/api/v1/tokens", None),
        ("GET", "/api/v1/audit", None),
    ]:
        assert client.request(method, path, headers=viewer, json=body).status_code == 403, (method, path)
    # an operator may not do an admin's work either
    for method, path, body in [
        ("PUT", "/api/v1/remediation/kill-switch", {"enabled": True}),
        ("POST", "/api/v1/tokens", {"name": "evil", "role": "admin"}),
        ("DELETE", "/api/v1/tokens/vic", None),
    ]:
        answer = client.request(method, path, headers=heads["operator"], json=body)
        assert answer.status_code == 403 and "needs the admin role" in answer.json()["detail"], (method, path)
    assert ex.store.kill_switch() is None


def test_an_operators_approval_and_silence_record_the_operator_whatever_the_body_says(world) -> None:
    _, client, heads, ex, dispatcher = world
    run_id = level2(ex)
    answer = client.post(
        f"/api/v1/remediation/runs/{run_id}/approve",
        headers=heads["operator"],
        json={"approver": "the-cto", "comment": "go"},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"run_id": run_id, "status": "approved", "approver": "olga"}
    approval = ex.store.get_approval(run_id)
    assert (approval.approver, approval.channel, approval.comment) == ("olga", "api", "go")
    assert dispatcher.started == [run_id]
    assert [a["actor"] for a in ex.store.audit_log(run_id)][-1] == "api:olga"
    # a client that sends no body at all is fine too
    other = level2(ex, "gpu-node-001")
    assert client.post(f"/api/v1/remediation/runs/{other}/reject", headers=heads["operator"]).status_code == 200
    assert ex.store.get_approval(other).approver == "olga"

    silence = client.post(
        "/api/v1/silences",
        headers=heads["operator"],
        json={"matchers": ['alertname="x"'], "duration": "1h", "createdBy": "the-cto"},
    )
    assert silence.status_code == 201 and silence.json()["created_by"] == "olga"
    entries = client.get("/api/v1/audit", headers=heads["operator"], params={"actor": "olga"}).json()["entries"]
    by_action = {e["action"]: e for e in entries}
    assert by_action["run.approve"]["detail"]["claimed_approver"] == "the-cto"
    assert by_action["silence.create"]["detail"]["claimed_created_by"] == "the-cto"


def test_a_revoked_token_gets_401_at_once(world, fresh_database: Settings) -> None:
    _, client, heads, _, _ = world
    made = client.post("/api/v1/tokens", headers=heads["admin"], json={"name": "temp", "role": "viewer"})
    assert made.status_code == 201, made.text
    token = made.json()["token"]
    assert re.fullmatch(r"cmt_[0-9a-f]{12}_[A-Za-z0-9_-]{43}", token)
    assert client.get("/api/v1/incidents", headers=bearer(token)).status_code == 200
    listed = client.get("/api/v1/tokens", headers=heads["admin"]).json()
    (temp,) = [t for t in listed if t["name"] == "temp"]
    assert temp["last_used_at"] is not None and "token" not in temp and "token_hash" not in temp
    assert client.delete("/api/v1/tokens/temp", headers=heads["admin"]).json()["revoked_by"] == "ada"
    refused = client.get("/api/v1/incidents", headers=bearer(token))
    assert (refused.status_code, refused.json()) == (401, {"detail": "token revoked"})
    assert 'error="invalid_token"' in refused.headers["WWW-Authenticate"]
    # the same id with another secret is not the token: the hash decides
    assert client.get("/api/v1/incidents", headers=bearer(token[:-1] + ("A" if token[-1] != "A" else "B"))).json() == {
        "detail": "invalid token"
    }
    with connect(fresh_database) as conn:
        stored = conn.execute("SELECT token_hash FROM api_tokens WHERE name = 'temp'").fetchone()
    assert stored is not None and stored[0] == hash_token(token) and token not in stored[0]
    # the name is free again: rotation is revoke, then create
    assert (
        client.post("/api/v1/tokens", headers=heads["admin"], json={"name": "temp", "role": "viewer"}).status_code
        == 201
    )
    taken = client.post("/api/v1/tokens", headers=heads["admin"], json={"name": "temp", "role": "admin"})
    assert taken.status_code == 400 and "already has an active token" in taken.json()["detail"]


def test_the_audit_log_holds_each_write_with_who_what_when_where_and_outcome(world) -> None:
    _, client, heads, ex, _ = world
    op, admin = heads["operator"], heads["admin"]
    run_id = level2(ex)
    before = time.time()
    sid = client.post("/api/v1/silences", headers=op, json={"matchers": ['node="n1"'], "duration": "1h"}).json()[
        "silence_id"
    ]
    assert client.delete(f"/api/v1/silences/{sid}", headers=op).status_code == 200
    assert client.post(f"/api/v1/remediation/runs/{run_id}/approve", headers=op).status_code == 200
    assert client.post(f"/api/v1/remediation/runs/{run_id}/reject", headers=op).status_code == 409  # decided
    assert (
        client.put("/api/v1/remediation/kill-switch", headers=admin, json={"enabled": True, "reason": "drill"}).json()[
            "kill_switch"
        ]
        == "on"
    )
    assert client.put("/api/v1/remediation/kill-switch", headers=admin, json={"enabled": False}).status_code == 200
    assert client.post("/api/v1/tokens", headers=admin, json={"name": "bot", "role": "viewer"}).status_code == 201
    assert client.delete("/api/v1/tokens/bot", headers=admin).status_code == 200
    assert (
        client.post(
            "/api/v1/silences", headers=heads["viewer"], json={"matchers": ['a="b"'], "duration": "1h"}
        ).status_code
        == 403
    )
    assert client.post("/api/v1/silences", headers=bearer(FORGED), json={}).status_code == 401  # nobody: no row
    assert client.get("/api/v1/silences", headers=op).status_code == 200  # a read: no row

    page = client.get("/api/v1/audit", headers=op, params={"limit": 100}).json()
    entries = page["entries"]
    assert page["next_before"] is None
    got = [(e["actor"], e["action"], e["target"], e["outcome"], e["status"]) for e in reversed(entries)]
    assert got == [
        ("olga", "silence.create", sid, "ok", 201),
        ("olga", "silence.expire", sid, "ok", 200),
        ("olga", "run.approve", run_id, "ok", 200),
        ("olga", "run.reject", run_id, "refused", 409),
        ("ada", "kill_switch.on", "kill_switch", "ok", 200),
        ("ada", "kill_switch.off", "kill_switch", "ok", 200),
        ("ada", "token.create", "bot", "ok", 201),
        ("ada", "token.revoke", "bot", "ok", 200),
        ("vic", "POST /api/v1/silences", "", "denied", 403),
    ]
    first = entries[-1]
    assert first["client"] == "testclient" and first["via"] == "token" and first["role"] == "operator"
    assert first["method"] == "POST" and first["path"] == "/api/v1/silences"
    assert first["detail"]["matchers"] == ['node="n1"']
    assert all(e["ts"] is not None and abs(_ts(e["ts"]) - before) < 120 for e in entries)
    assert entries[4]["detail"] == {"reason": "drill"}  # kill_switch.on, newest first

    # filters and pages
    olga = client.get("/api/v1/audit", headers=op, params={"actor": "olga", "outcome": "ok"}).json()["entries"]
    assert [e["action"] for e in olga] == ["run.approve", "silence.expire", "silence.create"]
    one = client.get("/api/v1/audit", headers=op, params={"limit": 4}).json()
    two = client.get("/api/v1/audit", headers=op, params={"limit": 4, "before": one["next_before"]}).json()
    three = client.get("/api/v1/audit", headers=op, params={"limit": 4, "before": two["next_before"]}).json()
    assert [e["id"] for e in one["entries"] + two["entries"] + three["entries"]] == [e["id"] for e in entries]
    assert three["next_before"] is None
    assert client.get("/api/v1/audit", headers=op, params={"since": "2999-01-01T00:00:00Z"}).json()["entries"] == []


def _ts(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def test_medic_token_create_list_revoke_round_trip(fresh_database: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    migrate(fresh_database)
    monkeypatch.setenv("CLUSTERMEDIC_DATABASE_URL", fresh_database.database_url or "")
    runner = CliRunner()
    made = runner.invoke(cli, ["token", "create", "--role", "operator", "--name", "dana"])
    assert made.exit_code == 0, made.output
    token = made.stdout.strip()
    assert re.fullmatch(r"cmt_[0-9a-f]{12}_[A-Za-z0-9_-]{43}", token), made.stdout
    assert "shown once" in made.stderr
    with TestClient(create_app(fresh_database)) as api:
        assert api.get("/api/v1/whoami", headers=bearer(token)).json()["name"] == "dana"
        listed = runner.invoke(cli, ["token", "list"])
        assert listed.exit_code == 0 and "dana" in listed.stdout and "operator" in listed.stdout
        assert token not in listed.output and token.split("_", 2)[2] not in listed.output
        assert runner.invoke(cli, ["token", "create", "--role", "operator", "--name", "dana"]).exit_code == 1
        assert (
            "viewer, operator or admin"
            in runner.invoke(cli, ["token", "create", "--role", "root", "--name", "x"]).output
        )
        revoked = runner.invoke(cli, ["token", "revoke", "dana"])
        assert revoked.exit_code == 0 and "revoked dana" in revoked.stderr
        assert api.get("/api/v1/whoami", headers=bearer(token)).status_code == 401
        assert runner.invoke(cli, ["token", "revoke", "dana"]).exit_code == 1
        by_id = runner.invoke(cli, ["token", "create", "--role", "viewer", "--name", "dana"]).stdout.strip()
        key = by_id.split("_")[1]
        assert runner.invoke(cli, ["token", "revoke", key]).exit_code == 0
        assert "dana" not in runner.invoke(cli, ["token", "list"]).stdout
        assert runner.invoke(cli, ["token", "list", "--all"]).stdout.count("dana") == 2
        admin = token_for(fresh_database, "root", Role.ADMIN)
        entries = api.get("/api/v1/audit", headers=bearer(admin), params={"target": "dana"}).json()["entries"]
    assert [(e["action"], e["outcome"], e["via"], e["client"]) for e in reversed(entries)] == [
        ("token.create", "ok", "cli", "local"),
        ("token.create", "refused", "cli", "local"),
        ("token.revoke", "ok", "cli", "local"),
        ("token.revoke", "refused", "cli", "local"),
        ("token.create", "ok", "cli", "local"),
        ("token.revoke", "ok", "cli", "local"),
    ]
    assert all(e["actor"].startswith("cli:") for e in entries)


def test_an_exposed_api_counts_stored_tokens_as_credentials(fresh_database: Settings) -> None:
    migrate(fresh_database)
    with pytest.raises(UnsafeListener, match="without CLUSTERMEDIC_API_TOKEN or a stored token"):
        check_api_listener(fresh_database, "0.0.0.0", 8080)
    token_for(fresh_database, "ops", Role.VIEWER)
    listener = check_api_listener(fresh_database, "0.0.0.0", 8080)
    assert (listener.token, listener.insecure) == (None, False)
    with connect(fresh_database) as conn:
        conn.execute("UPDATE api_tokens SET revoked_at = now()")
    with pytest.raises(UnsafeListener):
        check_api_listener(fresh_database, "0.0.0.0", 8080)
    assert check_api_listener(fresh_database, "0.0.0.0", 8080, insecure=True).insecure
    boot = check_api_listener(fresh_database.model_copy(update={"api_token": "b00t"}), "0.0.0.0", 8080)
    assert boot.token == "b00t" and not boot.insecure


def test_a_token_store_that_does_not_answer_refuses_with_503_and_names_nothing(fresh_database: Settings) -> None:
    gone = fresh_database.model_copy(
        update={"database_url": "postgresql://medic_canary_user:s3cret@127.0.0.1:1/canary_db?connect_timeout=2"}
    )
    with TestClient(create_app(gone)) as api:
        answer = api.get("/api/v1/incidents", headers=bearer(FORGED))
    assert (answer.status_code, answer.json()) == (503, {"detail": "authentication unavailable"})
    assert not any(word in answer.text for word in ("canary", "s3cret", "127.0.0.1"))


# --- tokens never reach a log ----------------------------------------------------------------------


def _secrets_in(text: str, secrets: list[str]) -> list[str]:
    found = [s for s in secrets if s in text]
    # the secret part alone must not show up either (a log line that cut the prefix)
    found += [s for s in secrets if s.startswith("cmt_") and s.split("_", 2)[2] in text]
    return found


def test_tokens_never_appear_in_the_logs_of_a_request_cycle(
    fresh_database: Settings, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate(fresh_database)
    settings = fresh_database.model_copy(update={"api_token": "b00tstrap-" + uuid.uuid4().hex})
    monkeypatch.setenv("CLUSTERMEDIC_DATABASE_URL", fresh_database.database_url or "")
    caplog.set_level(logging.DEBUG)
    with TestClient(create_app(settings)) as api:
        boot = bearer(settings.api_token or "")
        assert api.get("/api/v1/incidents", headers=bearer(FORGED)).status_code == 401
        assert api.get("/api/v1/incidents", headers=bearer(settings.api_token + "x")).status_code == 401
        made = api.post("/api/v1/tokens", headers=boot, json={"name": "logcheck", "role": "operator"}).json()["token"]
        assert (
            api.post(
                "/api/v1/silences", headers=bearer(made), json={"matchers": ['a="b"'], "duration": "1h"}
            ).status_code
            == 201
        )
        assert api.delete("/api/v1/tokens/logcheck", headers=boot).status_code == 200
        assert api.get("/api/v1/incidents", headers=bearer(made)).status_code == 401
        cli_made = CliRunner().invoke(cli, ["token", "create", "--role", "viewer", "--name", "cli-made"]).stdout.strip()
        assert api.get("/api/v1/incidents", headers=bearer(cli_made)).status_code == 200
    secrets = [settings.api_token or "", FORGED, made, cli_made]
    logged = caplog.text + "\n".join(str(r.args) + r.getMessage() for r in caplog.records)
    assert "401 GET /api/v1/incidents from testclient: revoked token" in caplog.text  # the refusal is logged...
    assert _secrets_in(logged, secrets) == []  # ...without the token


def test_tokens_never_appear_in_the_log_of_medic_api_serve(fresh_database: Settings, tmp_path: Path) -> None:
    """The real server at DEBUG, uvicorn's access log included, through a 401, a create, a use and a revoke."""
    migrate(fresh_database)
    port = free_port()
    bootstrap = "b00tstrap-" + uuid.uuid4().hex
    log = tmp_path / "api.log"
    env = {
        **os.environ,
        "CLUSTERMEDIC_DATABASE_URL": fresh_database.database_url or "",
        "CLUSTERMEDIC_API_TOKEN": bootstrap,
        "CLUSTERMEDIC_LOG_LEVEL": "DEBUG",
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "api", "serve", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            try:
                return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        poll(up, 60, 0.2, "medic api serve")
        with httpx.Client(base_url=base, timeout=10) as api:
            boot = bearer(bootstrap)
            assert api.get("/api/v1/incidents", headers=bearer(FORGED)).status_code == 401
            assert api.get("/api/v1/incidents", headers=bearer(GARBAGE)).status_code == 401
            made = api.post("/api/v1/tokens", headers=boot, json={"name": "served", "role": "operator"})
            assert made.status_code == 201, made.text
            token = made.json()["token"]
            assert api.get("/api/v1/whoami", headers=bearer(token)).json()["name"] == "served"
            assert api.delete("/api/v1/tokens/served", headers=boot).status_code == 200
            assert api.get("/api/v1/whoami", headers=bearer(token)).status_code == 401
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    text = log.read_text(errors="replace")
    assert '"GET /api/v1/whoami HTTP/1.1" 401' in text, text[-2000:]  # uvicorn's access log was on
    assert "POST /api/v1/tokens" in text
    assert _secrets_in(text, [bootstrap, FORGED, GARBAGE, token]) == [], text[-2000:]
