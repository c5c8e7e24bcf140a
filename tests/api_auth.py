"""Tokens for tests that call the HTTP API: a stored token of a role, and its Authorization header."""

from __future__ import annotations

from services.auth.tokens import Role, create_token
from services.core.settings import Settings
from services.store.db import connect


def token_for(settings: Settings, name: str, role: Role | str = Role.OPERATOR) -> str:
    """Store a token named ``name`` with ``role`` in the (migrated) database; return it."""
    with connect(settings) as conn:
        _, token = create_token(conn, name=name, role=role, created_by="test")
    return token


def bearer(token: str) -> dict[str, str]:
    """The ``Authorization`` header that carries ``token``."""
    return {"Authorization": f"Bearer {token}"}


def auth_headers(settings: Settings, name: str, role: Role | str = Role.OPERATOR) -> dict[str, str]:
    """A new stored token's ``Authorization`` header."""
    return bearer(token_for(settings, name, role))
