"""The ingest HTTP receivers, broker-free: a MemoryPublisher stands in for Kafka."""

from __future__ import annotations

import asyncio
import gzip
import json
import math
from pathlib import Path

import cramjam
import httpx
import pytest
from fastapi.testclient import TestClient

from services.core.events import Anomaly, DeadLetter, LogRecord, MetricBatch
from services.core.settings import Settings
from services.ingest.http import ALERTMANAGER_PATH, LOKI_PUSH_PATH, REMOTE_WRITE_PATH, create_app
from services.ingest.memory import MemoryPublisher
from services.ingest.normalise import encode_loki_protobuf, encode_remote_write

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ingest"
GPU = "GPU-5f1c2a7e-0d3b-4c1e-9a55-1b2c3d4e5f60"
RW_HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}


# These tests are about shapes, limits and answers; their payloads are stamped at fixed times (2019,
# 2023, 2026). The event-time bounds have their own tests (test_ingest_time_bounds.py).
UNBOUNDED = {"ingest_max_age_s": 1e11, "ingest_max_future_s": 1e11}


def _client(**overrides: object) -> tuple[TestClient, MemoryPublisher]:
    publisher = MemoryPublisher()
    app = create_app(Settings(**{**UNBOUNDED, **overrides}), publisher)  # type: ignore[arg-type]
    return TestClient(app), publisher


def _series() -> list[tuple[dict[str, str], list[tuple[float, int]]]]:
    dcgm = {"UUID": GPU, "gpu": "3", "Hostname": "gpu-node-1", "modelName": "NVIDIA H100 80GB HBM3"}
    return [
        ({"__name__": "DCGM_FI_DEV_GPU_TEMP", **dcgm}, [(71.0, 1_700_000_000_000), (72.5, 1_700_000_015_000)]),
        ({"__name__": "DCGM_FI_DEV_FB_USED", **dcgm}, [(61234.0, 1_700_000_000_000)]),
        (
            {"__name__": "vllm:num_requests_waiting", "pod": "llama-0", "model_name": "llama-70b"},
            [(4.0, 1_700_000_000_000)],
        ),
        (
            {"__name__": "vllm:e2e_request_latency_seconds_bucket", "pod": "llama-0", "le": "+Inf"},
            [(1234.0, 1_700_000_000_000)],
        ),
        ({"__name__": "node_load1", "instance": "gpu-node-2:9100", "job": "node"}, [(0.5, 1_700_000_000_250)]),
        ({"__name__": "DCGM_FI_DEV_SM_CLOCK", "hostname": "gpu-node-3", "gpu": "0"}, [(1980.0, 1_700_000_000_000)]),
    ]


def test_remote_write_lands_one_batch_per_entity_with_names_labels_and_values_intact() -> None:
    client, publisher = _client()
    with client:
        response = client.post(REMOTE_WRITE_PATH, content=encode_remote_write(_series()), headers=RW_HEADERS)
    assert response.status_code == 204
    batches = {b.entity: b for b in publisher.events(MetricBatch) if isinstance(b, MetricBatch)}
    assert sorted(batches) == sorted([GPU, "llama-0", "gpu-node-2:9100", "gpu-node-3"])
    gpu = batches[GPU]
    assert gpu.source == "remote_write"
    assert [(s.name, s.value, s.ts) for s in gpu.samples] == [
        ("DCGM_FI_DEV_GPU_TEMP", 71.0, 1_700_000_000.0),
        ("DCGM_FI_DEV_GPU_TEMP", 72.5, 1_700_000_015.0),
        ("DCGM_FI_DEV_FB_USED", 61234.0, 1_700_000_000.0),
    ]
    assert gpu.samples[0].labels == {
        "UUID": GPU,
        "gpu": "3",
        "Hostname": "gpu-node-1",
        "modelName": "NVIDIA H100 80GB HBM3",
    }
    bucket = next(s for s in batches["llama-0"].samples if s.name.endswith("_bucket"))
    assert bucket.labels == {"pod": "llama-0", "le": "+Inf"} and bucket.value == 1234.0
    assert batches["gpu-node-2:9100"].samples[0].ts == 1_700_000_000.25
    assert not publisher.deadletters()


