"""The pull clients (scrape, Prometheus query_range, Loki query_range), broker- and network-free.

A MemoryPublisher stands in for Kafka behind the real PublishQueue; HTTP goes through httpx's
MockTransport to a fake /metrics endpoint, a fake Prometheus query_range that refuses what Prometheus
refuses, and the Loki stand-in of tests/loki_standin.py.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from services.core.events import DeadLetter, LogRecord, MetricBatch
from services.ingest.errors import RejectedInput
from services.ingest.memory import MemoryPublisher
from services.ingest.pull import CursorStore, Delivery, run_every
from services.ingest.sink import IngestMetrics, PublishQueue
from services.ingest.sources.loki import LokiPuller
from services.ingest.sources.prometheus import PrometheusPuller
from services.ingest.sources.scrape import Scraper, parse_exposition
from tests.loki_standin import QUERY_RANGE, LokiStandIn

GPU = "GPU-5f1c2a7e-0d3b-4c1e-9a55-1b2c3d4e5f60"
DCGM = f'gpu="3",UUID="{GPU}",Hostname="gpu-node-1",job="dcgm-exporter"'
EXPOSITION = f"""# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{{{DCGM}}} 71
DCGM_FI_DEV_XID_ERRORS{{{DCGM}}} 79 1700000000123
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{{le="+Inf",model_name="llama-70b",pod="llama-70b-0"}} 12
vllm:e2e_request_latency_seconds_sum{{model_name="llama-70b",pod="llama-70b-0"}} NaN
"""


class Clock:
    """A settable wall clock."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def delivery() -> Iterator[tuple[Delivery, MemoryPublisher]]:
    publisher = MemoryPublisher()
    metrics = IngestMetrics()
    queue = PublishQueue(publisher, metrics, capacity=100_000, flush_timeout_s=5.0)
    queue.start()
    try:
        yield Delivery(queue, metrics, timeout_s=10.0, deadletter_max_bytes=64), publisher
    finally:
        queue.stop(5.0)


def _client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(handler))


def _samples(publisher: MemoryPublisher) -> list[tuple[str, str, str, dict[str, str], float, float]]:
    return [
        (b.entity, b.source, s.name, s.labels, s.value, s.ts)
        for b in publisher.events(MetricBatch)
        if isinstance(b, MetricBatch)
        for s in b.samples
    ]


# ------------------------------------------------------------------------------------ scrape


def test_parse_exposition_sets_target_labels_like_prometheus() -> None:
    series = parse_exposition(EXPOSITION, scrape_ts=1_800_000_000.0, target_labels={"job": "scrape", "instance": "h:1"})
    by_name = {labels["__name__"]: (labels, samples) for labels, samples in series}
    labels, samples = by_name["DCGM_FI_DEV_GPU_TEMP"]
    assert labels == {
        "__name__": "DCGM_FI_DEV_GPU_TEMP",
        "gpu": "3",
        "UUID": GPU,
        "Hostname": "gpu-node-1",
        "job": "scrape",
        "exported_job": "dcgm-exporter",  # honor_labels: false
        "instance": "h:1",
    }
    assert samples == [(71.0, 1_800_000_000.0)]
    assert by_name["DCGM_FI_DEV_XID_ERRORS"][1] == [(79.0, 1_700_000_000.123)]  # its own timestamp is kept
    assert math.isnan(by_name["vllm:e2e_request_latency_seconds_sum"][1][0][0])
    assert by_name["vllm:e2e_request_latency_seconds_bucket"][0]["le"] == "+Inf"


@pytest.mark.parametrize("text", ["garbage here\n", 'x{a="b" 1\n', 'x{a="1",a="2"} 3\n', "# TYPE x nonsense\nx 1\n"])
def test_parse_exposition_rejects_bad_text(text: str) -> None:
    with pytest.raises(RejectedInput) as caught:
        parse_exposition(text, scrape_ts=0.0)
    assert caught.value.reason == "exposition"


