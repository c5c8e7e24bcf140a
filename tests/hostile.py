"""Hypothesis strategies for hostile input: what anybody who can reach a receiver may send.

Shared by the property tests of every parser (tests/unit/test_parsers_total.py) so each entry point
sees the same kinds of input: random bytes, valid payloads, and valid payloads with one part swapped
for something hostile (a lone surrogate escape, a 5,000-digit number, a value of the wrong type, deep
nesting, a huge float, a long run of one character).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import strategies as st

# Raw JSON fragments json.dumps would never write, each a known way to break a naive parser.
RAW_JSON = (
    '"\\ud800"',  # a lone surrogate: parses, but UTF-8 cannot encode it
    '"bad \\udfff line"',
    '"\\ud83d\\ude00"',  # a valid pair (an emoji): must still work
    "1" + "0" * 5000,  # over Python's 4,300-digit int conversion limit
    "9" * 25,
    "-" + "9" * 19,
    "1e400",  # json.loads gives inf
    "-1e400",
    "NaN",
    "Infinity",
    "1.5",
    "-1",
    "0",
    "true",
    "null",
    '""',
    "[]",
    "{}",
    "[" * 3000 + "]" * 3000,  # deep nesting: RecursionError in a recursive decoder
    '{"a":' * 1500 + "1" + "}" * 1500,
    '"' + "x" * 20_000 + '"',
    '"' + "7" * 5000 + '"',  # a digit string: a timestamp of 5,000 digits
    '"\\u0000"',
    '"٣٤"',  # non-ASCII digits: str.isdigit() says yes, int() says yes, JSON numbers say no
    '"0000-00-00T00:00:00Z"',
    '"9999-12-31T23:59:59-23:59"',  # past datetime's range once the offset is applied
    '"0001-01-01T00:00:00+23:59"',
    '"2026-11-29T10:00:00.123456789Z"',
    '"2026-13-45T25:61:61Z"',
    '["1", "x"]',
    '[1780000000, "1"]',
    '[[1780000000, "NaN"]]',
    '{"kind": "Pod", "name": "p"}',
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def _placeholder(index: int) -> str:
    return f"__hostile_raw_{index}__"


def _mutate(draw: st.DrawFn, node: Any, raws: list[str]) -> Any:
    """Return ``node`` with one part replaced, added or removed (descending at random)."""
    containers = isinstance(node, dict | list) and len(node) > 0
    if containers and draw(st.integers(0, 3)) > 0:  # mostly descend: the deep fields matter most
        if isinstance(node, dict):
            key = draw(st.sampled_from(sorted(node)))
            action = draw(st.sampled_from(["descend", "descend", "descend", "delete", "add"]))
            if action == "delete":
                del node[key]
            elif action == "add":
                node[draw(st.text(max_size=10))] = _replacement(draw, raws)
            else:
                node[key] = _mutate(draw, node[key], raws)
        else:
            index = draw(st.integers(0, len(node) - 1))
            node[index] = _mutate(draw, node[index], raws)
        return node
    return _replacement(draw, raws)


def _replacement(draw: st.DrawFn, raws: list[str]) -> Any:
    if draw(st.booleans()):
        raws.append(draw(st.sampled_from(RAW_JSON)))
        return _placeholder(len(raws) - 1)
    return draw(json_values)


@st.composite
def mutated_json(draw: st.DrawFn, seeds: list[Any]) -> bytes:
    """One of ``seeds`` (JSON-able values) with one to three parts made hostile, as UTF-8 JSON bytes."""
    value = copy.deepcopy(draw(st.sampled_from(seeds)))
    raws: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        value = _mutate(draw, value, raws)
    text = json.dumps(value)
    for index, raw in enumerate(raws):
        text = text.replace(json.dumps(_placeholder(index)), raw)
    return text.encode()


@st.composite
def hostile_json(draw: st.DrawFn, seeds: list[Any]) -> bytes:
    """Bytes for a JSON entry point: mostly mutated seeds, also plain seeds, random JSON, cut JSON, bytes."""
    kind = draw(st.sampled_from(["mutated"] * 6 + ["seed", "random", "truncated", "bytes", "raw"]))
    if kind == "mutated":
        return draw(mutated_json(seeds))
    if kind == "seed":
        return json.dumps(draw(st.sampled_from(seeds))).encode()
    if kind == "random":
        return json.dumps(draw(json_values)).encode()
    if kind == "truncated":
        text = json.dumps(draw(st.sampled_from(seeds))).encode()
        return text[: draw(st.integers(0, len(text)))]
    if kind == "raw":
        return draw(st.sampled_from(RAW_JSON)).encode()
    return draw(st.binary(max_size=64))


def hostile_objects(seeds: list[Any]) -> st.SearchStrategy[Any]:
    """Decoded JSON values for an entry point that takes objects (a Kubernetes event, a page's items)."""

    def decoded(raw: bytes) -> Any:
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            return raw.decode("utf-8", "replace")

    return hostile_json(seeds).map(decoded)


# Text shapes that make a backtracking regex or a naive tokenizer work hard.
_RUNS = ("a_1111", "1.", "a.", "/a", "-", "0000:", "x://", "blk_1 ", "Xid (", " ", "\t", "f", "9", "<*>", "é", "\x00")
long_runs = st.builds(lambda piece, n: piece * n, st.sampled_from(_RUNS), st.integers(1, 3000))
# known signatures with a hostile number in each numeric field
_SIGNATURE_TEMPLATES = (
    "NVRM: Xid (PCI:0000:3b:00): {n}, pid=1234, name=python3, Ch 00000008",
    "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={n}, OpType=ALLREDUCE, NumelIn=1,"
    " NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.",
    "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1,"
    " NumelOut=1, Timeout(ms)={n}) ran for 600012 milliseconds before timing out.",
    "vllm: request echoed 'NVRM: Xid (PCI:0000:3b:00): {n}, pid=1'",
)
_numbers = st.one_of(st.integers(0, 10**6).map(str), st.integers(1, 6000).map(lambda n: "7" * n))
log_lines = st.one_of(
    st.text(max_size=80),
    long_runs,
    st.builds(lambda template, n: template.format(n=n), st.sampled_from(_SIGNATURE_TEMPLATES), _numbers),
    st.builds(
        lambda head, body: head + body,
        st.sampled_from(
            [
                "NVRM: Xid (PCI:0000:3b:00): ",
                "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=",
                "torch.OutOfMemoryError: CUDA out of memory. ",
                "ERROR engine: AsyncEngineDeadError ",
                "Xid (0000:3b:00): ",
                "<4>[  123.456] NVRM: Xid (PCI:0000:3b:00): ",
            ]
        ),
        st.one_of(st.text(max_size=40), st.text(alphabet="0123456789", min_size=1, max_size=6000), long_runs),
    ),
)


# ------------------------------------------------------------------------- Prometheus exposition

_EXPOSITION_LINES = (
    "# HELP vllm:num_requests_running Number of requests running.",
    "# TYPE vllm:num_requests_running gauge",
    'vllm:num_requests_running{model_name="llama-70b",pod="llama-70b-0"} 3',
    "# TYPE DCGM_FI_DEV_XID_ERRORS gauge",
    'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-1",Hostname="n1"} 79 1780000000123',
    "# TYPE vllm:e2e_request_latency_seconds histogram",
    'vllm:e2e_request_latency_seconds_bucket{le="+Inf",pod="p"} 12',
    'vllm:e2e_request_latency_seconds_sum{pod="p"} NaN',
    'vllm:e2e_request_latency_seconds_count{pod="p"} 12',
    "up 1",
)
_EXPOSITION_PIECES = (
    "{",
    "}",
    '"',
    "\\",
    "=",
    ",",
    " ",
    "\t",
    "\n",
    "#",
    "# TYPE x counter\n",
    "# TYPE x histogram\n",
    "# TYPE x summary\n",
    "# HELP x \\",
    'x_bucket{le="a"} 1\n',
    "x_sum 1\n",
    'a{b="c"} ',
    "1e400",
    "-Inf",
    "NaN",
    "0x1p3",
    "1" + "0" * 5000,
    "1" * 400,
    "99999999999999999999999",
    "-1",
    "1.5",
    "٣",
    "\x00",
    "\ud800",
    "é",
    "__name__",
    'le="+Inf"',
    'quantile="0.5"',
)


@st.composite
def exposition_texts(draw: st.DrawFn) -> str:
    """Prometheus text exposition: valid lines with hostile pieces spliced in, or arbitrary text."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=200))
    lines = draw(st.lists(st.sampled_from(_EXPOSITION_LINES), min_size=1, max_size=8))
    for _ in range(draw(st.integers(0, 3))):
        index = draw(st.integers(0, len(lines) - 1))
        line = lines[index]
        at = draw(st.integers(0, len(line)))
        cut = draw(st.integers(0, 3))
        lines[index] = line[:at] + draw(st.sampled_from(_EXPOSITION_PIECES)) + line[at + cut :]
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n\n", "\n# EOF\n"]))


# ------------------------------------------------------------------------- protobuf push bodies


def _snappy(raw: bytes) -> bytes:
    import cramjam

    return bytes(cramjam.snappy.compress_raw(raw))


def _unsnappy(body: bytes) -> bytes:
    import cramjam

    return bytes(cramjam.snappy.decompress_raw(body))


_label_names = st.one_of(st.sampled_from(["__name__", "pod", "UUID", "Hostname", "le", "", "job"]), st.text(max_size=8))
_label_values = st.one_of(st.text(max_size=12), st.sampled_from(["x" * 20_000, "DCGM_FI_DEV_XID_ERRORS", "GPU-1"]))
_samples = st.lists(
    st.tuples(
        st.floats(allow_nan=True, allow_infinity=True),
        st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(1_779_000_000_000, 1_781_000_000_000)),
    ),
    max_size=4,
)
# raw protobuf fragments a sender's bug or an attacker could leave in a body
_PROTO_FRAGMENTS = (
    b"\x0a\x00" * 50,  # empty messages: 2 bytes each on the wire
    b"\x0a\x80\x80\x01",  # a 3-byte length (16 KiB) that the body does not hold
    b"\x0a\xff\xff\xff\xff\x0f",
    b"\x12\x00",
    b"\x1a\x00",
    b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # a varint of 10 bytes
    b"\x0b",  # wire type 3 (start group)
    b"\x0f",
    b"\x80",
    b"\xff" * 11,
)


def _mutated(draw: st.DrawFn, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "insert", "cut"]))
        at = draw(st.integers(0, len(data)))
        if kind == "flip" and data:
            data[min(at, len(data) - 1)] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[at:at] = draw(st.sampled_from(_PROTO_FRAGMENTS))
        else:
            del data[at : at + draw(st.integers(1, 8))]
    return bytes(data)


@st.composite
def remote_write_bodies(draw: st.DrawFn) -> bytes:
    """Snappy bodies for the remote_write receiver: valid requests, mutated ones, random bytes."""
    from services.ingest.normalise import encode_remote_write

    kind = draw(st.sampled_from(["series", "series", "mutated", "mutated", "snappy_bytes", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(min_size=1, max_size=300))
    if kind == "snappy_bytes":
        return _snappy(draw(st.binary(max_size=300)))
    body = encode_remote_write(
        draw(st.lists(st.tuples(st.dictionaries(_label_names, _label_values, max_size=5), _samples), max_size=5))
    )
    if kind == "mutated":
        return _snappy(_mutated(draw, _unsnappy(body)))
    return body


@st.composite
def loki_protobuf_bodies(draw: st.DrawFn) -> bytes:
    """Snappy bodies for the Loki protobuf receiver: valid pushes, mutated ones, random bytes."""
    from services.ingest.normalise import encode_loki_protobuf

    kind = draw(st.sampled_from(["push", "push", "mutated", "mutated", "snappy_bytes", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(min_size=1, max_size=300))
    if kind == "snappy_bytes":
        return _snappy(draw(st.binary(max_size=300)))
    labels = draw(
        st.one_of(
            st.sampled_from(['{job="vllm", pod="p"}', '{unit="kernel", node="n"}', "{}", '{a="\\"", b="\\\\"}']),
            st.text(max_size=30),
        )
    )
    entries = draw(
        st.lists(
            st.tuples(
                st.one_of(st.integers(0, 2**63), st.integers(1_779_000_000, 1_781_000_000).map(lambda s: s * 10**9)),
                log_lines,
            ),
            max_size=3,
        )
    )
    body = encode_loki_protobuf([(labels, entries)])
    if kind == "mutated":
        return _snappy(_mutated(draw, _unsnappy(body)))
    return body
