"""Event contracts through the real Kafka broker and a real Faust agent."""

from __future__ import annotations

import asyncio
import time

import pytest

from pipelines.app import create_pipeline
from pipelines.smoke import register_smoke
from services.core.bus import KafkaPublisher, ensure_topics, read_raw
from services.core.events import DeadLetter, Event, LogRecord, MetricBatch
from services.core.examples import example_events

pytestmark = pytest.mark.integration


def _consume(settings, expected: int, timeout_s: float = 60.0) -> list[Event]:
    received: list[Event] = []

    async def run() -> None:
        pipeline = create_pipeline(settings)
        enough = asyncio.Event()

        async def on_event(event: Event) -> None:
            received.append(event)
            if len(received) >= expected:
                enough.set()

        register_smoke(pipeline, on_event)
        await pipeline.app.start()
        try:
            await asyncio.wait_for(enough.wait(), timeout_s)
        except TimeoutError:
            pass  # the assertions below say what is missing
        finally:
            await pipeline.app.stop()

    asyncio.run(run())
    return received


def test_every_event_model_round_trips_through_the_broker(kafka_ready, settings):
    ensure_topics(settings)
    sent = [e for e in example_events(time.time()) if not isinstance(e, DeadLetter)]
    with KafkaPublisher(settings) as publisher:
        for event in sent:
            publisher.publish(event)

    received = _consume(settings, expected=len(sent))

    assert sorted(received, key=lambda e: e.topic) == sorted(sent, key=lambda e: e.topic)


def test_messages_are_keyed_by_entity_so_one_entity_stays_on_one_partition(kafka_ready, settings):
    ensure_topics(settings)
    batches = [MetricBatch(entity=f"GPU-{i % 3}", samples=()) for i in range(30)]
    with KafkaPublisher(settings) as publisher:
        for batch in batches:
            publisher.publish(batch)
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        settings.topic(MetricBatch.topic),
        bootstrap_servers=settings.bootstrap_servers,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
    )
    partitions: dict[bytes, set[int]] = {}
    for n, message in enumerate(consumer, start=1):
        partitions.setdefault(message.key, set()).add(message.partition)
        if n == len(batches):
            break
    consumer.close()
    assert sorted(partitions) == [b"GPU-0", b"GPU-1", b"GPU-2"]
    assert all(len(p) == 1 for p in partitions.values())


def test_malformed_message_is_dead_lettered_and_the_agent_keeps_consuming(kafka_ready, settings):
    ensure_topics(settings)
    before = LogRecord(line="before", ts=1.0, stream={"pod": "p1"})
    after = LogRecord(line="after", ts=2.0, stream={"pod": "p1"})
    with KafkaPublisher(settings) as publisher:
        publisher.publish(before)
        publisher.send_raw(LogRecord.topic, b"p1", b"\x00 not json")
        publisher.send_raw(LogRecord.topic, b"p1", b'{"line": 3}')
        publisher.publish(after)

    received = _consume(settings, expected=2)

    assert [e.line for e in received if isinstance(e, LogRecord)] == ["before", "after"]
    raw_letters = read_raw(settings, [DeadLetter.topic], max_messages=2, timeout_s=20)
    letters = [DeadLetter.from_bytes(value) for _, _, value in raw_letters]
    assert sorted(letter.raw for letter in letters) == sorted([b"\x00 not json", b'{"line": 3}'])
    assert {letter.error_type for letter in letters} == {"DecodeError", "SchemaError"}
    assert all(letter.consumer == "smoke" and letter.source_key == "p1" for letter in letters)