def test_scraper_publishes_one_batch_per_entity_stamped_with_the_scrape_time(
    delivery: tuple[Delivery, MemoryPublisher],
) -> None:
    sink, publisher = delivery
    seen: list[httpx.Request] = []

    def metrics(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, text=EXPOSITION, headers={"Content-Type": "text/plain; version=0.0.4"})

    scraper = Scraper(
        ["http://node-1:9400/metrics"], sink, job="gpu", client=_client(metrics), clock=Clock(1_800_000_000.0)
    )
    assert scraper.poll() == 3  # the NaN sum is dropped and counted
    assert "text/plain" in seen[0].headers["accept"]
    samples = _samples(publisher)
    temp = next(s for s in samples if s[2] == "DCGM_FI_DEV_GPU_TEMP")
    assert temp[:2] == (GPU, "scrape") and temp[4:] == (71.0, 1_800_000_000.0)
    assert temp[3]["job"] == "gpu" and temp[3]["instance"] == "node-1:9400"
    assert {s[0] for s in samples} == {GPU, "llama-70b-0"}
    assert sink.metrics.dropped.labels("scrape")._value.get() == 1
    assert not publisher.deadletters()


def test_a_sample_the_exporter_stamped_is_sent_once_however_often_it_is_scraped(
    delivery: tuple[Delivery, MemoryPublisher],
) -> None:
    # the simulator stamps its samples with simulated time and is scraped faster than it updates
    sink, publisher = delivery
    stamp = {"ts": 1_700_000_000_000}

    def metrics(request: httpx.Request) -> httpx.Response:
        text = f'vllm:kv_cache_usage_perc{{pod="p-0"}} 0.97 {stamp["ts"]}\nvllm:num_requests_running{{pod="p-0"}} 3\n'
        return httpx.Response(200, text=text, headers={"Content-Type": "text/plain; version=0.0.4"})

    clock = Clock(1_800_000_000.0)
    scraper = Scraper(["http://sim:18080/metrics"], sink, client=_client(metrics), clock=clock)
    assert scraper.poll() == 2
    clock.now += 0.5
    assert scraper.poll() == 1  # the stamped sample did not change; the unstamped one gets the new scrape time
    stamp["ts"] += 15_000
    clock.now += 0.5
    assert scraper.poll() == 2
    kv = [(s[4], s[5]) for s in _samples(publisher) if s[2] == "vllm:kv_cache_usage_perc"]
    assert kv == [(0.97, 1_700_000_000.0), (0.97, 1_700_000_015.0)]
    assert sink.metrics.duplicates.labels("scrape")._value.get() == 1


@pytest.mark.parametrize(
    ("status", "content_type", "body", "reason"),
    [
        (500, "text/plain", b"exporter crashed", "http_500"),
        (200, "text/plain", b"DCGM_FI_DEV_GPU_TEMP{gpu=3} 71\n", "exposition"),
        (200, "application/json", b'{"temp": 71}', "media_type"),
        (200, "text/plain", b"\xff\xfe not utf-8", "exposition"),
        (200, "text/plain", b"x 1\n" * 1000, "too_large"),
    ],
)
def test_a_bad_scrape_is_dead_lettered_and_the_next_scrape_still_works(
    delivery: tuple[Delivery, MemoryPublisher], status: int, content_type: str, body: bytes, reason: str
) -> None:
    sink, publisher = delivery
    answers = [(status, content_type, body), (200, "text/plain", EXPOSITION.encode())]

    def metrics(request: httpx.Request) -> httpx.Response:
        code, kind, content = answers.pop(0)
        return httpx.Response(code, content=content, headers={"Content-Type": kind})

    scraper = Scraper(["http://node-1:9400/metrics"], sink, client=_client(metrics), max_bytes=2048)
    assert scraper.poll() == 0
    [letter] = publisher.deadletters()
    assert letter.source_topic == "scrape:http://node-1:9400/metrics" and letter.consumer == "ingest"
    assert letter.error_type == "RejectedInput" and "node-1:9400" in letter.error
    assert letter.raw == body[:64]  # the dead letter keeps deadletter_max_bytes
    assert sink.metrics.rejected.labels("scrape", reason)._value.get() == 1
    assert not _samples(publisher)
    assert scraper.poll() == 3


