"""A bad item in a page or a relist is skipped and recorded; its neighbours are delivered.

One bad object used to drop a whole Kubernetes relist, and one bad entry made a pull page fail whole:
dead-lettered and asked for again at every poll, forever, holding back every entry after it. Now the
good items are published, what was left out is dead-lettered once, and the cursor moves past the page.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from kubernetes import client

from services.core.events import DeadLetter, KubeEvent, LogRecord, MetricBatch
from services.ingest.errors import RejectedInput
from services.ingest.kube import EventWatcher
from services.ingest.memory import MemoryPublisher
from services.ingest.pull import Delivery
from services.ingest.sink import IngestMetrics, PublishQueue
from services.ingest.sources.loki import LokiPuller
from services.ingest.sources.prometheus import PrometheusPuller

NS = 1_000_000_000
T0 = int(time.time()) * NS


@pytest.fixture
def delivery() -> Iterator[tuple[Delivery, MemoryPublisher]]:
    publisher = MemoryPublisher()
    metrics = IngestMetrics()
    queue = PublishQueue(publisher, metrics, capacity=100_000, flush_timeout_s=5.0)
    queue.start()
    try:
        yield Delivery(queue, metrics, timeout_s=10.0, deadletter_max_bytes=4096), publisher
    finally:
        queue.stop(5.0)


class Scripted:
    """An HTTP server answering each request with the next scripted JSON body (then an empty result)."""

    def __init__(self, kind: str, *pages: object) -> None:
        self.pages = list(pages)
        self.requests: list[dict[str, str]] = []
        self.empty = {"status": "success", "data": {"resultType": kind, "result": []}}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(dict(request.url.params))
        return httpx.Response(200, json=self.pages.pop(0) if self.pages else self.empty)


def test_a_poison_entry_in_a_loki_page_is_dead_lettered_and_the_cursor_moves_past_it(
    delivery: tuple[Delivery, MemoryPublisher],
) -> None:
    sink, publisher = delivery
    page = {
        "status": "success",
        "data": {
            "resultType": "streams",
            "result": [
                {
                    "stream": {"pod": "a"},
                    "values": [
                        [str(T0 - 5 * NS), "good one"],
                        ["7" * 5000, "a 5,000-digit timestamp"],  # int() raised ValueError
                        [str(T0 - 4 * NS), 42],
                        [str(T0 - 3 * NS), "good two"],
                    ],
                },
                {"stream": {}, "values": [[str(T0 - 2 * NS), "a stream without labels"]]},
                "not a stream",
            ],
        },
    }
    loki = Scripted("streams", page)
    puller = LokiPuller(
        "http://loki:3100",
        '{pod="a"}',
        sink,
        lookback_s=10,
        client=httpx.Client(transport=httpx.MockTransport(loki)),
        clock=lambda: T0 / NS,
    )
    assert puller.poll() == 2
    lines = [r.line for r in publisher.events(LogRecord) if isinstance(r, LogRecord)]
    assert lines == ["good one", "good two"]
    [letter] = publisher.deadletters()
    assert "4 entries left out, the rest kept" in letter.error
    assert b"5,000-digit" not in letter.raw or b"values[1]" in letter.raw
    assert puller.cursor_ns == T0 - 3 * NS  # past the page: it is not asked for again
    puller.poll()
    assert loki.requests[-1]["start"] == str(T0 - 3 * NS)
    assert len(publisher.deadletters()) == 1


def test_a_poison_value_in_a_query_range_answer_is_dead_lettered_and_the_cursor_moves(
    delivery: tuple[Delivery, MemoryPublisher],
) -> None:
    sink, publisher = delivery
    now = T0 / NS
    answer = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {"metric": {"__name__": "up", "pod": "a"}, "values": [[now - 10, "1"], [1e400, "1"], [now - 5, "x"]]},
                {"metric": {"__name__": "up", "pod": "b"}, "values": [[int("1" + "0" * 400), "1"], [now - 5, "2"]]},
                {"metric": "not labels", "values": []},
            ],
        },
    }
    raw = json.dumps(answer).replace("Infinity", "1e400")
    prometheus = Scripted("matrix")

    def handler(request: httpx.Request) -> httpx.Response:
        prometheus.requests.append(dict(request.url.params))
        if len(prometheus.requests) == 1:
            return httpx.Response(200, content=raw.encode(), headers={"Content-Type": "application/json"})
        return httpx.Response(200, json=prometheus.empty)

    puller = PrometheusPuller(
        "http://prom:9090",
        {"up": "up"},
        sink,
        step_s=5,
        lookback_s=10,
        client=httpx.Client(transport=httpx.MockTransport(handler)),
        clock=lambda: now,
    )
    assert puller.poll() == 2  # a's first value and b's second (a's infinite timestamp is dropped)
    samples = sorted(
        (s.labels["pod"], s.value)
        for b in publisher.events(MetricBatch)
        if isinstance(b, MetricBatch)
        for s in b.samples
    )
    assert ("a", 1.0) in samples and ("b", 2.0) in samples
    letters = [d for d in publisher.deadletters() if "left out" in d.error]
    assert len(letters) == 1 and "3 values left out" in letters[0].error
    assert puller.cursors["up"] == int(now * 1000) - int(now * 1000) % 5000


def _event(name: str, rv: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "s", "uid": f"uid-{name}", "resourceVersion": str(rv)},
        "involvedObject": {"kind": "Pod", "name": f"pod-{name}", "namespace": "s"},
        "reason": "BackOff",
        "type": "Warning",
        "count": 1,
        "lastTimestamp": "2026-11-29T10:00:00Z",
    }


def _watcher() -> tuple[EventWatcher, list[list[KubeEvent | DeadLetter]]]:
    emitted: list[list[KubeEvent | DeadLetter]] = []
    api = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))  # never contacted
    return EventWatcher(api, emitted.append), emitted


def test_a_bad_object_in_a_relist_is_dead_lettered_and_its_neighbours_delivered() -> None:
    watcher, emitted = _watcher()
    items = [
        _event("e1", 10),
        "not an object",
        [1, 2],
        {**_event("e2", 11), "count": 1e400},  # OverflowError
        {**_event("e3", 12), "metadata": "not metadata"},  # AttributeError before; an event all the same
        _event("e4", 13),
    ]
    body = {"kind": "EventList", "metadata": {"resourceVersion": "13"}, "items": items}
    watcher._list = lambda **_kw: SimpleNamespace(data=json.dumps(body).replace("Infinity", "1e400").encode())
    watcher.relist()
    [out] = emitted
    assert [e.involved_object.name for e in out if isinstance(e, KubeEvent)] == ["pod-e1", "pod-e3", "pod-e4"]
    letters = [e for e in out if isinstance(e, DeadLetter)]
    assert len(letters) == 3 and all(d.source_topic == "k8s:events" for d in letters)
    assert watcher.resource_version == "13"
    watcher.relist()  # nothing new: the bad objects are remembered as delivered too
    assert len(emitted) == 1


@pytest.mark.parametrize("data", [b"[1, 2]", b"{not json", b'{"items": 5}', b"[" * 5000])
def test_a_relist_answer_that_is_not_a_list_object_is_refused_for_the_watcher_to_retry(data: bytes) -> None:
    watcher, emitted = _watcher()
    watcher._list = lambda **_kw: SimpleNamespace(data=data)
    with pytest.raises(RejectedInput):
        watcher.relist()
    assert emitted == [] and watcher.resource_version == ""
