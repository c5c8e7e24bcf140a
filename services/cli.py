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

from services import stack_cli
from services.auth import cli as auth_cli
from services.celery_app import QUEUES
from services.core.errors import ClusterMedicError
from services.core.paths import REPO_ROOT
from services.core.settings import Settings
from services.diagnostician import cli as diag_cli
from services.ingest import cli as ingest_cli
from services.remediation import cli as remediation_cli
from services.reports import cli as reports_cli
from services.simulator import cli as sim_cli

app = typer.Typer(help="ClusterMedic: autonomous SRE for LLM inference clusters.", no_args_is_help=True)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
topics_app = typer.Typer(help="Kafka topics.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(topics_app, name="topics")
detect_app = typer.Typer(help="Anomaly detectors: train, list models, evaluate.", no_args_is_help=True)
app.add_typer(detect_app, name="detect")
app.add_typer(sim_cli.app, name="sim", help="The GPU inference-cluster simulator.")
app.add_typer(stack_cli.app, name="stack", help="Every role as a supervised process: up, down, status, logs.")
app.add_typer(ingest_cli.app, name="ingest", help="Receivers and watchers that feed the telemetry topics.")
app.add_typer(remediation_cli.app, name="remediation", help="Remediation runs, playbooks and policy.")
app.add_typer(auth_cli.app, name="token", help="API tokens: create (shown once), list, revoke.")
app.add_typer(diag_cli.app, name="kb", help="Knowledge base: index, search; diagnose an incident.")
app.command("diagnose", help="Diagnose an incident with the offline ranker or the configured LLM.")(
    diag_cli.diagnose_cmd
)
app.command("report", help="Write an incident's post-incident report (md, html, pdf).")(reports_cli.report_cmd)
eval_app = typer.Typer(help="Evaluations on seeded simulator scenarios and public data sets.", no_args_is_help=True)
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
    beat: Annotated[
        bool, typer.Option(help="Embed Celery beat: send the remediation recovery sweep on a schedule.")
    ] = True,
) -> None:
    """Run a Celery worker (with embedded beat: the recovery sweep runs every recover_interval_s)."""
    from services.celery_app import configure
    from services.remediation.config import RemediationSettings

    settings = _settings()
    celery = configure(settings, recover_interval_s=RemediationSettings().recover_interval_s if beat else None)
    argv = ["worker", "-Q", queues, "-c", str(concurrency), "-n", name, "--loglevel", settings.log_level.upper()]
    if beat:
        # in-memory schedule: every worker may embed beat (duplicate sweeps are harmless), no shelve file to share
        argv += ["--beat", "--scheduler", "celery.beat:Scheduler"]
    celery.worker_main(argv)


@app.command()
def pipeline(
    role: Annotated[str, typer.Option(help="Which agents to run: detect, correlate or smoke.")] = "detect",
    routing: Annotated[str, typer.Option(help="correlate: the routing config (default: routing_config).")] = "",
) -> None:
    """Run the Faust worker for one role of the stream pipeline."""
    from pipelines.app import PipelineWorker, create_pipeline
    from pipelines.smoke import register_smoke

    settings = _settings()
    pipe = create_pipeline(settings, app_id=f"{settings.faust_app_id}-{role}", web_enabled=True)
    if role == "detect":
        from pipelines.detect import build_detectors, register_detect

        names = [n.strip() for n in settings.detectors.split(",") if n.strip()]
        register_detect(pipe, build_detectors(settings, names), model_refresh_s=settings.detect_model_refresh_s)
    elif role == "correlate":
        from pipelines.correlate.agent import CorrelateOptions, register_correlate
        from services.alerting.config import load_routing
        from services.alerting.notification import Notification
        from services.celery_app import configure
        from services.notify.tasks import enqueue

        config = load_routing(routing or settings.routing_config)
        configure(settings)

        def notify(notification: Notification) -> None:
            # one deliver task per notifier config; a receiver without any (Alertmanager's null
            # receiver) sends none
            enqueue(notification, config)

        register_correlate(
            pipe, config, notify=notify, options=CorrelateOptions(clock_rate=settings.correlate_clock_rate)
        )
    elif role == "smoke":

        async def print_event(event: object) -> None:
            print(json.dumps({"topic": type(event).__name__, "event": str(event)}), flush=True)

        register_smoke(pipe, print_event)
    else:
        console.print(f"unknown role {role!r}; known: detect, correlate, smoke")
        raise typer.Exit(2)
    PipelineWorker(pipe.app, role=role, loglevel=settings.log_level.lower()).execute_from_commandline()


