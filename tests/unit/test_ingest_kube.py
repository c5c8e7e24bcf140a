"""The Kubernetes events watcher against a local server that speaks the list/watch protocol."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes import client

from services.core.events import DeadLetter, KubeEvent
from services.ingest.kube import EventWatcher
from services.ingest.normalise import kube_event
from tests.conftest import poll
from tests.httpstub import StubHandler, serving


def _event(name: str, rv: int, reason: str, count: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": "serving", "uid": f"uid-{name}", "resourceVersion": str(rv)},
        "involvedObject": {"kind": "Pod", "name": f"pod-{name}", "namespace": "serving", "uid": f"pod-uid-{name}"},
        "reason": reason,
        "message": f"{reason} happened",
        "type": "Warning",
        "count": count,
        "lastTimestamp": "2026-11-29T10:00:00Z",
        "source": {"component": "kubelet", "host": "gpu-node-1"},
    }


E1, E2 = _event("e1", 10, "BackOff"), _event("e2", 11, "FailedMount")
E3, E1B = _event("e3", 12, "Unhealthy"), _event("e1", 14, "BackOff", count=2)
E4, E5, E6 = _event("e4", 15, "OOMKilling"), _event("e5", 16, "Evicted"), _event("e6", 17, "NodeNotReady")


class _Api:
    """The scripted API server: first list, a watch that drops, a watch that ends in 410, relist, watch."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.relisted = False
        self.release = threading.Event()


def _handler(api: _Api) -> type[StubHandler]:
    class Handler(StubHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            query = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
            if urlsplit(self.path).path != "/api/v1/events":
                self.send_error(404)
                return
            if query.get("watch") != "true":
                api.requests.append("list")
                items = [E1B, E2, E3, E4, E5] if api.relisted or len(api.requests) > 1 else [E1, E2]
                version = "16" if items[0] is E1B else "11"
                body = json.dumps(
                    {"kind": "EventList", "apiVersion": "v1", "metadata": {"resourceVersion": version}, "items": items}
                ).encode()
                self.reply(200, body)
                return
            rv = query.get("resourceVersion", "")
            api.requests.append(f"watch@{rv}")
            assert query.get("allowWatchBookmarks") == "true"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if rv == "11":
                self._line({"type": "ADDED", "object": E3})
                self._line({"type": "BOOKMARK", "object": {"kind": "Event", "metadata": {"resourceVersion": "13"}}})
                self._line({"type": "MODIFIED", "object": E1B})
                self.wfile.write(b"64\r\n" + b'{"type": "ADDED", "obj')  # a chunk cut short: connection drops
                self.wfile.flush()
                self.close_connection = True
                return
            if rv == "14":
                self._line({"type": "ADDED", "object": E4})
                gone = {
                    "kind": "Status",
                    "status": "Failure",
                    "code": 410,
                    "reason": "Expired",
                    "message": "too old resource version: 14 (16)",
                }
                self._line({"type": "ERROR", "object": gone})
                api.relisted = True
            elif rv == "16":
                self._line({"type": "ADDED", "object": E6})
                api.release.wait(30)
            self.wfile.write(b"0\r\n\r\n")
            self.close_connection = True

        def _line(self, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode() + b"\n"
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    return Handler


@pytest.fixture
def api_server() -> Iterator[tuple[_Api, str]]:
    api = _Api()
    with serving(_handler(api)) as url:
        try:
            yield api, url
        finally:
            api.release.set()  # before the shutdown: a watch waiting on it holds its request thread


def test_watcher_survives_a_drop_and_a_410_without_losing_or_repeating_an_event(
    api_server: tuple[_Api, str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="services.ingest.kube")
    api, url = api_server
    configuration = client.Configuration(host=url)
    received: list[KubeEvent | DeadLetter] = []
    watcher = EventWatcher(client.ApiClient(configuration), received.extend, watch_timeout_s=30)
    thread = threading.Thread(target=watcher.run, kwargs={"backoff_s": 0.05}, daemon=True)
    thread.start()
    poll(lambda: len(received) >= 7, 30, what="seven events")
    watcher.stop()
    api.release.set()
    thread.join(10)

    events = [e for e in received if isinstance(e, KubeEvent)]
    assert [(e.involved_object.name, e.reason, e.count) for e in events] == [
        ("pod-e1", "BackOff", 1),
        ("pod-e2", "FailedMount", 1),
        ("pod-e3", "Unhealthy", 1),
        ("pod-e1", "BackOff", 2),
        ("pod-e4", "OOMKilling", 1),
        ("pod-e5", "Evicted", 1),  # only in the relist: it happened while the watch was gone
        ("pod-e6", "NodeNotReady", 1),
    ]
    assert api.requests[:5] == ["list", "watch@11", "watch@14", "list", "watch@16"]
    assert watcher.relists == 2 and watcher.reconnects >= 1
    first = events[0]
    assert first.type == "Warning" and first.node == "gpu-node-1" and first.source_component == "kubelet"
    assert first.key() == "Pod/serving/pod-e1"
    # one ready line per process, however often it relists: `medic stack` counts one per start
    ready = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ready:")]
    assert ready == [f"ready: events watch follows {url} (core/v1, all namespaces)"]


def test_events_k8s_io_v1_objects_normalise_like_core_ones() -> None:
    event = kube_event(
        {
            "metadata": {"uid": "u1", "resourceVersion": "5"},
            "regarding": {"kind": "Node", "name": "gpu-node-2"},
            "reason": "NodeNotReady",
            "note": "Node gpu-node-2 status is now: NodeNotReady",
            "type": "Normal",
            "series": {"count": 4, "lastObservedTime": "2026-11-29T10:00:01.500000Z"},
            "eventTime": "2026-11-29T09:59:00.000000Z",
            "reportingController": "node-controller",
        }
    )
    assert (event.involved_object.kind, event.node, event.count, event.source_component) == (
        "Node",
        "gpu-node-2",
        4,
        "node-controller",
    )
    assert event.message.startswith("Node gpu-node-2") and event.ts % 60 == pytest.approx(1.5)


def test_a_failing_first_list_is_retried_instead_of_ending_the_watcher(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="services.ingest.kube")
    # the API server answers 503 at first (starting, overloaded): watch-k8s used to exit on it
    lists: list[int] = []

    class Handler(StubHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            watch = "watch=true" in self.path
            if not watch:
                lists.append(1)
            if not watch and len(lists) == 1:
                self.reply(503, content_type=None)
                return
            body = (
                b""
                if watch
                else json.dumps(
                    {"kind": "EventList", "apiVersion": "v1", "metadata": {"resourceVersion": "11"}, "items": [E1]}
                ).encode()
            )
            self.reply(200, body)

    with serving(Handler) as url:
        configuration = client.Configuration(host=url)
        received: list[KubeEvent | DeadLetter] = []
        watcher = EventWatcher(client.ApiClient(configuration), received.extend, watch_timeout_s=5)
        thread = threading.Thread(target=watcher.run, kwargs={"backoff_s": 0.05}, daemon=True)
        thread.start()
        poll(lambda: received, 30, what="the event of the second list")
        assert watcher.ready  # from the list that got through, and logged once
        assert [r.getMessage() for r in caplog.records].count(
            f"ready: events watch follows {configuration.host} (core/v1, all namespaces)"
        ) == 1
        watcher.stop()
        thread.join(10)
    assert [e.involved_object.name for e in received if isinstance(e, KubeEvent)] == ["pod-e1"]
    assert len(lists) >= 2 and watcher.reconnects >= 1
