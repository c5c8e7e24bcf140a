"""Ingest against the real Prometheus, Alertmanager and Kafka.

Prometheus and Alertmanager are Debian's binaries, started by infra/local/{prometheus,alertmanager}.sh
on free loopback ports with configs written here, and stopped afterwards. The ingest app runs in this
process (uvicorn in a thread) with the real Kafka publisher `medic ingest serve` uses (aiokafka); what
it published is read back from Kafka.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from kafka import KafkaConsumer

from services.core.bus import ensure_topics
from services.core.events import Anomaly, MetricBatch
from services.core.settings import Settings
from services.ingest.aiopublisher import AioKafkaPublisher
from services.ingest.http import ALERTMANAGER_PATH, create_app
from tests.conftest import REPO, poll
from tests.httpstub import StubHandler, serving

pytestmark = pytest.mark.integration

GPU = "GPU-5f1c2a7e-0d3b-4c1e-9a55-1b2c3d4e5f60"
DCGM_LABELS = f'gpu="3",UUID="{GPU}",device="nvidia3",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-1"'
EXPOSITION = f"""# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{{{DCGM_LABELS}}} 71
# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.
# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{{{DCGM_LABELS}}} 79
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="llama-70b",pod="llama-70b-0"}} 3
# HELP vllm:e2e_request_latency_seconds Histogram of end to end request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{{le="1.0",model_name="llama-70b",pod="llama-70b-0"}} 10
vllm:e2e_request_latency_seconds_bucket{{le="+Inf",model_name="llama-70b",pod="llama-70b-0"}} 12
vllm:e2e_request_latency_seconds_sum{{model_name="llama-70b",pod="llama-70b-0"}} 9.5
vllm:e2e_request_latency_seconds_count{{model_name="llama-70b",pod="llama-70b-0"}} 12
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _ingest(settings: Settings) -> Iterator[tuple[str, object]]:
    """The ingest app with the publisher `medic ingest serve` uses (aiokafka), served by uvicorn on a free port."""
    port = _free_port()
    app = create_app(settings, AioKafkaPublisher(settings))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    poll(lambda: server.started, 20, what="ingest server to start")
    try:
        yield f"http://127.0.0.1:{port}", app.state.service
    finally:
        server.should_exit = True
        thread.join(30)


@contextlib.contextmanager
def _metrics_endpoint() -> Iterator[str]:
    """A tiny /metrics endpoint with DCGM and vLLM exposition text (the simulator's, later)."""

    class Handler(StubHandler):
        def do_GET(self) -> None:
            self.reply(200, EXPOSITION.encode(), "text/plain; version=0.0.4")

    with serving(Handler) as url:
        yield url.removeprefix("http://")


def _scrape_and_remote_write(target: str, ingest_url: str) -> str:
    """A Prometheus config that scrapes ``target`` every second and remote-writes to the ingest app."""
    return f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: simulator
    static_configs:
      - targets: ["{target}"]
remote_write:
  - url: {ingest_url}/api/v1/write
    queue_config:
      batch_send_deadline: 1s
      min_backoff: 100ms
      max_backoff: 1s
"""


@contextlib.contextmanager
def _component(name: str, config: str, tmp: Path) -> Iterator[int]:
    """Start Prometheus or Alertmanager through its infra/local script; stop it afterwards."""
    port = _free_port()
    (tmp / f"{name}.yml").write_text(config)
    upper = name.upper()
    env = {
        **os.environ,
        f"CLUSTERMEDIC_{upper}_PORT": str(port),
        f"CLUSTERMEDIC_{upper}_CONFIG": str(tmp / f"{name}.yml"),
        "CLUSTERMEDIC_STATE_DIR": str(tmp / "state"),
    }
    script = str(REPO / "infra" / "local" / f"{name}.sh")
    started = subprocess.run(["bash", script, "start"], env=env, capture_output=True, text=True, timeout=120)
    if started.returncode != 0:
        log = tmp / "state" / f"{name}-{port}" / f"{name}.log"
        pytest.fail(f"{name} did not start: {started.stderr}\n{log.read_text() if log.exists() else ''}")
    try:
        yield port
    finally:
        subprocess.run(["bash", script, "stop"], env=env, capture_output=True, timeout=60)


class _TopicReader:
    """Keeps one consumer on a topic and accumulates everything read (for polling with a deadline)."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self.values: list[bytes] = []
        self._consumer = KafkaConsumer(
            settings.topic(topic),
            bootstrap_servers=settings.bootstrap_servers,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            group_id=None,
        )

    def read(self) -> list[bytes]:
        for records in self._consumer.poll(timeout_ms=200).values():
            self.values.extend(r.value for r in records)
        return self.values

    def close(self) -> None:
        self._consumer.close()


