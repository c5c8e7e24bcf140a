"""Real Prometheus against the simulator, and the pull clients, into the real Kafka.

One Prometheus (Debian's 2.42 binary, started by infra/local/prometheus.sh on a free loopback port
with a static config written here: the repository's config uses kubernetes_sd, which that build
lacks) scrapes the simulator's per-node ``/metrics`` endpoints every second and remote-writes to the
ingest app running in this process with the real KafkaPublisher. The tests then check, on Kafka:

- remote_write: the simulated node's samples arrive with names, labels and values intact (issue 4);
- Prometheus answers ``query_range`` for a DCGM metric with the simulated values (issue 3);
- ``PrometheusPuller`` pulls that query, resuming without a repeated or missing evaluation time;
- ``medic ingest scrape`` reads the same endpoint directly, and dead-letters a broken target;
- ``LokiPuller`` / ``medic ingest pull-loki`` follow a local Loki stand-in that checks every request
  as Loki does (Loki is not installable here), with no duplicate or missing line across pages and polls.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from services.core.bus import KafkaPublisher, ensure_topics
from services.core.events import DeadLetter, LogRecord, MetricBatch
from services.core.settings import Settings
from services.ingest.cli import app as ingest_app
from services.ingest.pull import delivery_for
from services.ingest.sources.loki import LokiPuller
from services.ingest.sources.prometheus import PrometheusPuller
from services.simulator.scenario import Scenario
from services.simulator.simulator import Simulator
from services.simulator.sinks import PrometheusSink
from tests.conftest import poll
from tests.httpstub import StubHandler, serving
from tests.integration.test_ingest_stack import _component, _ingest, _scrape_and_remote_write, _TopicReader
from tests.loki_standin import LokiStandIn

pytestmark = pytest.mark.integration

SeriesKey = tuple[str, str]  # (metric name, labels as sorted JSON)


def _key(name: str, labels: dict[str, str]) -> SeriesKey:
    return name, json.dumps(labels, sort_keys=True)


@dataclass
class Stack:
    """What the module's tests share."""

    settings: Settings
    node: str
    target: str  # host:port of the simulated node's /metrics
    exposition: dict[SeriesKey, float]  # what that endpoint serves, as Prometheus would label it
    prometheus: str  # base URL
    metrics: _TopicReader


