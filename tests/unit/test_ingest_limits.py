"""Ingest bounds what a payload becomes in memory, not only its size on the wire.

A 197 KB snappy body of empty Loki entries once became 2.1 million records (+1.47 GB, 17 s), and the
remote_write series cache, capped by entries only, left 529 MB resident after 8 requests. Each limit
is a setting, refused payloads get 413 naming it, and a record the broker could never take is
dead-lettered on its own instead of failing its publish round.
"""

from __future__ import annotations

import json
import resource
import threading
import time
from pathlib import Path

import cramjam
import pytest
from fastapi.testclient import TestClient

from services.core.events import DeadLetter, LogRecord, MetricBatch
from services.core.settings import Settings, markdown_table
from services.ingest import normalise
from services.ingest.errors import RejectedInput
from services.ingest.fastwrite import SeriesCache, walk_write_request
from services.ingest.http import LOKI_PUSH_PATH, REMOTE_WRITE_PATH, create_app
from services.ingest.memory import MemoryPublisher
from services.ingest.sink import IngestMetrics, PublishQueue

NOW_MS = int(time.time() * 1000)
RW_HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}
PROTO = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}
DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _client(**overrides: object) -> tuple[TestClient, MemoryPublisher]:
    publisher = MemoryPublisher()
    return TestClient(create_app(Settings(**overrides), publisher)), publisher  # type: ignore[arg-type]


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _loki_json(lines: list[str], stream: dict[str, str] | None = None) -> bytes:
    ns = str(time.time_ns())
    return json.dumps({"streams": [{"stream": stream or {"job": "vllm"}, "values": [[ns, x] for x in lines]}]}).encode()


@pytest.mark.timeout(60)  # it took 17 s and 1.47 GB before the limit; nothing is timed
def test_a_small_protobuf_body_of_millions_of_empty_entries_is_refused_at_once() -> None:
    stream = _field(1, b'{job="x"}') + b"\x12\x00" * 2_100_000  # 2.1 million empty entries
    body = bytes(cramjam.snappy.compress_raw(_field(1, stream)))
    assert len(body) < 250_000
    client, publisher = _client()
    before = _rss_mib()
    with client:
        answer = client.post(LOKI_PUSH_PATH, content=body, headers=PROTO)
    grew = _rss_mib() - before
    assert answer.status_code == 413, answer.text
    assert "CLUSTERMEDIC_INGEST_MAX_RECORDS_PER_REQUEST" in answer.text
    assert grew < 300, f"peak memory grew by {grew:.0f} MiB"  # was +1.47 GB
    [letter] = publisher.deadletters()
    assert letter.error_type == "RejectedInput"


@pytest.mark.timeout(60)
def test_a_body_of_millions_of_empty_series_is_refused_before_upb_builds_it() -> None:
    raw = b"\x0a\x00" * (16 * 1024 * 1024)  # 16 million empty TimeSeries in 32 MiB
    before = _rss_mib()
    with pytest.raises(RejectedInput) as refused:
        walk_write_request(raw, SeriesCache(), max_samples=1000)
    grew = _rss_mib() - before
    assert refused.value.status == 413 and "protobuf messages" in str(refused.value)
    assert grew < 300, f"peak memory grew by {grew:.0f} MiB"  # building it cost 1.6 GB


def test_more_records_than_the_limit_are_refused_naming_it() -> None:
    client, publisher = _client(ingest_max_records_per_request=10)
    many = normalise.encode_remote_write([({"__name__": "up", "pod": f"p{i}"}, [(1.0, NOW_MS)]) for i in range(11)])
    few = normalise.encode_remote_write([({"__name__": "up", "pod": f"p{i}"}, [(1.0, NOW_MS)]) for i in range(10)])
    with client:
        # twice: the second time the series are in the cache and take the fast path
        for _ in range(2):
            assert client.post(REMOTE_WRITE_PATH, content=few, headers=RW_HEADERS).status_code == 204
            answer = client.post(REMOTE_WRITE_PATH, content=many, headers=RW_HEADERS)
            assert answer.status_code == 413 and "more than 10 samples" in answer.text, answer.text
        answer = client.post(LOKI_PUSH_PATH, content=_loki_json(["x"] * 11), headers=JSON)
        assert answer.status_code == 413 and "more than 10 log entries" in answer.text, answer.text
        proto = normalise.encode_loki_protobuf([('{job="x"}', [(time.time_ns(), "x")] * 11)])
        answer = client.post(LOKI_PUSH_PATH, content=proto, headers=PROTO)
        assert answer.status_code == 413 and "CLUSTERMEDIC_INGEST_MAX_RECORDS_PER_REQUEST" in answer.text
    assert sum(len(b.samples) for b in publisher.events(MetricBatch) if isinstance(b, MetricBatch)) == 20


def test_a_json_body_of_too_many_values_is_refused_before_it_is_decoded() -> None:
    raw = b'{"streams": [' + b",".join([b"[]"] * 200) + b"]}"
    with pytest.raises(RejectedInput) as refused:
        normalise.loki_json(raw, limits=normalise.Limits(max_records=10))
    assert refused.value.status == 413 and "JSON values" in str(refused.value)
    # commas inside strings do not count
    normalise.loki_json(_loki_json(["a," * 100]), limits=normalise.Limits(max_records=10))


