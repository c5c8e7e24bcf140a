"""``medic stack``: every ClusterMedic role as a supervised process on this machine.

The roles and their commands are listed once, in :data:`ROLES`; ``docker-compose.yml`` and
``infra/k8s/deployments.yaml`` run the same commands (a test compares them). Supervision is
supervisord's (the ``supervisor`` package), not ours: it restarts a role that dies, with a backoff
that grows with each failed start, keeps each role's log, and stops exactly the process groups it
started. What this module adds is the ClusterMedic view of it:

* ``up`` writes ``.run/stack/supervisord.conf``, starts supervisord on a unix socket only the user can
  open, and waits until every role is ready (running for a few seconds, and answering ``/healthz``
  for the HTTP roles). A role that cannot start is named with the last lines of its log, and the
  others are stopped cleanly. A role whose required setting is unset (the events watch without a
  kubeconfig) is not started: ``up`` says so in one line and goes on.
* ``status`` shows each role's state, PID, uptime, restarts and readiness, and why it last exited
  (or why it was skipped).
* ``logs [ROLE]`` prints the logs with a coloured role prefix (``-f`` follows them).
* ``down`` stops the roles and supervisord (by its PID file).

Errors::

    ClusterMedicError
    └── ConfigError
        └── StackError     supervisord would not start, a role would not get ready, no stack running
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import xmlrpc.client
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from services.core.errors import ConfigError
from services.core.paths import REPO_ROOT
from services.core.settings import Settings


class StackError(ConfigError):
    """The stack could not be started, made ready, reached or stopped."""


@dataclass(frozen=True)
class Role:
    """One role of the stack.

    Attributes:
        name: the program name (supervisord's, and the compose service's).
        argv: the ``medic`` arguments that run it; compose and Kubernetes run ``medic`` with the same.
        health: the settings attribute holding its HTTP port when it answers ``/healthz``.
        what: one line for ``status``.
        env: settings this role needs besides the stack's (two Faust workers need two web ports).
        ready_log: a line the role logs once it is ready (Faust's, Celery's, the consumer loop's).
        requires: the settings attribute naming a file the role cannot run without; unset, the stack
            skips the role (``status`` says why) instead of starting one that can only fail.
    """

    name: str
    argv: tuple[str, ...]
    health: str = ""
    what: str = ""
    env: tuple[tuple[str, str], ...] = ()
    ready_log: str = ""
    requires: str = ""


# pipelines.app.PipelineWorker prints "ready: <role> pipeline ..." once its agents run; Celery logs
# "<node> ready."; services.core.consumer logs "ready: <role> consumes <topic>"; the events watch logs
# "ready: events watch follows <server>" once its first list is published.
ROLES: tuple[Role, ...] = (
    Role("ingest", ("ingest", "serve"), "ingest_port", "receivers: remote_write, Loki push, Alertmanager webhook"),
    Role(
        "detect",
        ("pipeline", "--role", "detect"),
        what="Faust detectors: telemetry -> anomalies.v1",
        ready_log="ready: detect pipeline",
    ),
    Role(
        "correlate",
        ("pipeline", "--role", "correlate"),
        what="Faust correlation: anomalies -> incidents.v1",
        env=(("CLUSTERMEDIC_FAUST_WEB_PORT", "16067"),),
        ready_log="ready: correlate pipeline",
    ),
    Role(
        "diagnostician", ("diagnostician",), what="incidents -> diagnoses.v1", ready_log="ready: diagnostician consumes"
    ),
    Role(
        "remediator",
        ("remediator",),
        what="diagnoses -> policy, approvals, playbooks",
        ready_log="ready: remediator consumes",
    ),
    Role("notifier", ("notifier",), what="diagnoses, runs -> Slack, PagerDuty", ready_log="ready: notifier consumes"),
    Role(
        "worker",
        ("worker",),
        what="Celery: playbook steps, verifications, notifications, recovery sweep",
        ready_log=r"celery\.apps\.worker: \S+ ready\.",
    ),
    Role("api", ("api", "serve"), "api_port", "HTTP API: incidents, approvals, silences"),
    # Only with an explicit kubeconfig: the watcher alone would fall back to ~/.kube/config, which on a
    # developer's machine usually names some real cluster that nobody asked this stack to watch.
    Role(
        "events",
        ("ingest", "watch-k8s"),
        what="Kubernetes events watch -> telemetry.events.v1",
        ready_log="ready: events watch follows",
        requires="ingest_k8s_kubeconfig",
    ),
)
ROLES_BY_NAME: dict[str, Role] = {r.name: r for r in ROLES}

# A role counts as started once it has run this long (supervisord's startsecs); a start that dies
# sooner is retried after 1, 2, 3... seconds, this many times, then the role is FATAL.
START_SECS = 3
START_RETRIES = 4
STOP_WAIT_SECS = 15
SKIPPED = "SKIPPED"  # the state ``status`` shows for a role ``up`` did not start


@dataclass(frozen=True)
class RoleStatus:
    """What supervisord and the health check say about one role."""

    name: str
    state: str
    pid: int
    uptime_s: float
    restarts: int
    ready: bool
    last_exit: str

    @property
    def skipped(self) -> bool:
        """Whether ``up`` did not start the role (``last_exit`` says why)."""
        return self.state == SKIPPED


class Stack:
    """The supervised stack of one checkout (its files under ``<run_dir>/stack``).

    Args:
        settings: ports (health checks) and the state directory.
        run_dir: where configuration, socket, PID file and logs go (default ``<repo>/.run``).
        roles: which roles to run (default: all of :data:`ROLES`).
        env: environment of the roles (default: this process's).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        run_dir: Path | None = None,
        roles: tuple[Role, ...] = ROLES,
        env: dict[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.dir = (run_dir or REPO_ROOT / ".run") / "stack"
        self.roles = roles
        self.env = dict(os.environ if env is None else env)
        # a role's last words before a crash must reach its log, not die in a pipe buffer
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        # pgserver and platformdirs want a runtime directory (the Makefile sets one too)
        self.env.setdefault("XDG_RUNTIME_DIR", str(Path("/tmp") / f"clustermedic-runtime-{os.getuid()}"))
        self.conf = self.dir / "supervisord.conf"
        self.sock = self.dir / "supervisor.sock"
        self.pidfile = self.dir / "supervisord.pid"
        self.logs = self.dir / "logs"
        self.skipped_file = self.dir / "skipped.json"

    # ------------------------------------------------------------------ configuration

    def skipped(self) -> dict[str, str]:
        """The roles ``up`` does not start, each with why: the setting it requires is unset.

        Raises:
            StackError: a required setting names a file that does not exist (a typo in a path is a
                mistake to fix, not a role to leave out quietly).
        """
        out = {}
        for role in self.roles:
            if not role.requires:
                continue
            value = getattr(self.settings, role.requires)
            variable = _variable(role.requires)
            if not value:
                out[role.name] = f"not configured: {variable} is unset"
            elif not Path(value).is_file():
                raise StackError(f"role {role.name}: {variable}={value} is no file")
        return out

    def config_text(self) -> str:
        """supervisord's configuration: one program per role it starts, each in its own process group."""
        skipped = self.skipped()
        lines = [
            "; written by `medic stack up`; rewritten on every start",
            "[unix_http_server]",
            f"file={self.sock}",
            "chmod=0700",
            "",
            "[supervisord]",
            f"pidfile={self.pidfile}",
            f"logfile={self.dir / 'supervisord.log'}",
            "logfile_maxbytes=10MB",
            "logfile_backups=2",
            f"childlogdir={self.logs}",
            f"directory={REPO_ROOT}",
            "",
            "[rpcinterface:supervisor]",
            "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
            "",
            "[supervisorctl]",
            f"serverurl=unix://{self.sock}",
            "",
        ]
        for role in self.roles:
            if role.name in skipped:
                continue
            argv = [sys.executable, "-m", "services.cli", *role.argv]
            env = list(role.env)
            if role.requires:  # the file checked here, absolute: the role runs in another directory
                env.append((_variable(role.requires), str(Path(getattr(self.settings, role.requires)).resolve())))
            lines += [
                f"[program:{role.name}]",
                f"command={' '.join(_quote(a) for a in argv)}",
                "autostart=true",
                "autorestart=true",
                f"startsecs={START_SECS}",
                f"startretries={START_RETRIES}",
                f"stopwaitsecs={STOP_WAIT_SECS}",
                "stopsignal=TERM",
                "stopasgroup=true",
                "killasgroup=true",
                "redirect_stderr=true",
                f"stdout_logfile={self.logs / (role.name + '.log')}",
                *([f"environment={','.join(f'{k}={_quote(v)}' for k, v in env)}"] if env else []),
                "stdout_logfile_maxbytes=20MB",
                "stdout_logfile_backups=1",
                "",
            ]
        return "\n".join(lines)

    # ------------------------------------------------------------------ lifecycle

    def running(self) -> bool:
        """Whether this checkout's supervisord is alive (by its PID file)."""
        pid = _read_pid(self.pidfile)
        return pid is not None and _alive(pid)

    def up(self, *, timeout_s: float = 120.0, say: Callable[[str], None] = print) -> list[RoleStatus]:
        """Start supervisord and every role, and wait until each is ready.

        Raises:
            StackError: supervisord would not start, or a role did not get ready (the others are
                then stopped; the message names the role and quotes the end of its log).
        """
        if self.running():
            raise StackError(
                f"a stack is already running (supervisord PID {_read_pid(self.pidfile)}): `medic stack down` first"
            )
        skipped = self.skipped()
        if len(skipped) == len(self.roles):
            raise StackError(f"no role to start: {'; '.join(f'{n} {why}' for n, why in skipped.items())}")
        self.logs.mkdir(parents=True, exist_ok=True)
        Path(self.env["XDG_RUNTIME_DIR"]).mkdir(mode=0o700, exist_ok=True)
        self.conf.write_text(self.config_text())
        self.skipped_file.write_text(json.dumps(skipped))  # what `status` shows for them
        for name, why in skipped.items():
            say(f"skipped: {name} ({why})")
        for role in self.roles:  # this start's logs only: status counts restarts from them
            (self.logs / f"{role.name}.log").unlink(missing_ok=True)
        (self.dir / "supervisord.log").unlink(missing_ok=True)
        started = subprocess.run(
            [sys.executable, "-m", "supervisor.supervisord", "-c", str(self.conf)],
            env=self.env,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if started.returncode != 0:
            raise StackError(f"supervisord did not start: {(started.stderr or started.stdout).strip()[-500:]}")
        deadline = time.monotonic() + timeout_s
        reported: set[str] = set()
        while True:
            statuses = self._statuses_or_none()
            if statuses is not None:
                for s in statuses:
                    if s.ready and s.name not in reported:
                        reported.add(s.name)
                        say(f"ready: {s.name} (pid {s.pid})")
                # FATAL: it died before START_SECS on every try; a role that lives a little longer
                # before dying is restarted forever, so a few restarts while starting fail it too
                failed = [
                    s for s in statuses if s.state in ("FATAL", "EXITED", "UNKNOWN") or s.restarts >= START_RETRIES
                ]
                if failed:
                    self._abort(failed[0], "could not start")
                if all(s.ready for s in statuses):
                    return statuses + self._skipped_statuses()
            if time.monotonic() > deadline:
                late = [s for s in (statuses or []) if not s.ready]
                if late:
                    self._abort(late[0], f"was not ready within {timeout_s:.0f} s")
                self._shutdown()
                raise StackError(
                    f"supervisord did not answer within {timeout_s:.0f} s: see {self.dir / 'supervisord.log'}"
                )
            time.sleep(0.5)

    def _abort(self, role: RoleStatus, why: str) -> None:
        tail = self.tail(role.name, 20)
        self._shutdown()
        detail = f" ({role.last_exit})" if role.last_exit else ""
        raise StackError(f"role {role.name} {why}{detail}; the others were stopped. Last lines of its log:\n{tail}")

    def down(self, *, timeout_s: float = 60.0) -> bool:
        """Stop every role and supervisord; False when no stack was running."""
        if not self.running():
            return False
        self._shutdown(timeout_s)
        return True

    def _shutdown(self, timeout_s: float = 60.0) -> None:
        pid = _read_pid(self.pidfile)
        with contextlib.suppress(OSError, xmlrpc.client.Fault, StackError):
            self._rpc().supervisor.shutdown()
        if pid is None:
            return
        deadline = time.monotonic() + timeout_s
        while _alive(pid):
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                break
            time.sleep(0.2)

    # ------------------------------------------------------------------ views

    def status(self) -> list[RoleStatus]:
        """Each role's state; a role ``up`` skipped is :data:`SKIPPED`, with why in ``last_exit``.

        Raises:
            StackError: no stack is running.
        """
        statuses = self._statuses_or_none()
        if statuses is None:
            raise StackError("no stack is running: `medic stack up` starts one")
        return statuses + self._skipped_statuses()

    def _skipped_statuses(self) -> list[RoleStatus]:
        try:
            skipped: dict[str, str] = json.loads(self.skipped_file.read_text())
        except (OSError, ValueError):
            return []
        return [RoleStatus(name, SKIPPED, 0, 0.0, 0, False, why) for name, why in skipped.items()]

    def _statuses_or_none(self) -> list[RoleStatus] | None:
        try:
            infos = self._rpc().supervisor.getAllProcessInfo()
        except (OSError, xmlrpc.client.Fault, StackError):
            return None
        out = []
        for info in infos:
            name = str(info["name"])
            role = ROLES_BY_NAME.get(name)
            state = str(info["statename"])
            uptime = float(info["now"] - info["start"]) if state == "RUNNING" else 0.0
            spawned, last_exit = self._history(name)
            ready = (
                state == "RUNNING"
                and uptime >= START_SECS
                and (role is None or (self._healthy(role) and self._logged_ready(role, spawned)))
            )
            if info.get("spawnerr"):
                last_exit = str(info["spawnerr"])
            out.append(
                RoleStatus(
                    name=name,
                    state=state,
                    pid=int(info["pid"]),
                    uptime_s=uptime,
                    restarts=max(0, spawned - 1),
                    ready=ready,
                    last_exit=last_exit,
                )
            )
        return out

    def _history(self, name: str) -> tuple[int, str]:
        """How often supervisord started a role, and why it last exited ('' if it never did).

        Read from supervisord's own log, which records every spawn and every exit with its status
        ("exited: detect (exit status 1; not expected)"), so it outlives this process.
        """
        try:
            text = (self.dir / "supervisord.log").read_text(errors="replace")
        except OSError:
            return 0, ""
        why = ""
        for line in text.splitlines():
            marker = f"exited: {name} ("
            if marker in line:
                why = line.split(marker, 1)[1].rstrip(")")
        return text.count(f"spawned: '{name}'"), why

    def _healthy(self, role: Role) -> bool:
        if not role.health:
            return True
        port = int(getattr(self.settings, role.health))
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _logged_ready(self, role: Role, spawned: int) -> bool:
        """Whether the current process of ``role`` logged its ready line.

        Every start logs it once, and the log holds only this stack's starts, so the current process
        is ready when the log has as many ready lines as supervisord made starts.
        """
        if not role.ready_log:
            return True
        try:
            text = (self.logs / f"{role.name}.log").read_text(errors="replace")
        except OSError:
            return False
        return len(re.findall(role.ready_log, text)) >= max(1, spawned)

    def tail(self, role: str, lines: int = 40) -> str:
        """The last lines of a role's log ('' when it has none)."""
        path = self.logs / f"{role}.log"
        try:
            with path.open("rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - 256 * 1024))
                data = fh.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(data.splitlines()[-lines:])

    def follow(
        self, roles: list[str], *, from_end: bool = True, stop: Callable[[], bool] = lambda: False
    ) -> Iterator[tuple[str, str]]:
        """``(role, line)`` as the roles' logs grow, until ``stop()`` says so."""
        handles: dict[str, Any] = {}
        try:
            while not stop():
                got = False
                for role in roles:
                    fh = handles.get(role)
                    if fh is None:
                        path = self.logs / f"{role}.log"
                        if not path.exists():
                            continue
                        fh = handles[role] = path.open("r", errors="replace")
                        if from_end:
                            fh.seek(0, os.SEEK_END)
                    for line in fh:
                        got = True
                        yield role, line.rstrip("\n")
                if not got:
                    time.sleep(0.3)
        finally:
            for fh in handles.values():
                fh.close()

    def _rpc(self) -> Any:
        if not self.sock.exists():
            raise StackError("no supervisord socket")
        from supervisor.xmlrpc import SupervisorTransport

        transport = SupervisorTransport(None, None, f"unix://{self.sock}")
        return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)


def _variable(setting: str) -> str:
    return f"CLUSTERMEDIC_{setting.upper()}"


def _quote(arg: str) -> str:
    # supervisord splits command= with shlex
    import shlex

    return shlex.quote(arg)


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