@detect_app.command("train")
def detect_train(
    from_kafka: Annotated[
        bool, typer.Option("--from-kafka", help="Train on a time range of telemetry.metrics.v1, not the simulator.")
    ] = False,
    since: Annotated[
        str, typer.Option(help="--from-kafka: start (record time): 6h (ago), UNIX seconds or ISO 8601 (UTC).")
    ] = "6h",
    until: Annotated[str, typer.Option(help="--from-kafka: end, same forms; default now.")] = "now",
    seeds: Annotated[str, typer.Option(help="Simulator seeds, e.g. 1-4 or 1,5,9 (each is another cluster).")] = "1-4",
    duration: Annotated[float, typer.Option(help="Simulated seconds of baseline.")] = 3600.0,
    scenario: Annotated[str, typer.Option(help="Fault-free scenario to run.")] = "baseline",
) -> None:
    """Train the isolation forest and LSTM on a normal baseline and store new model versions."""
    import time

    from pipelines.training import TimeRange, parse_instant, simulator_baseline, train_and_store, train_from_kafka

    settings = _settings()
    if from_kafka:
        now = time.time()
        try:
            span = TimeRange(parse_instant(since, now), parse_instant(until, now))
        except ClusterMedicError as exc:
            raise typer.BadParameter(str(exc)) from None
        described = span.describe()
        console.print(f"[detect] reading metrics written {described['since_iso']} .. {described['until_iso']}...")
        try:
            kafka_report = train_from_kafka(settings, span, contamination=settings.detect_contamination)
        except ClusterMedicError as exc:
            console.print(f"[detect] {exc}")
            raise typer.Exit(1) from None
        if kafka_report is None:
            raise typer.Exit(1)
        report = kafka_report
    else:
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
        console.print(f"[detect] stored {key} version {version} ({report.scrapes} scrapes)")
    console.print(f"[detect] trained in {report.seconds:.1f} s")


@detect_app.command("retrain")
def detect_retrain(
    once: Annotated[bool, typer.Option("--once", help="Retrain once and exit instead of looping.")] = False,
) -> None:
    """Retrain on a schedule from recent metrics judged normal; detect workers hot-swap the new versions.

    Every CLUSTERMEDIC_DETECT_RETRAIN_INTERVAL_S it reads the last ..._LOOKBACK_S of telemetry.metrics.v1,
    leaves out the windows that overlapped anomalies or incidents, trains and stores version N+1.
    """
    import time

    from pipelines.training import retrain_once

    settings = _settings()
    while True:
        report = retrain_once(
            settings,
            lookback_s=settings.detect_retrain_lookback_s,
            margin_s=settings.detect_retrain_margin_s,
            window_s=settings.detect_retrain_window_s,
            min_scrapes=settings.detect_retrain_min_scrapes,
            contamination=settings.detect_contamination,
        )
        if report is not None:
            stored = ", ".join(f"{key} v{version}" for key, version in sorted(report.versions.items()))
            console.print(f"[detect] retrained on {report.scrapes} scrapes in {report.seconds:.1f} s: {stored}")
        if once:
            return
        time.sleep(settings.detect_retrain_interval_s)  # the schedule itself, not a synchronisation


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


@detect_app.command("signals")
def detect_signals() -> None:
    """Print every anomaly signal the registered detectors declare, with the detectors that emit it, and
    check the runbooks of the knowledge folder against them (exit 1 when one names a signal nothing emits)."""
    print(json.dumps(signal_catalog_checked(_settings()), indent=2))