def test_an_unreachable_target_is_logged_and_skipped(delivery: tuple[Delivery, MemoryPublisher]) -> None:
    sink, publisher = delivery

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "down":
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, text=EXPOSITION)

    scraper = Scraper(["http://down:1/metrics", "http://up:1/metrics"], sink, client=_client(handler))
    assert scraper.poll() == 3
    assert not publisher.deadletters()
    assert sink.metrics.requests.labels("scrape", "unreachable")._value.get() == 1


# ---------------------------------------------------------------------- Prometheus query_range


class FakePrometheus:
    """query_range answers: a DCGM query gets a gauge whose value at t is t % 1000, any other a series
    without ``__name__`` (1, or NaN at odd seconds). Refuses what Prometheus refuses."""

    def __init__(self) -> None:
        self.ranges: list[tuple[float, float, float]] = []
        self.fail_next: httpx.Response | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/query_range"
        if self.fail_next is not None:
            answer, self.fail_next = self.fail_next, None
            return answer
        params = request.url.params
        start, end, step = float(params["start"]), float(params["end"]), float(params["step"])
        if end < start or step <= 0:
            return httpx.Response(400, json={"status": "error", "errorType": "bad_data", "error": "bad range"})
        if (end - start) / step > 11_000:
            return httpx.Response(
                400,
                json={"status": "error", "errorType": "bad_data", "error": "exceeded maximum resolution of 11,000"},
            )
        self.ranges.append((start, end, step))
        times, t = [], start
        while t <= end + 1e-9:
            times.append(round(t, 3))
            t += step
        series = [
            {
                "metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "UUID": GPU},
                "values": [[t, f"{t % 1000:g}"] for t in times],
            },
            {"metric": {"pod": "llama-70b-0"}, "values": [[t, "NaN" if t % 2 else "1"] for t in times]},
        ]
        series = series[:1] if "DCGM" in params["query"] else series[1:]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "matrix", "result": series}})


def test_query_range_pulls_each_evaluation_time_once_across_polls(delivery: tuple[Delivery, MemoryPublisher]) -> None:
    sink, publisher = delivery
    prometheus, clock = FakePrometheus(), Clock(1_800_000_007.4)
    puller = PrometheusPuller(
        "http://prom:9090/",
        {"gpu_temp": "DCGM_FI_DEV_GPU_TEMP", "queue": "sum by (pod) (x)"},
        sink,
        step_s=2,
        lookback_s=10,
        client=_client(prometheus),
        clock=clock,
    )
    puller.poll()
    assert prometheus.ranges[0] == (1_799_999_996.0, 1_800_000_006.0, 2.0)  # aligned to the step grid
    clock.now = 1_800_000_013.9
    puller.poll()
    assert prometheus.ranges[2] == (1_800_000_008.0, 1_800_000_012.0, 2.0)  # resumes one step after the cursor
    clock.now = 1_800_000_013.95
    puller.poll()  # nothing new on the grid: no request
    assert len(prometheus.ranges) == 4
    temps = [(s[0], s[1], s[4], s[5]) for s in _samples(publisher) if s[2] == "DCGM_FI_DEV_GPU_TEMP"]
    assert [ts for *_, ts in temps] == [1_799_999_996.0 + 2 * k for k in range(9)]  # no gap, no repeat
    assert all(entity == GPU and source == "query_range" and value == ts % 1000 for entity, source, value, ts in temps)
    named = [s for s in _samples(publisher) if s[2] == "queue"]  # a series without __name__ takes the query's name
    assert named and all(s[0] == "llama-70b-0" and s[4] == 1.0 for s in named)  # NaN values are dropped
    assert puller.cursors == {"gpu_temp": 1_800_000_012_000, "queue": 1_800_000_012_000}


