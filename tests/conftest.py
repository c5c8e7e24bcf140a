"""Shared fixtures.

Integration fixtures connect to the real Kafka, PostgreSQL and Redis that `make test` starts. When one
is missing they fail with what to run, never skip: a green run must mean the real thing was exercised.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.core.settings import Settings

REPO = Path(__file__).resolve().parents[1]


def poll(predicate, timeout_s: float, interval_s: float = 0.05, what: str = "condition"):  # type: ignore[no-untyped-def]
    """Wait until ``predicate()`` is truthy and return it; fail the test at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for a server the test starts)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def settings() -> Settings:
    """Settings with a fresh topic prefix so each test sees only its own messages."""
    return Settings(topic_prefix=f"test.{uuid.uuid4().hex[:10]}.")


@pytest.fixture(scope="session")
def kafka_ready() -> None:
    from services.core.bus import ensure_topics
    from services.core.errors import InfraError

    try:
        ensure_topics(Settings(), [])
    except InfraError as exc:
        pytest.fail(f"Kafka is not reachable ({exc}); `make test` starts it, or run `make up`")


@pytest.fixture(scope="session")
def database_url() -> str:
    from services.core.errors import InfraError
    from services.store.embedded import database_url as resolve

    try:
        return resolve(Settings())
    except InfraError as exc:
        pytest.fail(f"PostgreSQL is not reachable ({exc}); `make test` starts it, or run `make up`")


@pytest.fixture
def fresh_database(database_url: str) -> Iterator[Settings]:
    """Settings pointing at a new, empty database on the real server; dropped afterwards."""
    import psycopg
    from psycopg import sql

    name = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = _with_dbname(database_url, name)
    try:
        yield Settings(database_url=url)
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _with_dbname(url: str, name: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


@pytest.fixture(scope="session")
def redis_ready() -> None:
    import redis

    try:
        redis.Redis.from_url(Settings().broker_url, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        pytest.fail(f"Redis is not reachable at {Settings().broker_url} ({exc}); `make test` starts it")


@pytest.fixture(scope="session")
def celery_worker(redis_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[bytes]]:
    """A real Celery worker process (`medic worker`) consuming every queue."""
    log = tmp_path_factory.mktemp("celery") / "worker.log"
    name = f"test-{uuid.uuid4().hex[:6]}@%h"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "worker", "--concurrency", "1", "--name", name],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "CLUSTERMEDIC_LOG_LEVEL": "INFO"},
        )
    try:
        yield proc
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
        if proc.poll() is None:
            proc.kill()
