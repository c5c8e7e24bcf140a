"""``medic stack up | down | status | logs``: the typer sub-app over :mod:`services.stack`."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from services.core.settings import Settings
from services.stack import ROLES, ROLES_BY_NAME, Stack, StackError

app = typer.Typer(help="Every ClusterMedic role as a supervised process on this machine.", no_args_is_help=True)
COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan", "bright_magenta")


def _stack(roles: str = "") -> Stack:
    if not roles:
        return Stack(Settings())
    names = [r.strip() for r in roles.split(",") if r.strip()]
    unknown = [n for n in names if n not in ROLES_BY_NAME]
    if unknown:
        raise typer.BadParameter(f"unknown role {unknown[0]!r}; roles: {', '.join(ROLES_BY_NAME)}")
    return Stack(Settings(), roles=tuple(ROLES_BY_NAME[n] for n in names))


def _fail(exc: StackError) -> None:
    typer.echo(f"medic stack: {exc}", err=True)
    raise typer.Exit(1) from exc


@app.command("up")
def up_cmd(
    roles: Annotated[str, typer.Option(help="comma-separated roles (default: all)")] = "",
    timeout: Annotated[float, typer.Option(help="seconds to wait for every role to be ready")] = 120.0,
) -> None:
    """Start every role under supervisord and wait until each is ready."""
    stack = _stack(roles)
    try:
        statuses = stack.up(timeout_s=timeout, say=lambda line: typer.echo(f"[stack] {line}", err=True))
    except StackError as exc:
        _fail(exc)
        return
    ready, skipped = sum(s.ready for s in statuses), sum(s.skipped for s in statuses)
    note = f" ({skipped} skipped)" if skipped else ""
    typer.echo(f"[stack] {ready} roles ready{note}; logs: medic stack logs -f; stop: medic stack down", err=True)


@app.command("down")
def down_cmd() -> None:
    """Stop every role and supervisord (exactly what `up` started, by its PID file)."""
    typer.echo("[stack] stopped" if _stack().down() else "[stack] no stack was running", err=True)


@app.command("status")
def status_cmd() -> None:
    """Each role's state, PID, uptime, restarts, readiness and last exit (or why `up` skipped it)."""
    try:
        statuses = _stack().status()
    except StackError as exc:
        _fail(exc)
        return
    table = Table("role", "state", "pid", "up", "restarts", "ready", "last exit")
    for s in statuses:
        table.add_row(
            s.name,
            s.state,
            str(s.pid or ""),
            f"{s.uptime_s:.0f} s" if s.uptime_s else "",
            str(s.restarts),
            "yes" if s.ready else "-" if s.skipped else "no",
            s.last_exit,
        )
    Console().print(table)
    if not all(s.ready or s.skipped for s in statuses):
        raise typer.Exit(1)


@app.command("logs")
def logs_cmd(
    role: Annotated[str, typer.Argument(help="one role (default: all)")] = "",
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing as the logs grow")] = False,
    lines: Annotated[int, typer.Option("--lines", "-n", help="lines of each log to show first")] = 20,
) -> None:
    """The roles' logs, each line prefixed with its role in a colour of its own."""
    stack = _stack()
    names = [role] if role else [r.name for r in ROLES]
    if role and role not in ROLES_BY_NAME:
        raise typer.BadParameter(f"unknown role {role!r}; roles: {', '.join(ROLES_BY_NAME)}")
    console = Console(highlight=False)
    width = max(len(n) for n in names)
    colour = {n: COLOURS[i % len(COLOURS)] for i, n in enumerate(r.name for r in ROLES)}

    def show(name: str, line: str) -> None:
        console.print(f"[{colour[name]}]{name:<{width}} |[/] ", end="")
        console.print(line, markup=False)

    for name in names:
        for line in stack.tail(name, lines).splitlines():
            show(name, line)
    if follow:
        try:
            for name, line in stack.follow(names):
                show(name, line)
        except KeyboardInterrupt:
            pass