def test_query_range_catches_up_in_chunks_prometheus_accepts(delivery: tuple[Delivery, MemoryPublisher]) -> None:
    sink, publisher = delivery
    prometheus = FakePrometheus()
    puller = PrometheusPuller(
        "http://prom:9090",
        {"t": "DCGM_FI_DEV_GPU_TEMP"},
        sink,
        step_s=1,
        lookback_s=25,
        max_points=10,
        client=_client(prometheus),
        clock=Clock(1_800_000_000.0),
    )
    puller.poll()
    assert [(s, e) for s, e, _ in prometheus.ranges] == [
        (1_799_999_975.0, 1_799_999_984.0),
        (1_799_999_985.0, 1_799_999_994.0),
        (1_799_999_995.0, 1_800_000_000.0),
    ]
    temps = sorted(s[5] for s in _samples(publisher) if s[2] == "DCGM_FI_DEV_GPU_TEMP")
    assert temps == [1_799_999_975.0 + k for k in range(26)]


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (httpx.Response(422, json={"status": "error", "errorType": "execution", "error": "boom"}), "http_422"),
        (httpx.Response(503, text="Service Unavailable"), "http_503"),
        (httpx.Response(200, text="<html>not json</html>"), "json"),
        (httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}}), "schema"),
        (httpx.Response(200, json={"status": "error", "error": "x"}), "api_error"),
    ],
)
def test_a_bad_query_range_answer_is_dead_lettered_and_the_range_pulled_later(
    delivery: tuple[Delivery, MemoryPublisher], answer: httpx.Response, reason: str
) -> None:
    sink, publisher = delivery
    prometheus, clock = FakePrometheus(), Clock(1_800_000_010.0)
    puller = PrometheusPuller(
        "http://prom:9090",
        {"t": "DCGM_FI_DEV_GPU_TEMP"},
        sink,
        step_s=5,
        lookback_s=10,
        client=_client(prometheus),
        clock=clock,
    )
    prometheus.fail_next = answer
    assert puller.poll() == 0
    [letter] = publisher.deadletters()
    assert letter.source_topic == "pull:http://prom:9090/api/v1/query_range" and letter.source_key == "t"
    assert sink.metrics.rejected.labels("query_range", reason)._value.get() == 1
    assert puller.cursors == {"t": 1_799_999_995_000}  # the failed range is pulled later: no gap
    clock.now = 1_800_000_020.0
    puller.poll()
    times = sorted(s[5] for s in _samples(publisher) if s[2] == "DCGM_FI_DEV_GPU_TEMP")
    assert times == [1_800_000_000.0, 1_800_000_005.0, 1_800_000_010.0, 1_800_000_015.0, 1_800_000_020.0]


def test_query_range_does_not_move_the_cursor_when_kafka_fails(delivery: tuple[Delivery, MemoryPublisher]) -> None:
    sink, publisher = delivery
    prometheus, clock = FakePrometheus(), Clock(1_800_000_010.0)
    puller = PrometheusPuller(
        "http://prom:9090",
        {"t": "DCGM_FI_DEV_GPU_TEMP"},
        sink,
        step_s=5,
        lookback_s=5,
        client=_client(prometheus),
        clock=clock,
    )
    publisher.fail_next_flush = True
    assert puller.poll() == 0 and puller.cursors == {"t": 1_800_000_000_000}
    assert puller.poll() > 0 and puller.cursors == {"t": 1_800_000_010_000}
    times = sorted(s[5] for s in _samples(publisher) if s[2] == "DCGM_FI_DEV_GPU_TEMP")
    assert times == [1_800_000_005.0, 1_800_000_010.0]


# ---------------------------------------------------------------------------- Loki query_range

NS = 1_000_000_000
T0 = 1_800_000_000 * NS


