"""``medic sim`` commands (a typer sub-app the main CLI mounts)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

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


@app.command("serve")
def serve_cmd(
    scenario: str = typer.Option("default", help="shipped scenario name or YAML path"),
    seed: int = typer.Option(0, help="episode seed"),
    speed: float = typer.Option(1.0, help="simulated seconds per wall second (above 0, at most 1000)"),
    host: str = typer.Option("127.0.0.1", help="listen address of metrics, events and control API"),
    port: int = typer.Option(18080, help="listen port (the remediation actuator's URL names it)"),
    loki_url: str = typer.Option("", help="push logs here, e.g. the ingest receiver http://127.0.0.1:9091"),
    duration: float = typer.Option(None, help="simulated seconds (default: the scenario's)"),
    kubeconfig: Annotated[
        Path | None, typer.Option(help="write a kubeconfig for `medic ingest watch-k8s` here")
    ] = None,
    insecure: bool = typer.Option(False, "--insecure", help="allow a non-loopback address without a token"),
) -> None:
    """Run a simulation against the wall clock and serve it as a cluster: /metrics, Kubernetes events, control API."""
    import signal
    import time

    import uvicorn

    from services.core.errors import ClusterMedicError
    from services.core.exposure import check_listener
    from services.simulator.http import TOKEN_VARIABLE
    from services.simulator.live import LiveSimulation, LogShipper, bind, check_speed, create_live_app, live_epoch
    from services.simulator.live import kubeconfig as kubeconfig_text
    from services.simulator.scenario import load_scenario
    from services.simulator.simulator import Simulator

    settings = Settings()
    try:
        check_speed(speed)
        sc = load_scenario(scenario)
        listener = check_listener(
            "simulator", host, port, token=settings.sim_token, token_variable=TOKEN_VARIABLE, insecure=insecure
        )
        sock = bind(host, port)
    except ClusterMedicError as exc:
        typer.echo(f"medic sim serve: {exc}", err=True)
        raise typer.Exit(2) from exc
    length = sc.duration_s if duration is None else duration
    # simulated time never passes the wall clock: telemetry is stamped as a real cluster's could be
    sim = Simulator(sc, seed=seed, epoch=live_epoch(time.time(), length, speed))
    live = LiveSimulation(sim, speed, duration_s=length)
    if loki_url:
        live.shipper = LogShipper(loki_url, settings.ingest_token, live.stats)
    server_url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    if kubeconfig is not None:
        kubeconfig.write_text(kubeconfig_text(server_url, settings.sim_token))
    typer.echo(
        f"simulating {sc.name} (seed {seed}) at {speed:g}x on {server_url}: /metrics, /api/v1/events, /state, "
        f"/actions; logs {'to ' + live.shipper.url if live.shipper else 'not pushed (no --loki-url)'}",
        err=True,
    )
    live.start()
    server = uvicorn.Server(uvicorn.Config(create_live_app(live, listener), log_level="warning"))

    def leave(signum: int, _frame: object) -> None:
        # uvicorn shuts down gracefully on SIGTERM, then raises it again with the previous handler
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, leave)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        live.stop()
        typer.echo(f"stopped at simulated second {live.now():.0f}: {sim.grade().to_json()}", err=True)
