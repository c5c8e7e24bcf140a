"""Property tests on every receiver: no 5xx on any input, and every rejected payload is dead-lettered."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator

import cramjam
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from services.core.settings import Settings
from services.ingest.http import ALERTMANAGER_PATH, LOKI_PUSH_PATH, REMOTE_WRITE_PATH, create_app
from services.ingest.memory import MemoryPublisher
from services.ingest.normalise import encode_loki_protobuf, encode_remote_write

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def ingest() -> Iterator[tuple[TestClient, MemoryPublisher]]:
    publisher = MemoryPublisher()
    with TestClient(create_app(Settings(ingest_max_body_bytes=64 * 1024), publisher)) as client:
        yield client, publisher


def _check(ingest: tuple[TestClient, MemoryPublisher], path: str, body: bytes, headers: dict[str, str]) -> None:
    client, publisher = ingest
    before = len(publisher.deadletters())
    response = client.post(path, content=body, headers=headers)
    letters = publisher.deadletters()[before:]
    event(f"HTTP {response.status_code}")
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert len(letters) == 1, f"{response.status_code} {response.text} left {len(letters)} dead letters"
        if "refused as out of bounds" in response.text:  # the letter holds the refused entries, not the body
            assert letters[0].raw.startswith(b'{"refused": '), letters[0].raw[:80]
        else:
            assert letters[0].raw == body[: len(letters[0].raw)] and letters[0].raw
        assert letters[0].error_type == "RejectedInput", letters[0].error  # never an unexpected exception
        assert response.text  # a reason for the sender
    else:
        assert response.status_code in (200, 204) and not letters


label_names = st.one_of(st.sampled_from(["__name__", "pod", "UUID", "Hostname", "le", ""]), st.text(max_size=8))
label_sets = st.dictionaries(label_names, st.text(max_size=12), max_size=5)
samples = st.lists(
    st.tuples(st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    max_size=4,
)
rw_headers = st.sampled_from(
    [
        {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"},
        {
            "Content-Type": "application/x-protobuf",
            "Content-Encoding": "snappy",
            "X-Prometheus-Remote-Write-Version": "0.1.0",
        },
        {},
        {"Content-Type": "text/plain"},
        {"Content-Encoding": "zstd"},
    ]
)


@st.composite
def remote_write_bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bytes", "snappy_bytes", "series", "mutated"]))
    if kind == "bytes":
        return draw(st.binary(min_size=1, max_size=300))
    if kind == "snappy_bytes":
        return bytes(cramjam.snappy.compress_raw(draw(st.binary(max_size=300))))
    body = encode_remote_write(draw(st.lists(st.tuples(label_sets, samples), max_size=5)))
    if kind == "mutated" and body:
        raw = bytearray(bytes(cramjam.snappy.decompress_raw(body)))
        for _ in range(draw(st.integers(1, 4))):
            if raw:
                raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        return bytes(cramjam.snappy.compress_raw(bytes(raw)))
    return body


@FUZZ
@given(body=remote_write_bodies(), headers=rw_headers)
def test_remote_write_never_5xx_and_dead_letters_every_rejection(
    ingest: tuple[TestClient, MemoryPublisher], body: bytes, headers: dict[str, str]
) -> None:
    _check(ingest, REMOTE_WRITE_PATH, body, headers)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)


@st.composite
def loki_bodies(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    kind = draw(st.sampled_from(["json", "shaped", "gzip", "proto", "bytes"]))
    if kind == "json":
        return json.dumps(draw(json_values)).encode(), {"Content-Type": "application/json"}
    stream = draw(st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=3))
    values = draw(
        st.lists(
            st.one_of(
                st.tuples(st.text(alphabet="0123456789", min_size=1, max_size=19), st.text(max_size=20)).map(list),
                st.lists(json_values, max_size=3),
            ),
            max_size=3,
        )
    )
    shaped = json.dumps({"streams": [{"stream": stream, "values": values}]}).encode()
    if kind == "shaped":
        return shaped, {"Content-Type": "application/json"}
    if kind == "gzip":
        body = gzip.compress(shaped) if draw(st.booleans()) else draw(st.binary(max_size=100))
        return body, {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    if kind == "proto":
        labels = draw(st.one_of(st.text(max_size=30), st.just('{app="a", b="c\\"d"}')))
        entries = draw(st.lists(st.tuples(st.integers(0, 2**62), st.text(max_size=20)), max_size=3))
        return encode_loki_protobuf([(labels, entries)]), {"Content-Type": "application/x-protobuf"}
    return draw(st.binary(min_size=1, max_size=200)), {
        "Content-Type": draw(st.sampled_from(["application/x-protobuf", "application/json", "image/png", ""]))
    }


@FUZZ
@given(case=loki_bodies())
def test_loki_push_never_5xx_and_dead_letters_every_rejection(
    ingest: tuple[TestClient, MemoryPublisher], case: tuple[bytes, dict[str, str]]
) -> None:
    body, headers = case
    _check(ingest, LOKI_PUSH_PATH, body or b" ", headers)


times = st.one_of(st.just("2026-11-29T10:15:02.123456789Z"), st.just("0001-01-01T00:00:00Z"), st.text(max_size=25))
alerts = st.fixed_dictionaries(
    {
        "status": st.sampled_from(["firing", "resolved", "pending", ""]),
        "labels": st.one_of(
            st.dictionaries(st.sampled_from(["alertname", "severity", "pod", "UUID", "x"]), st.text(max_size=8)),
            json_values,
        ),
        "startsAt": times,
        "endsAt": times,
        "fingerprint": st.text(max_size=16),
    }
)


@st.composite
def webhook_bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["shaped", "json", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(min_size=1, max_size=200))
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    payload = {
        "version": draw(st.sampled_from(["4", "3", 4])),
        "groupKey": draw(st.text(max_size=10)),
        "status": draw(st.sampled_from(["firing", "resolved"])),
        "alerts": draw(st.lists(alerts, max_size=3)),
    }
    return json.dumps(payload).encode()


@FUZZ
@given(body=webhook_bodies())
def test_alertmanager_webhook_never_5xx_and_dead_letters_every_rejection(
    ingest: tuple[TestClient, MemoryPublisher], body: bytes
) -> None:
    _check(ingest, ALERTMANAGER_PATH, body, {"Content-Type": "application/json"})
