"""The audit log (table ``audit_log``, migration 0008): one row per write, whoever made it and however it ended.

The API's middleware (:class:`services.auth.http.AuthMiddleware`) writes a row for every request that
is not a read (``GET``, ``HEAD``, ``OPTIONS``) once an identity is known: a token, the bootstrap token
or a mapped Slack user. It is written before the answer leaves, so a client that got its answer can
read its row at once. ``medic token`` writes one per create and revoke. A request that authenticated as
nobody (a missing, unknown or revoked token, a forged Slack signature) is logged but gets no row:
otherwise anyone who can reach the port could grow the table.

Outcomes: ``ok`` (2xx, 3xx), ``denied`` (401, 403, or refused for who asked, such as an unmapped Slack
user), ``refused`` (other 4xx: invalid input, a conflict, not found) and ``error`` (5xx).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ConfigDict, Field

Outcome = Literal["ok", "denied", "refused", "error"]
MAX_PAGE = 1000
_COLUMNS = "id, ts, actor, role, via, action, target, method, path, client, status, outcome, detail"


class AuditEntry(BaseModel):
    """One row of the audit log.

    Attributes:
        id: increasing; pages go by it (``before``).
        ts: when (the database's wall clock).
        actor: who: a token's name, ``bootstrap``, ``cli:<OS user>``, or ``slack:<user id>`` for an
            unmapped Slack user.
        role: the actor's role then ("" when it had none).
        via: ``token``, ``bootstrap``, ``slack`` or ``cli``.
        action: what: ``silence.create``, ``run.approve``, ``token.revoke``...; a request whose route
            named no action (it was refused before it ran, or the route names none) records its method
            and path (``POST /api/v1/...``).
        target: what it acted on (a silence id, a run id, a token name), when there is one.
        method: the HTTP method ("" from the CLI).
        path: the request path ("" from the CLI).
        client: from where: the peer address of the request (``local`` from the CLI).
        status: the HTTP status answered (None from the CLI).
        outcome: ``ok``, ``denied``, ``refused`` or ``error``.
        detail: what else the route noted (never a token).
    """

    model_config = ConfigDict(frozen=True)

    id: int = 0
    ts: datetime | None = None
    actor: str
    role: str = ""
    via: str
    action: str
    target: str = ""
    method: str = ""
    path: str = ""
    client: str = ""
    status: int | None = None
    outcome: Outcome
    detail: dict[str, Any] = Field(default_factory=dict)


def outcome_of(status: int) -> Outcome:
    """The outcome an HTTP status stands for."""
    if status < 400:
        return "ok"
    if status in (401, 403):
        return "denied"
    return "refused" if status < 500 else "error"


def record(conn: psycopg.Connection[Any], entry: AuditEntry) -> int:
    """Append ``entry``; return its id."""
    row = conn.execute(
        """INSERT INTO audit_log (actor, role, via, action, target, method, path, client, status, outcome, detail)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id""",
        (
            entry.actor,
            entry.role,
            entry.via,
            entry.action,
            entry.target,
            entry.method,
            entry.path,
            entry.client,
            entry.status,
            entry.outcome,
            Jsonb(entry.detail),
        ),
    ).fetchone()
    assert row is not None
    return int(row[0])


def list_entries(
    conn: psycopg.Connection[Any],
    *,
    actor: str | None = None,
    action: str | None = None,
    target: str | None = None,
    outcome: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    before: int | None = None,
    limit: int = 100,
) -> list[AuditEntry]:
    """Entries newest first, filtered; ``before`` (an id) gives the next page after one ending there."""
    where: list[str] = []
    args: list[Any] = []
    for column, value in (("actor", actor), ("action", action), ("target", target), ("outcome", outcome)):
        if value is not None:
            where.append(f"{column} = %s")
            args.append(value)
    if since is not None:
        where.append("ts >= %s")
        args.append(since)
    if until is not None:
        where.append("ts < %s")
        args.append(until)
    if before is not None:
        where.append("id < %s")
        args.append(before)
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    args.append(max(1, min(limit, MAX_PAGE)))
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(f"SELECT {_COLUMNS} FROM audit_log {clause} ORDER BY id DESC LIMIT %s", args)
        return [AuditEntry.model_validate(r) for r in cur.fetchall()]
