"""An in-memory publisher with KafkaPublisher's interface, for unit tests and dry runs.

Events become visible in :attr:`MemoryPublisher.acked` only when ``flush`` is called, as with Kafka,
and ``flush`` can be held back (``gate``) or made to fail to test backpressure and retries.
"""

from __future__ import annotations

import threading

from services.core.errors import InfraError
from services.core.events import EVENTS_BY_TOPIC, DeadLetter, Event


class MemoryPublisher:
    """Records published events; ``acked`` holds ``(topic, event)`` once flushed."""

    def __init__(self) -> None:
        self.pending: list[tuple[str, Event]] = []
        self.acked: list[tuple[str, Event]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_next_flush = False
        self.closed = False
        self._lock = threading.Lock()

    def publish(self, event: Event, *, topic: str | None = None) -> None:
        """Queue an event (serialised and parsed back, as a Kafka round trip would)."""
        copy = EVENTS_BY_TOPIC[event.topic].from_bytes(event.to_bytes())
        with self._lock:
            self.pending.append((topic or event.topic, copy))

    def send_raw(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Queue bytes already serialised for a topic given by base name (parsed back as its event)."""
        copy = EVENTS_BY_TOPIC[topic].from_bytes(value)
        with self._lock:
            self.pending.append((topic, copy))

    def flush(self, timeout_s: float = 30.0) -> None:
        """Acknowledge what is pending; wait for ``gate`` first.

        Raises:
            InfraError: the gate stayed closed past ``timeout_s``, or ``fail_next_flush`` was set.
        """
        if not self.gate.wait(timeout_s):
            raise InfraError(f"memory publisher held for {timeout_s} s")
        with self._lock:
            if self.fail_next_flush:
                self.fail_next_flush = False
                self.pending.clear()
                raise InfraError("memory publisher told to fail this flush")
            self.acked.extend(self.pending)
            self.pending.clear()

    def close(self) -> None:
        """Mark closed (nothing to release)."""
        self.closed = True

    def events(self, kind: type[Event]) -> list[Event]:
        """Acknowledged events of one type, in order."""
        with self._lock:
            return [event for _, event in self.acked if isinstance(event, kind)]

    def deadletters(self) -> list[DeadLetter]:
        """Acknowledged dead letters, in order."""
        return [e for e in self.events(DeadLetter) if isinstance(e, DeadLetter)]