def _lines(publisher: MemoryPublisher) -> list[tuple[str, float, str]]:
    return [(r.stream["pod"], r.ts, r.line) for r in publisher.events(LogRecord) if isinstance(r, LogRecord)]


def test_loki_pages_and_polls_deliver_every_entry_once_in_order(delivery: tuple[Delivery, MemoryPublisher]) -> None:
    sink, publisher = delivery
    loki, clock = LokiStandIn(), Clock(T0 / NS)
    puller = LokiPuller(
        "http://loki:3100",
        '{namespace="llm"} |= "vllm"',
        sink,
        limit=3,
        lookback_s=60,
        client=httpx.Client(transport=loki.transport()),
        clock=clock,
    )
    a = {"namespace": "llm", "pod": "a"}
    b = {"namespace": "llm", "pod": "b"}
    pushed: list[tuple[str, int, str]] = []

    def push(stream: dict[str, str], ns: int, line: str) -> None:
        loki.push(stream, ns, line)
        if "vllm" in line and stream["namespace"] == "llm":  # what the query selects
            pushed.append((stream["pod"], ns, line))

    # entries sharing a nanosecond across a page boundary, in two streams, and one the filter drops
    for k, ns in enumerate([T0 - 50 * NS, T0 - 45 * NS, T0 - 40 * NS, T0 - 40 * NS, T0 - 30 * NS, T0 - 30 * NS]):
        push(a if k % 2 else b, ns, f"vllm line {k}")
    push(a, T0 - 20 * NS, "kubelet noise")
    push({"namespace": "other", "pod": "c"}, T0 - 10 * NS, "vllm elsewhere")
    assert puller.poll() == 6
    # new entries arrive, one of them at the cursor's own nanosecond (late, same timestamp)
    push(b, T0 - 30 * NS, "vllm late at the cursor")
    push(a, T0 + 5 * NS, "vllm line 6")
    clock.now = T0 / NS + 10
    assert puller.poll() == 2
    clock.now = T0 / NS + 20
    assert puller.poll() == 0
    delivered = _lines(publisher)
    assert sorted(delivered) == sorted((pod, ns / NS, line) for pod, ns, line in pushed)
    assert len(delivered) == len(set(delivered)) == 8
    assert [ts for _, ts, _ in delivered] == sorted(ts for _, ts, _ in delivered)
    assert not loki.violations
    first = loki.requests[0]
    assert first["direction"] == "forward" and first["limit"] == "3" and first["start"] == str(T0 - 60 * NS)
    assert all(r["start"].isdigit() and r["end"].isdigit() for r in loki.requests)  # nanosecond epochs
    assert puller.cursor_ns == T0 + 5 * NS


def test_more_than_limit_entries_in_one_nanosecond_do_not_stall_the_puller(
    delivery: tuple[Delivery, MemoryPublisher],
) -> None:
    sink, publisher = delivery
    loki = LokiStandIn()
    for k in range(5):
        loki.push({"pod": "a"}, T0 - 5 * NS, f"line {k}")
    loki.push({"pod": "a"}, T0 - 1 * NS, "after")
    puller = LokiPuller(
        "http://loki:3100",
        '{pod="a"}',
        sink,
        limit=2,
        lookback_s=10,
        client=httpx.Client(transport=loki.transport()),
        clock=Clock(T0 / NS),
    )
    puller.poll()
    lines = [line for _, _, line in _lines(publisher)]
    assert lines[-1] == "after" and len(lines) == len(set(lines))
    assert puller.cursor_ns == T0 - 1 * NS


