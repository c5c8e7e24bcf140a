"""services/auth without a database: token format and names, roles, and the middleware's decisions
(401, 403, 503, which requests get an audit row and what it says) over a store stand-in.

tests/integration/test_api_auth.py runs the same through the real PostgreSQL and every route of the app.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

import pytest
from fastapi import FastAPI, HTTPException
from fastapi.testclient import TestClient

from services.auth.audit import AuditEntry, outcome_of
from services.auth.http import Admin, Operator, Viewer, install
from services.auth.tokens import (
    Identity,
    Role,
    TokenError,
    Verdict,
    check_name,
    hash_token,
    new_token,
    parse_role,
    token_id,
)
from services.core.errors import InfraNotReady
from services.remediation.errors import SignatureError
from services.remediation.slack import APPROVE_ACTION, parse_interaction


def test_roles_are_ordered_viewer_operator_admin() -> None:
    assert [r.value for r in Role] == ["viewer", "operator", "admin"]
    assert Role.ADMIN.allows(Role.OPERATOR) and Role.OPERATOR.allows(Role.VIEWER) and Role.VIEWER.allows(Role.VIEWER)
    assert not Role.VIEWER.allows(Role.OPERATOR) and not Role.OPERATOR.allows(Role.ADMIN)
    assert parse_role(" Operator ") is Role.OPERATOR
    with pytest.raises(TokenError, match="viewer, operator or admin"):
        parse_role("root")


def test_a_token_is_prefixed_random_and_only_its_hash_is_kept() -> None:
    key, token = new_token()
    other_key, other = new_token()
    assert token.startswith(f"cmt_{key}_") and len(token) == 4 + 12 + 1 + 43
    assert token_id(token) == key and key != other_key and token != other
    assert hash_token(token) == hash_token(token) != hash_token(other)
    assert len(hash_token(token)) == 64 and token not in hash_token(token)
    for malformed in ("", "cmt_", f"cmt_{key}", f"xyz_{key}_{token[-43:]}", token + "x", token[:-1], f"Bearer {token}"):
        assert token_id(malformed) is None, malformed


@pytest.mark.parametrize("name", ["alice", "ci-bot", "alice@example.com", "team.sre_1", "A"])
def test_names_that_may_name_a_token(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize(
    "name", ["", " alice", "-x", "a b", "a" * 65, "bootstrap", "System", "anonymous", "0123456789ab", "slack:U1", "é"]
)
def test_names_that_may_not(name: str) -> None:
    with pytest.raises(TokenError):
        check_name(name)


def test_outcomes_of_statuses() -> None:
    assert [outcome_of(s) for s in (200, 201, 302, 400, 401, 403, 404, 409, 422, 500, 503)] == [
        "ok", "ok", "ok", "refused", "denied", "denied", "refused", "refused", "refused", "error", "error",
    ]  # fmt: skip


# --- the middleware over a store stand-in ---------------------------------------------------------


class FakeStore:
    """What the middleware asks of an AuthStore: authenticate a token, record an audit row."""

    def __init__(self, tokens: dict[str, Verdict], *, down: bool = False) -> None:
        self.tokens = tokens
        self.down = down
        self.entries: list[AuditEntry] = []
        self.asked: list[str] = []

    def authenticate(self, token: str) -> Verdict:
        self.asked.append(token)
        if self.down:
            raise InfraNotReady("cannot connect to PostgreSQL: host db.internal port 5432 user medic")
        return self.tokens.get(token, Verdict(None, "unknown"))

    def record(self, entry: AuditEntry) -> int:
        self.entries.append(entry)
        return len(self.entries)


VIEWER = Verdict(Identity("vic", Role.VIEWER, "token", "aaaaaaaaaaaa"))
OPERATOR = Verdict(Identity("olga", Role.OPERATOR, "token", "bbbbbbbbbbbb"))


def app_with(store: FakeStore, bootstrap: str | None = None) -> TestClient:
    app = FastAPI()
    install(app, store, bootstrap_token=bootstrap, open_paths={"/healthz"})  # type: ignore[arg-type]

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/read")
    def read(auth: Viewer) -> dict[str, str]:
        return {"name": auth.name}

    @app.post("/write/{thing}")
    def write(thing: str, auth: Operator) -> dict[str, str]:
        auth.note("thing.write", thing, size=3)
        if thing == "boom":
            raise RuntimeError("handler failed")
        if thing == "taken":
            raise HTTPException(409, "taken")
        return {"by": auth.name}

    @app.delete("/admin")
    def admin(auth: Admin) -> dict[str, str]:
        return {}

    return TestClient(app, raise_server_exceptions=False)


def test_no_token_or_an_unknown_or_revoked_one_is_401_before_any_route_and_leaves_no_row() -> None:
    store = FakeStore({"cmt_revoked": Verdict(None, "revoked")})
    client = app_with(store)
    missing = client.post("/write/x")
    assert missing.status_code == 401 and missing.headers["WWW-Authenticate"] == 'Bearer realm="clustermedic"'
    assert missing.json()["detail"].startswith("authentication required")
    assert store.asked == [], "no token: nothing to look up"
    unknown = client.post("/write/x", headers={"Authorization": "Bearer nope"})
    assert (unknown.status_code, unknown.json()) == (401, {"detail": "invalid token"})
    assert unknown.headers["WWW-Authenticate"] == 'Bearer realm="clustermedic", error="invalid_token"'
    assert client.get("/read", headers={"Authorization": "Bearer cmt_revoked"}).json() == {"detail": "token revoked"}
    assert client.get("/read", headers={"Authorization": "Basic nope"}).status_code == 401
    assert client.get("/no-such-route").status_code == 401  # refused before routing
    assert client.get("/healthz").json() == {"status": "ok"}
    assert store.entries == []


def test_a_role_too_low_is_403_and_audited_as_denied() -> None:
    store = FakeStore({"v": VIEWER})
    client = app_with(store)
    assert client.get("/read", headers={"Authorization": "Bearer v"}).json() == {"name": "vic"}
    answer = client.post("/write/x", headers={"Authorization": "Bearer v"})
    assert answer.status_code == 403 and answer.json()["detail"] == "this needs the operator role; 'vic' has viewer"
    (entry,) = store.entries  # the read left none
    assert (entry.actor, entry.role, entry.action, entry.outcome, entry.status) == (
        "vic", "viewer", "POST /write/x", "denied", 403,
    )  # fmt: skip
    assert entry.client == "testclient" and entry.method == "POST" and entry.path == "/write/x"


def test_each_write_is_audited_with_what_the_route_noted_and_how_it_ended() -> None:
    store = FakeStore({"o": OPERATOR})
    client = app_with(store)
    auth = {"Authorization": "Bearer o"}
    assert client.post("/write/a", headers=auth).json() == {"by": "olga"}
    assert client.post("/write/taken", headers=auth).status_code == 409
    assert client.post("/write/boom", headers=auth).status_code == 500
    assert client.delete("/admin", headers=auth).status_code == 403
    got = [(e.actor, e.action, e.target, e.outcome, e.status, e.detail) for e in store.entries]
    assert got == [
        ("olga", "thing.write", "a", "ok", 200, {"size": 3}),
        ("olga", "thing.write", "taken", "refused", 409, {"size": 3}),
        ("olga", "thing.write", "boom", "error", 500, {"size": 3}),
        ("olga", "DELETE /admin", "", "denied", 403, {}),
    ]


def test_the_bootstrap_token_is_an_admin_and_needs_no_store() -> None:
    store = FakeStore({}, down=True)
    client = app_with(store, bootstrap="b00t")
    assert client.delete("/admin", headers={"Authorization": "Bearer b00t"}).status_code == 200
    assert store.asked == []
    (entry,) = store.entries
    assert (entry.actor, entry.role, entry.via) == ("bootstrap", "admin", "bootstrap")
    assert client.get("/read", headers={"Authorization": "Bearer b00t2"}).status_code == 503  # asks the store


def test_a_store_that_does_not_answer_is_503_naming_nothing(caplog: pytest.LogCaptureFixture) -> None:
    client = app_with(FakeStore({}, down=True))
    answer = client.get("/read", headers={"Authorization": "Bearer cmt_x"})
    assert (answer.status_code, answer.json()) == (503, {"detail": "authentication unavailable"})
    assert "db.internal" not in answer.text and "db.internal" in caplog.text  # the why goes to the log


def test_require_without_the_middleware_is_401() -> None:
    app = FastAPI()

    @app.get("/read")
    def read(auth: Viewer) -> dict[str, str]:
        return {}

    assert TestClient(app).get("/read").status_code == 401


# --- Slack clicks -----------------------------------------------------------------------------------


def _click(user: dict[str, Any]) -> bytes:
    payload = {"type": "block_actions", "user": user, "actions": [{"action_id": APPROVE_ACTION, "value": "run-1"}]}
    return urlencode({"payload": json.dumps(payload)}).encode()


def test_a_slack_click_carries_the_stable_user_id() -> None:
    click = parse_interaction(_click({"id": "U024BE7LH", "username": "carol"}))
    assert click == (APPROVE_ACTION, "run-1", "U024BE7LH", "carol")
    with pytest.raises(SignatureError, match="no user id"):
        parse_interaction(_click({"username": "carol"}))  # a name alone may be anyone's
    with pytest.raises(SignatureError):
        parse_interaction(b"payload=%5B%5D")
