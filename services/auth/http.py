"""The API's authentication and authorisation, and its audit of every write (docs/api.md).

* :class:`AuthMiddleware` (pure ASGI) authenticates every request whose path is not an open one
  (``/healthz``, ``/metrics``, the Slack button, which Slack signs): ``Authorization: Bearer <token>``
  with a stored token (:mod:`services.auth.tokens`) or the bootstrap token (CLUSTERMEDIC_API_TOKEN, an
  ``admin`` named ``bootstrap``). A missing, unknown or revoked token gets 401 with
  ``WWW-Authenticate``, before any route runs: a route someone adds is closed until a token opens it.
  It then writes one :mod:`audit <services.auth.audit>` row for every request that is not a read,
  before the answer leaves.
* Routes say which role they need with a parameter typed :data:`Viewer`, :data:`Operator` or
  :data:`Admin` (``require(role)``); a role too low gets 403 naming the role needed. The parameter is
  the request's :class:`AuthContext`: who asks (never the body), and what the audit row should say.
  ``tests/integration/test_api_auth.py`` fails for any route that declares no role.
* :func:`auth_router`: ``GET /whoami``, ``GET|POST /tokens``, ``DELETE /tokens/{name_or_id}`` and
  ``GET /audit``.

Tokens never reach a log: the middleware logs a refusal's reason, method, path and peer, never a header.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, TypeVar

import psycopg
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.auth import audit, replay, tokens
from services.auth.audit import AuditEntry, Outcome
from services.auth.tokens import Identity, Role, TokenError, TokenNotFound, Verdict
from services.core.errors import InfraError, StoreError
from services.core.exposure import Listener, bearer_token, check_listener, is_loopback
from services.core.settings import Settings
from services.store.db import connect

log = logging.getLogger(__name__)

T = TypeVar("T")
SCOPE_KEY = "clustermedic.auth"
REALM = 'Bearer realm="clustermedic"'
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
BOOTSTRAP = Identity("bootstrap", Role.ADMIN, "bootstrap")
# What `medic api serve` names when it refuses an exposed address that nobody could authenticate to.
API_CREDENTIALS = "CLUSTERMEDIC_API_TOKEN or a stored token (medic token create)"


class AuthStore:
    """Tokens, audit rows and seen requests for one API process: one autocommit connection, under a lock.

    Args:
        settings: where PostgreSQL is.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    def run(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``work`` on the connection (opened on first use, reopened after a lost one).

        Raises:
            InfraError: PostgreSQL is not reachable.
            StoreError: the query failed.
        """
        with self._lock:
            if self._conn is None or self._conn.closed:
                self._conn = connect(self._settings, autocommit=True)
            try:
                return work(self._conn)
            except psycopg.OperationalError as exc:
                self._close()
                raise StoreError(f"auth store: {exc}") from exc
            except psycopg.Error as exc:
                raise StoreError(f"auth store: {exc}") from exc

    def authenticate(self, token: str) -> Verdict:
        """The identity of a stored token (see :func:`services.auth.tokens.authenticate`)."""
        return self.run(lambda c: tokens.authenticate(c, token))

    def identity_named(self, name: str) -> Identity | None:
        """The identity of the active token named ``name``."""
        return self.run(lambda c: tokens.identity_named(c, name))

    def count_active(self) -> int:
        """How many stored tokens are active."""
        return self.run(tokens.count_active)

    def record(self, entry: AuditEntry) -> int:
        """Append an audit row."""
        return self.run(lambda c: audit.record(c, entry))

    def first_sighting(self, source: str, key: str, request_ts: float, keep_s: float) -> bool:
        """Whether a signed request is new (see :func:`services.auth.replay.first_sighting`)."""
        return self.run(lambda c: replay.first_sighting(c, source, key, request_ts=request_ts, keep_s=keep_s))

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        """Close the connection (reopened on next use)."""
        with self._lock:
            self._close()


@dataclass
class AuthContext:
    """One request's caller and what its audit row will say; routes get it from :func:`require`.

    Attributes:
        client: the peer address.
        identity: who authenticated (None on an open path until a route sets it, as the Slack button
            does for a mapped user).
        action: the audit row's action (default: ``METHOD /the/path``).
        target: what the request acted on.
        detail: more for the audit row (never a token).
        actor: who to record when no identity is known (an unmapped Slack user).
        outcome: overrides the outcome the status implies (a Slack refusal answers 200 so that Slack
            shows its text, yet it is ``denied``).
    """

    client: str
    identity: Identity | None = None
    action: str = ""
    target: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    actor: str = ""
    outcome: Outcome | None = None

    @property
    def name(self) -> str:
        """The authenticated name (what writes record as their author)."""
        assert self.identity is not None, "require() guarantees an identity"
        return self.identity.name

    def note(self, action: str | None = None, target: str | None = None, **detail: Any) -> None:
        """Say what the audit row records: the action, its target, and any detail."""
        if action is not None:
            self.action = action
        if target is not None:
            self.target = target
        self.detail.update(detail)


def context(request: Request) -> AuthContext:
    """The request's :class:`AuthContext` (a fresh empty one when no middleware set it)."""
    ctx = request.scope.get(SCOPE_KEY)
    if not isinstance(ctx, AuthContext):
        ctx = AuthContext(client=_client(request.scope))
        request.scope[SCOPE_KEY] = ctx
    return ctx


def require(role: Role) -> Callable[[Request], Any]:
    """A dependency that admits an identity of at least ``role`` and returns the request's context.

    Without the middleware nothing is authenticated, so it answers 401: it fails closed.
    """

    async def check(request: Request) -> AuthContext:
        ctx = context(request)
        if ctx.identity is None:
            raise HTTPException(401, "authentication required", headers={"WWW-Authenticate": REALM})
        if not ctx.identity.role.allows(role):
            raise HTTPException(
                403,
                f"this needs the {role.value} role; {ctx.identity.name!r} has {ctx.identity.role.value}",
                headers={"WWW-Authenticate": f'{REALM}, error="insufficient_scope"'},
            )
        return ctx

    check.required_role = role  # type: ignore[attr-defined]
    return check


Viewer = Annotated[AuthContext, Depends(require(Role.VIEWER))]
Operator = Annotated[AuthContext, Depends(require(Role.OPERATOR))]
Admin = Annotated[AuthContext, Depends(require(Role.ADMIN))]


def route_role(route: BaseRoute) -> Role | None:
    """The role a route declares through :func:`require`, or None (tests enumerate routes with this)."""
    dependant = getattr(route, "dependant", None)
    pending = list(dependant.dependencies) if dependant is not None else []
    while pending:
        dep = pending.pop()
        role = getattr(dep.call, "required_role", None)
        if isinstance(role, Role):
            return role
        pending.extend(dep.dependencies)
    return None


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


def _route_path(scope: Scope) -> str:
    path = str(scope.get("path", ""))
    root = str(scope.get("root_path", ""))
    return path[len(root) :] if root and path.startswith(root) else path


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers") or []:
        if name == b"authorization":
            return bearer_token(value.decode("latin-1"))
    return None


class AuthMiddleware:
    """Authenticate every request outside ``open_paths``; audit every write.

    Args:
        app: the wrapped application.
        store: tokens and the audit log.
        bootstrap_token: CLUSTERMEDIC_API_TOKEN, admitted as the admin ``bootstrap`` (None: none).
        open_paths: paths served without a token (``/healthz``, ``/metrics``, the signed Slack button).
    """

    def __init__(
        self, app: ASGIApp, *, store: AuthStore, bootstrap_token: str | None, open_paths: Collection[str]
    ) -> None:
        self.app = app
        self.store = store
        self.bootstrap = bootstrap_token or None
        self.open_paths = frozenset(open_paths)

    def identify(self, token: str | None) -> Verdict:
        """The identity a bearer token stands for, or why none (``missing``, ``unknown``, ``revoked``)."""
        if not token:
            return Verdict(None, "missing")
        if self.bootstrap is not None and hmac.compare_digest(token.encode(), self.bootstrap.encode()):
            return Verdict(BOOTSTRAP)
        return self.store.authenticate(token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer 401 (503 when the token store does not answer), or pass the request on and audit it."""
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        ctx = AuthContext(client=_client(scope))
        scope[SCOPE_KEY] = ctx
        method = str(scope.get("method", "GET")).upper()
        if _route_path(scope) not in self.open_paths:
            try:
                verdict = await run_in_threadpool(self.identify, _bearer(scope))
            except (InfraError, StoreError) as exc:
                log.warning("the token store does not answer: %s", exc)
                await _refuse(scope, send, 503, "authentication unavailable", None)
                return
            if verdict.identity is None:
                log.info("401 %s %s from %s: %s token", method, _route_path(scope), ctx.client, verdict.reason)
                await _refuse(scope, send, 401, _REASONS[verdict.reason], verdict.reason)
                return
            ctx.identity = verdict.identity
        if scope["type"] != "http" or method in SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        await self._audited(scope, receive, send, ctx, method)

    async def _audited(self, scope: Scope, receive: Receive, send: Send, ctx: AuthContext, method: str) -> None:
        # the answer is held until its audit row is written: a client that has its answer can read the row
        held: list[Message] = []

        async def hold(message: Message) -> None:
            held.append(message)

        try:
            await self.app(scope, receive, hold)
        except Exception:
            await self._record(scope, ctx, method, 500)
            raise
        status = next((int(m["status"]) for m in held if m["type"] == "http.response.start"), 500)
        await self._record(scope, ctx, method, status)
        for message in held:
            await send(message)

    async def _record(self, scope: Scope, ctx: AuthContext, method: str, status: int) -> None:
        actor = ctx.identity.name if ctx.identity else ctx.actor
        if not actor:
            return  # nobody authenticated (a forged Slack click): logged, not stored
        entry = AuditEntry(
            actor=actor,
            role=ctx.identity.role.value if ctx.identity else "",
            via=ctx.identity.via if ctx.identity else "slack",
            action=ctx.action or f"{method} {_route_path(scope)}",
            target=ctx.target,
            method=method,
            path=_route_path(scope),
            client=ctx.client,
            status=status,
            outcome=ctx.outcome or audit.outcome_of(status),
            detail=ctx.detail,
        )
        try:
            await run_in_threadpool(self.store.record, entry)
        except (InfraError, StoreError) as exc:
            log.error("audit row not written (%s %s by %s, %d): %s", method, entry.path, actor, status, exc)


_REASONS = {
    "missing": "authentication required: send Authorization: Bearer <token> (medic token create)",
    "unknown": "invalid token",
    "revoked": "token revoked",
}


async def _refuse(scope: Scope, send: Send, status: int, detail: str, reason: str | None) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008, "reason": detail})
        return
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        challenge = REALM if reason == "missing" else f'{REALM}, error="invalid_token"'
        headers.append((b"www-authenticate", challenge.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# ------------------------------------------------------------------------------------------- routes


class TokenBody(BaseModel):
    """Body of ``POST /tokens``."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str
    role: Role


def auth_router(store: AuthStore) -> APIRouter:
    """``/whoami`` (viewer), ``/tokens`` (admin) and ``/audit`` (operator)."""
    router = APIRouter(tags=["auth"])

    @router.get("/whoami")
    def whoami(auth: Viewer) -> dict[str, str]:
        identity = auth.identity
        assert identity is not None
        return {"name": identity.name, "role": identity.role.value, "via": identity.via}

    @router.get("/tokens")
    def list_tokens(auth: Admin, include_revoked: bool = False) -> list[dict[str, Any]]:
        rows = store.run(lambda c: tokens.list_tokens(c, include_revoked=include_revoked))
        return [r.model_dump(mode="json") for r in rows]

    @router.post("/tokens", status_code=201)
    def create_token(body: TokenBody, auth: Admin) -> dict[str, Any]:
        auth.note("token.create", body.name, role=body.role.value)
        try:
            row, token = store.run(
                lambda c: tokens.create_token(c, name=body.name, role=body.role, created_by=auth.name)
            )
        except TokenError as exc:
            raise HTTPException(400, str(exc)) from exc
        auth.note(token_id=row.id)
        return {**row.model_dump(mode="json"), "token": token}

    @router.delete("/tokens/{name_or_id}")
    def revoke_token(name_or_id: str, auth: Admin) -> dict[str, Any]:
        auth.note("token.revoke", name_or_id)
        try:
            row = store.run(lambda c: tokens.revoke_token(c, name_or_id, revoked_by=auth.name))
        except TokenNotFound as exc:
            raise HTTPException(404, str(exc)) from exc
        auth.note(target=row.name, token_id=row.id)
        return row.model_dump(mode="json")

    @router.get("/audit")
    def audit_log(
        auth: Operator,
        actor: str | None = None,
        action: str | None = None,
        target: str | None = None,
        outcome: Outcome | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        before: int | None = Query(default=None, ge=1, description="an id: the page after one that ended there"),
        limit: int = Query(default=100, ge=1, le=audit.MAX_PAGE),
    ) -> dict[str, Any]:
        rows = store.run(
            lambda c: audit.list_entries(
                c,
                actor=actor,
                action=action,
                target=target,
                outcome=outcome,
                since=since,
                until=until,
                before=before,
                limit=limit,
            )
        )
        return {
            "entries": [r.model_dump(mode="json") for r in rows],
            "next_before": rows[-1].id if len(rows) == limit else None,
        }

    return router


def install(app: Any, store: AuthStore, *, bootstrap_token: str | None, open_paths: Iterable[str]) -> None:
    """Put :class:`AuthMiddleware` in front of every route of ``app`` (a FastAPI or Starlette app)."""
    app.add_middleware(AuthMiddleware, store=store, bootstrap_token=bootstrap_token, open_paths=frozenset(open_paths))


def check_api_listener(settings: Settings, host: str, port: int, *, insecure: bool = False) -> Listener:
    """The listener rule for ``medic api serve``, counting stored tokens as credentials.

    A non-loopback address needs CLUSTERMEDIC_API_TOKEN or at least one active stored token; with
    ``insecure`` it starts without either, and every route but the open ones answers 401 until
    ``medic token create`` makes one. Stored tokens are counted only when the answer depends on them.

    Raises:
        services.core.exposure.UnsafeListener: exposed, no credential, no ``insecure``.
    """
    stored = 0
    if not settings.api_token and not is_loopback(host):
        store = AuthStore(settings)
        try:
            stored = store.count_active()
        except (InfraError, StoreError) as exc:
            log.warning("could not count the stored API tokens: %s", exc)
        finally:
            store.close()
    return check_listener(
        "api",
        host,
        port,
        token=settings.api_token,
        token_variable=API_CREDENTIALS,
        insecure=insecure,
        credentials=stored,
        unguarded="every route but /healthz and /metrics answers 401 until `medic token create` makes a token",
    )
