"""``medic demo``: ClusterMedic heals a simulated cluster, end to end, through its production paths.

What runs (every process is started here and stopped at the end, by PID):

* ``medic sim serve``: the cluster (the ``demo`` scenario: an XID 79 GPU loss, KV-cache exhaustion
  under a burst, a bad rollout, rising ECC errors) at ``--speed`` simulated seconds per wall second;
* ``medic ingest scrape`` reading the simulator's ``/metrics``, stamped with simulated time, into Kafka;
* a real Prometheus (``infra/local/prometheus.sh``) scraping the same ``/metrics``, for PromQL while the
  demo runs. It stamps samples with its own (wall) time and does not feed ClusterMedic: Prometheus'
  remote_write sends only samples newer than its own start, and its TSDB refuses samples an hour
  older than its newest, so simulated time running 30 times faster than the wall clock cannot pass
  through it (at ``--speed 1`` it could; see docs/demo.md);
* ``medic ingest watch-k8s`` following the simulator's Kubernetes events API;
* ``medic stack``: ingest, detect, correlate, diagnostician, remediator, worker, API (every role of
  production), with the remediation actuator pointed at the simulator's control API;
* a local Slack and PagerDuty stand-in (:mod:`services.notify.standin`) as the routing tree's receivers.

While it runs, :class:`~services.demo.view.LiveView` follows the topics and the simulator. A run that
waits for approval is approved through the API after a visible pause, as an on-call engineer would,
with an operator token named ``demo-oncall`` made in the run's database as ``medic token create``
makes one (the API records that name as the approver); a level-3 run pages the PagerDuty stand-in.
The demo ends with one row per planted fault and fails (exit status 1) when any fault was not
mitigated.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import yaml

from services.core.errors import ClusterMedicError, ConfigError
from services.core.paths import REPO_ROOT
from services.core.settings import Settings
from services.notify.standin import PAGERDUTY, ROUTING_KEY, SLACK_WEBHOOK, WEBHOOK, VendorServer
from services.stack import ROLES, Stack

log = logging.getLogger(__name__)

SCRAPE_INTERVAL_SIM_S = 15.0  # a DCGM exporter's usual scrape interval, in simulated seconds
APPROVAL_PAUSE_S = 8.0  # wall seconds the demo "thinks" before it approves a level-2 run
ONCALL = "demo-oncall"  # the operator token the demo approves with: the approver every approval records


@dataclass
class DemoConfig:
    """What to run.

    Attributes:
        scenario: the simulator scenario (default ``demo``).
        seed: its seed.
        speed: simulated seconds per wall second.
        run_dir: where configuration, logs and state go (default ``.run/demo``).
        approve: approve level-2 runs through the API (as a human would, after a pause).
        timeout_s: wall seconds the whole run may take once the stack is up.
        on_tick: called about twice a second while the cluster runs, with the stack and the view
            (tests use it to kill a role mid-run).
    """

    scenario: str = "demo"
    seed: int = 1
    speed: float = 30.0
    run_dir: Path = field(default_factory=lambda: REPO_ROOT / ".run" / "demo")
    approve: bool = True
    timeout_s: float = 600.0
    on_tick: Callable[[Stack, Any], None] | None = None


@dataclass
class DemoResult:
    """What one demo run did.

    Attributes:
        rows: one per planted fault (the summary table).
        database_url: the run's own database (incidents, diagnoses, runs, steps, audit), kept after it.
        actions: the simulator's record of every action request (``GET /actions``), oldest first.
        topic_prefix: the run's topics (deleted by the next run, as its database is dropped).
        reports: each fault incident's post-incident report (HTML), by incident id.
    """

    rows: list[FaultRow]
    database_url: str
    actions: list[dict[str, Any]]
    topic_prefix: str = ""
    reports: dict[str, Path] = field(default_factory=dict)


@dataclass
class Ports:
    """The loopback ports of one demo run (free ones, so a developer's own services are left alone)."""

    sim: int
    ingest: int
    api: int
    prometheus: int
    faust_detect: int
    faust_correlate: int

    @classmethod
    def pick(cls) -> Ports:
        """Free ports, one each."""
        socks = [socket.socket() for _ in range(6)]
        try:
            for s in socks:
                s.bind(("127.0.0.1", 0))
            return cls(*(int(s.getsockname()[1]) for s in socks))
        finally:
            for s in socks:
                s.close()


@dataclass
class Processes:
    """Processes this demo started, stopped in reverse order."""

    started: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def start(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        """Start one process with its output in ``log``."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.started.append((name, proc))
        return proc

    def stop(self) -> None:
        """Terminate each (kill after 15 s), last started first."""
        for _, proc in reversed(self.started):
            if proc.poll() is None:
                proc.terminate()
        for _, proc in reversed(self.started):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.started.clear()

    def dead(self) -> list[str]:
        """Names of the processes that exited on their own."""
        return [name for name, proc in self.started if proc.poll() is not None]


def demo_env(
    settings: Settings, ports: Ports, tokens: dict[str, str], files: dict[str, Path], speed: float
) -> dict[str, str]:
    """The environment every process of the demo shares: its ports, tokens, topics and configuration files.

    The run has topics, consumer groups and a Redis database of its own, so it neither reads what an
    earlier run left nor hands a task to a developer's own worker.
    """
    env = dict(os.environ)
    env.update(
        {
            "CLUSTERMEDIC_TOPIC_PREFIX": settings.topic_prefix,
            "CLUSTERMEDIC_FAUST_APP_ID": f"{settings.topic_prefix.strip('.').replace('.', '-')}",
            "CLUSTERMEDIC_REDIS_URL": settings.broker_url.rsplit("/", 1)[0] + "/5",
            "CLUSTERMEDIC_INGEST_PORT": str(ports.ingest),
            "CLUSTERMEDIC_API_PORT": str(ports.api),
            "CLUSTERMEDIC_INGEST_TOKEN": tokens["ingest"],
            "CLUSTERMEDIC_SIM_TOKEN": tokens["sim"],
            "CLUSTERMEDIC_FAUST_WEB_PORT": str(ports.faust_detect),
            "CLUSTERMEDIC_REMEDIATION_CONFIG": str(files["remediation"]),
            "CLUSTERMEDIC_ROUTING_CONFIG": str(files["routing"]),
            # the correlate clock runs at the simulation's pace between two anomalies
            "CLUSTERMEDIC_CORRELATE_CLOCK_RATE": str(speed),
            "CLUSTERMEDIC_INGEST_K8S_KUBECONFIG": str(files["kubeconfig"]),
            "CLUSTERMEDIC_NOTIFY_PAGERDUTY_URL": files["pagerduty_url"].read_text().strip(),
            "CLUSTERMEDIC_KAFKA_PORT": str(settings.kafka_port),
            "CLUSTERMEDIC_REDIS_PORT": str(settings.redis_port),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if settings.database_url:
        env["CLUSTERMEDIC_DATABASE_URL"] = settings.database_url
    return env


def write_configs(run_dir: Path, ports: Ports, vendor_url: str, speed: float) -> dict[str, Path]:
    """Routing (receivers at the stand-in), remediation (actuator at the simulator), Prometheus."""
    secrets_dir = run_dir / "secrets"
    secrets_dir.mkdir(parents=True, exist_ok=True)
    (secrets_dir / "slack-webhook").write_text(vendor_url + SLACK_WEBHOOK)
    (secrets_dir / "pagerduty-routing-key").write_text(ROUTING_KEY)
    pagerduty_url = secrets_dir / "pagerduty-url"
    pagerduty_url.write_text(vendor_url + PAGERDUTY)

    routing = yaml.safe_load((REPO_ROOT / "infra" / "config" / "routing.yaml").read_text())
    for receiver in routing["receivers"]:
        for slack in receiver.get("slack_configs", []):
            slack["api_url_file"] = str(secrets_dir / "slack-webhook")
        for pager in receiver.get("pagerduty_configs", []):
            pager["routing_key_file"] = str(secrets_dir / "pagerduty-routing-key")
            pager["url"] = vendor_url + PAGERDUTY
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = vendor_url + WEBHOOK
    routing_path = run_dir / "routing.yaml"
    routing_path.write_text(yaml.safe_dump(routing, sort_keys=False))

    remediation = yaml.safe_load((REPO_ROOT / "infra" / "config" / "remediation.yaml").read_text())
    remediation["actuator"] = {
        "kind": "simulator",
        "url": f"http://127.0.0.1:{ports.sim}",
        "time_scale": 1.0 / speed,  # wall seconds per simulated second between verifications
        "timeout_s": 10,
    }
    # the executor runs on the simulation's clock: cooldowns, breaker and approval TTL in simulated time
    remediation.setdefault("execution", {})["clock"] = "world"
    remediation_path = run_dir / "remediation.yaml"
    remediation_path.write_text(yaml.safe_dump(remediation, sort_keys=False))

    interval_ms = scrape_interval_ms(speed)
    prometheus = {
        "global": {"scrape_interval": f"{interval_ms}ms", "external_labels": {"cluster": "demo"}},
        "scrape_configs": [
            {
                "job_name": "simulated-cluster",
                "honor_labels": True,
                # wall time: simulated time (hours behind the wall clock at 30x) would be refused as too old
                "honor_timestamps": False,
                "scrape_interval": f"{interval_ms}ms",
                "scrape_timeout": f"{interval_ms}ms",
                "static_configs": [{"targets": [f"127.0.0.1:{ports.sim}"]}],
            }
        ],
    }
    prometheus_path = run_dir / "prometheus.yml"
    prometheus_path.write_text(yaml.safe_dump(prometheus, sort_keys=False))
    return {
        "routing": routing_path,
        "remediation": remediation_path,
        "prometheus": prometheus_path,
        "kubeconfig": run_dir / "kubeconfig",
        "pagerduty_url": pagerduty_url,
        "secrets": secrets_dir,
    }


def scrape_interval_ms(speed: float) -> int:
    """Wall milliseconds between scrapes that make :data:`SCRAPE_INTERVAL_SIM_S` simulated seconds."""
    return max(100, round(SCRAPE_INTERVAL_SIM_S / speed * 1000))


def _wait_http(url: str, timeout_s: float, what: str, alive: Callable[[], bool]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise ConfigError(f"{what} exited while starting")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        time.sleep(0.3)
    raise ConfigError(f"{what} did not answer {url} within {timeout_s:.0f} s")


@contextlib.contextmanager
def running_demo(
    settings: Settings, config: DemoConfig, say: Callable[[str], None]
) -> Iterator[tuple[Ports, dict[str, str], VendorServer, Stack]]:
    """Start every process of the demo; stop them all on the way out, whatever happened."""
    run_dir = config.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    ports = Ports.pick()
    tokens = {name: secrets.token_hex(16) for name in ("ingest", "sim")}
    tokens["oncall"] = oncall_token(settings)
    vendor = VendorServer().start()
    files = write_configs(run_dir, ports, vendor.url, config.speed)
    (files["secrets"] / "ingest-token").write_text(tokens["ingest"])
    env = demo_env(settings, ports, tokens, files, config.speed)
    procs = Processes()
    stack = Stack(
        settings.model_copy(update={"ingest_port": ports.ingest, "api_port": ports.api}),
        run_dir=run_dir,
        env=env,
        # the demo follows the simulator's events API itself (below), through the kubeconfig sim serve writes:
        # an events role would watch whatever cluster the shell's CLUSTERMEDIC_INGEST_K8S_KUBECONFIG names
        roles=tuple(r for r in ROLES if r.name != "events"),
    )
    prometheus_env = {
        **env,
        "CLUSTERMEDIC_PROMETHEUS_PORT": str(ports.prometheus),
        "CLUSTERMEDIC_PROMETHEUS_CONFIG": str(files["prometheus"]),
    }
    prometheus_script = str(REPO_ROOT / "infra" / "local" / "prometheus.sh")
    try:
        say("starting every ClusterMedic role (medic stack up)")
        stack.up(timeout_s=240, say=lambda line: say(f"  {line}"))
        say(f"starting the simulated cluster: {config.scenario} seed {config.seed} at {config.speed:g}x")
        sim = procs.start(
            "sim serve",
            [
                sys.executable, "-m", "services.cli", "sim", "serve",
                "--scenario", config.scenario, "--seed", str(config.seed), "--speed", str(config.speed),
                "--port", str(ports.sim), "--loki-url", f"http://127.0.0.1:{ports.ingest}",
                "--kubeconfig", str(files["kubeconfig"]),
            ],
            env,
            run_dir / "logs" / "sim.log",
        )  # fmt: skip
        _wait_http(f"http://127.0.0.1:{ports.sim}/healthz", 60, "medic sim serve", lambda: sim.poll() is None)
        procs.start(
            "watch-k8s",
            [sys.executable, "-m", "services.cli", "ingest", "watch-k8s"],
            env,
            run_dir / "logs" / "watch-k8s.log",
        )
        procs.start(
            "scrape",
            [
                sys.executable, "-m", "services.cli", "ingest", "scrape",
                "--target", f"http://127.0.0.1:{ports.sim}/metrics", "--job", "simulated-cluster",
                # twice per exporter update, so that no update is missed whatever the phase (repeats are dropped)
                "--interval", f"{scrape_interval_ms(config.speed) / 2000:g}",
            ],
            env,
            run_dir / "logs" / "scrape.log",
        )  # fmt: skip
        say(f"starting Prometheus on http://127.0.0.1:{ports.prometheus}: scraping the simulator for PromQL")
        started = subprocess.run(
            ["bash", prometheus_script, "start"], env=prometheus_env, capture_output=True, text=True, timeout=180
        )
        if started.returncode != 0:
            raise ConfigError(f"Prometheus did not start: {(started.stderr or started.stdout).strip()[-400:]}")
        yield ports, tokens, vendor, stack
    finally:
        procs.stop()
        subprocess.run(["bash", prometheus_script, "stop"], env=prometheus_env, capture_output=True, timeout=60)
        stack.down()
        vendor.stop()


@dataclass
class FaultRow:
    """One planted fault, as the summary shows it."""

    fault: str
    entity: str
    detected_after_s: float | None
    root_cause: str
    action: str
    recovered_after_s: float | None
    slo_impact: str
    incident_id: str = ""  # the fault's own incident (the one holding its earliest alert), "" if none

    @property
    def mitigated(self) -> bool:
        """Whether the fault's symptom went away after an action (or on its own, for a transient fault)."""
        return self.recovered_after_s is not None


def fault_rows(faults: list[dict[str, Any]], view: Any) -> list[FaultRow]:
    """One row per planted fault, from the simulator's records and what the live view saw."""
    rows = []
    for f in faults:
        diagnosis = view.diagnosis_for(f)
        run = view.run_for(f)
        rows.append(
            FaultRow(
                fault=f"{f['type']}" + (f" {f['params'].get('code')}" if f["params"].get("code") else ""),
                entity=str(f["entity"]),
                detected_after_s=view.detected_after(f),
                root_cause=diagnosis,
                action=run,
                recovered_after_s=view.recovered_after(f),
                slo_impact=view.slo_impact(f),
                incident_id=next(iter(view.incidents_of(f)), ""),
            )
        )
    return rows


def write_summary(rows: list[FaultRow], path: Path) -> None:
    """The summary as JSON next to the logs (for the README's screenshots and for tests)."""
    path.write_text(json.dumps([r.__dict__ | {"mitigated": r.mitigated} for r in rows], indent=2) + "\n")


def run_demo(settings: Settings, config: DemoConfig, console: Any) -> DemoResult:
    """Run the closed loop (see the module docstring): one row per planted fault, and where to read more.

    Raises:
        ConfigError: a process would not start, or a role died during the run.
    """
    from rich.live import Live

    from services.core.bus import ensure_topics
    from services.demo.view import LiveView

    if threading.current_thread() is threading.main_thread():
        # a terminated demo (SIGTERM: a CI timeout, kill) stops what it started, as Ctrl-C does
        signal.signal(signal.SIGTERM, _terminated)
    stamp = int(time.time())
    settings = settings.model_copy(
        update={"topic_prefix": f"demo.{stamp}.", "database_url": fresh_database(settings, f"demo_{stamp}")}
    )
    drop_old_demo_topics(settings, keep=settings.topic_prefix)
    ensure_topics(settings)
    say = console.print
    with running_demo(settings, config, lambda line: say(f"[demo] {line}")) as (ports, tokens, vendor, stack):
        view = LiveView(settings).start()
        sim = httpx.Client(
            base_url=f"http://127.0.0.1:{ports.sim}", headers={"Authorization": f"Bearer {tokens['sim']}"}
        )
        api = httpx.Client(
            base_url=f"http://127.0.0.1:{ports.api}", headers={"Authorization": f"Bearer {tokens['oncall']}"}
        )
        approvals: dict[str, float] = {}
        announced: set[str] = set()
        try:
            with Live(view.render(), console=console, refresh_per_second=2, transient=False) as live:
                deadline = time.monotonic() + config.timeout_s
                finished_at: float | None = None
                while time.monotonic() < deadline:
                    state = sim.get("/live").json()
                    view.sim = state
                    view.scores.append((float(state["t"]), float(state.get("score", 1.0))))
                    _answer_runs(view, api, approvals, announced, vendor, config)
                    stopped = [s.name for s in stack.status() if s.state not in ("RUNNING", "STARTING")]
                    if stopped:
                        view.say(f"roles not running: {', '.join(stopped)} (supervisord restarts them)")
                    if state.get("finished"):
                        finished_at = finished_at or time.monotonic()
                        if time.monotonic() - finished_at > 15:  # the last events reach the topics
                            break
                    if config.on_tick is not None:
                        config.on_tick(stack, view)
                    live.update(view.render())
                    time.sleep(0.5)
                live.update(view.render())
            faults = sim.get("/faults").json()
            actions = sim.get("/actions").json()
            view.gpu_node = {uuid: str(gpu["node"]) for uuid, gpu in sim.get("/state").json().get("gpus", {}).items()}
        finally:
            view.stop()
            sim.close()
            api.close()
        rows = fault_rows(faults, view)
        for row, fault in zip(rows, faults, strict=True):
            if row.recovered_after_s is None and view.paged(fault):
                row.recovered_after_s = -1.0  # handed to a human: the level-3 answer
            elif row.recovered_after_s is None and fault.get("resolved_by") == "expired":
                row.action += f"; the fault ended by itself after {fault['resolved_at'] - fault['started_at']:.0f} s"
        write_summary(rows, config.run_dir / "summary.json")
        pages = len(vendor.to(PAGERDUTY))
        say(f"[demo] notifications: {len(vendor.to(SLACK_WEBHOOK))} to Slack, {pages} to PagerDuty")
        reports = write_reports(settings, rows, config.run_dir / "reports", say)
    return DemoResult(rows, str(settings.database_url), actions, settings.topic_prefix, reports)


def write_reports(
    settings: Settings, rows: list[FaultRow], out_dir: Path, say: Callable[[str], None]
) -> dict[str, Path]:
    """The post-incident report (HTML) of each fault's incident, written while its telemetry topics exist.

    The next demo run drops this run's topics, and with them the series the plots read; the database
    stays, so ``medic report`` can write the rest again later, without plots. A report that cannot be
    written is named with the reason and the demo goes on.
    """
    from services.reports.service import render_report

    written: dict[str, Path] = {}
    for incident_id in dict.fromkeys(r.incident_id for r in rows if r.incident_id):
        try:
            written[incident_id] = render_report(settings, incident_id, "html", out_dir).files[0]
        except ClusterMedicError as exc:
            say(f"[demo] no report for {incident_id}: {exc}")
    return written


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _answer_runs(
    view: Any,
    api: httpx.Client,
    approvals: dict[str, float],
    announced: set[str],
    vendor: VendorServer,
    config: DemoConfig,
) -> None:
    """Play the on-call engineer: approve level-2 runs after a pause, note the level-3 pages."""
    now = time.monotonic()
    with view.lock:
        runs = list(view.runs.values())
    for run in runs:
        if run.status == "awaiting_approval" and run.run_id not in approvals and config.approve:
            approvals[run.run_id] = now + APPROVAL_PAUSE_S
            view.say(
                f"{run.playbook} needs approval (level {run.level}): "
                f"the on-call engineer approves it in {APPROVAL_PAUSE_S:.0f} s"
            )
        if run.status == "paged" and run.run_id not in announced:
            announced.add(run.run_id)
            view.say(
                f"level {run.level}: {run.playbook} pages a human; "
                f"the PagerDuty stand-in has {len(vendor.to(PAGERDUTY))} event(s)"
            )
    for run_id, due in list(approvals.items()):
        if due and now >= due:
            with view.lock:
                current = view.runs.get(run_id)
            if current is not None and current.status != "awaiting_approval":
                # withdrawn meanwhile (the diagnosis changed its mind), or already answered
                view.say(f"{run_id} no longer waits for approval ({current.status}): not approved")
                approvals[run_id] = 0.0
                continue
            # the approver is the token's name (demo-oncall), never a field of the body
            answer = api.post(
                f"/api/v1/remediation/runs/{run_id}/approve",
                json={"comment": "approved by make demo after reading the diagnosis"},
            )
            view.say(f"approved {run_id} through the API: HTTP {answer.status_code}")
            approvals[run_id] = 0.0


def oncall_token(settings: Settings) -> str:
    """An operator token named :data:`ONCALL` in the run's own (fresh) database, as ``medic token create`` makes it.

    The demo's API listens on loopback and has no bootstrap token: the demo approves the way an
    on-call engineer would, with a token of their own.
    """
    from services.auth.tokens import Role, create_token
    from services.store.db import connect

    with connect(settings) as conn:
        _, token = create_token(conn, name=ONCALL, role=Role.OPERATOR, created_by="medic demo")
    return token


def drop_old_demo_topics(settings: Settings, keep: str) -> list[str]:
    """Delete the topics of earlier demo runs (``demo.<time>.*`` and their Faust ``demo-<time>-*``).

    Each run has topics of its own; without this, every ``make demo`` left about twenty behind.
    Returns the names deleted. A broker that refuses is no reason to stop the demo: it is logged.
    """
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    faust_keep = keep.strip(".").replace(".", "-") + "-"
    try:
        admin = KafkaAdminClient(bootstrap_servers=settings.bootstrap_servers, request_timeout_ms=10_000)
    except KafkaError:
        return []  # ensure_topics names the problem next
    try:
        old = [
            t
            for t in admin.list_topics()
            if (t.startswith("demo.") and not t.startswith(keep))
            or (t.startswith("demo-") and not t.startswith(faust_keep))
        ]
        if old:
            admin.delete_topics(old, timeout_ms=30_000)
        return old
    except KafkaError as exc:
        log.warning("could not delete earlier demo topics: %s", exc)
        return []
    finally:
        admin.close()


def fresh_database(settings: Settings, name: str) -> str:
    """A new, migrated database for this run on the configured server (older demo databases dropped).

    Guardrails remember past runs (cooldowns, the breaker), so a second demo on the same database
    would find its nodes "remediated a minute ago" by the first. The latest demo's database is kept,
    so its incidents and runs can be read afterwards.
    """
    import psycopg
    from psycopg import sql

    from services.store.db import migrate
    from services.store.embedded import database_url

    server = database_url(settings)
    with psycopg.connect(server, autocommit=True) as conn:
        old = [r[0] for r in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'demo\\_%'").fetchall()]
        for db in old:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    parts = urlsplit(server)
    url = urlunsplit(parts._replace(path=f"/{name}"))
    migrate(settings.model_copy(update={"database_url": url}))
    return url
