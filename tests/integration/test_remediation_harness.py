"""Helpers of the remediation integration tests (no tests here): a simulator HTTP server, a real worker."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
import yaml

from services.core.settings import Settings
from services.simulator.http import create_http_app
from services.simulator.scenario import load_scenario
from services.simulator.simulator import Simulator

REPO = Path(__file__).resolve().parents[2]
# A Redis database of its own, so no other engineer's worker (db 0) takes these tasks.
REDIS_DB = 13
TIME_SCALE = 0.004  # wall seconds per simulated second for the waits between steps


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SimServer:
    """A simulator behind its HTTP control API, with a ticker advancing simulated time."""

    sim: Simulator
    url: str
    server: uvicorn.Server
    slow: dict[str, float] = field(default_factory=dict)
    # action kinds answered "200 OK" with an HTML page (a proxy's error page): the client cannot parse it
    broken: set[str] = field(default_factory=set)
    arrived: dict[str, threading.Event] = field(default_factory=dict)
    ticking: threading.Event = field(default_factory=threading.Event)

    def actions(self, kind: str | None = None) -> list[Any]:
        return [a for a in self.sim.actions.log if kind is None or a.kind == kind]


@contextlib.contextmanager
def sim_server(scenario: str = "xid79", seed: int = 0, start_at: float = 330.0) -> Iterator[SimServer]:
    """Serve a simulator on a free port; simulated time advances ~5 s every 20 ms once ``ticking`` is set."""
    sim = Simulator(load_scenario(scenario), seed=seed, telemetry=False)
    while sim.t < start_at:
        sim.step()
    app = create_http_app(sim)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    box = SimServer(sim, f"http://127.0.0.1:{port}", server)

    @app.middleware("http")
    async def slow_actions(request: Any, call_next: Callable[[Any], Any]) -> Any:
        kind = request.url.path.rsplit("/", 1)[-1]
        if request.method == "POST" and kind in box.broken:
            from starlette.responses import HTMLResponse

            box.arrived.setdefault(kind, threading.Event()).set()
            return HTMLResponse("<html><body>502 upstream unavailable</body></html>", status_code=200)
        if request.method == "POST" and kind in box.slow:
            box.arrived.setdefault(kind, threading.Event()).set()
            import asyncio

            await asyncio.sleep(box.slow[kind])
        return await call_next(request)

    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("simulator server did not start")
        time.sleep(0.02)
    stop = threading.Event()

    def tick() -> None:
        with httpx.Client(base_url=box.url, timeout=5) as client:
            while not stop.is_set():
                if box.ticking.is_set():
                    client.post("/advance", params={"seconds": 5})
                stop.wait(0.02)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield box
    finally:
        stop.set()
        ticker.join(5)
        server.should_exit = True
        thread.join(10)


def write_config(path: Path, sim_url: str, **policy: Any) -> Path:
    base = yaml.safe_load((REPO / "infra" / "config" / "remediation.yaml").read_text())
    base["actuator"] = {"kind": "simulator", "url": sim_url, "time_scale": TIME_SCALE, "timeout_s": 10}
    base["execution"] = {"lease_s": 3, "verify_backoff_max_s": 2}
    base["policy"]["defaults"].update(policy)
    path.write_text(yaml.safe_dump(base))
    return path


def worker_env(settings: Settings, config: Path) -> dict[str, str]:
    return {
        **os.environ,
        "CLUSTERMEDIC_DATABASE_URL": str(settings.database_url),
        "CLUSTERMEDIC_REDIS_URL": settings.broker_url,
        "CLUSTERMEDIC_TOPIC_PREFIX": settings.topic_prefix,
        "CLUSTERMEDIC_REMEDIATION_CONFIG": str(config),
        "CLUSTERMEDIC_LOG_LEVEL": "INFO",
    }


class Worker:
    """A real `medic worker` process in its own process group (so the test can kill it outright)."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env = env
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.name = ""  # the Celery node name of the current process (for control.inspect)
        self._offset = 0

    def start(self, timeout_s: float = 60.0) -> None:
        self.launch()
        self.wait_ready(timeout_s)

    def launch(self) -> None:
        """Start the process without waiting (start several, then wait_ready on each)."""
        self._offset = self.log.stat().st_size if self.log.exists() else 0
        self.name = f"rem-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "services.cli",
                    "worker",
                    "--concurrency",
                    "2",
                    "--name",
                    self.name,
                ],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while b" ready." not in self.log.read_bytes()[self._offset :]:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL the worker and its pool processes: nothing gets to clean up."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.kill()


def isolated_settings(base: Settings) -> Settings:
    """The fresh database's settings plus a Redis DB and topic prefix of their own."""
    return base.model_copy(
        update={
            "redis_url": f"redis://127.0.0.1:{base.redis_port}/{REDIS_DB}",
            "topic_prefix": f"test.{uuid.uuid4().hex[:10]}.",
        }
    )


class RecordingDispatcher:
    """Records what the executor would start on Celery (nothing here may start)."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def execute(self, run_id: str) -> None:
        self.started.append(run_id)

    def chain(self, run_id: str, *args: object) -> None:
        self.started.append(run_id)

    def rollback(self, run_id: str, token: str) -> None:
        self.started.append(run_id)
