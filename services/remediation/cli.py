"""``medic`` remediation commands: a typer sub-app (``medic remediation ...``) and ``medic approve``.

The lead mounts them in services/cli.py::

    from services.remediation.cli import app as remediation_app, approve, reject
    app.add_typer(remediation_app, name="remediation")
    app.command("approve")(approve)
    app.command("reject")(reject)
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from services.core.settings import Settings
from services.remediation.config import RemediationSettings
from services.remediation.errors import ApprovalError
from services.remediation.executor import Executor

app = typer.Typer(help="Remediation runs, approvals and recovery.", no_args_is_help=True)


def _executor() -> Executor:
    from services.celery_app import configure
    from services.remediation.runtime import build_executor
    from services.remediation.tasks import CeleryDispatcher

    settings = Settings()
    configure(settings)
    return build_executor(settings, RemediationSettings(), CeleryDispatcher())


@app.command("approve")
def approve(
    run_id: str,
    approver: Annotated[str, typer.Option(help="Who approves (recorded in the audit log).")] = "",
    comment: Annotated[str, typer.Option(help="Why.")] = "",
) -> None:
    """Approve a level-2 run waiting for approval; it starts at once."""
    _decide(run_id, True, approver, comment)


@app.command("reject")
def reject(
    run_id: str,
    approver: Annotated[str, typer.Option(help="Who rejects (recorded in the audit log).")] = "",
    comment: Annotated[str, typer.Option(help="Why.")] = "",
) -> None:
    """Reject a level-2 run waiting for approval; it never acts."""
    _decide(run_id, False, approver, comment)


def _decide(run_id: str, ok: bool, approver: str, comment: str) -> None:
    import getpass

    ex = _executor()
    who = approver or getpass.getuser()
    try:
        run = (ex.approve if ok else ex.reject)(run_id, approver=who, channel="cli", comment=comment)
    except ApprovalError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(json.dumps({"run_id": run.run_id, "status": run.status, "approver": who}))


@app.command("runs")
def runs(status: Annotated[str, typer.Option(help="Only runs with this status.")] = "") -> None:
    """List recent runs as JSON lines."""
    for run in _executor().store.list_runs(status or None):
        typer.echo(
            json.dumps({k: v for k, v in run.model_dump(mode="json").items() if k not in ("plan", "rollback_plan")})
        )


@app.command("recover")
def recover() -> None:
    """Resume or fail runs whose worker died, and expire overdue approvals (what workers do on start)."""
    typer.echo(json.dumps({"recovered": _executor().recover()}))


@app.command("kill-switch")
def kill_switch(
    state: Annotated[str, typer.Argument(help="on, off or status.")] = "status",
    by: Annotated[str, typer.Option("--by", help="Who flips it (recorded; default: the OS user).")] = "",
    reason: Annotated[str, typer.Option(help="Why (shown in every run it blocks).")] = "",
) -> None:
    """Stop (on) or allow (off) every remediation at once, on every worker.

    Once `on` returns, no run starts and no action begins anywhere; running runs stop before their
    next action and roll back what they did (rollbacks still run). Stored in Postgres, read in the
    same transaction that starts a run (docs/security.md).
    """
    import getpass

    if state not in ("on", "off", "status"):
        typer.echo("error: give on, off or status", err=True)
        raise typer.Exit(2)
    from services.remediation.store import RunStore

    store = RunStore(Settings())
    try:
        if state != "status":
            store.set_kill_switch(state == "on", set_by=by or getpass.getuser(), reason=reason)
        ks = store.kill_switch()
    finally:
        store.close()
    typer.echo(json.dumps({"kill_switch": "on" if ks else "off", **(ks.model_dump() if ks else {})}))
