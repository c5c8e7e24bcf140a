"""``medic sim serve``: a simulation against the wall clock, served as a cluster is.

The command runs as its own process. The test reads its doors the way ClusterMedic's production
paths do: ``/metrics`` as Prometheus would scrape it, the Kubernetes events API through the very
watcher ``medic ingest watch-k8s`` runs (the official client, through the kubeconfig the command
writes), log lines through a local Loki push stand-in, and the control API with its token.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.core.events import DeadLetter, KubeEvent
from services.core.settings import Settings
from services.ingest.kube import EventWatcher, api_client
from tests.conftest import free_port, poll

REPO = Path(__file__).resolve().parents[2]
TOKEN = "sim-test-token-1234567890"


@contextlib.contextmanager
def loki_standin() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A Loki push endpoint that checks the bearer token and keeps what it got."""
    pushes: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path != "/loki/api/v1/push" or self.headers.get("Authorization") != "Bearer ingest-token":
                self.send_response(401)
                self.end_headers()
                return
            pushes.append(json.loads(body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", pushes
    finally:
        server.shutdown()
        server.server_close()


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "services.cli", "sim", "serve", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_the_served_cluster_is_scraped_watched_pushed_and_controlled(tmp_path: Path) -> None:
    port = free_port()
    kubeconfig = tmp_path / "kubeconfig"
    with loki_standin() as (loki_url, pushes):
        proc = _serve(
            "--scenario", "node_flapping", "--seed", "1", "--speed", "200", "--port", str(port),
            "--loki-url", loki_url, "--kubeconfig", str(kubeconfig),
            env={"CLUSTERMEDIC_SIM_TOKEN": TOKEN, "CLUSTERMEDIC_INGEST_TOKEN": "ingest-token"},
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            client = httpx.Client(base_url=base, timeout=5)
            poll(lambda: _up(client), timeout_s=60, what="medic sim serve to answer")
            # Prometheus scrapes without a credential; samples carry simulated time in milliseconds
            text = poll(lambda: _metrics(client), timeout_s=60, what="a scrape's worth of metrics")
            temp = next(line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP{"))
            assert 'Hostname="' in temp and temp.rsplit(" ", 1)[1].isdigit()
            assert "vllm:num_requests_waiting{" in text
            # the control API wants the token
            assert client.get("/state").status_code == 401
            state = client.get("/state", headers={"Authorization": f"Bearer {TOKEN}"})
            assert state.status_code == 200 and state.json()["deployments"]
            assert client.post("/advance", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 409
            # the Kubernetes events API, through the watcher watch-k8s runs and the written kubeconfig
            got: list[KubeEvent | DeadLetter] = []
            watcher = EventWatcher(
                api_client(Settings(ingest_k8s_kubeconfig=kubeconfig)), got.extend, watch_timeout_s=5
            )
            thread = threading.Thread(target=watcher.run, daemon=True)
            thread.start()
            poll(
                lambda: any(isinstance(e, KubeEvent) and e.reason == "NodeNotReady" for e in got),
                timeout_s=90,
                what="the flapping node's NodeNotReady through list and watch",
            )
            watcher.stop()
            assert not [e for e in got if isinstance(e, DeadLetter)]
            # the log agent's part: lines pushed to Loki with the ingest token
            poll(lambda: pushes, timeout_s=30, what="a Loki push")
            streams = [s["stream"] for p in pushes for s in p["streams"]]
            assert any(s.get("container") == "vllm" for s in streams)
        finally:
            proc.terminate()
            output, _ = proc.communicate(timeout=30)
    assert "stopped at simulated second" in output, output


def test_a_bad_scenario_a_bad_speed_and_a_port_in_use_each_give_one_line(tmp_path: Path) -> None:
    bad = _serve("--scenario", "no-such-scenario")
    out, _ = bad.communicate(timeout=60)
    assert bad.returncode == 2 and out.strip().count("\n") == 0 and "no-such-scenario" in out, out
    bad = _serve("--speed", "0")
    out, _ = bad.communicate(timeout=60)
    assert bad.returncode == 2 and "--speed must be above 0" in out, out
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        bad = _serve("--port", str(port))
        out, _ = bad.communicate(timeout=60)
    assert bad.returncode == 2 and f"port {port} on 127.0.0.1 is in use" in out, out
    bad = _serve("--host", "0.0.0.0", env={"CLUSTERMEDIC_SIM_TOKEN": ""})
    out, _ = bad.communicate(timeout=60)
    assert bad.returncode == 2 and "refusing to listen on 0.0.0.0" in out, out


def _up(client: httpx.Client) -> bool:
    try:
        return client.get("/healthz").status_code == 200
    except httpx.HTTPError:
        return False


def _metrics(client: httpx.Client) -> str | None:
    text = client.get("/metrics").text
    return text if "DCGM_FI_DEV_GPU_TEMP{" in text else None


pytestmark = pytest.mark.integration