def signal_catalog_checked(settings: Settings) -> dict[str, list[str]]:
    """The detectors' signal catalog, after checking the configured runbooks against it.

    The diagnostician (a service) cannot ask the detectors (the pipeline) which signals exist, so the
    entrypoints that start it check its runbooks here.

    Raises:
        typer.Exit: a runbook is invalid or names a signal no detector emits (the message names them).
    """
    from pipelines.detectors.registry import signal_catalog
    from services.diagnostician.documents import default_knowledge_dir
    from services.diagnostician.runbooks import check_anomaly_signals, load_runbooks

    catalog = signal_catalog()
    try:
        check_anomaly_signals(load_runbooks((settings.kb_dir or default_knowledge_dir()) / "runbooks"), catalog)
    except ClusterMedicError as exc:
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True)
        raise typer.Exit(1) from exc
    return {signal: list(detectors) for signal, detectors in catalog.items()}


@detect_app.command("evaluate")
def detect_evaluate(
    seeds: Annotated[str, typer.Option(help="Simulator seeds, e.g. 1-10 or 1,5,9.")] = "1-5",
    scenario: Annotated[str, typer.Option(help="Evaluate one shipped scenario instead of --all-faults.")] = "",
    all_faults: Annotated[
        bool, typer.Option("--all-faults", help="Every shipped fault scenario plus fault-free runs (the default).")
    ] = False,
    duration: Annotated[
        float | None, typer.Option(help="Simulated seconds per run (default: each scenario's own).")
    ] = None,
    fault_free_duration: Annotated[float, typer.Option(help="Simulated seconds of each fault-free run.")] = 3600.0,
    within: Annotated[float, typer.Option(help="A detection counts within this many seconds of onset.")] = 60.0,
    models: Annotated[
        str, typer.Option(help="stored: the newest stored models, as the detect role; none: no learned models.")
    ] = "stored",
) -> None:
    """Detection rate, delay and right-entity rate per fault type, and false positives on fault-free runs.

    Runs the detect role's own objects (evals.detect.OfflineDetect) over seeded simulator scenarios;
    prints a table on stderr and the JSON summary on stdout.
    """
    from evals.detect import FAULT_FREE_SCENARIO, ScenarioResult, evaluate, fault_scenarios, summarise
    from pipelines.detect import DetectorSet, build_detectors
    from pipelines.detectors.registry import DETECTORS

    settings = _settings()
    if scenario and all_faults:
        raise typer.BadParameter("give --scenario NAME or --all-faults, not both")
    if models not in ("stored", "none"):
        raise typer.BadParameter(f"--models must be stored or none, not {models!r}")
    scenarios = [scenario] if scenario else [*fault_scenarios(), FAULT_FREE_SCENARIO]
    names = [n.strip() for n in settings.detectors.split(",") if n.strip()] or DETECTORS.names()
    if models == "stored":
        detectors = build_detectors(settings, names)
    else:
        detectors = DetectorSet.of([DETECTORS.load(name)() for name in names])
    seed_list = parse_seeds(seeds)
    console.print(f"evaluate: {len(scenarios)} scenario(s) x {len(seed_list)} seed(s), models={models}...")

    def progress(result: ScenarioResult) -> None:
        found = ", ".join(f"{f.fault_type} {f.delay_s if f.delay_s is not None else 'missed'}" for f in result.faults)
        console.print(f"evaluate: {result.scenario} seed {result.seed}: {found or 'fault-free'}")

    results = evaluate(
        scenarios,
        seed_list,
        detectors,
        duration_s=duration,
        fault_free_duration_s=fault_free_duration,
        within_s=within,
        progress=progress,
    )
    summary = summarise(results, within_s=within)
    summary["models"] = models if models == "none" else detectors.versions
    table = Table(title=f"Detection within {within:.0f} s of onset")
    for column in ("fault type", "detected", "rate", "delay p50 s", "delay max s", "right entity", "first signals"):
        table.add_column(column)
    for fault_type, row in summary["fault_types"].items():
        table.add_row(
            fault_type,
            f"{row['detected_within']}/{row['faults']}",
            f"{row['detection_rate']:.2f}",
            "" if row["delay_p50_s"] is None else f"{row['delay_p50_s']:.0f}",
            "" if row["delay_max_s"] is None else f"{row['delay_max_s']:.0f}",
            "" if row["right_entity_rate"] is None else f"{row['right_entity_rate']:.2f}",
            ", ".join(row["first_signals"]),
        )
    console.print(table)
    quiet = summary["fault_free"]
    if quiet["runs"]:
        console.print(
            f"evaluate: fault-free: {quiet['anomalies']} anomalies in {quiet['entity_hours']} entity-hours = "
            f"{quiet['false_positives_per_entity_hour']} per entity-hour; noisiest entity "
            f"{quiet['max_per_entity_hour']} per hour"
        )
    for run, breach in quiet["overloaded_runs"].items():
        console.print(
            f"evaluate: {run} had no planted fault but failed {breach['failed_share']:.2%} of its requests "
            f"(over its availability SLO): {breach['anomalies']} anomalies, counted as true alarms"
        )
    print(json.dumps(summary, indent=2))


