"""Every parser is total: any input gives a parsed value or the project's own error, nothing else.

Each entry point is called directly (not over HTTP, where the receivers turn any exception into a
400, which is why tests/unit/test_ingest_fuzz.py could not see these) with hostile input from
tests/hostile.py. The ``@example`` inputs are the crashes found when these tests were written, each
kept as a regression case: they raised a non-project exception before.

Deterministic (``derandomize``, no example database), and sized to run in a few seconds each.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kubernetes import client

from pipelines.detectors.logtemplates import LogTemplateDetector
from services.core.errors import EventError
from services.core.events import ALL_EVENTS, Anomaly, DeadLetter, Diagnosis, Event, KubeEvent, LogRecord
from services.core.examples import example_events
from services.ingest import normalise, pull
from services.ingest.errors import RejectedInput
from services.ingest.fastwrite import SeriesCache
from services.ingest.kube import EventWatcher
from services.ingest.sources import loki, prometheus, scrape
from services.ingest.timebounds import TimeCheck
from tests.hostile import (
    exposition_texts,
    hostile_json,
    hostile_objects,
    log_lines,
    loki_protobuf_bodies,
    remote_write_bodies,
)

# hundreds of examples per parser: run by `make test`, left out of the quick `make test-unit`
pytestmark = pytest.mark.slow

NOW = 1_780_000_000.0
NS = str(int(NOW * 1e9))
TOTAL = settings(
    max_examples=300,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


def _check() -> TimeCheck:
    return TimeCheck(max_future_s=600.0, max_age_s=7 * 86_400.0, now=NOW)


# ----------------------------------------------------------------------------- event contracts

EXAMPLES = {type(event): json.loads(event.to_bytes()) for event in example_events(NOW)}
DEEP = "[" * 300 + "]" * 300  # parses, but is deeper than pydantic serialises
TOO_DEEP = "[" * 3000 + "]" * 3000  # deeper than json.loads recurses


def _with(cls: type[Event], field: str, raw: str) -> bytes:
    """The example of ``cls`` with ``field`` set to the raw JSON ``raw``."""
    return json.dumps({**EXAMPLES[cls], field: "__raw__"}).replace('"__raw__"', raw).encode()


_STRING_FIELD = {
    "MetricBatch": "entity",
    "LogRecord": "line",
    "KubeEvent": "reason",
    "Anomaly": "entity",
    "IncidentEvent": "title",
    "Diagnosis": "diagnostician",
    "RemediationEvent": "detail",
    "DeadLetter": "error",
}


@pytest.mark.parametrize("cls", ALL_EVENTS, ids=lambda c: c.__name__)
def test_every_event_contract_parses_or_raises_its_own_error(cls: type[Event]) -> None:
    # the crashes found: nesting past json.loads' recursion and a lone surrogate in every contract,
    # nesting past pydantic's serialiser in the two with free-form dicts
    regressions = [TOO_DEEP.encode(), _with(cls, _STRING_FIELD[cls.__name__], '"bad \\ud800 line"')]
    if cls is Anomaly:
        regressions.append(_with(cls, "evidence", '{"x": ' + DEEP + "}"))
    if cls is Diagnosis:
        regressions.append(_with(cls, "proposed_params", '{"x": ' + DEEP + "}"))
    if "ts" in EXAMPLES[cls]:  # pydantic writes an infinity as null, which would not read back
        regressions.append(_with(cls, "ts", "1e400"))
        regressions.append(_with(cls, "ts", "NaN"))

    @TOTAL
    @given(raw=hostile_json([EXAMPLES[cls]]))
    def parses_or_refuses(raw: bytes) -> None:
        try:
            event = cls.from_bytes(raw)
        except EventError:
            return
        # a parsed event can be written again and read back: every consumer re-serialises what it read
        assert isinstance(event.key(), str)
        assert type(cls.from_bytes(event.to_bytes())) is cls

    for raw in regressions:
        with pytest.raises(EventError):
            cls.from_bytes(raw)
    parses_or_refuses()


def test_a_valid_surrogate_pair_and_an_escaped_backslash_still_parse() -> None:
    emoji = LogRecord.from_bytes(_with(LogRecord, "line", '"\\ud83d\\ude00"'))
    assert emoji.line == "\U0001f600"
    quoted = LogRecord.from_bytes(_with(LogRecord, "line", '"\\\\ud800"'))
    assert quoted.line == "\\ud800"


def test_a_dead_letter_quoting_a_lone_surrogate_can_be_written() -> None:
    letter = DeadLetter.of(raw=b"x", source_topic="k8s:events", error="bad \ud800", consumer="ingest", ts=NOW)
    assert DeadLetter.from_bytes(letter.to_bytes()).error == "bad \\ud800"


# ------------------------------------------------------------------------------------ Loki JSON

LOKI_SEEDS: list[Any] = [
    {
        "streams": [
            {"stream": {"job": "vllm", "pod": "p"}, "values": [[NS, "line one"], [NS, "two", {"trace_id": "1"}]]},
            {"stream": {"unit": "kernel", "node": "n"}, "values": [[NS, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1"]]},
        ]
    }
]


@TOTAL
@given(raw=hostile_json(LOKI_SEEDS))
@example(raw=b'{"streams": ' + TOO_DEEP.encode() + b"}")  # RecursionError
def test_loki_json_parses_or_refuses(raw: bytes) -> None:
    try:
        records = normalise.loki_json(raw, _check())
    except RejectedInput:
        return
    assert all(isinstance(r, LogRecord) for r in records)


@TOTAL
@given(body=loki_protobuf_bodies())
def test_loki_protobuf_parses_or_refuses(body: bytes) -> None:
    try:
        records = normalise.loki_protobuf(body, max_decompressed=1 << 20, check=_check())
    except RejectedInput:
        return
    assert all(isinstance(r, LogRecord) for r in records)


@TOTAL
@given(text=st.one_of(st.text(max_size=60), st.just('{a="' + "\\" * 5001 + '"}'), st.just("{" + 'a="b",' * 3000 + "}")))
def test_stream_selectors_parse_or_refuse(text: str) -> None:
    try:
        labels = normalise.parse_stream_labels(text)
    except RejectedInput:
        return
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())


# --------------------------------------------------------------------------------- remote_write

CACHE = SeriesCache(capacity=500)  # one cache across examples, as the receiver keeps one: the fast path too


@TOTAL
@given(body=remote_write_bodies())
@example(body=normalise.encode_remote_write([({"__name__": "up", "x": "y" * 20_000}, [(1.0, int(NOW * 1000))])]))
def test_remote_write_parses_or_refuses(body: bytes) -> None:
    try:
        batches, accepted, dropped = normalise.remote_write(
            body, max_decompressed=1 << 20, max_samples=1000, cache=CACHE, check=_check()
        )
    except RejectedInput:
        return
    assert accepted == sum(json.loads(b.to_bytes())["samples"].__len__() for b in batches)
    assert dropped >= 0


# --------------------------------------------------------------------------- Alertmanager webhook

WEBHOOK_SEEDS: list[Any] = [
    {
        "version": "4",
        "groupKey": "g",
        "status": "firing",
        "receiver": "r",
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "GpuHot", "pod": "p"},
                "startsAt": "2026-05-28T20:26:40Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "fingerprint": "f",
            }
        ],
    }
]


@TOTAL
@given(raw=hostile_json(WEBHOOK_SEEDS))
def test_alertmanager_webhook_parses_or_refuses(raw: bytes) -> None:
    try:
        anomalies = normalise.alertmanager_webhook(raw, _check())
    except RejectedInput:
        return
    assert all(isinstance(a, Anomaly) for a in anomalies)


# ---------------------------------------------------------------------------- Kubernetes events

KUBE_SEEDS: list[Any] = [
    {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "e", "namespace": "s", "uid": "u", "resourceVersion": "1"},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": "s", "uid": "pu"},
        "reason": "BackOff",
        "message": "m",
        "type": "Warning",
        "count": 3,
        "lastTimestamp": "2026-05-28T20:26:40Z",
        "source": {"component": "kubelet", "host": "n1"},
    },
    {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "e", "uid": "u2", "resourceVersion": "2"},
        "regarding": {"kind": "Node", "name": "n1"},
        "reason": "NodeNotReady",
        "note": "x",
        "eventTime": "2026-05-28T20:26:40.000001Z",
        "series": {"count": 2, "lastObservedTime": "2026-05-28T20:26:40.5Z"},
        "reportingController": "c",
    },
]


@TOTAL
@given(obj=hostile_objects(KUBE_SEEDS))
@example(obj=[])  # the six JSON types that are not an object raised AttributeError
@example(obj="event")
@example(obj=None)
@example(obj=7)
@example(obj=1.5)
@example(obj=True)
@example(obj={**KUBE_SEEDS[0], "count": float("inf")})  # 1e400 in JSON: OverflowError
@example(obj={**KUBE_SEEDS[1], "note": "bad \ud800"})  # parsed, then failed the watcher's publish forever
def test_kubernetes_events_normalise_or_refuse(obj: Any) -> None:
    try:
        event = normalise.kube_event(obj, _check())
    except RejectedInput:
        return
    assert isinstance(event, KubeEvent)
    event.to_bytes()


def _watcher(emitted: list[list[KubeEvent | DeadLetter]]) -> EventWatcher:
    api = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))  # never contacted
    return EventWatcher(api, emitted.append)


@TOTAL
@given(objects=st.lists(hostile_objects(KUBE_SEEDS), max_size=4))
def test_a_relist_emits_one_event_or_dead_letter_per_new_object(objects: list[Any]) -> None:
    emitted: list[list[KubeEvent | DeadLetter]] = []
    _watcher(emitted)._deliver(objects)
    out = [item for batch in emitted for item in batch]
    assert len(out) <= len(objects)
    for item in out:
        item.to_bytes()


# ---------------------------------------------------------------------------- scrape /metrics


@TOTAL
@given(text=exposition_texts())
@example(text="x " + "1" * 400 + "\n")  # a value too large for a float: OverflowError
@example(text="x 1 " + "1" * 400 + "\n")  # a timestamp too large: OverflowError inside prometheus_client
def test_scraped_expositions_parse_or_refuse(text: str) -> None:
    try:
        series = scrape.parse_exposition(text, scrape_ts=NOW, target_labels={"job": "j", "instance": "i"})
    except RejectedInput:
        return
    normalise.metric_batches(series, source="scrape", max_samples=1000, check=_check())


# ------------------------------------------------------------------------------- pull answers

PULL_SEEDS: list[Any] = [
    {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [{"metric": {"__name__": "up", "job": "j"}, "values": [[NOW, "1"], [NOW + 15, "NaN"]]}],
        },
    },
    {
        "status": "success",
        "warnings": ["w"],
        "data": {
            "resultType": "streams",
            "result": [{"stream": {"job": "j", "pod": "p"}, "values": [[NS, "a"], [NS, "b", {"x": "y"}]]}],
        },
    },
]


def _pull_answer(raw: bytes) -> None:
    answer = pull.Answer("http://x", 200, "application/json", raw, True)
    data = pull.json_answer(answer, "q")
    skipped = pull.Skipped()
    if data.get("resultType") == "streams":
        loki.log_records(loki.loki_entries(data, what="q", skipped=skipped), _check())
    else:
        series = prometheus.matrix_series(data, default_name="n", what="q", skipped=skipped)
        normalise.metric_batches(series, source="query_range", max_samples=1000, check=_check())


def _seed(index: int, path: tuple[Any, ...], raw: str) -> bytes:
    value = json.loads(json.dumps(PULL_SEEDS[index]))
    node = value
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = "__raw__"
    return json.dumps(value).replace('"__raw__"', raw).encode()


@TOTAL
@given(raw=hostile_json(PULL_SEEDS))
@example(raw=TOO_DEEP.encode())  # RecursionError
@example(raw=_seed(1, ("warnings",), "7"))  # warnings not a list: TypeError
@example(raw=_seed(1, ("data", "result", 0, "values", 0, 0), '"' + "7" * 5000 + '"'))  # int() of 5,000 digits
@example(raw=_seed(0, ("data", "result", 0, "values", 0, 0), "1" + "0" * 400))  # float() overflows
@example(raw=_seed(0, ("data", "result", 0, "metric", "__name__"), '"\\ud800"'))  # ValidationError: not a str
def test_pull_answers_parse_or_refuse(raw: bytes) -> None:
    try:
        _pull_answer(raw)
    except RejectedInput:
        return


# ------------------------------------------------------------------------ drain3 log templates

DETECTOR = LogTemplateDetector(warmup_lines=5)
STATE = [DETECTOR.initial_state()]
streams = st.sampled_from([{"unit": "kernel", "node": "n"}, {"pod": "p"}, {}, {"job": "x"}])
NCCL = (
    "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1,"
    " NumelOut=1, Timeout(ms)={timeout}) ran for 600012 milliseconds before timing out."
)


@TOTAL
@given(batch=st.lists(st.tuples(streams, log_lines, st.floats(0, 2e9)), min_size=1, max_size=4))
@example(batch=[({"pod": "p"}, NCCL.format(seq="7" * 5000, timeout=600000), NOW)])  # int() of 5,000 digits
@example(batch=[({"pod": "p"}, NCCL.format(seq=7, timeout="7" * 5000), NOW)])
def test_the_log_template_detector_takes_any_line(batch: list[tuple[dict[str, str], str, float]]) -> None:
    records = [LogRecord(stream=stream, line=line, ts=ts) for stream, line, ts in batch]
    STATE[0], found = DETECTOR.detect(records, STATE[0])
    for anomaly in found:
        Anomaly.from_bytes(anomaly.to_bytes())


# ----------------------------------------------------------------------------------- encodings


@TOTAL
@given(body=st.binary(max_size=200), encoding=st.sampled_from(["gzip", "deflate", "", "br", "snappy"]))
def test_content_encodings_inflate_or_refuse(body: bytes, encoding: str) -> None:
    try:
        normalise.inflate(body, encoding, 4096)
    except RejectedInput:
        pass
    try:
        normalise.snappy_block(body, 4096)
    except RejectedInput:
        pass
