"""The publish queue with a publisher that acknowledges later: rounds overlap, jobs complete on the ack."""

from __future__ import annotations

import threading
from collections.abc import Callable

from services.core.errors import InfraError
from services.core.events import Event, MetricBatch
from services.ingest.sink import IngestMetrics, PipelinedPublisher, PublishQueue
from tests.conftest import poll

Acked = Callable[[BaseException | None], None]


class LaterPublisher:
    """Records each flushed round and acknowledges it only when the test says so."""

    def __init__(self) -> None:
        self.pending: list[Event] = []
        self.rounds: list[tuple[list[Event], Acked]] = []
        self.lock = threading.Lock()
        self.closed = False

    def publish(self, event: Event, *, topic: str | None = None) -> None:
        self.pending.append(event)

    def flush_async(self, acked: Acked, timeout_s: float = 30.0) -> None:
        with self.lock:
            self.rounds.append((self.pending, acked))
        self.pending = []

    def flush(self, timeout_s: float = 30.0) -> None:
        raise AssertionError("a pipelined publisher is flushed asynchronously")

    def close(self) -> None:
        self.closed = True

    def round_count(self) -> int:
        with self.lock:
            return len(self.rounds)


def _batch(entity: str, samples: int) -> MetricBatch:
    return MetricBatch.model_validate(
        {
            "entity": entity,
            "source": "test",
            "samples": [{"name": "up", "labels": {}, "value": 1.0, "ts": float(i)} for i in range(samples)],
        }
    )


def _published(metrics: IngestMetrics) -> float:
    return metrics.registry.get_sample_value("clustermedic_ingest_published_total", {"topic": MetricBatch.topic}) or 0


def test_next_round_is_published_before_the_previous_is_acknowledged_and_jobs_complete_on_their_ack() -> None:
    publisher = LaterPublisher()
    assert isinstance(publisher, PipelinedPublisher)
    metrics = IngestMetrics()
    queue = PublishQueue(publisher, metrics, capacity=100, rounds_in_flight=2)
    done: dict[str, BaseException | None] = {}

    def record(name: str) -> Callable[[BaseException | None], None]:
        def completed(error: BaseException | None) -> None:
            done[name] = error

        return completed

    queue.start()
    try:
        assert queue.offer([_batch("gpu-a", 10)], record("a"))
        poll(lambda: publisher.round_count() == 1, 10, what="first round")
        assert queue.offer([_batch("gpu-b", 20)], record("b"))
        poll(lambda: publisher.round_count() == 2, 10, what="second round while the first awaits its ack")
        assert queue.offer([_batch("gpu-c", 5)], record("c"))
        assert done == {} and queue.weight == 35, "nothing completes and no weight is freed before an ack"
        assert _published(metrics) == 0

        publisher.rounds[1][1](None)  # the second round is acknowledged first
        poll(lambda: "b" in done, 10, what="job b")
        assert done == {"b": None} and queue.weight == 15 and _published(metrics) == 1

        poll(lambda: publisher.round_count() == 3, 10, what="third round once a slot is free")
        publisher.rounds[0][1](InfraError("broker said no"))
        publisher.rounds[2][1](None)
        poll(lambda: len(done) == 3, 10, what="jobs a and c")
        assert isinstance(done["a"], InfraError) and done["c"] is None
        assert queue.weight == 0 and _published(metrics) == 2
        assert metrics.registry.get_sample_value("clustermedic_ingest_publish_errors_total") == 1
    finally:
        for _, acked in publisher.rounds[3:]:
            acked(None)
        queue.stop(10)
    assert publisher.closed


def test_rounds_in_flight_are_bounded_and_stop_waits_for_their_acks() -> None:
    publisher = LaterPublisher()
    queue = PublishQueue(publisher, IngestMetrics(), capacity=1000, rounds_in_flight=2)
    queue.start()
    done: list[BaseException | None] = []
    for i, rounds in enumerate((1, 2, 2)):
        assert queue.offer([_batch(f"gpu-{i}", 1)], done.append)
        poll(lambda expected=rounds: publisher.round_count() >= expected, 10, what="a round")
    assert publisher.round_count() == 2, "a third round waits for a free slot"
    stopper = threading.Thread(target=queue.stop, args=(10,))
    stopper.start()
    publisher.rounds[0][1](None)
    poll(lambda: publisher.round_count() == 3, 10, what="the third round")
    assert stopper.is_alive(), "stop waits for the acks of the rounds in flight"
    publisher.rounds[1][1](None)
    publisher.rounds[2][1](None)
    stopper.join(10)
    assert not stopper.is_alive() and done == [None, None, None] and publisher.closed
