"""``medic sim`` commands (a typer sub-app the main CLI mounts)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from services.core.settings import Settings
from services.simulator import runner

app = typer.Typer(help="Stochastic GPU inference-cluster simulator.", no_args_is_help=True)


@app.command("run")
def run_cmd(
    scenario: str = typer.Option("default", help="shipped scenario name or YAML path"),
    seed: int = typer.Option(0, help="episode seed"),
    speed: float = typer.Option(0.0, help="simulated seconds per wall second (0: as fast as possible)"),
    sink: str = typer.Option("stdout", help="stdout, null, hash, file:PATH, prometheus[:PORT], loki:URL, kafka"),
    duration: float = typer.Option(None, help="simulated seconds (default: the scenario's)"),
    policy: str = typer.Option("noop", help="noop, static or autoscaler"),
    trajectory: str = typer.Option("", help="save step records here for 'sim grade'"),
) -> None:
    """Run an episode, stream telemetry to the sink, print the grade on stderr."""
    grade = runner.run(
        scenario, seed, speed, sink, duration, Settings(), policy, Path(trajectory) if trajectory else None
    )
    typer.echo(grade.to_json(), err=True)


@app.command("scenarios")
def scenarios_cmd() -> None:
    """List shipped scenarios."""
    for name in runner.list_scenarios():
        typer.echo(name)


@app.command("grade")
def grade_cmd(trajectory: Path, scenario: str = typer.Option("default", help="scenario whose SLOs apply")) -> None:
    """Grade a saved trajectory."""
    typer.echo(json.dumps(runner.grade(trajectory, scenario).model_dump(), sort_keys=True))
