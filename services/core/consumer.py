"""A consumer-group loop for services that are not stream processors (diagnostician, remediator).

Request/response work with a database (and maybe an LLM or an actuator) has no stream state to
co-partition, so it runs as a plain kafka-python consumer in a group. Offsets are committed after a
poll's messages are handled and what they published is acknowledged, so a crash repeats at most one
poll (at-least-once: each handler is idempotent or harmless to repeat).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kafka import KafkaConsumer
from kafka.errors import KafkaError

from services.core.bus import SUBSCRIBER_METADATA_MAX_AGE_MS, KafkaPublisher
from services.core.errors import InfraNotReady
from services.core.settings import Settings

Handler = Callable[[bytes, bytes | None, KafkaPublisher], None]
log = logging.getLogger(__name__)


def consume(
    settings: Settings,
    topic: str,
    consumer: str,
    handle: Handler,
    *,
    stop: threading.Event | None = None,
    max_messages: int | None = None,
    poll_timeout_ms: int = 500,
) -> int:
    """Feed every message of ``topic`` (a base name) to ``handle`` until ``stop`` or ``max_messages``.

    Args:
        settings: Kafka address, topic prefix, consumer-group prefix.
        topic: base topic name, e.g. ``incidents.v1``.
        consumer: the service's name; the group is ``<faust_app_id>-<consumer>``.
        handle: called with the raw value, the key and a publisher; it must not raise for bad input
            (dead-letter it instead).
        stop: set it to end the loop after the current poll.
        max_messages: end after this many messages (tests, one-shot runs).
        poll_timeout_ms: how long one poll waits.

    Returns:
        How many messages were handled.

    Raises:
        InfraNotReady: Kafka is unreachable at start.
    """
    try:
        kafka = KafkaConsumer(
            settings.topic(topic),
            bootstrap_servers=settings.bootstrap_servers,
            group_id=f"{settings.faust_app_id}-{consumer}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            metadata_max_age_ms=SUBSCRIBER_METADATA_MAX_AGE_MS,
        )
    except KafkaError as exc:
        raise InfraNotReady(f"no Kafka broker at {settings.bootstrap_servers}: {exc}") from exc
    handled = 0
    stop = stop or threading.Event()
    try:
        with KafkaPublisher(settings) as publisher:
            # `medic stack` waits for this line: the role is connected and about to take messages
            log.info("ready: %s consumes %s", consumer, settings.topic(topic))
            while not stop.is_set() and (max_messages is None or handled < max_messages):
                batches = kafka.poll(timeout_ms=poll_timeout_ms, max_records=50)
                if not batches:
                    continue
                for records in batches.values():
                    for record in records:
                        handle(record.value, record.key, publisher)
                        handled += 1
                publisher.flush()
                kafka.commit()
    finally:
        kafka.close()
    return handled
