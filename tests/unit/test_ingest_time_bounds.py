"""Event time is bounded at ingest: entries from 2001 or a day ahead are refused, their neighbours kept.

Every receiver and puller goes through one check (services/ingest/timebounds.py); each test sends
one entry from 2001, one a day ahead and valid ones in the same payload, and looks at what reached
Kafka (a MemoryPublisher), what was dead-lettered, the answer and the metric.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from kubernetes import client as k8s

from services.core.events import Anomaly, DeadLetter, KubeEvent, LogRecord, MetricBatch
from services.core.settings import Settings
from services.ingest.http import ALERTMANAGER_PATH, LOKI_PUSH_PATH, REMOTE_WRITE_PATH, create_app
from services.ingest.kube import EventWatcher
from services.ingest.memory import MemoryPublisher
from services.ingest.normalise import encode_loki_protobuf, encode_remote_write
from services.ingest.pull import Delivery
from services.ingest.sink import IngestMetrics, PublishQueue
from services.ingest.sources.loki import LokiPuller
from services.ingest.sources.prometheus import PrometheusPuller
from services.ingest.sources.scrape import Scraper
from services.ingest.timebounds import TimeCheck

Y2001 = 978_307_200.0  # 2001-01-01T00:00:00Z
DAY = 86_400.0
RW_HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}
GPU = "GPU-5f1c2a7e-0d3b-4c1e-9a55-1b2c3d4e5f60"


def _app(**overrides: Any) -> tuple[TestClient, MemoryPublisher]:
    publisher = MemoryPublisher()
    return TestClient(create_app(Settings(**overrides), publisher)), publisher


def _counted(client: TestClient, receiver: str, bound: str) -> float:
    value: float | None = client.app.state.service.metrics.registry.get_sample_value(  # type: ignore[attr-defined]
        "clustermedic_ingest_out_of_bounds_total", {"receiver": receiver, "bound": bound}
    )
    return value or 0.0


def _letter(publisher: MemoryPublisher) -> tuple[DeadLetter, dict[str, Any]]:
    [letter] = publisher.deadletters()
    return letter, json.loads(letter.raw)


def _samples(publisher: MemoryPublisher) -> list[tuple[str, float]]:
    return [(s.name, s.ts) for b in publisher.events(MetricBatch) if isinstance(b, MetricBatch) for s in b.samples]


# ------------------------------------------------------------------------------ the one check


def test_the_window_is_the_settings_around_the_receivers_clock() -> None:
    check = TimeCheck.of(Settings(ingest_max_future_s=60, ingest_max_age_s=3600), now=10_000.0)
    assert check.admit(10_000.0 + 60) and check.admit(10_000.0 - 3600)
    assert not check.admit(10_000.0 + 61) and not check.admit(10_000.0 - 3601) and not check.admit(float("nan"))
    assert (check.refused, check.too_new, check.too_old) == (3, 1, 2)
    message = check.message(5)
    assert "3 of 5 entries refused as out of bounds" in message
    assert "1 stamped more than 1m ahead" in message and "2 stamped more than 1h ago" in message


def test_defaults_are_lokis_grace_period_and_max_age() -> None:
    settings = Settings()
    assert settings.ingest_max_future_s == 600  # creation_grace_period: 10m
    assert settings.ingest_max_age_s == 7 * DAY  # reject_old_samples_max_age: 168h


# ------------------------------------------------------------------------------ remote_write


def _write_body(now: float) -> bytes:
    dcgm = {"UUID": GPU, "gpu": "0", "Hostname": "node-1"}
    ms = int(now * 1000)
    return encode_remote_write(
        [
            ({"__name__": "DCGM_FI_DEV_GPU_TEMP", **dcgm}, [(71.0, ms)]),
            ({"__name__": "DCGM_FI_DEV_POWER_USAGE", **dcgm}, [(300.0, int(Y2001 * 1000))]),
            ({"__name__": "DCGM_FI_DEV_FB_USED", **dcgm}, [(0.0, int((now + DAY) * 1000))]),  # zero: its own layout
            ({"__name__": "vllm:num_requests_waiting", "pod": "p-0"}, [(3.0, ms), (4.0, int((now + DAY) * 1000))]),
        ]
    )


@pytest.mark.parametrize("warm", [False, True], ids=["general walk", "cached fast path"])
def test_remote_write_refuses_out_of_bounds_samples_and_keeps_their_neighbours(warm: bool) -> None:
    client, publisher = _app()
    with client:
        if warm:  # teach the series cache these exact series, stamped now
            now = time.time()
            ms = int(now * 1000)
            dcgm = {"UUID": GPU, "gpu": "0", "Hostname": "node-1"}
            teach = encode_remote_write(
                [
                    ({"__name__": "DCGM_FI_DEV_GPU_TEMP", **dcgm}, [(70.0, ms)]),
                    ({"__name__": "DCGM_FI_DEV_POWER_USAGE", **dcgm}, [(290.0, ms)]),
                    ({"__name__": "DCGM_FI_DEV_FB_USED", **dcgm}, [(0.0, ms)]),
                ]
            )
            assert client.post(REMOTE_WRITE_PATH, content=teach, headers=RW_HEADERS).status_code == 204
            cache = client.app.state.service.series  # type: ignore[attr-defined]
            assert len(cache.one_sample) == 2 and len(cache.zero_sample) == 1  # the three take the fast path now
        before = len(_samples(publisher))
        now = time.time()
        response = client.post(REMOTE_WRITE_PATH, content=_write_body(now), headers=RW_HEADERS)
        assert response.status_code == 400
        assert "3 of 5 entries refused as out of bounds" in response.text, response.text
        assert "2 stamped more than 10m ahead" in response.text and "1 stamped more than 7d ago" in response.text
        assert "the other 2 were accepted" in response.text
        kept = _samples(publisher)[before:]
        assert sorted(name for name, _ts in kept) == ["DCGM_FI_DEV_GPU_TEMP", "vllm:num_requests_waiting"]
        letter, raw = _letter(publisher)
        assert letter.source_topic == f"http:{REMOTE_WRITE_PATH}" and letter.error_type == "RejectedInput"
        assert "out of bounds" in letter.error
        assert (raw["refused"], raw["too_new"], raw["too_old"]) == (3, 2, 1)
        assert {e["name"] for e in raw["examples"]} == {
            "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_FB_USED",
            "vllm:num_requests_waiting",
        }
        assert _counted(client, "remote_write", "too_new") == 2 and _counted(client, "remote_write", "too_old") == 1


def test_remote_write_honours_the_bound_settings() -> None:
    client, publisher = _app(ingest_max_future_s=60, ingest_max_age_s=3600)
    now = time.time()
    body = encode_remote_write(
        [
            ({"__name__": "a", "job": "j"}, [(1.0, int((now - 1800) * 1000))]),  # inside an hour
            ({"__name__": "b", "job": "j"}, [(1.0, int((now - 7200) * 1000))]),  # two hours old
            ({"__name__": "c", "job": "j"}, [(1.0, int((now + 300) * 1000))]),  # five minutes ahead
        ]
    )
    with client:
        response = client.post(REMOTE_WRITE_PATH, content=body, headers=RW_HEADERS)
    assert response.status_code == 400 and "2 of 3 entries" in response.text
    assert [name for name, _ts in _samples(publisher)] == ["a"]


def test_a_payload_inside_the_window_is_answered_as_before() -> None:
    client, publisher = _app()
    body = encode_remote_write([({"__name__": "a", "job": "j"}, [(1.0, int(time.time() * 1000))])])
    with client:
        response = client.post(REMOTE_WRITE_PATH, content=body, headers=RW_HEADERS)
    assert response.status_code == 204 and not publisher.deadletters()


# ------------------------------------------------------------------------------------ Loki


def _loki_values(now: float) -> list[tuple[int, str]]:
    return [
        (int(now * 1e9), "ok before"),
        (int(Y2001 * 1e9), "from 2001"),
        (int((now + DAY) * 1e9), "a day ahead"),
        (int((now - 60) * 1e9), "ok after"),
    ]


def _lines(publisher: MemoryPublisher) -> list[str]:
    return [r.line for r in publisher.events(LogRecord) if isinstance(r, LogRecord)]


@pytest.mark.parametrize("encoding", ["json", "protobuf"])
def test_loki_push_refuses_out_of_bounds_entries_and_keeps_their_neighbours(encoding: str) -> None:
    client, publisher = _app()
    values = _loki_values(time.time())
    if encoding == "json":
        body = json.dumps(
            {"streams": [{"stream": {"job": "vllm", "pod": "p-0"}, "values": [[str(ns), line] for ns, line in values]}]}
        ).encode()
        headers = {"Content-Type": "application/json"}
    else:
        body = encode_loki_protobuf([('{job="vllm", pod="p-0"}', values)])
        headers = {"Content-Type": "application/x-protobuf"}
    with client:
        response = client.post(LOKI_PUSH_PATH, content=body, headers=headers)
    assert response.status_code == 400
    assert "2 of 4 entries refused as out of bounds" in response.text, response.text
    assert _lines(publisher) == ["ok before", "ok after"]
    letter, raw = _letter(publisher)
    assert letter.source_topic == f"http:{LOKI_PUSH_PATH}"
    assert sorted(e["line"] for e in raw["examples"]) == ["a day ahead", "from 2001"]
    assert _counted(client, "loki_push", "too_new") == 1 and _counted(client, "loki_push", "too_old") == 1


# ---------------------------------------------------------------------------- Alertmanager


def _rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _alert(name: str, status: str, starts: float, ends: str) -> dict[str, Any]:
    return {
        "status": status,
        "labels": {"alertname": name, "severity": "critical", "node": "node-1"},
        "annotations": {},
        "startsAt": _rfc3339(starts),
        "endsAt": ends,
        "fingerprint": name,
    }


def test_webhook_refuses_alerts_stamped_out_of_bounds_and_keeps_the_others() -> None:
    client, publisher = _app()
    now = time.time()
    zero = "0001-01-01T00:00:00Z"  # what Alertmanager sends as a firing alert's endsAt
    alerts = [
        _alert("Fresh", "firing", now - 120, zero),
        _alert("From2001", "firing", Y2001, zero),
        _alert("Tomorrow", "firing", now + DAY, zero),
        # resolved: its time is endsAt, so a long-past startsAt is fine
        _alert("LongResolved", "resolved", now - 8 * DAY, _rfc3339(now - 30)),
        _alert("ResolvedIn2001", "resolved", Y2001, _rfc3339(Y2001 + 60)),
    ]
    payload = {"version": "4", "groupKey": "{}:{}", "status": "firing", "receiver": "cm", "alerts": alerts}
    with client:
        response = client.post(ALERTMANAGER_PATH, json=payload)
        assert response.status_code == 400
        assert "3 of 5 entries refused as out of bounds" in response.text, response.text
        assert sorted(a.signal for a in publisher.events(Anomaly) if isinstance(a, Anomaly)) == [
            "Fresh",
            "LongResolved",
        ]
        _letter(publisher)
        assert _counted(client, "alertmanager", "too_old") == 2 and _counted(client, "alertmanager", "too_new") == 1
        # a refused alert was not remembered as delivered: once its times are right it is taken
        again = {**payload, "alerts": [_alert("Tomorrow", "firing", now - 10, zero)]}
        assert client.post(ALERTMANAGER_PATH, json=again).json()["accepted"] == 1


# ------------------------------------------------------------------------------ Kubernetes


def _kube_event(name: str, ts: float) -> dict[str, Any]:
    return {
        "metadata": {"uid": name, "resourceVersion": "1", "creationTimestamp": _rfc3339(ts)},
        "involvedObject": {"kind": "Pod", "name": name, "namespace": "default"},
        "reason": "BackOff",
        "type": "Warning",
        "lastTimestamp": _rfc3339(ts),
        "message": "Back-off restarting failed container",
    }


def test_watcher_dead_letters_events_stamped_out_of_bounds_and_delivers_the_others() -> None:
    emitted: list[KubeEvent | DeadLetter] = []
    settings = Settings()
    watcher = EventWatcher(k8s.ApiClient(), emitted.extend, time_window=lambda now: TimeCheck.of(settings, now))
    now = time.time()
    watcher._deliver([_kube_event("fresh", now - 5), _kube_event("old", Y2001), _kube_event("ahead", now + DAY)])
    events = [e.involved_object.name for e in emitted if isinstance(e, KubeEvent)]
    letters = [e for e in emitted if isinstance(e, DeadLetter)]
    assert events == ["fresh"]
    assert len(letters) == 2 and all("refused as out of bounds" in letter.error for letter in letters)
    assert {json.loads(letter.raw)["metadata"]["uid"] for letter in letters} == {"old", "ahead"}


# ---------------------------------------------------------------------------- pull clients


@pytest.fixture
def delivery() -> Iterator[tuple[Delivery, MemoryPublisher]]:
    publisher = MemoryPublisher()
    metrics = IngestMetrics()
    queue = PublishQueue(publisher, metrics, capacity=100_000, flush_timeout_s=5.0)
    queue.start()
    settings = Settings()
    try:
        yield (
            Delivery(
                queue,
                metrics,
                timeout_s=10.0,
                deadletter_max_bytes=64 * 1024,
                time_window=lambda now: TimeCheck.of(settings, now),
            ),
            publisher,
        )
    finally:
        queue.stop(5.0)


def _mock(body: str | dict[str, Any], content_type: str = "application/json") -> httpx.Client:
    text = body if isinstance(body, str) else json.dumps(body)
    return httpx.Client(
        transport=httpx.MockTransport(lambda _r: httpx.Response(200, text=text, headers={"Content-Type": content_type}))
    )


def _pull_letter(sink: Delivery, publisher: MemoryPublisher, receiver: str) -> dict[str, Any]:
    letter, raw = _letter(publisher)
    assert "refused as out of bounds" in letter.error and letter.error_type == "RejectedInput"
    assert sink.metrics.out_of_bounds.labels(receiver, "too_old")._value.get() == 1
    assert sink.metrics.out_of_bounds.labels(receiver, "too_new")._value.get() == 1
    return raw


def test_scraper_refuses_exposition_samples_stamped_out_of_bounds(delivery: tuple[Delivery, MemoryPublisher]) -> None:
    sink, publisher = delivery
    now = time.time()
    text = (
        "up_now 1\n"
        f"old_one 1 {int(Y2001 * 1000)}\n"
        f"ahead_one 1 {int((now + DAY) * 1000)}\n"
        f"recent_one 1 {int((now - 30) * 1000)}\n"
    )
    scraper = Scraper(["http://node-1:9400/metrics"], sink, client=_mock(text, "text/plain; version=0.0.4"))
    assert scraper.poll() == 2
    assert sorted(name for name, _ts in _samples(publisher)) == ["recent_one", "up_now"]
    raw = _pull_letter(sink, publisher, "scrape")
    assert {e["name"] for e in raw["examples"]} == {"old_one", "ahead_one"}


def test_query_range_refuses_points_stamped_out_of_bounds(delivery: tuple[Delivery, MemoryPublisher]) -> None:
    sink, publisher = delivery
    now = time.time()
    answer = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {
                    "metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "UUID": GPU},
                    "values": [[now - 30, "70"], [Y2001, "71"], [now + DAY, "72"], [now - 15, "73"]],
                }
            ],
        },
    }
    puller = PrometheusPuller("http://prom:9090", {"t": "DCGM_FI_DEV_GPU_TEMP"}, sink, step_s=15, client=_mock(answer))
    assert puller.poll() == 2
    assert [ts for _name, ts in _samples(publisher)] == [pytest.approx(now - 30), pytest.approx(now - 15)]
    _pull_letter(sink, publisher, "query_range")


def test_loki_puller_refuses_entries_stamped_out_of_bounds(delivery: tuple[Delivery, MemoryPublisher]) -> None:
    sink, publisher = delivery
    values = _loki_values(time.time())
    answer = {
        "status": "success",
        "data": {
            "resultType": "streams",
            "result": [{"stream": {"job": "vllm"}, "values": [[str(ns), line] for ns, line in sorted(values)]}],
        },
    }
    puller = LokiPuller("http://loki:3100", '{job="vllm"}', sink, client=_mock(answer))
    assert puller.poll() == 2
    assert sorted(_lines(publisher)) == ["ok after", "ok before"]
    raw = _pull_letter(sink, publisher, "loki_pull")
    assert sorted(e["line"] for e in raw["examples"]) == ["a day ahead", "from 2001"]
