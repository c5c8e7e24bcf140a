"""Kill the correlate worker (SIGKILL) mid-stream and start another: no incident lost or duplicated.

The worker is the real CLI (`python -m services.cli pipeline --role correlate`) on a fresh topic
prefix, consumer group and database. Each anomaly is about a GPU on its own node, so each opens its
own incident. They are published in order on one key (one partition), a minute apart in their
timestamps, so no tick overtakes the next anomaly and the incident ids must be exactly those a pure
engine computes from the same input: a worker that re-applied something at another engine time would
show up as a different id.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from kafka import KafkaConsumer

from pipelines.correlate import Engine
from pipelines.correlate.role import STATE_TABLE
from services.alerting.config import load_routing
from services.core.bus import KafkaPublisher, ensure_topics, read_raw
from services.core.events import Anomaly, IncidentEvent
from services.core.settings import Settings
from services.store.db import connect, migrate
from tests.conftest import REPO, poll

pytestmark = pytest.mark.integration

ROUTING = """
route: {receiver: nobody, group_by: [alertname, node], group_wait: 1s, group_interval: 2s, repeat_interval: 1h}
receivers: [{name: nobody}]
"""
TOTAL = 40


def _publish(settings: Settings, anomalies: list[Anomaly]) -> None:
    with KafkaPublisher(settings) as publisher:
        for a in anomalies:
            publisher.send_raw(Anomaly.topic, b"fleet", a.to_bytes())  # one key: one partition, in order


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _anomalies(start: float) -> list[Anomaly]:
    out = []
    for i in range(TOTAL):
        labels = {"node": f"node-{i}", "UUID": f"GPU-{i}"}
        out.append(
            Anomaly(
                entity=f"GPU-{i}",
                entity_kind="gpu",
                signal="gpu_ecc",
                detector="gpu_rules",
                score=2.0,
                threshold=1.0,
                ts=start + 60.0 * i,
                labels=labels,
                evidence={"dbe": i},
            )
        )
    return out


class Worker:
    """One `medic pipeline --role correlate` process."""

    def __init__(self, settings: Settings, routing: Path, log: Path) -> None:
        self.env = {
            **os.environ,
            "CLUSTERMEDIC_TOPIC_PREFIX": settings.topic_prefix,
            "CLUSTERMEDIC_DATABASE_URL": settings.database_url or "",
            "CLUSTERMEDIC_FAUST_APP_ID": f"kill-{uuid.uuid4().hex[:8]}",
            "CLUSTERMEDIC_FAUST_WEB_PORT": str(_free_port()),
            "CLUSTERMEDIC_STATE_DIR": str(log.parent),
            "CLUSTERMEDIC_LOG_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",  # a SIGKILLed worker keeps its log
            # Faust's own settings: the broker evicts the killed member after 6 s instead of 60 s
            "BROKER_SESSION_TIMEOUT": "6",
            "BROKER_HEARTBEAT_INTERVAL": "1",
        }
        self.routing, self.log = routing, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "services.cli",
                    "pipeline",
                    "--role",
                    "correlate",
                    "--routing",
                    str(self.routing),
                ],
                cwd=REPO,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=20)
            if self.proc.poll() is None:
                self.proc.kill()


def _incident_ids(settings: Settings) -> list[str]:
    with connect(settings) as conn:
        return [r[0] for r in conn.execute("SELECT incident_id FROM incidents")]


def test_a_killed_worker_restarts_without_losing_or_duplicating_an_incident(
    kafka_ready, fresh_database, settings, tmp_path
):
    settings = fresh_database.model_copy(update={"topic_prefix": settings.topic_prefix})
    migrate(settings)
    ensure_topics(settings)
    routing = tmp_path / "routing.yaml"
    routing.write_text(ROUTING)
    anomalies = _anomalies(start=1_700_000_000.0)
    engine = Engine(load_routing(routing))
    expected = {e.incident_id for a in anomalies for e in engine.ingest(a, a.ts) if isinstance(e, IncidentEvent)}
    assert len(expected) == TOTAL
    worker = Worker(settings, routing, tmp_path / "worker.log")
    try:
        _publish(settings, anomalies[:10])
        worker.start()
        poll(lambda: len(_incident_ids(settings)) >= 10, 90, what="the first worker's first 10 incidents")
        _publish(settings, anomalies[10:20])
        poll(lambda: len(_incident_ids(settings)) >= 15, 30, what="the first worker to be mid-way")
        worker.kill()
        _publish(settings, anomalies[20:])  # arrives while no worker runs
        worker.start()
        poll(lambda: len(_incident_ids(settings)) >= TOTAL, 90, what="every incident after the restart")
    finally:
        worker.stop()
    log = (tmp_path / "worker.log").read_text(errors="replace")
    rows = _incident_ids(settings)
    assert len(rows) == TOTAL and set(rows) == expected, log[-3000:]
    with connect(settings) as conn:
        alerts = conn.execute("SELECT incident_id, count(*) FROM alerts GROUP BY incident_id").fetchall()
    assert len(alerts) == TOTAL and all(n == 1 for _, n in alerts)
    published = [
        IncidentEvent.from_bytes(v)
        for _, _, v in read_raw(settings, [IncidentEvent.topic], max_messages=100_000, timeout_s=10)
    ]
    opened = {e.incident_id for e in published if e.kind == "opened"}
    assert opened == expected
    # the first worker checkpointed the engine into the table's changelog, which the second one restored
    app_id = worker.env["CLUSTERMEDIC_FAUST_APP_ID"]
    consumer = KafkaConsumer(
        f"{app_id}-correlate-{STATE_TABLE}-changelog",  # the CLI's app id is <faust_app_id>-<role>
        bootstrap_servers=settings.bootstrap_servers,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
    )
    checkpoints = [json.loads(m.value) for m in consumer if m.key == b"default"]
    consumer.close()
    assert checkpoints and checkpoints[-1]["position"] is not None
    assert len(checkpoints[-1]["engine"]["incidents"]) == TOTAL