def test_remote_write_drops_staleness_markers_and_counts_them() -> None:
    client, publisher = _client()
    stale = struct_nan()
    series = [({"__name__": "up", "instance": "a:1"}, [(1.0, 1000), (stale, 2000), (math.inf, 3000)])]
    with client:
        assert (
            client.post(REMOTE_WRITE_PATH, content=encode_remote_write(series), headers=RW_HEADERS).status_code == 204
        )
        metrics = client.get("/metrics").text
    [batch] = publisher.events(MetricBatch)
    assert isinstance(batch, MetricBatch) and [s.value for s in batch.samples] == [1.0]
    assert 'clustermedic_ingest_dropped_samples_total{receiver="remote_write"} 2.0' in metrics
    assert 'clustermedic_ingest_received_total{receiver="remote_write"} 1.0' in metrics
    assert 'clustermedic_ingest_published_total{topic="telemetry.metrics.v1"} 1.0' in metrics


def struct_nan() -> float:
    import struct

    return struct.unpack("<d", (0x7FF0000000000002).to_bytes(8, "little"))[0]  # Prometheus' stale NaN


def test_large_write_is_split_into_batches_under_the_sample_cap() -> None:
    client, publisher = _client(ingest_max_samples_per_batch=100)
    series = [({"__name__": f"m{i}", "pod": "p"}, [(float(i), 1000)]) for i in range(250)]
    with client:
        assert (
            client.post(REMOTE_WRITE_PATH, content=encode_remote_write(series), headers=RW_HEADERS).status_code == 204
        )
    sizes = [len(b.samples) for b in publisher.events(MetricBatch) if isinstance(b, MetricBatch)]
    assert sizes == [100, 100, 50]


@pytest.mark.parametrize(
    ("body", "headers", "status", "says"),
    [
        (b"\x00\x01not snappy at all", RW_HEADERS, 400, "snappy"),
        (bytes(cramjam.snappy.compress_raw(b"\xff\xff\xff")), RW_HEADERS, 400, "WriteRequest"),
        (encode_remote_write([({"job": "x"}, [(1.0, 1)])]), RW_HEADERS, 400, "__name__"),
        (encode_remote_write(_series()), {**RW_HEADERS, "Content-Type": "application/json"}, 415, "x-protobuf"),
        (encode_remote_write(_series()), {**RW_HEADERS, "Content-Encoding": "gzip"}, 415, "snappy"),
        (encode_remote_write(_series()), {**RW_HEADERS, "X-Prometheus-Remote-Write-Version": "2.0.0"}, 415, "version"),
        (
            encode_remote_write(_series()),
            {**RW_HEADERS, "Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request"},
            415,
            "WriteRequest",
        ),
    ],
)
def test_bad_remote_write_gets_a_clear_4xx_and_is_dead_lettered(
    body: bytes, headers: dict[str, str], status: int, says: str
) -> None:
    client, publisher = _client()
    with client:
        response = client.post(REMOTE_WRITE_PATH, content=body, headers=headers)
    assert response.status_code == status
    assert says in response.text
    [letter] = publisher.deadletters()
    assert letter.raw == body and letter.source_topic == f"http:{REMOTE_WRITE_PATH}" and letter.consumer == "ingest"
    assert says in letter.error and letter.error_type == "RejectedInput"
    assert not publisher.events(MetricBatch)


