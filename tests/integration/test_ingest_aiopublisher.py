"""The aiokafka publisher against the real broker: same partitions as KafkaPublisher, order kept, acks real."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from kafka import KafkaConsumer, TopicPartition

from services.core.bus import KafkaPublisher, ensure_topics
from services.core.events import MetricBatch
from services.core.settings import Settings
from services.ingest.aiopublisher import AioKafkaPublisher
from services.ingest.http import REMOTE_WRITE_PATH, create_app
from services.ingest.normalise import encode_remote_write
from tests.conftest import poll

pytestmark = pytest.mark.integration

RW_HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}


def _batch(entity: str, seq: int) -> MetricBatch:
    return MetricBatch.model_validate(
        {"entity": entity, "source": "test", "samples": [{"name": "seq", "labels": {}, "value": seq, "ts": 1.0}]}
    )


def _read_all(settings: Settings, topic: str, expected: int) -> list[tuple[int, bytes, bytes]]:
    """Every (partition, key, value) on a topic, in partition order, once ``expected`` arrived."""
    name = settings.topic(topic)
    consumer = KafkaConsumer(bootstrap_servers=settings.bootstrap_servers, enable_auto_commit=False, group_id=None)
    try:
        parts = [TopicPartition(name, p) for p in sorted(consumer.partitions_for_topic(name) or ())]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        got: list[tuple[int, bytes, bytes]] = []

        def fetch() -> bool:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend((r.partition, r.key, r.value) for r in records)
            return len(got) >= expected

        poll(fetch, 30, what=f"{expected} messages on {name}")
        return got
    finally:
        consumer.close()


def test_keys_land_where_kafka_publisher_puts_them_in_order_and_intact(kafka_ready: None, settings: Settings) -> None:
    ensure_topics(settings, [settings.topic(MetricBatch.topic)])
    entities = [f"GPU-{i:04d}" for i in range(40)]
    with KafkaPublisher(settings) as reference:
        for entity in entities:
            reference.publish(_batch(entity, -1))
    where = {key: partition for partition, key, _ in _read_all(settings, MetricBatch.topic, len(entities))}

    publisher = AioKafkaPublisher(settings)
    try:
        for seq in range(5):  # five rounds, each flushed
            for entity in entities:
                publisher.publish(_batch(entity, seq))
            publisher.flush(20)
    finally:
        publisher.close()
    records = _read_all(settings, MetricBatch.topic, len(entities) * 6)
    seen: dict[bytes, list[float]] = {}
    for partition, key, value in records:
        assert partition == where[key], f"{key!r} went to partition {partition}, KafkaPublisher chose {where[key]}"
        batch = MetricBatch.from_bytes(value)
        assert batch.key().encode() == key
        seen.setdefault(key, []).append(batch.samples[0].value)
    assert all(values == [-1, 0, 1, 2, 3, 4] for values in seen.values()), seen


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _ingest(settings: Settings) -> Iterator[str]:
    port = _free_port()
    app = create_app(settings, AioKafkaPublisher(settings))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    poll(lambda: server.started, 20, what="ingest server to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def test_remote_write_is_answered_after_kafka_acknowledged_every_batch(kafka_ready: None, settings: Settings) -> None:
    ensure_topics(settings)
    gpus = [f"GPU-{i}" for i in range(6)]
    stamp_ms = int(time.time()) * 1000  # recent: ingest refuses samples older than ingest_max_age_s
    body = encode_remote_write(
        [
            ({"__name__": "DCGM_FI_DEV_GPU_TEMP", "UUID": gpu, "Hostname": "node-1"}, [(60.0 + i, stamp_ms)])
            for i, gpu in enumerate(gpus)
        ]
        + [
            ({"__name__": "DCGM_FI_DEV_XID_ERRORS", "UUID": gpu, "Hostname": "node-1"}, [(0.0, stamp_ms)])
            for gpu in gpus
        ]
    )
    with _ingest(settings) as base:
        for _ in range(3):
            assert httpx.post(base + REMOTE_WRITE_PATH, content=body, headers=RW_HEADERS).status_code == 204
        metrics = httpx.get(base + "/metrics").text
    # answered 204 only after the acks, so every batch is on the topic already
    records = _read_all(settings, MetricBatch.topic, 3 * len(gpus))
    batches = [MetricBatch.from_bytes(value) for _, _, value in records]
    assert len(batches) == 3 * len(gpus)
    assert sorted({b.entity for b in batches}) == gpus
    temps = {(b.entity, s.value) for b in batches for s in b.samples if s.name == "DCGM_FI_DEV_GPU_TEMP"}
    assert temps == {(gpu, 60.0 + i) for i, gpu in enumerate(gpus)}
    assert all(
        s.value == 0.0 and s.ts == stamp_ms / 1000
        for b in batches
        for s in b.samples
        if s.name == "DCGM_FI_DEV_XID_ERRORS"
    )
    assert f'clustermedic_ingest_published_total{{topic="{MetricBatch.topic}"}} {3 * len(gpus)}.0' in metrics
    assert 'clustermedic_ingest_received_total{receiver="remote_write"} 36.0' in metrics