@silences_app.command("add")
def silences_add(
    matcher: Annotated[
        list[str], typer.Option("--matcher", "-m", help='Label matcher, e.g. alertname="gpu_xid" (repeatable).')
    ],
    duration: Annotated[str, typer.Option(help="How long it mutes: 30m, 2h, 1d...")] = "2h",
    author: Annotated[str, typer.Option(help="Who asks for it (default: your user name).")] = "",
    comment: Annotated[str, typer.Option(help="Why.")] = "",
    starts_in: Annotated[str, typer.Option(help="Start later instead of now: 10m, 1h...")] = "0s",
    mute_all: Annotated[
        bool, typer.Option("--all", help='Confirm a silence that mutes every alert (e.g. alertname=~".+").')
    ] = False,
) -> None:
    """Create a silence; the correlate role applies it within a few seconds.

    A silence whose matchers every alert satisfies is refused without --all; with it, the comment
    records who confirmed it.
    """
    import getpass
    import time

    from services.alerting.durations import parse_duration
    from services.alerting.errors import SilenceError
    from services.store.db import connect
    from services.store.silences import create_silence

    try:
        start = time.time() + parse_duration(starts_in)
        end = start + parse_duration(duration)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        with connect(_settings()) as conn:
            stored = create_silence(
                conn,
                matchers=matcher,
                starts_at=start,
                ends_at=end,
                created_by=author or getpass.getuser(),
                comment=comment,
                allow_all=mute_all,
                via="cli",
            )
    except SilenceError as exc:
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True, markup=True, highlight=False)
        raise typer.Exit(1) from exc
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
    insecure: Annotated[
        bool,
        typer.Option("--insecure", help="Start on a non-loopback address before any token exists (routes need one)."),
    ] = False,
) -> None:
    """Run the HTTP API: incidents, silences, runs, tokens, the audit log, /healthz, /metrics.

    Every route but /healthz, /metrics and the Slack button needs a token (`medic token create`).
    It listens on loopback by default; a non-loopback address needs CLUSTERMEDIC_API_TOKEN or a
    stored token, or --insecure (a warning, and clustermedic_insecure_listener{role="api"} 1 on /metrics).
    """
    import uvicorn

    from services.api.app import create_app
    from services.auth.http import check_api_listener
    from services.core.exposure import UnsafeListener

    settings = _settings()
    host, port = host or settings.api_host, port or settings.api_port
    try:
        listener = check_api_listener(settings, host, port, insecure=insecure)
    except UnsafeListener as exc:
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True)
        raise typer.Exit(2) from exc
    uvicorn.run(create_app(settings, listener=listener), host=host, port=port, log_level=settings.log_level.lower())


@app.command("diagnostician")
def diagnostician_service() -> None:
    """Run the diagnostician: diagnose each opened or updated incident on incidents.v1, store and publish it."""
    from services.diagnostician.service import run

    settings = _settings()
    signal_catalog_checked(settings)  # a runbook naming a signal nothing emits would never match
    run(settings)


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


