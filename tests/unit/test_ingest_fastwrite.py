"""The remote_write walk agrees with a plain upb decode on every body, with a cold or a warm cache.

The walk serves series it has seen before from a cache without asking upb again (services/ingest/
fastwrite.py), so the properties here feed it the same series many times, and bodies mutated after the
cache learnt them: it must accept exactly what upb accepts and yield exactly the samples upb reads.
"""

from __future__ import annotations

import json
import math
from typing import Any

import cramjam
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.core.events import MetricBatch
from services.ingest.errors import RejectedInput
from services.ingest.fastwrite import EncodedMetricBatch, SeriesCache, walk_write_request
from services.ingest.normalise import encode_remote_write, entity_of, remote_write
from services.ingest.protowire import WriteRequest

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Samples = dict[str, list[tuple[str, dict[str, str], float, float]]]

# today's millisecond timestamps are 6-byte varints (the cached layout); others take the general walk
ms_values = st.one_of(
    st.integers(min_value=2**35, max_value=2**42 - 1),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
)
values = st.one_of(st.just(0.0), st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5).map(float))
label_sets = st.fixed_dictionaries(
    {"__name__": st.sampled_from(["DCGM_FI_DEV_GPU_TEMP", "vllm:num_requests_waiting", "up", ""])},
    optional={
        "UUID": st.sampled_from(["GPU-1", "GPU-2"]),
        "pod": st.text(max_size=6),
        "Hostname": st.just("node-1"),
        "le": st.sampled_from(["0.5", "+Inf"]),
        "": st.just("x"),
    },
)
series_pool = st.lists(label_sets, min_size=1, max_size=6)


def reference(raw: bytes) -> Samples | None:
    """What the body holds, read the slow and obvious way (None: it must be rejected)."""
    try:
        request = WriteRequest.FromString(raw)
    except DecodeError:
        return None
    out: Samples = {}
    for series in request.timeseries:
        labels: dict[str, str] = {}
        for label in series.labels:
            if label.name in labels:
                return None
            labels[label.name] = label.value
        name = labels.pop("__name__", "")
        if not name or "" in labels:
            return None
        entity = entity_of(labels, name)[0]
        bucket = out.setdefault(entity, [])
        for sample in series.samples:
            if math.isfinite(sample.value):
                bucket.append((name, labels, sample.value, sample.timestamp / 1000.0))
    return {entity: samples for entity, samples in out.items() if samples}


def walked(raw: bytes, cache: SeriesCache) -> Samples | None:
    """What the walk makes of the body, read back from the JSON it wrote (None: rejected)."""
    try:
        batches, accepted, _ = walk_write_request(raw, cache, max_samples=3)
    except RejectedInput:
        return None
    out: Samples = {}
    for batch in batches:
        parsed = MetricBatch.from_bytes(batch.to_bytes())
        assert parsed.entity == batch.entity and len(parsed.samples) <= 3
        out.setdefault(parsed.entity, []).extend((s.name, s.labels, s.value, s.ts) for s in parsed.samples)
    assert accepted == sum(len(v) for v in out.values())
    return out


def _raw(series: list[tuple[dict[str, str], list[tuple[float, int]]]]) -> bytes:
    return bytes(cramjam.snappy.decompress_raw(encode_remote_write(series)))


@st.composite
def bodies(draw: st.DrawFn) -> list[bytes]:
    """Several bodies drawing their series from one small pool, as successive scrapes would."""
    pool = draw(series_pool)
    out = []
    for _ in range(draw(st.integers(1, 4))):
        picks = draw(st.lists(st.integers(0, len(pool) - 1), max_size=8))
        series = [(pool[i], draw(st.lists(st.tuples(values, ms_values), min_size=1, max_size=2))) for i in picks]
        out.append(_raw(series))
    return out


@PROPERTY
@given(batch=bodies())
def test_the_walk_reads_what_upb_reads_with_a_cold_and_a_warm_cache(batch: list[bytes]) -> None:
    cache = SeriesCache()
    for raw in batch + batch:  # the second pass is served from the cache
        assert walked(raw, cache) == reference(raw)


@PROPERTY
@given(batch=bodies(), data=st.data())
def test_a_body_mutated_after_the_cache_learnt_its_series_is_judged_as_upb_judges_it(
    batch: list[bytes], data: st.DataObject
) -> None:
    cache = SeriesCache()
    for raw in batch:
        walked(raw, cache)
    body = bytearray(batch[-1])
    if not body:
        return
    for _ in range(data.draw(st.integers(1, 3))):
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        body = body[: data.draw(st.integers(0, len(body)))]
    assert walked(bytes(body), cache) == reference(bytes(body))