@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (500, b"too many outstanding requests", "http_500"),
        (200, b'{"status": "success", "data": {"resultType": "matrix", "result": []}}', "schema"),
        (200, b'{"status": "success", "data": {"resultType": "streams", "result": [{"stream": {}}]}}', "schema"),
        (
            200,
            b'{"status":"success","data":{"resultType":"streams","result":[{"stream":{},"values":[["1","x"]]}]}}',
            "schema",  # the stream is left out (no labels) and dead-lettered; the page goes on
        ),
        (200, b"{not json", "json"),
    ],
)
def test_a_bad_loki_answer_is_dead_lettered_and_nothing_is_lost(
    delivery: tuple[Delivery, MemoryPublisher], status: int, body: bytes, reason: str
) -> None:
    sink, publisher = delivery
    loki, clock = LokiStandIn(), Clock(T0 / NS)
    loki.push({"pod": "a"}, T0 - 5 * NS, "before the failure")
    puller = LokiPuller(
        "http://loki:3100",
        '{pod="a"}',
        sink,
        lookback_s=10,
        client=httpx.Client(transport=loki.transport()),
        clock=clock,
    )
    loki.scripted.append((status, "application/json", body))
    assert puller.poll() == 0
    [letter] = publisher.deadletters()
    assert letter.source_topic == "pull:http://loki:3100/loki/api/v1/query_range" and letter.source_key == '{pod="a"}'
    assert sink.metrics.rejected.labels("loki_pull", reason)._value.get() == 1
    loki.push({"pod": "a"}, T0 + 5 * NS, "after the failure")
    clock.now += 10
    assert puller.poll() == 2
    assert [line for _, _, line in _lines(publisher)] == ["before the failure", "after the failure"]


def test_the_loki_standin_refuses_what_loki_refuses() -> None:
    loki = LokiStandIn()
    loki.push({"app": "api"}, 1_000, "a")
    good = {"query": '{app="api"}', "start": "0", "end": "2000", "limit": "10", "direction": "FORWARD"}
    status, _, body = loki.answer(QUERY_RANGE, good)
    assert status == 200 and json.loads(body)["data"]["result"][0]["values"] == [["1000", "a"]]
    refused = [
        {**good, "query": ""},
        {**good, "query": '{app=~".*"}'},
        {**good, "query": 'rate({app="api"}[1m])'},
        {**good, "end": "0"},
        {**good, "limit": "0"},
        {**good, "limit": "5001"},
        {**good, "direction": "sideways"},
        {**good, "start": "yesterday"},
    ]
    for params in refused:
        assert loki.answer(QUERY_RANGE, params)[0] == 400, params
    assert len(loki.violations) == len(refused)
    # start is inclusive, end exclusive
    assert json.loads(loki.answer(QUERY_RANGE, {**good, "start": "1000", "end": "1001"})[2])["data"]["result"]
    assert not json.loads(loki.answer(QUERY_RANGE, {**good, "start": "0", "end": "1000"})[2])["data"]["result"]


# ----------------------------------------------------------------------------------- loop, CLI


def test_run_every_survives_a_failing_poll_and_stops_when_told() -> None:
    stop, calls = threading.Event(), []

    def poll() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in one poll")
        if len(calls) == 3:
            stop.set()

    run_every(poll, 0.0, stop, name="test")
    assert len(calls) == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["scrape", "--once"], "no targets"),
        (["pull-prom", "--once", "--query", "t=up"], "needs --url"),
        (["pull-prom", "--once", "--url", "http://p:9090", "--query", "no-equals-sign"], "not NAME=PROMQL"),
        (["pull-loki", "--once"], "needs --url"),
    ],
)
def test_pull_commands_explain_missing_configuration(args: list[str], message: str) -> None:
    from services.ingest.cli import app

    result = CliRunner().invoke(app, args, env={"CLUSTERMEDIC_INGEST_SCRAPE_TARGETS": "[]"})
    assert result.exit_code == 2
    assert message in result.output


