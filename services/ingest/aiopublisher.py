"""A high-throughput Kafka publisher for the ingest service, built on aiokafka.

:class:`services.core.bus.KafkaPublisher` (kafka-python) spends ~180 µs of Python per message on this
kind of machine, which capped ingest at ~14,000 samples/s. This publisher keeps the same
``publish``/``flush``/``close`` interface and the same guarantees, and is much cheaper per message:

- messages of one round are appended straight into one record batch per partition
  (``BatchBuilder.append``, a C extension) and handed to the producer with ``send_batch``, so there
  is one future per partition and round instead of one coroutine and one future per message;
- the partition of a key is what the default partitioner of kafka-python, aiokafka and the Java
  client picks (murmur2 of the key over all partitions), computed once per key and cached, so an
  entity lands on the same partition whichever publisher wrote it;
- ``flush_async`` lets the caller go on with the next round while Kafka acknowledges this one
  (:class:`~services.ingest.sink.PublishQueue` keeps a few rounds in flight).

The producer lives on an event loop in a thread of its own, so callers stay synchronous. Delivery is
at-least-once with ``acks=all``; aiokafka sends one batch per partition at a time, so the order of
one key's messages is kept across rounds and retries.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner

from services.core.errors import InfraError, InfraNotReady
from services.core.events import Event
from services.core.settings import Settings

Acked = Callable[[BaseException | None], None]
"""Called once a flushed round is acknowledged (``None``) or failed (the error)."""

_PARTITIONER = DefaultPartitioner()
_KEY_CACHE_LIMIT = 100_000
_PARTITIONS_TTL_S = 60.0  # how long a topic's partition list is trusted (topics can gain partitions)


class AioKafkaPublisher:
    """Publishes events to their topics, keyed by entity, through aiokafka (see the module docstring).

    Not thread-safe: one thread publishes and flushes (the ingest publish queue's thread).

    Args:
        settings: bootstrap servers and topic prefix come from here.
        compression: Kafka compression codec (``zstd``, ``lz4``, ``snappy``, ``gzip`` or ``None``).
            None by default: every consumer must be able to decode it, and the kafka-python readers
            in this project (``read_raw``, tests) only have gzip, which costs more CPU than it saves.
        max_batch_bytes: most bytes of one record batch (under the broker's ``message.max.bytes``).
        start_timeout_s: how long to wait for the broker when starting.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        compression: str | None = None,
        max_batch_bytes: int = 512 * 1024,
        start_timeout_s: float = 30.0,
    ) -> None:
        self._settings = settings
        self._pending: list[tuple[str, bytes | None, bytes]] = []
        self._partitions: dict[str, list[int]] = {}
        self._partition_of: dict[tuple[str, bytes], int] = {}
        self._partitions_checked = 0.0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="aiokafka-publisher", daemon=True)
        self._thread.start()
        self._producer: AIOKafkaProducer | None = None
        self._closed = False
        options: dict[str, Any] = {
            "bootstrap_servers": settings.bootstrap_servers,
            "acks": "all",
            "compression_type": compression,
            "max_batch_size": max_batch_bytes,
            "max_request_size": max(1024 * 1024, 2 * max_batch_bytes),
        }
        try:
            self._call(self._start(options), start_timeout_s)
        except BaseException as exc:
            self._stop_loop()
            if isinstance(exc, (KafkaError, OSError, TimeoutError)):
                raise InfraNotReady(f"no Kafka broker at {settings.bootstrap_servers}: run `make up`") from exc
            raise

    async def _start(self, options: dict[str, Any]) -> None:
        producer = AIOKafkaProducer(**options)
        try:
            await producer.start()
        except BaseException:
            await producer.stop()
            raise
        self._producer = producer

    def _call(self, coro: Any, timeout_s: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    # ------------------------------------------------------------------ Publisher interface

    def publish(self, event: Event, *, topic: str | None = None) -> None:
        """Queue one event for its topic (or ``topic``, a base name such as ``deadletter.v1``)."""
        self.send_raw(topic or event.topic, event.key().encode(), event.to_bytes())

    def send_raw(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Queue raw bytes for a topic given by base name; nothing is sent before the next flush."""
        if self._closed:
            raise InfraError(f"cannot publish to {topic}: the publisher is closed")
        self._pending.append((self._settings.topic(topic), key, value))

    def flush_async(self, acked: Acked, timeout_s: float = 30.0) -> None:
        """Send everything queued since the last flush; ``acked`` runs (on the publisher's thread) when done.

        ``acked`` gets ``None`` once the broker acknowledged every message, else the error (an
        :class:`InfraError`, also when the acks took longer than ``timeout_s``; the messages may still
        arrive later, which at-least-once delivery allows). It is called exactly once, also when
        nothing was queued.
        """
        messages, self._pending = self._pending, []
        if self._closed:
            acked(InfraError("the publisher is closed"))
            return
        future = asyncio.run_coroutine_threadsafe(self._send_within(messages, timeout_s), self._loop)

        def settle(done: concurrent.futures.Future[None]) -> None:
            error = done.exception() if not done.cancelled() else InfraError("publish round cancelled")
            if error is not None and not isinstance(error, InfraError):
                error = InfraError(f"Kafka did not acknowledge: {type(error).__name__}: {error}")
            acked(error)

        future.add_done_callback(settle)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Block until every queued message is acknowledged.

        Raises:
            InfraError: Kafka did not acknowledge within ``timeout_s`` or refused a message.
        """
        done = threading.Event()
        outcome: list[BaseException | None] = []

        def acked(error: BaseException | None) -> None:
            outcome.append(error)
            done.set()

        self.flush_async(acked, timeout_s)
        if not done.wait(timeout_s + 1.0):
            raise InfraError(f"Kafka did not acknowledge within {timeout_s} s")
        if outcome[0] is not None:
            raise outcome[0]

    def close(self) -> None:
        """Flush what is queued, stop the producer and its thread (idempotent)."""
        if self._closed:
            return
        try:
            if self._pending:
                self.flush()
        finally:
            self._closed = True
            try:
                if self._producer is not None:
                    self._call(self._producer.stop(), 30.0)
            finally:
                self._stop_loop()

    def __enter__(self) -> AioKafkaPublisher:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.flush()
        self.close()

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10.0)
        if not self._loop.is_running():
            self._loop.close()

    # ------------------------------------------------------------------ on the event loop

    async def _partition(self, producer: AIOKafkaProducer, topic: str, key: bytes | None) -> int:
        """The default partitioner's choice for ``key``, cached (murmur2 in Python is not free).

        No key: a random partition, as every default partitioner does.
        """
        cached = self._partition_of.get((topic, key)) if key is not None else None
        if cached is not None:
            return cached
        partitions = self._partitions.get(topic)
        if partitions is None:
            found = await producer.partitions_for(topic)
            if not found:
                raise InfraError(f"topic {topic} has no partitions (does it exist?)")
            partitions = self._partitions[topic] = sorted(found)
        partition: int = _PARTITIONER(key, partitions, partitions)
        if key is None:
            return partition
        if len(self._partition_of) >= _KEY_CACHE_LIMIT:
            self._partition_of.clear()
        self._partition_of[(topic, key)] = partition
        return partition

    async def _send_within(self, messages: list[tuple[str, bytes | None, bytes]], timeout_s: float) -> None:
        try:
            await asyncio.wait_for(self._send(messages), timeout_s)
        except TimeoutError as exc:
            raise InfraError(f"Kafka did not acknowledge within {timeout_s} s") from exc

    async def _send(self, messages: list[tuple[str, bytes | None, bytes]]) -> None:
        """Append the round to one record batch per partition, send them and wait for the acks."""
        producer = self._producer
        if producer is None:
            raise InfraError("the publisher is not started")
        if not messages:
            return
        now = self._loop.time()
        if now - self._partitions_checked > _PARTITIONS_TTL_S:
            self._partitions.clear()
            self._partition_of.clear()
            self._partitions_checked = now
        open_batches: dict[tuple[str, int], Any] = {}
        acks: list[asyncio.Future[Any]] = []
        try:
            for topic, key, value in messages:
                where = (topic, await self._partition(producer, topic, key))
                batch = open_batches.get(where)
                if batch is None:
                    batch = open_batches[where] = producer.create_batch()
                if batch.append(timestamp=None, key=key, value=value) is None:  # full: send it, start another
                    acks.append(await producer.send_batch(batch, where[0], partition=where[1]))
                    batch = open_batches[where] = producer.create_batch()
                    if batch.append(timestamp=None, key=key, value=value) is None:
                        raise InfraError(f"a message of {len(value)} bytes does not fit a record batch")
            for (topic, partition), batch in open_batches.items():
                batch.close()  # a round is already a group commit: send it now rather than linger
                acks.append(await producer.send_batch(batch, topic, partition=partition))
            await asyncio.gather(*acks)
        except KafkaError as exc:
            raise InfraError(f"Kafka did not acknowledge: {type(exc).__name__}: {exc}") from exc