def test_bodies_over_the_limits_get_413_and_a_truncated_dead_letter() -> None:
    client, publisher = _client(ingest_max_body_bytes=2048, ingest_deadletter_max_bytes=1024)
    with client:
        response = client.post(REMOTE_WRITE_PATH, content=b"x" * 5000, headers=RW_HEADERS)
    assert response.status_code == 413
    [letter] = publisher.deadletters()
    assert letter.raw == b"x" * 1024 and "first 1024 of" in letter.error


def test_decompression_bombs_get_413_before_they_are_inflated() -> None:
    client, publisher = _client(ingest_max_decompressed_bytes=100_000)
    bomb = bytes(cramjam.snappy.compress_raw(b"\x00" * 200_000))
    forged = b"\xff\xff\xff\xff\x0f" + b"\x00" * 10  # claims 4 GiB uncompressed
    big_gzip = gzip.compress(b" " * 200_000)
    with client:
        responses = [
            client.post(REMOTE_WRITE_PATH, content=bomb, headers=RW_HEADERS),
            client.post(REMOTE_WRITE_PATH, content=forged, headers=RW_HEADERS),
            client.post(
                LOKI_PUSH_PATH,
                content=big_gzip,
                headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
            ),
        ]
    assert [r.status_code for r in responses] == [413, 413, 413]
    assert all("limit" in r.text for r in responses)
    assert [d.raw for d in publisher.deadletters()] == [bomb, forged, big_gzip]


def test_loki_push_accepts_grafanas_json_examples_gzip_and_protobuf() -> None:
    client, publisher = _client()
    example = (FIXTURES / "loki_push_grafana_example.json").read_bytes()
    metadata_example = (FIXTURES / "loki_push_structured_metadata_example.json").read_bytes()
    proto = encode_loki_protobuf(
        [
            (
                '{pod="llama-0", namespace="serving", msg="say \\"hi\\""}',
                [(1_700_000_000_123_456_789, "CUDA error: XID 79")],
            )
        ]
    )
    with client:
        assert (
            client.post(LOKI_PUSH_PATH, content=example, headers={"Content-Type": "application/json"}).status_code
            == 204
        )
        assert (
            client.post(
                LOKI_PUSH_PATH, content=metadata_example, headers={"Content-Type": "application/json"}
            ).status_code
            == 204
        )
        gz = gzip.compress(example)
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        assert client.post(LOKI_PUSH_PATH, content=gz, headers=headers).status_code == 204
        assert (
            client.post(LOKI_PUSH_PATH, content=proto, headers={"Content-Type": "application/x-protobuf"}).status_code
            == 204
        )
    records = [r for r in publisher.events(LogRecord) if isinstance(r, LogRecord)]
    assert [(r.stream, r.line, r.ts) for r in records[:3]] == [
        ({"foo": "bar2"}, "fizzbuzz", 1570818238.0),
        ({"job": "test"}, "fizzbuzz", 1570818238.0),
        ({"foo": "bar2"}, "fizzbuzz", 1570818238.0),
    ]
    last = records[3]
    assert last.stream == {"pod": "llama-0", "namespace": "serving", "msg": 'say "hi"'}
    assert last.line == "CUDA error: XID 79" and last.entity == "llama-0"
    assert last.ts == pytest.approx(1_700_000_000.123456789)
    assert not publisher.deadletters()


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b'{"streams": [{"stream": {"a": "b"}, "values": [[1570818238000000000, "x"]]}]}', "application/json"),
        (b'{"streams": [{"stream": {}, "values": [["1", "x"]]}]}', "application/json"),
        (b'{"streams": "nope"}', "application/json"),
        (b"{not json", "application/json"),
        (encode_loki_protobuf([("app=unquoted", [(1, "x")])]), "application/x-protobuf"),
        (b"plain text", "text/plain"),
    ],
)
def test_bad_loki_push_is_rejected_and_dead_lettered(body: bytes, content_type: str) -> None:
    client, publisher = _client()
    with client:
        response = client.post(LOKI_PUSH_PATH, content=body, headers={"Content-Type": content_type})
    assert 400 <= response.status_code < 500
    assert [letter.raw for letter in publisher.deadletters()] == [body]
    assert not publisher.events(LogRecord)