def test_each_registered_source_gets_its_command_with_its_flags() -> None:
    from services.ingest.cli import app
    from services.ingest.registry import SOURCES

    flags = {
        "scrape": ["--target", "--interval", "--job", "--once"],
        "pull-prom": ["--url", "--query", "--step", "--interval", "--once"],
        "pull-loki": ["--url", "--query", "--limit", "--interval", "--once"],
    }
    commands = {SOURCES.load(name).command: SOURCES.load(name) for name in SOURCES.names()}
    assert sorted(commands) == sorted(flags)
    for command, source in commands.items():
        assert [f"--{o.name}" for o in source.options] + ["--once"] == flags[command]
        shown = CliRunner().invoke(app, [command, "--help"])
        assert shown.exit_code == 0, shown.output
        assert all(flag in shown.output for flag in flags[command]) and source.summary[:40] in shown.output


def test_dead_letter_keeps_the_configured_prefix_of_a_large_answer(delivery: tuple[Delivery, MemoryPublisher]) -> None:
    sink, publisher = delivery
    sink.deadletter(
        receiver="scrape", source="scrape:x", key="x", raw=b"y" * 200, error=RejectedInput("bad", reason="exposition")
    )
    [letter] = publisher.deadletters()
    assert isinstance(letter, DeadLetter) and letter.raw == b"y" * 64
    assert "keeps the first 64 of 200 bytes" in letter.error


def test_a_restarted_query_range_puller_resumes_from_its_cursor_file(
    delivery: tuple[Delivery, MemoryPublisher], tmp_path: Path
) -> None:
    sink, publisher = delivery
    prometheus, clock = FakePrometheus(), Clock(1_800_000_007.4)
    store = tmp_path / "state" / "cursors.json"

    def puller(**kw: Any) -> PrometheusPuller:
        return PrometheusPuller(
            "http://prom:9090", {"gpu_temp": "DCGM_FI_DEV_GPU_TEMP"}, sink, step_s=2, lookback_s=10,
            client=_client(prometheus), clock=clock, cursors=CursorStore(store), **kw,
        )

    puller().poll()
    clock.now = 1_800_000_100.0  # the process was down for ~90 s
    puller().poll()  # a new process: resumes one step after the stored cursor, not `lookback` before now
    temps = [s[5] for s in _samples(publisher) if s[2] == "DCGM_FI_DEV_GPU_TEMP"]
    assert temps == [1_799_999_996.0 + 2 * k for k in range(len(temps))]  # no gap, no repeat across the restart
    assert temps[-1] == 1_800_000_100.0
    # a cursor older than the catch-up limit is moved forward instead of pulling days of data
    clock.now = 1_800_010_000.0
    late = puller(max_catchup_s=60)
    late.poll()
    assert prometheus.ranges[-1][0] == 1_800_009_940.0
    # an unreadable file starts from the lookback, it does not stop the puller
    store.write_text("{not json")
    fresh = puller()
    fresh.poll()
    assert fresh.cursors["gpu_temp"] == 1_800_010_000_000


def test_a_restarted_loki_puller_resumes_without_duplicates_or_gaps(
    delivery: tuple[Delivery, MemoryPublisher], tmp_path: Path
) -> None:
    sink, publisher = delivery
    loki, clock = LokiStandIn(), Clock(T0 / NS)
    store = CursorStore(tmp_path / "cursors.json")

    def puller() -> LokiPuller:
        return LokiPuller(
            "http://loki:3100", '{namespace="llm"}', sink, limit=10, lookback_s=60,
            client=httpx.Client(transport=loki.transport()), clock=clock, cursors=CursorStore(store.path),
        )

    stream = {"namespace": "llm", "pod": "a"}
    for k, ns in enumerate([T0 - 50 * NS, T0 - 40 * NS, T0 - 40 * NS]):
        loki.push(stream, ns, f"line {k}")
    assert puller().poll() == 3
    loki.push(stream, T0 - 40 * NS, "late line at the cursor's nanosecond")
    loki.push(stream, T0 + 5 * NS, "line after the restart")
    clock.now = T0 / NS + 3600  # down for an hour: lookback alone (60 s) would lose the two new lines
    assert puller().poll() == 2
    lines = [line for _, _, line in _lines(publisher)]
    assert len(lines) == len(set(lines)) == 5
    assert not loki.violations
