"""Roles, identities and API tokens (table ``api_tokens``, migration 0008; parametrised SQL only).

A token reads ``cmt_<id>_<secret>``: ``cmt_`` makes it recognisable to a secret scanner, ``<id>`` (12 hex
digits) is its public part, shown by ``medic token list`` and used to find its row, and ``<secret>`` is 32
random bytes (URL-safe base64). Only the SHA-256 of the whole token is stored: a token carries 256 bits
of entropy, so a slow password hash would add nothing but latency to every request. The stored hash is
compared in constant time. A token is shown once, when it is created.

Each token has a name, the identity every write records (the approver of a run, the author of a silence),
and a role: ``viewer`` reads, ``operator`` also approves, rejects and silences, ``admin`` also manages
tokens, the kill switch and silences that mute every alert. A name has at most one active token; revoke
it and create another to rotate.

Errors (under ``StoreError`` in the tree of ``services/core/errors.py``)::

    StoreError
    └── TokenError          an invalid name or role, or a name that already has an active token
        └── TokenNotFound   no active token with this name or id
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import psycopg
from psycopg.rows import dict_row
from pydantic import BaseModel, ConfigDict

from services.core.errors import StoreError

TOKEN_PREFIX = "cmt_"
_TOKEN = re.compile(r"^cmt_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
_ID = re.compile(r"^[0-9a-f]{12}$")
# Names the system itself writes into audit trails (the bootstrap token's identity, remediation's own steps).
RESERVED_NAMES = frozenset({"bootstrap", "system", "anonymous"})
# last_used_at is written at most this often per token: a read per request, not a write per request.
LAST_USED_RESOLUTION_S = 60
_COLUMNS = "id, name, role, created_by, created_at, last_used_at, revoked_at, revoked_by"


class TokenError(StoreError):
    """A token cannot be created as asked: an invalid name or role, or the name already has an active token."""


class TokenNotFound(TokenError):
    """No active token has this name or id."""


class Role(StrEnum):
    """What an identity may do; each role may do everything the ones before it may."""

    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        """0 for viewer, 1 for operator, 2 for admin."""
        return list(Role).index(self)

    def allows(self, required: Role) -> bool:
        """Whether this role may do what ``required`` may."""
        return self.rank >= required.rank


@dataclass(frozen=True)
class Identity:
    """Who a request acts as.

    Attributes:
        name: the token's name (or ``bootstrap``): what writes record as their author.
        role: what it may do.
        via: how it was authenticated: ``token`` (a stored token), ``bootstrap`` (CLUSTERMEDIC_API_TOKEN)
            or ``slack`` (a signed Slack click by a mapped user).
        token_id: the stored token's id ("" for the bootstrap token).
    """

    name: str
    role: Role
    via: str = "token"
    token_id: str = ""


class StoredToken(BaseModel):
    """One row of ``api_tokens``; never the token or its hash."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    role: Role
    created_by: str
    created_at: datetime
    last_used_at: datetime | None = None
    revoked_at: datetime | None = None
    revoked_by: str = ""

    @property
    def active(self) -> bool:
        """Not revoked."""
        return self.revoked_at is None