def test_prometheus_scrapes_and_remote_writes_samples_intact_to_kafka(
    kafka_ready: None, settings: Settings, tmp_path: Path
) -> None:
    ensure_topics(settings)
    reader = _TopicReader(settings, MetricBatch.topic)
    with _ingest(settings) as (ingest_url, _), _metrics_endpoint() as target:
        with _component("prometheus", _scrape_and_remote_write(target, ingest_url), tmp_path):

            def arrived() -> dict[str, MetricBatch] | None:
                batches = [MetricBatch.from_bytes(v) for v in reader.read()]
                names = {s.name for b in batches for s in b.samples}
                wanted = {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS", "vllm:num_requests_waiting"}
                wanted |= {f"vllm:e2e_request_latency_seconds_{x}" for x in ("bucket", "sum", "count")}
                if not wanted <= names:
                    return None
                return {s.name + json.dumps(s.labels, sort_keys=True): b for b in batches for s in b.samples}

            by_series = poll(arrived, 90, interval_s=0.2, what="Prometheus' remote_write samples on Kafka")
    reader.close()
    batches = {id(b): b for b in by_series.values()}.values()
    samples = [(b.entity, b.source, s) for b in batches for s in b.samples]
    temp = [(e, src, s) for e, src, s in samples if s.name == "DCGM_FI_DEV_GPU_TEMP"]
    entity, source, sample = temp[0]
    assert (entity, source, sample.value) == (GPU, "remote_write", 71.0)
    assert sample.labels == {
        "gpu": "3",
        "UUID": GPU,
        "device": "nvidia3",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "gpu-node-1",
        "instance": target,
        "job": "simulator",
    }
    assert abs(sample.ts - time.time()) < 120
    xid = [s for _, _, s in samples if s.name == "DCGM_FI_DEV_XID_ERRORS"]
    assert xid[0].value == 79.0
    waiting = [(e, s) for e, _, s in samples if s.name == "vllm:num_requests_waiting"]
    assert waiting[0][0] == "llama-70b-0" and waiting[0][1].value == 3.0
    buckets = {s.labels["le"]: s.value for _, _, s in samples if s.name == "vllm:e2e_request_latency_seconds_bucket"}
    assert buckets == {"1.0": 10.0, "+Inf": 12.0}
    assert {s.value for _, _, s in samples if s.name == "vllm:e2e_request_latency_seconds_sum"} == {9.5}


def test_alertmanager_alert_lands_on_anomalies_once_despite_resends(
    kafka_ready: None, settings: Settings, tmp_path: Path
) -> None:
    settings = settings.model_copy(update={"ingest_token": "am-secret"})
    ensure_topics(settings)
    reader = _TopicReader(settings, Anomaly.topic)
    with _ingest(settings) as (ingest_url, service):
        config = f"""
route:
  receiver: clustermedic
  group_by: [alertname]
  group_wait: 200ms
  group_interval: 1s
  repeat_interval: 2s
receivers:
  - name: clustermedic
    webhook_configs:
      - url: {ingest_url}{ALERTMANAGER_PATH}
        send_resolved: true
        http_config:
          authorization:
            type: Bearer
            credentials: am-secret
"""
        with _component("alertmanager", config, tmp_path) as port:
            now = dt.datetime.now(dt.UTC)
            alert = {
                "labels": {"alertname": "GpuXidError", "severity": "critical", "UUID": GPU, "Hostname": "gpu-node-1"},
                "annotations": {"summary": "XID 79 on GPU 3"},
                "startsAt": now.isoformat(),
                "endsAt": (now + dt.timedelta(hours=1)).isoformat(),
            }
            posted = httpx.post(f"http://127.0.0.1:{port}/api/v2/alerts", json=[alert], timeout=10)
            assert posted.status_code == 200, posted.text

            # Alertmanager notifies once, then again every repeat_interval: wait for a resend
            duplicates = service.metrics.duplicates.labels("alertmanager")  # type: ignore[attr-defined]
            poll(lambda: duplicates._value.get() >= 1, 60, interval_s=0.2, what="Alertmanager to resend the alert")
            poll(lambda: reader.read(), 20, what="the anomaly on Kafka")
            anomalies_before = [Anomaly.from_bytes(v) for v in reader.read()]
    end = time.monotonic() + 3
    while time.monotonic() < end:  # not synchronisation: a window in which a duplicate would show up
        reader.read()
    anomalies = [Anomaly.from_bytes(v) for v in reader.read()]
    reader.close()
    assert len(anomalies) == 1, anomalies
    assert anomalies == anomalies_before
    [anomaly] = anomalies
    assert (anomaly.entity, anomaly.entity_kind, anomaly.signal, anomaly.detector) == (
        GPU,
        "gpu",
        "GpuXidError",
        "alertmanager",
    )
    assert anomaly.severity == "critical" and anomaly.status == "firing"
    assert anomaly.evidence["annotations"] == {"summary": "XID 79 on GPU 3"}
    assert anomaly.fingerprint == "alertmanager:" + anomaly.evidence["alertmanager_fingerprint"]


def test_the_same_webhook_posted_twice_gives_one_anomaly(kafka_ready: None, settings: Settings) -> None:
    ensure_topics(settings)
    body = (REPO / "tests" / "fixtures" / "ingest" / "alertmanager_webhook_v4.json").read_bytes()
    reader = _TopicReader(settings, Anomaly.topic)
    with _ingest(settings) as (ingest_url, _):
        first = httpx.post(f"{ingest_url}{ALERTMANAGER_PATH}", content=body, timeout=30)
        second = httpx.post(f"{ingest_url}{ALERTMANAGER_PATH}", content=body, timeout=30)
    assert first.json()["accepted"] == 2 and second.json() == {"status": "ok", "accepted": 0, "duplicates": 2}
    poll(lambda: len(reader.read()) >= 2, 30, what="two anomalies")
    end = time.monotonic() + 2
    while time.monotonic() < end:
        reader.read()
    reader.close()
    assert sorted(Anomaly.from_bytes(v).signal for v in reader.values) == ["GpuXidError", "VllmQueueSaturated"]