def test_a_line_over_the_limit_is_refused_naming_it() -> None:
    client, _ = _client(ingest_max_line_bytes=1024)
    with client:
        ok = client.post(LOKI_PUSH_PATH, content=_loki_json(["é" * 512]), headers=JSON)  # 1024 bytes
        assert ok.status_code == 204, ok.text
        answer = client.post(LOKI_PUSH_PATH, content=_loki_json(["fine", "é" * 513]), headers=JSON)
        assert answer.status_code == 413 and "CLUSTERMEDIC_INGEST_MAX_LINE_BYTES" in answer.text
        assert "1026 bytes" in answer.text and "values[1]" in answer.text
        proto = normalise.encode_loki_protobuf([('{job="x"}', [(time.time_ns(), "x" * 1025)])])
        answer = client.post(LOKI_PUSH_PATH, content=proto, headers=PROTO)
        assert answer.status_code == 413 and "CLUSTERMEDIC_INGEST_MAX_LINE_BYTES" in answer.text


def test_labels_over_the_limit_are_refused_naming_it() -> None:
    client, _ = _client(ingest_max_label_bytes=256)
    big = "v" * 300
    with client:
        answer = client.post(LOKI_PUSH_PATH, content=_loki_json(["x"], {"job": big}), headers=JSON)
        assert answer.status_code == 413 and "CLUSTERMEDIC_INGEST_MAX_LABEL_BYTES" in answer.text
        proto = normalise.encode_loki_protobuf([(f'{{job="{big}"}}', [(time.time_ns(), "x")])])
        answer = client.post(LOKI_PUSH_PATH, content=proto, headers=PROTO)
        assert answer.status_code == 413 and "CLUSTERMEDIC_INGEST_MAX_LABEL_BYTES" in answer.text
        series = normalise.encode_remote_write([({"__name__": "up", "job": big}, [(1.0, NOW_MS)])])
        answer = client.post(REMOTE_WRITE_PATH, content=series, headers=RW_HEADERS)
        assert answer.status_code == 413 and "CLUSTERMEDIC_INGEST_MAX_LABEL_BYTES" in answer.text


def test_metric_batches_are_split_to_fit_the_message_limit() -> None:
    labels = {"__name__": "vllm:request_prompt", "pod": "vllm-0", "prompt": "x" * 20_000}
    series = [({**labels, "n": str(i)}, [(float(i), NOW_MS)]) for i in range(120)]  # one entity, 2.4 MB
    client, publisher = _client()
    with client:
        assert (
            client.post(
                REMOTE_WRITE_PATH, content=normalise.encode_remote_write(series), headers=RW_HEADERS
            ).status_code
            == 204
        )
    batches = [b for b in publisher.events(MetricBatch) if isinstance(b, MetricBatch)]
    assert len(batches) >= 3 and all(len(b.to_bytes()) <= 1_000_000 for b in batches)
    assert sorted(s.value for b in batches for s in b.samples) == [float(i) for i in range(120)]


def test_the_series_cache_is_bounded_by_bytes() -> None:
    cache = SeriesCache(max_bytes=1024 * 1024)
    for round_ in range(3):
        raw = bytes(
            cramjam.snappy.decompress_raw(
                normalise.encode_remote_write(
                    [
                        ({"__name__": "up", "pod": f"p{round_}-{i}", "x": "y" * 10_000}, [(1.0, NOW_MS)])
                        for i in range(60)
                    ]
                )
            )
        )
        batches, accepted, _ = walk_write_request(raw, cache, max_samples=1000)
        assert accepted == 60 and len(batches) == 60
        assert cache.bytes <= 1024 * 1024 + 30_000  # at most one entry past the bound before it starts afresh


def test_a_record_over_the_message_limit_is_dead_lettered_alone_and_its_round_succeeds() -> None:
    publisher = MemoryPublisher()
    queue = PublishQueue(publisher, IngestMetrics(), capacity=100, max_message_bytes=100_000)
    queue.start()
    outcome: list[BaseException | None] = []
    done = threading.Event()

    def finished(error: BaseException | None) -> None:
        outcome.append(error)
        done.set()

    try:
        huge = LogRecord(stream={"job": "x"}, line="\x01" * 30_000, ts=1.0)  # 30 KB that escapes to 180 KB
        good = [LogRecord(stream={"job": "x"}, line=f"good {i}", ts=1.0) for i in range(2)]
        assert queue.offer([good[0], huge, good[1]], finished)
        assert done.wait(30), "the publish round never finished"
    finally:
        queue.stop(5.0)
    assert outcome == [None]
    assert [e.line for e in publisher.events(LogRecord) if isinstance(e, LogRecord)] == ["good 0", "good 1"]
    [letter] = publisher.deadletters()
    assert isinstance(letter, DeadLetter) and "over the 100000-byte message limit" in letter.error
    assert "CLUSTERMEDIC_INGEST_MAX_MESSAGE_BYTES" in letter.error and letter.source_topic == LogRecord.topic


def test_every_limit_is_a_documented_setting() -> None:
    table = markdown_table()
    docs = DOCS.read_text()
    for name in (
        "INGEST_MAX_RECORDS_PER_REQUEST",
        "INGEST_MAX_LINE_BYTES",
        "INGEST_MAX_LABEL_BYTES",
        "INGEST_MAX_MESSAGE_BYTES",
        "INGEST_SERIES_CACHE_BYTES",
    ):
        row = next(line for line in table.splitlines() if f"`CLUSTERMEDIC_{name}`" in line)
        assert row in docs, f"docs/configuration.md is missing or out of date for {name}"