def _served(url: str, job: str, instance: str) -> dict[SeriesKey, float]:
    """The endpoint's series, parsed independently of the code under test, with the target labels."""
    text = httpx.get(url, timeout=10).text
    out: dict[SeriesKey, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[_key(sample.name, {**sample.labels, "job": job, "instance": instance})] = float(sample.value)
    return out


@pytest.fixture(scope="module")
def stack(kafka_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    settings = Settings(topic_prefix=f"test.{uuid.uuid4().hex[:10]}.")
    ensure_topics(settings)
    sim = Simulator(Scenario(), seed=0)
    cluster = sim.cluster
    node_of = {u: cluster.nodes[int(cluster.gpus.node[i])].name for i, u in enumerate(cluster.gpu_uuids)}

    def entity_node(entity: str) -> str:
        if entity in node_of:
            return node_of[entity]
        pod = cluster.pod_by_name.get(entity)
        return cluster.nodes[pod.node].name if pod is not None and pod.node >= 0 else ""

    sink = PrometheusSink(entity_node, [n.name for n in cluster.nodes])
    sim.sinks.append(sink)
    sim.run(20)  # the endpoints keep serving the last step's values
    node = cluster.nodes[0].name
    target = f"127.0.0.1:{sink.ports[node]}"
    exposition = _served(f"http://{target}/metrics", "simulator", target)
    reader = _TopicReader(settings, MetricBatch.topic)
    tmp = tmp_path_factory.mktemp("prometheus")
    try:
        with _ingest(settings) as (ingest_url, _):
            config = _scrape_and_remote_write(target, ingest_url)
            with _component("prometheus", config, tmp) as port:
                base = f"http://127.0.0.1:{port}"

                def target_up() -> bool:
                    active = httpx.get(f"{base}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
                    return bool(active) and all(t["health"] == "up" for t in active)

                poll(target_up, 60, interval_s=0.2, what="Prometheus to scrape the simulator (health=up)")
                yield Stack(settings, node, target, exposition, base, reader)
    finally:
        reader.close()
        sim.close()


def _samples(values: list[bytes], source: str) -> list[tuple[str, Any]]:
    batches = [MetricBatch.from_bytes(v) for v in values]
    return [(b.entity, s) for b in batches if b.source == source for s in b.samples]


# --------------------------------------------------------------------------- remote_write (issue 4)


def test_prometheus_scrapes_the_simulator_and_remote_writes_samples_intact(stack: Stack) -> None:
    wanted = set(stack.exposition)

    def all_arrived() -> dict[SeriesKey, tuple[str, float, float]] | None:
        got = {
            _key(s.name, s.labels): (entity, s.value, s.ts)
            for entity, s in _samples(stack.metrics.read(), "remote_write")
        }
        return got if wanted <= set(got) else None

    got = poll(all_arrived, 90, interval_s=0.2, what="every simulated series on telemetry.metrics.v1 via remote_write")
    dcgm = [k for k in wanted if k[0].startswith("DCGM_FI_")]
    vllm = [k for k in wanted if k[0].startswith("vllm:")]
    assert len(dcgm) >= 8 * 5 and vllm, "the node serves DCGM and vLLM series"
    for key in wanted:
        entity, value, ts = got[key]
        assert value == stack.exposition[key], key  # names and labels are the key; values intact
        assert abs(ts - time.time()) < 300
        if key[0].startswith("DCGM_FI_"):
            assert entity == json.loads(key[1])["UUID"], key  # keyed by the GPU
    temp = next(k for k in dcgm if k[0] == "DCGM_FI_DEV_GPU_TEMP")
    labels = json.loads(temp[1])
    assert labels["Hostname"] == labels["hostname"] == stack.node and labels["UUID"].startswith("GPU-")
    assert got[temp][0] == labels["UUID"]  # keyed by the GPU


# ------------------------------------------------------------------------------ query_range (issue 3)


def test_prometheus_answers_query_range_for_a_dcgm_metric(stack: Stack) -> None:
    expected = {
        json.loads(labels)["UUID"]: value
        for (name, labels), value in stack.exposition.items()
        if name == "DCGM_FI_DEV_GPU_TEMP"
    }
    assert len(expected) == 8

    def answered() -> list[dict[str, Any]] | None:
        now = time.time()
        response = httpx.get(
            f"{stack.prometheus}/api/v1/query_range",
            params={
                "query": f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{stack.node}"}}',
                "start": f"{now - 30:.3f}",
                "end": f"{now:.3f}",
                "step": "1",
            },
            timeout=10,
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["status"] == "success" and body["data"]["resultType"] == "matrix"
        result: list[dict[str, Any]] = body["data"]["result"]
        return result if len(result) == len(expected) else None

    result = poll(answered, 60, interval_s=0.5, what="a query_range answer for every GPU of the node")
    for series in result:
        metric = series["metric"]
        assert metric["__name__"] == "DCGM_FI_DEV_GPU_TEMP" and metric["job"] == "simulator"
        assert metric["instance"] == stack.target
        assert {float(v) for _, v in series["values"]} == {expected[metric["UUID"]]}


# ------------------------------------------------------------------------------ the pull clients


def test_pull_prom_publishes_query_range_samples_and_resumes_without_gaps(stack: Stack) -> None:
    settings = stack.settings
    delivery = delivery_for(settings, KafkaPublisher(settings))
    query = f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{stack.node}"}}'
    puller = PrometheusPuller(stack.prometheus, {"gpu_temp": query}, delivery, step_s=1, lookback_s=5)
    polls: list[int] = []

    def pulled_three_times() -> bool:
        polls.append(puller.poll())  # the first may find nothing yet: Prometheus has scraped for a moment only
        return len([n for n in polls if n]) >= 3

    try:
        poll(pulled_three_times, 60, interval_s=0.5, what="three polls that pulled new evaluation times")
    finally:
        delivery.queue.stop(settings.ingest_flush_timeout_s)
    # the command, with an expression whose series have no __name__: they take the query's name
    args = ["pull-prom", "--once", "--url", stack.prometheus, "--step", "1", "--interval", "5"]
    result = CliRunner().invoke(
        ingest_app,
        [*args, "--query", f"max_temp=max by (UUID) ({query})"],
        env={"CLUSTERMEDIC_TOPIC_PREFIX": settings.topic_prefix},
    )
    assert result.exit_code == 0, result.output
    published = re.search(r"pull-prom: (\d+) items published", result.output)
    assert published and int(published.group(1)) > 0, result.output
    from_cli = int(published.group(1))
    expected = {k: v for k, v in stack.exposition.items() if k[0] == "DCGM_FI_DEV_GPU_TEMP"}

    def pulled() -> list[tuple[str, Any]] | None:
        samples = _samples(stack.metrics.read(), "query_range")
        return samples if len(samples) >= sum(polls) + from_cli else None

    samples = poll(pulled, 30, interval_s=0.2, what="the pulled samples on telemetry.metrics.v1")
    assert len(samples) == sum(polls) + from_cli
    by_uuid = {json.loads(labels)["UUID"]: value for (_, labels), value in expected.items()}
    cli_samples = [s for _, s in samples if s.name == "max_temp"]
    assert len(cli_samples) == from_cli
    assert all(s.labels.keys() == {"UUID"} and s.value == by_uuid[s.labels["UUID"]] for s in cli_samples)
    by_series: dict[SeriesKey, list[float]] = {}
    for entity, sample in (pair for pair in samples if pair[1].name != "max_temp"):
        key = _key(sample.name, sample.labels)
        assert key in expected and sample.value == expected[key] and entity == sample.labels["UUID"]
        by_series.setdefault(key, []).append(sample.ts)
    assert len(by_series) == 8
    for times in by_series.values():
        ordered = sorted(times)
        assert len(set(ordered)) == len(ordered), "an evaluation time was pulled twice"
        assert [round(b - a, 3) for a, b in itertools.pairwise(ordered)] == [1.0] * (len(ordered) - 1)
        assert ordered[-1] == puller.cursors["gpu_temp"] / 1000


@contextlib.contextmanager
def _broken_endpoint() -> Iterator[str]:
    """A /metrics endpoint that serves text that is not the exposition format."""

    class Handler(StubHandler):
        def do_GET(self) -> None:
            self.reply(200, b"DCGM_FI_DEV_GPU_TEMP{gpu=0 71\n", "text/plain; version=0.0.4")

    with serving(Handler) as url:
        yield f"{url}/metrics"


def test_medic_ingest_scrape_reads_the_simulator_and_dead_letters_a_broken_target(stack: Stack) -> None:
    settings = stack.settings
    deadletters = _TopicReader(settings, DeadLetter.topic)
    good = f"http://{stack.target}/metrics"
    with _broken_endpoint() as bad:
        result = CliRunner().invoke(
            ingest_app,
            ["scrape", "--once", "--job", "simulator", "--target", bad, "--target", good],
            env={"CLUSTERMEDIC_TOPIC_PREFIX": settings.topic_prefix},
        )
        assert result.exit_code == 0, result.output
        assert f"{len(stack.exposition)} items published" in result.output
    wanted = set(stack.exposition)

    def scraped() -> dict[SeriesKey, tuple[str, float]] | None:
        got = {_key(s.name, s.labels): (e, s.value) for e, s in _samples(stack.metrics.read(), "scrape")}
        return got if wanted <= set(got) else None

    got = poll(scraped, 30, interval_s=0.2, what="the scraped samples on telemetry.metrics.v1")
    assert {k: v for k, (_, v) in got.items()} == stack.exposition

    def scrape_letters() -> list[DeadLetter]:
        letters = [DeadLetter.from_bytes(v) for v in deadletters.read()]
        return [d for d in letters if d.source_topic.startswith("scrape:")]

    [letter] = poll(scrape_letters, 30, what="the broken target's dead letter")
    deadletters.close()
    assert letter.source_topic == f"scrape:{bad}" and letter.consumer == "ingest"
    assert "exposition does not parse" in letter.error and letter.raw.startswith(b"DCGM_FI_DEV_GPU_TEMP{gpu=0")


def test_pull_loki_follows_a_loki_standin_without_duplicates_or_gaps(stack: Stack) -> None:
    settings = stack.settings
    logs = _TopicReader(settings, LogRecord.topic)
    loki = LokiStandIn()
    now_ns = time.time_ns()
    pushed: list[tuple[str, int, str]] = []

    def push(pod: str, ns: int, line: str) -> None:
        loki.push({"namespace": "llm-serving", "pod": pod}, ns, line)
        pushed.append((pod, ns, line))

    for k in range(7):  # pairs share a nanosecond; pages of 3 split them
        push(f"vllm-{k % 2}", now_ns - 20_000_000_000 + (k // 2) * 1_000, f"request {k} done")
    loki.push({"namespace": "kube-system", "pod": "coredns"}, now_ns - 1_000, "not selected")
    with loki.serve() as url:
        query = '{namespace="llm-serving"}'
        result = CliRunner().invoke(
            ingest_app,
            ["pull-loki", "--once", "--url", url, "--query", query, "--limit", "3", "--interval", "60"],
            env={"CLUSTERMEDIC_TOPIC_PREFIX": settings.topic_prefix},
        )
        assert result.exit_code == 0, result.output
        assert "7 items published" in result.output
        # a long-running puller: several polls, entries arriving in between, one bad answer
        delivery = delivery_for(settings, KafkaPublisher(settings))
        puller = LokiPuller(url, query, delivery, limit=3, lookback_s=60)
        try:
            assert puller.poll() == 7
            push("vllm-0", time.time_ns(), "late line 1")
            loki.scripted.append((502, "text/plain", b"upstream connect error"))
            assert puller.poll() == 0
            push("vllm-1", time.time_ns(), "late line 2")
            assert puller.poll() == 2
            assert puller.poll() == 0
        finally:
            delivery.queue.stop(settings.ingest_flush_timeout_s)
    assert not loki.violations, loki.violations
    wanted = 7 + 9  # the CLI's run, then the puller's

    def arrived() -> list[LogRecord] | None:
        values = logs.read()
        return [LogRecord.from_bytes(v) for v in values] if len(values) >= wanted else None

    records = poll(arrived, 30, what="the pulled log lines on telemetry.logs.v1")
    logs.close()
    # the CLI's run delivered the first 7 lines once, the puller every line once; nothing else
    assert Counter((r.stream["pod"], r.ts, r.line) for r in records) == Counter(
        (pod, ns / 1e9, line) for pod, ns, line in pushed[:7] + pushed
    )
    assert all(r.entity == r.stream["pod"] for r in records)