def test_a_first_series_of_16_kib_or_more_is_read_not_refused() -> None:
    # its length varint takes 3 bytes; batching senders (vmagent, the OTel collector) send such series
    # when they catch up, and a 4xx is never retried, so a refusal here would lose the data
    big = {"__name__": "vllm:request_prompt", "pod": "vllm-0", "prompt": "x" * 20_000}
    small = {"__name__": "up", "pod": "vllm-0"}
    for series in (
        [(big, [(1.0, 1_780_000_000_000)]), (small, [(2.0, 1_780_000_000_000)])],
        [(small, [(2.0, 1_780_000_000_000)]), (big, [(1.0, 1_780_000_000_000)])],
    ):
        raw = _raw(series)
        expected = reference(raw)
        assert expected is not None and sum(len(v) for v in expected.values()) == 2
        cache = SeriesCache()
        assert walked(raw, cache) == expected
        assert walked(raw, cache) == expected  # and again, warm


def test_a_zero_valued_sample_is_kept_and_served_from_the_cache() -> None:
    labels = {"__name__": "DCGM_FI_DEV_XID_ERRORS", "UUID": "GPU-1", "Hostname": "node-1"}
    cache = SeriesCache()
    for ms in (1_780_000_000_000, 1_780_000_015_000):
        raw = _raw([(labels, [(0.0, ms)])])
        assert walked(raw, cache) == {
            "GPU-1": [("DCGM_FI_DEV_XID_ERRORS", {"Hostname": "node-1"} | {"UUID": "GPU-1"}, 0.0, ms / 1000)]
        }
    assert len(cache.zero_sample) == 1, "the zero-valued layout is cached, not walked every time"


def test_a_series_seen_before_is_not_validated_again(monkeypatch: pytest.MonkeyPatch) -> None:
    labels = {"__name__": "DCGM_FI_DEV_GPU_TEMP", "UUID": "GPU-1"}
    cache = SeriesCache()
    walked(_raw([(labels, [(70.0, 1_780_000_000_000)])]), cache)
    calls: list[bytes] = []
    monkeypatch.setattr("services.ingest.fastwrite.validate_write_request", calls.append)
    assert walked(_raw([(labels, [(71.5, 1_780_000_015_000)])]), cache) == {
        "GPU-1": [("DCGM_FI_DEV_GPU_TEMP", {"UUID": "GPU-1"}, 71.5, 1_780_000_015.0)]
    }
    assert calls == []
    walked(_raw([({**labels, "gpu": "0"}, [(71.5, 1_780_000_015_000)])]), cache)
    assert len(calls) == 1, "a new series sends the body to upb first"


def test_encoded_batch_is_what_model_construct_and_to_bytes_would_make() -> None:
    samples = [{"name": "up", "labels": {"job": "x"}, "value": 1.0, "ts": 1.5}]
    fast = EncodedMetricBatch.of('GPU-é"1', "remote_write", [json.dumps(s, separators=(",", ":")) for s in samples])
    slow = MetricBatch.model_validate({"entity": 'GPU-é"1', "source": "remote_write", "samples": samples})
    constructed: Any = EncodedMetricBatch.model_construct(entity='GPU-é"1', source="remote_write", samples=())
    assert json.loads(fast.to_bytes()) == json.loads(slow.to_bytes())
    assert fast.model_dump() == constructed.model_dump() and fast.model_fields_set == constructed.model_fields_set
    assert fast.key() == slow.key() and fast.sample_count == 1


def test_the_cache_stays_within_its_capacity_and_still_decodes_correctly() -> None:
    cache = SeriesCache(capacity=10)
    for round_ in range(3):
        series = [
            ({"__name__": "up", "pod": f"pod-{i}"}, [(float(i % 2), 1_780_000_000_000 + round_)]) for i in range(25)
        ]
        raw = _raw(series)
        assert walked(raw, cache) == reference(raw)
        assert 0 < cache.size <= 10


def test_the_receiver_keeps_one_cache_across_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """The path the HTTP receiver takes: normalise.remote_write with the service's (at first empty) cache."""
    cache = SeriesCache()
    labels = {"__name__": "DCGM_FI_DEV_GPU_TEMP", "UUID": "GPU-1"}
    remote_write(
        encode_remote_write([(labels, [(70.0, 1_780_000_000_000)])]), max_decompressed=4096, max_samples=10, cache=cache
    )
    assert cache.size == 2, "the series is learnt by the cache it was given"
    calls: list[bytes] = []
    monkeypatch.setattr("services.ingest.fastwrite.validate_write_request", calls.append)
    _, accepted, _ = remote_write(
        encode_remote_write([(labels, [(71.0, 1_780_000_015_000)])]), max_decompressed=4096, max_samples=10, cache=cache
    )
    assert accepted == 1 and calls == [], "the next request is served from that cache"
