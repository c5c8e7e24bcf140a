"""Kafka from non-Faust code: a publisher, topic creation and a bounded reader.

Faust agents own the stream side (``pipelines/``). Everything else that writes events (ingest
receivers, the simulator, Celery tasks, the CLI) uses :class:`KafkaPublisher`, which keys each message
with :meth:`Event.key` so all messages about one entity land on one partition.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from types import TracebackType

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from services.core.errors import InfraError, InfraNotReady
from services.core.events import ALL_EVENTS, Event
from services.core.settings import Settings

SUBSCRIBER_METADATA_MAX_AGE_MS = 10_000
"""How often a subscribing kafka-python consumer refreshes topic metadata (its default: 5 minutes).

A consumer group's leader that has no metadata for a subscribed topic when it assigns partitions
(kafka-python's range assignor then logs "No partition metadata for topic ...") assigns that topic to
nobody, and the group rebalances only once a metadata refresh shows the partitions. The demo's
diagnostician lost a whole run that way, twice, on a loaded machine: with the default it waited out
the five minutes. A refresh every 10 s bounds the stall; measured on the local broker, a consumer's
first message and its steady latency are the same with it as without."""


def all_topics(settings: Settings) -> list[str]:
    """Full names of every topic in the architecture, with the settings' prefix."""
    return [settings.topic(cls.topic) for cls in ALL_EVENTS]


def ensure_topics(settings: Settings, names: Iterable[str] | None = None) -> list[str]:
    """Create the topics (default: all of them) with ``settings.kafka_partitions``; return those created.

    Raises:
        InfraNotReady: no broker answers.
    """
    wanted = list(names) if names is not None else all_topics(settings)
    try:
        admin = KafkaAdminClient(bootstrap_servers=settings.bootstrap_servers, request_timeout_ms=10_000)
    except KafkaError as exc:
        raise InfraNotReady(f"no Kafka broker at {settings.bootstrap_servers}: run `make up`") from exc
    try:
        existing = set(admin.list_topics())
        missing = [name for name in wanted if name not in existing]
        created: list[str] = []
        for name in missing:
            try:
                admin.create_topics([NewTopic(name, settings.kafka_partitions, 1)])
                created.append(name)
            except TopicAlreadyExistsError:  # created concurrently by another process
                pass
        return created
    finally:
        admin.close()


class KafkaPublisher:
    """Publishes events to their topics, keyed by entity.

    Delivery is at-least-once: ``publish`` returns once the send is queued, ``flush`` waits for every
    queued message to be acknowledged by the broker (``acks=all``).

    Args:
        settings: bootstrap servers and topic prefix come from here.
        linger_ms: how long the producer waits to batch messages (throughput vs latency).
    """

    def __init__(self, settings: Settings, *, linger_ms: int = 5) -> None:
        self._settings = settings
        try:
            self._producer = KafkaProducer(
                bootstrap_servers=settings.bootstrap_servers,
                acks="all",
                linger_ms=linger_ms,
                retries=5,
                max_in_flight_requests_per_connection=1,  # keeps per-key order across retries
            )
        except KafkaError as exc:
            raise InfraNotReady(f"no Kafka broker at {settings.bootstrap_servers}: run `make up`") from exc

    def publish(self, event: Event, *, topic: str | None = None) -> None:
        """Queue one event for its topic (or ``topic``, a base name such as ``deadletter.v1``)."""
        self.send_raw(topic or event.topic, event.key().encode(), event.to_bytes())

    def send_raw(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Queue raw bytes for a topic given by base name; for tests and dead-letter replays."""
        try:
            self._producer.send(self._settings.topic(topic), key=key, value=value)
        except KafkaError as exc:
            raise InfraError(f"cannot publish to {topic}: {exc}") from exc

    def flush(self, timeout_s: float = 30.0) -> None:
        """Block until every queued message is acknowledged."""
        try:
            self._producer.flush(timeout=timeout_s)
        except KafkaError as exc:
            raise InfraError(f"Kafka did not acknowledge within {timeout_s} s: {exc}") from exc

    def close(self) -> None:
        """Flush and close the producer."""
        self._producer.close()

    def __enter__(self) -> KafkaPublisher:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.flush()
        self.close()


def read_raw(
    settings: Settings,
    topics: Iterable[str],
    *,
    max_messages: int,
    timeout_s: float,
    from_beginning: bool = True,
) -> Iterator[tuple[str, bytes | None, bytes]]:
    """Yield ``(base topic, key, value)`` from topics (base names) until ``max_messages`` or the deadline.

    A plain consumer without a group: for the demo, the CLI and tests that check what reached a topic.
    """
    prefix = settings.topic_prefix
    consumer = KafkaConsumer(
        *[settings.topic(t) for t in topics],
        bootstrap_servers=settings.bootstrap_servers,
        auto_offset_reset="earliest" if from_beginning else "latest",
        enable_auto_commit=False,
        group_id=None,
        consumer_timeout_ms=500,
    )
    deadline = time.monotonic() + timeout_s
    seen = 0
    try:
        while seen < max_messages and time.monotonic() < deadline:
            for message in consumer:
                yield message.topic[len(prefix) :], message.key, message.value
                seen += 1
                if seen >= max_messages or time.monotonic() >= deadline:
                    break
    finally:
        consumer.close()