def test_alertmanager_alerts_become_anomalies_once_even_when_redelivered() -> None:
    client, publisher = _client()
    body = (FIXTURES / "alertmanager_webhook_v4.json").read_bytes()
    with client:
        first = client.post(ALERTMANAGER_PATH, content=body, headers={"Content-Type": "application/json"})
        second = client.post(ALERTMANAGER_PATH, content=body, headers={"Content-Type": "application/json"})
        payload = json.loads(body)
        payload["alerts"][0]["status"] = "resolved"
        payload["alerts"][0]["endsAt"] = "2026-11-29T10:30:00Z"
        third = client.post(ALERTMANAGER_PATH, json=payload)
    assert first.json() == {"status": "ok", "accepted": 2, "duplicates": 0}
    assert second.json() == {"status": "ok", "accepted": 0, "duplicates": 2}
    assert third.json() == {"status": "ok", "accepted": 1, "duplicates": 1}
    anomalies = [a for a in publisher.events(Anomaly) if isinstance(a, Anomaly)]
    assert len(anomalies) == 3
    xid, queue, xid_resolved = anomalies
    assert (xid.entity, xid.entity_kind, xid.signal, xid.detector) == (GPU, "gpu", "GpuXidError", "alertmanager")
    assert xid.severity == "critical" and xid.status == "firing" and xid.score == 1.0
    assert xid.labels["xid"] == "79" and xid.evidence["annotations"]["summary"].startswith("XID 79")
    assert xid.ts == pytest.approx(_utc(2026, 11, 29, 10, 15, 2) + 0.123456789)
    # the alert's identity is Alertmanager's fingerprint alone: its resolution must find the alert
    assert xid.fingerprint == "alertmanager:a1b2c3d4e5f60718"
    assert (queue.entity, queue.entity_kind, queue.severity, queue.status) == (
        "llama-70b-fp16-7c9d8-x2k4q",
        "pod",
        "warning",
        "resolved",
    )
    assert queue.ts == pytest.approx(_utc(2026, 11, 29, 9, 20, 0) + 0.5)  # endsAt 10:20:00.5+01:00
    # the same alert, in a new state: one identity, two deliveries
    assert xid_resolved.status == "resolved" and xid_resolved.fingerprint == xid.fingerprint
    assert xid_resolved.dedup_key != xid.dedup_key


def _utc(*parts: int) -> float:
    import datetime as dt

    return dt.datetime(*parts, tzinfo=dt.UTC).timestamp()


def test_alert_with_only_a_node_label_is_keyed_by_the_node() -> None:
    client, publisher = _client()
    payload = json.loads((FIXTURES / "alertmanager_webhook_v4.json").read_bytes())
    payload["alerts"] = payload["alerts"][:1]
    del payload["alerts"][0]["labels"]["UUID"]
    with client:
        client.post(ALERTMANAGER_PATH, json=payload)
    [anomaly] = publisher.events(Anomaly)
    assert isinstance(anomaly, Anomaly)
    assert (anomaly.entity, anomaly.entity_kind) == ("gpu-node-1", "node")


