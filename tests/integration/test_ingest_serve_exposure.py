"""`medic ingest serve` as an operator runs it, against the real Kafka: on 0.0.0.0 it needs a token
(then every push route needs it too), or --insecure, which warns and shows on /metrics."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.core.settings import Settings
from services.ingest.http import ALERTMANAGER_PATH
from tests.conftest import REPO, free_port, poll

pytestmark = pytest.mark.integration
WEBHOOK = (REPO / "tests" / "fixtures" / "ingest" / "alertmanager_webhook_v4.json").read_bytes()


@contextlib.contextmanager
def _serve(settings: Settings, log: Path, *args: str, token: str | None = None) -> Iterator[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items() if k != "CLUSTERMEDIC_INGEST_TOKEN"}
    env |= {"CLUSTERMEDIC_TOPIC_PREFIX": settings.topic_prefix, "PYTHONUNBUFFERED": "1"}
    if token:
        env["CLUSTERMEDIC_INGEST_TOKEN"] = token
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "ingest", "serve", *args],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
        if proc.poll() is None:
            proc.kill()


def _metrics(port: int) -> str | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return None


def test_refused_on_all_addresses_without_a_token(kafka_ready: None, settings: Settings, tmp_path: Path) -> None:
    port = free_port()
    with _serve(settings, tmp_path / "ingest.log", "--host", "0.0.0.0", "--port", str(port)) as proc:
        assert proc.wait(timeout=60) == 2
    said = (tmp_path / "ingest.log").read_text()
    assert (
        f"refusing to listen on 0.0.0.0:{port} without CLUSTERMEDIC_INGEST_TOKEN; set a token or pass --insecure"
        in said
    )


def test_insecure_warns_and_shows_on_metrics(kafka_ready: None, settings: Settings, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "ingest.log"
    with _serve(settings, log, "--host", "0.0.0.0", "--port", str(port), "--insecure") as proc:
        text = poll(lambda: proc.poll() is None and _metrics(port), 60, interval_s=0.2, what="ingest /metrics")
        assert 'clustermedic_insecure_listener{role="ingest"} 1.0' in text
    assert f"ingest listens on 0.0.0.0:{port} WITHOUT a token (--insecure)" in log.read_text()


def test_with_a_token_every_push_needs_it(kafka_ready: None, settings: Settings, tmp_path: Path) -> None:
    port = free_port()
    with _serve(settings, tmp_path / "ingest.log", "--host", "0.0.0.0", "--port", str(port), token="t0k-1") as proc:
        text = poll(lambda: proc.poll() is None and _metrics(port), 60, interval_s=0.2, what="ingest /metrics")
        assert 'clustermedic_insecure_listener{role="ingest"} 0.0' in text
        url = f"http://127.0.0.1:{port}{ALERTMANAGER_PATH}"
        assert httpx.post(url, content=WEBHOOK).status_code == 401
        assert httpx.post(url, content=WEBHOOK, headers={"Authorization": "Bearer t0k-2"}).status_code == 401
        good = httpx.post(url, content=WEBHOOK, headers={"Authorization": "Bearer t0k-1"}, timeout=30)
        assert good.status_code == 200 and good.json()["accepted"] >= 1