def hash_token(token: str) -> str:
    """The stored form of a token: hex SHA-256 of its UTF-8 bytes."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_id(token: str) -> str | None:
    """The id part of a well-formed token, else None (the caller then has nothing to look up)."""
    match = _TOKEN.match(token)
    return match.group(1) if match else None


def new_token() -> tuple[str, str]:
    """``(id, token)``: a fresh random token and its public id."""
    key = secrets.token_hex(6)
    return key, f"{TOKEN_PREFIX}{key}_{secrets.token_urlsafe(32)}"


def check_name(name: str) -> str:
    """Return ``name`` if it may name a token.

    Raises:
        TokenError: empty, too long (64), characters other than letters, digits and ``._@-``, a
            reserved name, or 12 hex digits (which ``revoke`` would read as an id).
    """
    if not _NAME.match(name):
        raise TokenError(f"token name {name!r}: 1-64 letters, digits or ._@-, starting with a letter or digit")
    if name.lower() in RESERVED_NAMES:
        raise TokenError(f"token name {name!r} is reserved")
    if _ID.match(name):
        raise TokenError(f"token name {name!r} looks like a token id; choose another")
    return name


def parse_role(role: str) -> Role:
    """The role named ``role``.

    Raises:
        TokenError: not viewer, operator or admin.
    """
    try:
        return Role(role.strip().lower())
    except ValueError:
        raise TokenError(f"role must be viewer, operator or admin, not {role!r}") from None


def create_token(
    conn: psycopg.Connection[Any], *, name: str, role: Role | str, created_by: str
) -> tuple[StoredToken, str]:
    """Store a new token; return its row and the token itself (the only time anyone sees it).

    Raises:
        TokenError: an invalid name or role, or ``name`` already has an active token.
    """
    role = parse_role(str(role))
    check_name(name)
    key, token = new_token()
    try:
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            cur.execute(
                f"""INSERT INTO api_tokens (id, name, role, token_hash, created_by) VALUES (%s, %s, %s, %s, %s)
                    RETURNING {_COLUMNS}""",
                (key, name, role.value, hash_token(token), created_by),
            )
            row = cur.fetchone()
    except psycopg.errors.UniqueViolation:
        raise TokenError(f"{name!r} already has an active token: revoke it first (medic token revoke {name})") from None
    assert row is not None
    return StoredToken.model_validate(row), token


def list_tokens(conn: psycopg.Connection[Any], *, include_revoked: bool = True) -> list[StoredToken]:
    """Tokens, oldest first (active ones only unless ``include_revoked``)."""
    where = "" if include_revoked else "WHERE revoked_at IS NULL"
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(f"SELECT {_COLUMNS} FROM api_tokens {where} ORDER BY created_at, id")
        return [StoredToken.model_validate(r) for r in cur.fetchall()]


def count_active(conn: psycopg.Connection[Any]) -> int:
    """How many tokens are not revoked."""
    row = conn.execute("SELECT count(*) FROM api_tokens WHERE revoked_at IS NULL").fetchone()
    return int(row[0]) if row else 0


def revoke_token(conn: psycopg.Connection[Any], name_or_id: str, *, revoked_by: str) -> StoredToken:
    """Revoke the active token with this id or name; requests carrying it get 401 from now on.

    Raises:
        TokenNotFound: no active token has this id or name.
    """
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            f"""UPDATE api_tokens SET revoked_at = now(), revoked_by = %s
                WHERE revoked_at IS NULL AND (id = %s OR name = %s) RETURNING {_COLUMNS}""",
            (revoked_by, name_or_id, name_or_id),
        )
        row = cur.fetchone()
    if row is None:
        raise TokenNotFound(f"no active token with name or id {name_or_id!r}")
    return StoredToken.model_validate(row)


@dataclass(frozen=True)
class Verdict:
    """What :func:`authenticate` found: an identity, or why not (``unknown`` or ``revoked``)."""

    identity: Identity | None
    reason: str = ""


def authenticate(conn: psycopg.Connection[Any], token: str) -> Verdict:
    """The identity of a presented token, and note its use (``last_used_at``, at most once a minute).

    The row is found by the token's public id; its hash is then compared in constant time, so neither
    the index lookup nor the comparison's timing tells anything about the secret.
    """
    key = token_id(token)
    if key is None:
        return Verdict(None, "unknown")
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            """SELECT name, role, token_hash, revoked_at IS NOT NULL AS revoked,
                      last_used_at IS NULL OR last_used_at < now() - make_interval(secs => %s) AS stale
               FROM api_tokens WHERE id = %s""",
            (LAST_USED_RESOLUTION_S, key),
        )
        row = cur.fetchone()
    if row is None or not hmac.compare_digest(str(row["token_hash"]), hash_token(token)):
        return Verdict(None, "unknown")
    if row["revoked"]:
        return Verdict(None, "revoked")
    if row["stale"]:
        conn.execute("UPDATE api_tokens SET last_used_at = now() WHERE id = %s", (key,))
    return Verdict(Identity(str(row["name"]), Role(row["role"]), "token", key))


def identity_named(conn: psycopg.Connection[Any], name: str) -> Identity | None:
    """The identity of the active token named ``name`` (a Slack user maps to one), else None."""
    row = conn.execute("SELECT id, role FROM api_tokens WHERE name = %s AND revoked_at IS NULL", (name,)).fetchone()
    return Identity(name, Role(row[1]), "slack", str(row[0])) if row else None
