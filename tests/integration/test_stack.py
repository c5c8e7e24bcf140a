"""``medic stack``: every role supervised against the real Kafka, PostgreSQL and Redis.

The stack runs in a folder of its own with its own topic prefix, ports and Redis database, so it
cannot take another test's messages or tasks.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.core.bus import ensure_topics
from services.core.settings import Settings
from services.simulator.live import kubeconfig
from services.stack import ROLES, ROLES_BY_NAME, SKIPPED, Role, Stack, StackError, _alive
from services.store.db import migrate
from tests.conftest import free_port, poll
from tests.httpstub import StubHandler, serving

pytestmark = pytest.mark.integration


def _stack(
    tmp_path: Path, database: Settings, roles: tuple[Role, ...] = ROLES, kube_config: Path | None = None
) -> Stack:
    migrate(database)  # what `medic up` does before `medic stack up`
    ports = {
        "CLUSTERMEDIC_INGEST_PORT": str(free_port()),
        "CLUSTERMEDIC_API_PORT": str(free_port()),
        "CLUSTERMEDIC_FAUST_WEB_PORT": str(free_port()),
    }
    env = {
        **os.environ,
        **ports,
        "CLUSTERMEDIC_TOPIC_PREFIX": f"test.{uuid.uuid4().hex[:10]}.",
        "CLUSTERMEDIC_DATABASE_URL": str(database.database_url),
        # a Redis database of its own: no other test's worker takes this stack's tasks
        "CLUSTERMEDIC_REDIS_URL": Settings().broker_url.rsplit("/", 1)[0] + "/12",
        "CLUSTERMEDIC_RUN_DIR": str(tmp_path / "state"),
    }
    # correlate's second Faust web port, in the same spirit as the stack's own 16067
    fixed = tuple(
        dataclasses.replace(r, env=(("CLUSTERMEDIC_FAUST_WEB_PORT", str(free_port())),)) if r.env else r for r in roles
    )
    settings = Settings(
        ingest_port=int(ports["CLUSTERMEDIC_INGEST_PORT"]),
        api_port=int(ports["CLUSTERMEDIC_API_PORT"]),
        topic_prefix=env["CLUSTERMEDIC_TOPIC_PREFIX"],
        ingest_k8s_kubeconfig=kube_config,
    )
    ensure_topics(settings)  # what `medic up` does before `medic stack up`
    return Stack(settings, run_dir=tmp_path, roles=fixed, env=env)


def test_up_restarts_a_killed_role_and_down_stops_exactly_what_it_started(
    tmp_path: Path, fresh_database: Settings, kafka_ready: None
) -> None:
    stack = _stack(tmp_path, fresh_database)  # no kubeconfig: the events watch is skipped
    said: list[str] = []
    try:
        statuses = stack.up(timeout_s=240, say=said.append)
        assert {s.name for s in statuses} == set(ROLES_BY_NAME)
        (events,) = [s for s in statuses if s.skipped]
        assert events.name == "events" and "CLUSTERMEDIC_INGEST_K8S_KUBECONFIG is unset" in events.last_exit
        running = [s for s in statuses if not s.skipped]
        assert all(s.ready for s in running)
        assert said[0] == f"skipped: events ({events.last_exit})"
        assert sorted(said[1:]) == sorted(f"ready: {s.name} (pid {s.pid})" for s in running)
        assert [(s.name, s.state) for s in stack.status() if s.skipped] == [("events", SKIPPED)]
        pids = {s.name: s.pid for s in running}
        os.kill(pids["detect"], signal.SIGKILL)  # the role dies: supervisord starts it again
        again = poll(
            lambda: next(
                (s for s in stack.status() if s.name == "detect" and s.ready and s.pid != pids["detect"]), None
            ),
            timeout_s=120,
            what="detect restarted and ready",
        )
        assert again.restarts == 1 and "SIGKILL" in again.last_exit
        pids["detect"] = again.pid
        assert stack.tail("detect", 5), "the restarted role's log is kept"
    finally:
        stopped = stack.down()
    assert stopped
    assert not [name for name, pid in pids.items() if _alive(pid)], "every role stopped"
    assert not stack.running()
    with pytest.raises(StackError, match="no stack is running"):
        stack.status()


def test_a_role_that_cannot_start_is_named_with_its_log_and_the_others_are_stopped(
    tmp_path: Path, fresh_database: Settings, kafka_ready: None
) -> None:
    broken = Role("detect", ("pipeline", "--role", "no-such-role"))
    stack = _stack(tmp_path, fresh_database, roles=(ROLES_BY_NAME["api"], broken))
    try:
        with pytest.raises(StackError) as caught:
            stack.up(timeout_s=120, say=lambda _: None)
    finally:
        stack.down()  # a no-op when up stopped everything, as it must
    message = str(caught.value)
    assert message.startswith("role detect could not start") and "unknown role 'no-such-role'" in message
    assert "the others were stopped" in message
    assert not stack.running()


@pytest.fixture
def events_api() -> Iterator[str]:
    """A Kubernetes API with one event: the list answers it, a watch stays open with nothing new."""
    closing = threading.Event()
    event = {
        "metadata": {"name": "e1", "namespace": "serving", "uid": "uid-e1", "resourceVersion": "7"},
        "involvedObject": {"kind": "Pod", "name": "vllm-0", "namespace": "serving"},
        "reason": "BackOff",
        "type": "Warning",
        "lastTimestamp": "2026-01-01T00:00:00Z",
    }

    class Handler(StubHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            watching = "watch=true" in self.path
            body = b"" if watching else json.dumps({"metadata": {"resourceVersion": "7"}, "items": [event]}).encode()
            self.reply(200, body)
            if watching:
                closing.wait(60)

    with serving(Handler) as url:
        try:
            yield url
        finally:
            closing.set()


def test_with_a_kubeconfig_the_events_watch_runs_and_is_ready_once_its_first_list_is_published(
    tmp_path: Path, fresh_database: Settings, kafka_ready: None, events_api: str
) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(kubeconfig(events_api, "t0ken"))
    stack = _stack(tmp_path, fresh_database, roles=(ROLES_BY_NAME["events"],), kube_config=config)
    try:
        (events,) = stack.up(timeout_s=120, say=lambda _: None)
        assert (events.name, events.state, events.ready) == ("events", "RUNNING", True)
        assert f"ready: events watch follows {events_api} (core/v1, all namespaces)" in stack.tail("events")
    finally:
        stack.down()