@app.command("notifier")
def notifier_service(
    routing: Annotated[str, typer.Option(help="The routing config (receivers, route tree).")] = str(
        REPO_ROOT / "infra" / "config" / "routing.yaml"
    ),
) -> None:
    """Run the notifier: diagnoses and remediation runs on their topics reach humans (Slack, PagerDuty, webhooks)."""
    from services.alerting.config import load_routing
    from services.celery_app import configure
    from services.notify.service import run

    settings = _settings()
    config = load_routing(routing)
    configure(settings)
    run(settings, config)


@app.command()
def demo(
    smoke: Annotated[bool, typer.Option("--smoke", help="Only send one event of each type through Kafka.")] = False,
    scenario: Annotated[str, typer.Option(help="Simulator scenario of the closed loop.")] = "demo",
    seed: Annotated[int, typer.Option(help="Its seed.")] = 1,
    speed: Annotated[float, typer.Option(help="Simulated seconds per wall second.")] = 30.0,
    approve: Annotated[bool, typer.Option(help="Approve level-2 runs through the API, as on-call would.")] = True,
) -> None:
    """ClusterMedic heals a simulated cluster: every role, a real Prometheus, the live view, a summary."""
    if smoke:
        _smoke()
        return
    from services.demo.loop import DemoConfig, run_demo

    out = Console(width=max(Console().width, 140))
    try:
        result = run_demo(_settings(), DemoConfig(scenario=scenario, seed=seed, speed=speed, approve=approve), out)
    except ClusterMedicError as exc:
        console.print(f"[red]demo failed: {exc}")
        raise typer.Exit(1) from exc
    rows = result.rows
    table = Table(title=f"{scenario} (seed {seed}, {speed:g}x): what ClusterMedic did")
    for column in ("fault", "entity", "detected after", "root cause found", "action", "recovered after", "SLO impact"):
        table.add_column(column)
    for r in rows:
        recovered = f"{r.recovered_after_s:.0f} s" if r.mitigated else "NO"
        recovered = "paged" if r.recovered_after_s == -1.0 else recovered
        detected = f"{r.detected_after_s:.0f} s" if r.detected_after_s is not None else "not detected"
        table.add_row(r.fault, r.entity[:30], detected, r.root_cause, r.action, recovered, r.slo_impact)
    out.print(table)
    for r in rows:
        report = result.reports.get(r.incident_id)
        if report is not None:
            out.print(f"post-incident report of {r.fault}: {report}")
    out.print("summary: .run/demo/summary.json; logs: .run/demo/logs/ and .run/demo/stack/logs/")
    if not all(r.mitigated for r in rows):
        console.print("[red]not every fault was mitigated")
        raise typer.Exit(1)
    out.print("[green]every fault was mitigated (or handed to a human at level 3)")


def _smoke() -> None:
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


@eval_app.command("loop")
def eval_loop(
    seeds: Annotated[str, typer.Option(help="Seeds: A-B, or a comma list.")] = "1-5",
    scenario: Annotated[str | None, typer.Option(help="One scenario (default: one per fault type).")] = None,
    speed: Annotated[float, typer.Option(help="0: as fast as the simulator goes (the only mode in process).")] = 0.0,
) -> None:
    """The closed loop (detect, correlate, diagnose, remediate) against the simulator, beside its baselines.

    The scorecard is JSON on stdout and a table on stderr; one progress line per seed and scenario on
    stderr (docs/evaluation.md).
    """
    if speed != 0:
        console.print("--speed must be 0 in process; a paced run is `medic sim serve --speed X` with `medic stack up`")
        raise typer.Exit(2)
    from evals.loop import evaluate, render_table, scorecard

    settings = _settings()
    for chatty in ("httpx", "drain3"):  # one line per in-process call would bury the progress lines
        logging.getLogger(chatty).setLevel(logging.WARNING)
    try:
        episodes = evaluate(settings, parse_seeds(seeds), scenario=scenario)
    except ClusterMedicError as exc:
        console.print(f"[red]{exc}")
        raise typer.Exit(1) from exc
    card = scorecard(episodes)
    console.print(render_table(card))
    sys.stdout.write(json.dumps(card, indent=2, sort_keys=True) + "\n")


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
