"""``medic``: the ClusterMedic command line.

Each command builds one Settings object from the environment and passes it down.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from services.celery_app import QUEUES
from services.core.errors import ClusterMedicError
from services.core.paths import REPO_ROOT
from services.core.settings import Settings
from services.diagnostician import cli as diag_cli
from services.ingest import cli as ingest_cli
from services.remediation import cli as remediation_cli
from services.simulator import cli as sim_cli

app = typer.Typer(help="ClusterMedic: autonomous SRE for LLM inference clusters.", no_args_is_help=True)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
topics_app = typer.Typer(help="Kafka topics.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(topics_app, name="topics")
detect_app = typer.Typer(help="Anomaly detectors: train, list models.", no_args_is_help=True)
app.add_typer(detect_app, name="detect")
app.add_typer(sim_cli.app, name="sim", help="The GPU inference-cluster simulator.")
app.add_typer(ingest_cli.app, name="ingest", help="Receivers and watchers that feed the telemetry topics.")
app.add_typer(remediation_cli.app, name="remediation", help="Remediation runs, playbooks and policy.")
app.add_typer(diag_cli.app, name="kb", help="Knowledge base: index, search; diagnose an incident.")
app.command("diagnose", help="Diagnose an incident with the offline ranker or the configured LLM.")(
    diag_cli.diagnose_cmd
)
eval_app = typer.Typer(help="Evaluations on seeded simulator scenarios.", no_args_is_help=True)
eval_app.command("diagnose", help="Top-1/top-3 root-cause accuracy and latency of the diagnostician.")(
    diag_cli.eval_cmd
)
app.add_typer(eval_app, name="eval")
app.command("approve")(remediation_cli.approve)
app.command("reject")(remediation_cli.reject)
silences_app = typer.Typer(help="Silences: mute matching alerts for a while.", no_args_is_help=True)
app.add_typer(silences_app, name="silences")
incidents_app = typer.Typer(help="Incidents the correlate role opened.", no_args_is_help=True)
app.add_typer(incidents_app, name="incidents")
api_app = typer.Typer(help="The HTTP API (incidents, silences).", no_args_is_help=True)
app.add_typer(api_app, name="api")

console = Console(stderr=True)
INFRA = REPO_ROOT / "infra" / "local"
COMPONENTS = ("kafka", "postgres", "redis")


def _settings() -> Settings:
    settings = Settings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.log_level.upper() != "DEBUG":
        # the Kafka clients and Faust narrate every connection at INFO; keep their warnings only
        for noisy in ("kafka", "aiokafka", "faust", "mode"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    return settings


def _infra(action: str, components: tuple[str, ...]) -> int:
    failed = 0
    for component in components:
        rc = subprocess.call(["bash", str(INFRA / f"{component}.sh"), action], cwd=REPO_ROOT)
        failed += rc != 0
    return failed


@app.command()
def up() -> None:
    """Start the local Kafka, PostgreSQL+pgvector and Redis (idempotent), then migrate and create topics."""
    if _infra("start", COMPONENTS):
        raise typer.Exit(1)
    migrate()
    create_topics()


@app.command()
def down() -> None:
    """Stop exactly the local processes `up` started (by their PID files)."""
    raise typer.Exit(1 if _infra("stop", tuple(reversed(COMPONENTS))) else 0)


@app.command()
def status() -> None:
    """Show whether each local component is running."""
    raise typer.Exit(1 if _infra("status", COMPONENTS) else 0)


@db_app.command("migrate")
def migrate() -> None:
    """Apply pending schema migrations (safe to run any number of times)."""
    from services.store.db import migrate as apply

    applied = apply(_settings())
    console.print(f"[db] applied {', '.join(applied)}" if applied else "[db] schema is up to date")


@topics_app.command("create")
def create_topics() -> None:
    """Create every topic of the architecture with the configured partition count."""
    from services.core.bus import ensure_topics

    created = ensure_topics(_settings())
    console.print(f"[kafka] created {len(created)} topics" if created else "[kafka] topics exist")


@app.command()
def worker(
    queues: Annotated[str, typer.Option(help="Comma-separated queues to consume.")] = ",".join(QUEUES),
    concurrency: Annotated[int, typer.Option(help="Worker processes.")] = 2,
    name: Annotated[str, typer.Option(help="Celery node name.")] = "medic@%h",
) -> None:
    """Run a Celery worker."""
    from services.celery_app import configure

    settings = _settings()
    celery = configure(settings)
    celery.worker_main(
        ["worker", "-Q", queues, "-c", str(concurrency), "-n", name, "--loglevel", settings.log_level.upper()]
    )


@app.command()
def pipeline(
    role: Annotated[str, typer.Option(help="Which agents to run: detect, correlate or smoke.")] = "detect",
    routing: Annotated[str, typer.Option(help="correlate: the routing config.")] = str(
        REPO_ROOT / "infra" / "config" / "routing.yaml"
    ),
) -> None:
    """Run the Faust worker for one role of the stream pipeline."""
    from faust import Worker

    from pipelines.app import create_pipeline
    from pipelines.smoke import register_smoke

    settings = _settings()
    pipe = create_pipeline(settings, app_id=f"{settings.faust_app_id}-{role}", web_enabled=True)
    if role == "detect":
        from pipelines.detect import build_detectors, register_detect

        names = [n.strip() for n in settings.detectors.split(",") if n.strip()]
        register_detect(pipe, build_detectors(settings, names), model_refresh_s=settings.detect_model_refresh_s)
    elif role == "correlate":
        from pipelines.correlate import load_routing
        from pipelines.correlate.agent import register_correlate

        register_correlate(pipe, load_routing(routing))
    elif role == "smoke":

        async def print_event(event: object) -> None:
            print(json.dumps({"topic": type(event).__name__, "event": str(event)}), flush=True)

        register_smoke(pipe, print_event)
    else:
        console.print(f"unknown role {role!r}; known: detect, correlate, smoke")
        raise typer.Exit(2)
    Worker(pipe.app, loglevel=settings.log_level.lower()).execute_from_commandline()


@detect_app.command("train")
def detect_train(
    source: Annotated[str, typer.Option(help="simulator (a fault-free run) or kafka (not yet).")] = "simulator",
    seeds: Annotated[str, typer.Option(help="Simulator seeds, e.g. 1-4 or 1,5,9 (each is another cluster).")] = "1-4",
    duration: Annotated[float, typer.Option(help="Simulated seconds of baseline.")] = 3600.0,
    scenario: Annotated[str, typer.Option(help="Fault-free scenario to run.")] = "baseline",
) -> None:
    """Train the isolation forest and LSTM on a normal baseline and store new model versions."""
    from pipelines.training import simulator_baseline, train_and_store

    settings = _settings()
    if source != "simulator":
        console.print("only --source simulator is implemented so far")
        raise typer.Exit(2)
    seed_list = parse_seeds(seeds)
    console.print(f"[detect] simulating {duration:.0f} s of fault-free '{scenario}' for seeds {seeds}...")
    baseline = simulator_baseline(seed_list, duration, scenario)
    console.print(f"[detect] {baseline.scrapes} scrapes; training...")
    report = train_and_store(
        settings,
        baseline,
        source=f"simulator:{scenario}:seeds={seeds}:{duration:.0f}s",
        contamination=settings.detect_contamination,
    )
    for key, version in sorted(report.versions.items()):
        console.print(f"[detect] stored {key} version {version}")
    console.print(f"[detect] trained in {report.seconds:.1f} s")


@detect_app.command("models")
def detect_models() -> None:
    """List stored detector models, newest first."""
    from services.store.detector_models import list_models

    table = Table(title="Detector models")
    for column in ("detector", "class", "version", "trained at", "threshold", "training"):
        table.add_column(column)
    for m in list_models(_settings()):
        table.add_row(
            m.detector,
            m.entity_class,
            str(m.version),
            m.trained_at.isoformat(timespec="seconds"),
            f"{m.threshold:.4g}" if m.threshold is not None else "",
            json.dumps(m.training),
        )
    Console().print(table)


@silences_app.command("add")
def silences_add(
    matcher: Annotated[
        list[str], typer.Option("--matcher", "-m", help='Label matcher, e.g. alertname="gpu_xid" (repeatable).')
    ],
    duration: Annotated[str, typer.Option(help="How long it mutes: 30m, 2h, 1d...")] = "2h",
    author: Annotated[str, typer.Option(help="Who asks for it (default: your user name).")] = "",
    comment: Annotated[str, typer.Option(help="Why.")] = "",
    starts_in: Annotated[str, typer.Option(help="Start later instead of now: 10m, 1h...")] = "0s",
) -> None:
    """Create a silence; the correlate role applies it within a few seconds."""
    import getpass
    import time

    from pipelines.correlate.durations import parse_duration
    from services.store.db import connect
    from services.store.silences import create_silence

    try:
        start = time.time() + parse_duration(starts_in)
        end = start + parse_duration(duration)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    with connect(_settings()) as conn:
        stored = create_silence(
            conn,
            matchers=matcher,
            starts_at=start,
            ends_at=end,
            created_by=author or getpass.getuser(),
            comment=comment,
        )
    print(stored.silence_id)
    until = f"{stored.ends_at:%Y-%m-%d %H:%M:%S %Z}"
    console.print(f"[silences] {stored.silence_id} mutes {', '.join(stored.matchers)} until {until}")


@silences_app.command("list")
def silences_list(
    state: Annotated[str, typer.Option(help="pending, active, expired or all.")] = "all",
) -> None:
    """List silences, newest start first."""
    import time

    from services.store.db import connect
    from services.store.silences import list_silences

    if state not in ("pending", "active", "expired", "all"):
        raise typer.BadParameter(f"state must be pending, active, expired or all, not {state!r}")
    now = time.time()
    with connect(_settings()) as conn:
        rows = list_silences(conn, now=now, state=None if state == "all" else state)  # type: ignore[arg-type]
    table = Table(title="Silences")
    for column in ("id", "state", "matchers", "starts", "ends", "author", "comment"):
        table.add_column(column)
    for s in rows:
        table.add_row(
            s.silence_id,
            s.state(now),
            ", ".join(s.matchers),
            f"{s.starts_at:%Y-%m-%d %H:%M}",
            f"{s.ends_at:%Y-%m-%d %H:%M}",
            s.created_by,
            s.comment,
        )
    Console().print(table)


@silences_app.command("expire")
def silences_expire(silence_id: Annotated[str, typer.Argument(help="The silence id.")]) -> None:
    """End a silence now."""
    import time

    from services.store.db import connect
    from services.store.silences import expire_silence

    with connect(_settings()) as conn:
        stored = expire_silence(conn, silence_id, now=time.time())
    console.print(f"[silences] {stored.silence_id} expired at {stored.ends_at:%Y-%m-%d %H:%M:%S %Z}")


@incidents_app.command("list")
def incidents_list(
    status: Annotated[str | None, typer.Option(help="opened, updated, mitigated or resolved.")] = None,
    limit: Annotated[int, typer.Option(help="Most incidents shown.")] = 50,
) -> None:
    """List incidents, most recently changed first."""
    from services.store.db import connect
    from services.store.incidents import STATUSES, list_incidents

    if status is not None and status not in STATUSES:
        raise typer.BadParameter(f"status must be one of {', '.join(STATUSES)}, not {status!r}")
    with connect(_settings()) as conn:
        rows = list_incidents(conn, status=status, limit=limit)
    table = Table(title="Incidents")
    for column in ("id", "status", "severity", "title", "opened", "updated"):
        table.add_column(column)
    for r in rows:
        table.add_row(
            r.incident_id,
            r.status,
            r.severity,
            r.title,
            f"{r.opened_at:%Y-%m-%d %H:%M:%S}",
            f"{r.updated_at:%Y-%m-%d %H:%M:%S}",
        )
    Console().print(table)


@incidents_app.command("show")
def incidents_show(incident_id: Annotated[str, typer.Argument(help="The incident id.")]) -> None:
    """Show one incident and its linked alerts, each with its evidence."""
    from services.store.db import connect
    from services.store.incidents import get_incident

    with connect(_settings()) as conn:
        row = get_incident(conn, incident_id)
    if row is None:
        console.print(f"[red]no incident {incident_id!r}")
        raise typer.Exit(1)
    out = Console()
    out.print(f"[bold]{row.title}[/bold]  {row.incident_id}")
    out.print(
        f"status {row.status} · severity {row.severity} · opened {row.opened_at:%Y-%m-%d %H:%M:%S} · "
        f"updated {row.updated_at:%Y-%m-%d %H:%M:%S}"
    )
    out.print(", ".join(f"{k}={v}" for k, v in sorted(row.labels.items())))
    table = Table(title=f"{len(row.alerts)} linked alerts")
    for column in ("signal", "entity", "detector", "severity", "status", "since", "evidence"):
        table.add_column(column)
    for a in row.alerts:
        table.add_row(
            a.signal,
            a.entity,
            a.detector,
            a.severity,
            a.status,
            f"{a.starts_at:%Y-%m-%d %H:%M:%S}",
            json.dumps(a.evidence, sort_keys=True)[:200],
        )
    out.print(table)


@api_app.command("serve")
def api_serve(
    host: Annotated[str | None, typer.Option(help="Listen address (default: api_host).")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port (default: api_port).")] = None,
) -> None:
    """Run the HTTP API: incidents, silences, /healthz."""
    import uvicorn

    from services.api.app import create_app

    settings = _settings()
    uvicorn.run(
        create_app(settings),
        host=host or settings.api_host,
        port=port or settings.api_port,
        log_level=settings.log_level.lower(),
    )


@app.command("diagnostician")
def diagnostician_service() -> None:
    """Run the diagnostician: diagnose each opened or updated incident on incidents.v1, store and publish it."""
    from services.diagnostician.service import run

    run(_settings())


@app.command("remediator")
def remediator_service() -> None:
    """Run the remediator: submit each diagnosis on diagnoses.v1 to policy, approvals and the Celery playbooks."""
    from services.celery_app import configure
    from services.remediation.config import RemediationSettings
    from services.remediation.runtime import build_executor
    from services.remediation.service import run
    from services.remediation.tasks import CeleryDispatcher

    settings = _settings()
    configure(settings)
    run(settings, build_executor(settings, RemediationSettings(), CeleryDispatcher()))


@app.command()
def demo() -> None:
    """Send one event of each type through Kafka and the smoke agent; print what arrived."""
    from services.demo import describe, run_smoke

    result = run_smoke(_settings())
    out = Console(width=max(Console().width, 120))
    table = Table(title="One event of each type: publisher -> Kafka -> Faust smoke agent")
    table.add_column("topic", no_wrap=True)
    table.add_column("key", no_wrap=True, max_width=44)
    table.add_column("after", justify="right", no_wrap=True)
    table.add_column("what arrived")
    for event, after in sorted(result.received, key=lambda item: item[1]):
        table.add_row(event.topic, event.key(), f"{after * 1000:.0f} ms", describe(event))
    out.print(table)
    for letter in result.dead_letters:
        out.print(f"dead letter from {letter.source_topic} ({letter.consumer or 'producer'}): {letter.error}")
    if not result.ok:
        console.print("[red]smoke flow FAILED: not every event arrived or the malformed one was not dead-lettered")
        raise typer.Exit(1)
    out.print(f"[green]smoke flow OK: {len(result.received)} events arrived, malformed input dead-lettered")


def parse_seeds(spec: str) -> list[int]:
    """``"1-4"`` -> [1, 2, 3, 4]; ``"1,5,9"`` -> [1, 5, 9]; both forms mix."""
    seeds: list[int] = []
    try:
        for part in spec.split(","):
            low, _, high = part.strip().partition("-")
            seeds.extend(range(int(low), int(high or low) + 1))
    except ValueError:
        raise typer.BadParameter(f"seeds must look like 1-4 or 1,5,9, not {spec!r}") from None
    return seeds


def main() -> None:
    """Console-script entry point: turn ClusterMedic errors into a one-line message and exit 1."""
    try:
        app()
    except ClusterMedicError as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(1)


if __name__ == "__main__":
    main()
