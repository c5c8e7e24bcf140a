"""``medic token``: API tokens (a typer sub-app; services/cli.py mounts it as ``token``).

``create`` prints the token once, alone on stdout (``TOKEN=$(medic token create ...)``), and nowhere
else: only its hash is stored. ``list`` never shows a token. Each create and revoke writes an audit
row (actor ``cli:<OS user>``, client ``local``). The commands talk to PostgreSQL directly: whoever can
run them holds the database's credentials, which is the trust root of every token.
"""

from __future__ import annotations

import getpass
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from services.auth import audit, tokens
from services.auth.audit import AuditEntry
from services.auth.tokens import TokenError
from services.core.settings import Settings
from services.store.db import connect

app = typer.Typer(help="API tokens: create (shown once), list, revoke.", no_args_is_help=True)
err = Console(stderr=True)


def _actor() -> str:
    return f"cli:{getpass.getuser()}"


def _audit(action: str, target: str, outcome: audit.Outcome, **detail: str) -> AuditEntry:
    return AuditEntry(
        actor=_actor(), via="cli", action=action, target=target, client="local", outcome=outcome, detail=detail
    )


@app.command("create")
def create(
    role: Annotated[str, typer.Option("--role", help="viewer (read), operator (approve, reject, silence) or admin.")],
    name: Annotated[str, typer.Option("--name", help="Who it is for: recorded as the author of every write.")],
) -> None:
    """Create a token and print it once; store it where its user keeps secrets."""
    with connect(Settings()) as conn:
        try:
            row, token = tokens.create_token(conn, name=name, role=role, created_by=_actor())
        except TokenError as exc:
            audit.record(conn, _audit("token.create", name, "refused", error=str(exc)))
            conn.commit()
            err.print(f"[red]error:[/red] {exc}", soft_wrap=True, highlight=False)
            raise typer.Exit(1) from exc
        audit.record(conn, _audit("token.create", name, "ok", role=row.role.value, token_id=row.id))
    print(token)
    err.print(
        f"[token] {row.name} ({row.role.value}, id {row.id}): shown once, store it now; "
        f"send it as Authorization: Bearer <token>",
        soft_wrap=True,
        highlight=False,
    )


@app.command("list")
def list_(
    include_revoked: Annotated[bool, typer.Option("--all", help="Revoked tokens too.")] = False,
) -> None:
    """List tokens (never the tokens themselves): id, name, role, when created, last used, revoked."""
    with connect(Settings()) as conn:
        rows = tokens.list_tokens(conn, include_revoked=include_revoked)
    table = Table(title="API tokens")
    for column in ("id", "name", "role", "created", "by", "last used", "revoked"):
        table.add_column(column)
    for r in rows:
        table.add_row(
            r.id,
            r.name,
            r.role.value,
            f"{r.created_at:%Y-%m-%d %H:%M}",
            r.created_by,
            f"{r.last_used_at:%Y-%m-%d %H:%M}" if r.last_used_at else "never",
            f"{r.revoked_at:%Y-%m-%d %H:%M} by {r.revoked_by}" if r.revoked_at else "",
        )
    Console(width=160).print(table)


@app.command("revoke")
def revoke(name_or_id: Annotated[str, typer.Argument(help="The token's name or id (medic token list).")]) -> None:
    """Revoke a token: every request carrying it gets 401 from now on."""
    with connect(Settings()) as conn:
        try:
            row = tokens.revoke_token(conn, name_or_id, revoked_by=_actor())
        except TokenError as exc:
            audit.record(conn, _audit("token.revoke", name_or_id, "refused", error=str(exc)))
            conn.commit()
            err.print(f"[red]error:[/red] {exc}", soft_wrap=True, highlight=False)
            raise typer.Exit(1) from exc
        audit.record(conn, _audit("token.revoke", row.name, "ok", token_id=row.id))
    err.print(f"[token] revoked {row.name} ({row.role.value}, id {row.id})", highlight=False)