@pytest.mark.parametrize(
    "body",
    [
        b'{"version": "3", "groupKey": "g", "status": "firing", "alerts": []}',
        b'{"version": "4", "groupKey": "g", "status": "firing", "alerts": [{"status": "firing", "labels": {}}]}',
        b'{"version": "4", "groupKey": "g", "status": "firing", "alerts": [{"status": "firing", '
        b'"labels": {"alertname": "A"}, "startsAt": "yesterday"}]}',
        b"[]",
        b"\xff\xfe",
    ],
)
def test_bad_webhooks_are_rejected_and_dead_lettered(body: bytes) -> None:
    client, publisher = _client()
    with client:
        response = client.post(ALERTMANAGER_PATH, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert [letter.raw for letter in publisher.deadletters()] == [body]


def test_push_endpoints_need_the_bearer_token_when_one_is_set() -> None:
    client, publisher = _client(ingest_token="s3cret")
    body = (FIXTURES / "alertmanager_webhook_v4.json").read_bytes()
    with client:
        missing = client.post(ALERTMANAGER_PATH, content=body)
        wrong = client.post(LOKI_PUSH_PATH, content=b"{}", headers={"Authorization": "Bearer nope"})
        good = client.post(ALERTMANAGER_PATH, content=body, headers={"Authorization": "Bearer s3cret"})
        health = client.get("/healthz")
    assert (missing.status_code, wrong.status_code, good.status_code, health.status_code) == (401, 401, 200, 200)
    assert missing.headers["WWW-Authenticate"] == "Bearer"
    letters = publisher.deadletters()
    assert [(d.error_type, d.raw) for d in letters] == [("Unauthorized", b""), ("Unauthorized", b"")]
    assert len(publisher.events(Anomaly)) == 2


def test_full_queue_answers_503_with_retry_after_and_recovers() -> None:
    asyncio.run(_full_queue_scenario())


async def _full_queue_scenario() -> None:
    publisher = MemoryPublisher()
    publisher.gate.clear()  # Kafka is slow: nothing is acknowledged until the gate opens
    app = create_app(Settings(ingest_queue_capacity=10, ingest_retry_after_s=7, **UNBOUNDED), publisher)  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=app)
    body = encode_remote_write([({"__name__": "m", "pod": "p"}, [(float(i), 1000 + i) for i in range(8)])])
    async with httpx.AsyncClient(transport=transport, base_url="http://ingest") as client:
        first = asyncio.create_task(client.post(REMOTE_WRITE_PATH, content=body, headers=RW_HEADERS))
        service = app.state.service
        for _ in range(200):
            if service.queue.weight:
                break
            await asyncio.sleep(0.01)
        second = await client.post(REMOTE_WRITE_PATH, content=body, headers=RW_HEADERS)
        assert second.status_code == 503 and second.headers["Retry-After"] == "7"
        publisher.gate.set()
        assert (await first).status_code == 204
        third = await client.post(REMOTE_WRITE_PATH, content=body, headers=RW_HEADERS)
        assert third.status_code == 204
    service.queue.stop()
    assert len(publisher.events(MetricBatch)) == 2
    assert not publisher.deadletters()  # backpressure is not bad input


def test_kafka_failure_answers_503_and_the_alert_can_be_redelivered() -> None:
    client, publisher = _client()
    body = (FIXTURES / "alertmanager_webhook_v4.json").read_bytes()
    with client:
        publisher.fail_next_flush = True
        failed = client.post(ALERTMANAGER_PATH, content=body)
        retried = client.post(ALERTMANAGER_PATH, content=body)
    assert failed.status_code == 503 and "Retry-After" in failed.headers
    assert retried.json()["accepted"] == 2
    assert len(publisher.events(Anomaly)) == 2


def test_metrics_and_health_endpoints() -> None:
    client, _ = _client()
    with client:
        client.post(LOKI_PUSH_PATH, content=b"nope", headers={"Content-Type": "application/json"})
        metrics = client.get("/metrics")
        health = client.get("/healthz").json()
    assert metrics.headers["content-type"].startswith("text/plain")
    assert 'clustermedic_ingest_rejected_total{reason="json",receiver="loki_push"} 1.0' in metrics.text
    assert 'clustermedic_ingest_requests_total{code="400",receiver="loki_push"} 1.0' in metrics.text
    assert "clustermedic_ingest_publish_latency_seconds_bucket" in metrics.text
    assert health["status"] == "ok" and health["queue_capacity"] > 0
    assert DeadLetter.topic == "deadletter.v1"
