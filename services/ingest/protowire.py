"""Protobuf messages of the two push protocols, built at runtime from their published field numbers.

No ``protoc`` is needed: the messages are declared below as ``FileDescriptorProto`` objects in a
private descriptor pool and turned into classes by ``google.protobuf``'s message factory (the upb C
backend parses them, which keeps remote_write decoding fast).

Prometheus remote_write 1.0 (``prometheus/prompb/remote.proto`` and ``types.proto``)::

    message WriteRequest   { repeated TimeSeries timeseries = 1; reserved 2; repeated MetricMetadata metadata = 3; }
    message TimeSeries     { repeated Label labels = 1; repeated Sample samples = 2; repeated Exemplar exemplars = 3; }
    message Label          { string name = 1; string value = 2; }
    message Sample         { double value = 1; int64 timestamp = 2; }   // timestamp in ms
    message Exemplar       { repeated Label labels = 1; double value = 2; int64 timestamp = 3; }
    message MetricMetadata { MetricType type = 1; string metric_family_name = 2; string help = 4; string unit = 5; }

Loki push (``pkg/push/push.proto``)::

    message PushRequest      { repeated StreamAdapter streams = 1; }
    message StreamAdapter    { string labels = 1; repeated EntryAdapter entries = 2; uint64 hash = 3; }
    message EntryAdapter     { google.protobuf.Timestamp timestamp = 1; string line = 2;
                               repeated LabelPairAdapter structuredMetadata = 3; }
    message LabelPairAdapter { string name = 1; string value = 2; }

Fields a newer sender adds (native histograms, field 4 of TimeSeries) are kept as unknown fields and
ignored, as protobuf intends.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2
from google.protobuf.message import Message

_F = descriptor_pb2.FieldDescriptorProto

METRIC_TYPES: dict[int, str] = {
    0: "unknown",
    1: "counter",
    2: "gauge",
    3: "histogram",
    4: "gaugehistogram",
    5: "summary",
    6: "info",
    7: "stateset",
}


def _field(
    message: descriptor_pb2.DescriptorProto,
    name: str,
    number: int,
    kind: int,
    *,
    repeated: bool = False,
    type_name: str = "",
    json_name: str = "",
) -> None:
    field = message.field.add()
    field.name = name
    field.number = number
    field.type = kind
    field.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    if type_name:
        field.type_name = type_name
    if json_name:
        field.json_name = json_name


def _prometheus_file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(name="clustermedic/prometheus_remote.proto", package="prometheus")
    file.syntax = "proto3"

    enum = file.enum_type.add(name="MetricType")
    for number, name in METRIC_TYPES.items():
        enum.value.add(name=name.upper(), number=number)

    label = file.message_type.add(name="Label")
    _field(label, "name", 1, _F.TYPE_STRING)
    _field(label, "value", 2, _F.TYPE_STRING)

    sample = file.message_type.add(name="Sample")
    _field(sample, "value", 1, _F.TYPE_DOUBLE)
    _field(sample, "timestamp", 2, _F.TYPE_INT64)

    exemplar = file.message_type.add(name="Exemplar")
    _field(exemplar, "labels", 1, _F.TYPE_MESSAGE, repeated=True, type_name=".prometheus.Label")
    _field(exemplar, "value", 2, _F.TYPE_DOUBLE)
    _field(exemplar, "timestamp", 3, _F.TYPE_INT64)

    series = file.message_type.add(name="TimeSeries")
    _field(series, "labels", 1, _F.TYPE_MESSAGE, repeated=True, type_name=".prometheus.Label")
    _field(series, "samples", 2, _F.TYPE_MESSAGE, repeated=True, type_name=".prometheus.Sample")
    _field(series, "exemplars", 3, _F.TYPE_MESSAGE, repeated=True, type_name=".prometheus.Exemplar")

    metadata = file.message_type.add(name="MetricMetadata")
    _field(metadata, "type", 1, _F.TYPE_ENUM, type_name=".prometheus.MetricType")
    _field(metadata, "metric_family_name", 2, _F.TYPE_STRING)
    _field(metadata, "help", 4, _F.TYPE_STRING)
    _field(metadata, "unit", 5, _F.TYPE_STRING)

    write = file.message_type.add(name="WriteRequest")
    _field(write, "timeseries", 1, _F.TYPE_MESSAGE, repeated=True, type_name=".prometheus.TimeSeries")
    write.reserved_range.add(start=2, end=3)
    _field(write, "metadata", 3, _F.TYPE_MESSAGE, repeated=True, type_name=".prometheus.MetricMetadata")
    return file


def _loki_file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(name="clustermedic/loki_push.proto", package="logproto")
    file.syntax = "proto3"
    file.dependency.append("google/protobuf/timestamp.proto")

    pair = file.message_type.add(name="LabelPairAdapter")
    _field(pair, "name", 1, _F.TYPE_STRING)
    _field(pair, "value", 2, _F.TYPE_STRING)

    entry = file.message_type.add(name="EntryAdapter")
    _field(entry, "timestamp", 1, _F.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp")
    _field(entry, "line", 2, _F.TYPE_STRING)
    _field(
        entry,
        "structured_metadata",
        3,
        _F.TYPE_MESSAGE,
        repeated=True,
        type_name=".logproto.LabelPairAdapter",
        json_name="structuredMetadata",
    )

    stream = file.message_type.add(name="StreamAdapter")
    _field(stream, "labels", 1, _F.TYPE_STRING)
    _field(stream, "entries", 2, _F.TYPE_MESSAGE, repeated=True, type_name=".logproto.EntryAdapter")
    _field(stream, "hash", 3, _F.TYPE_UINT64)

    push = file.message_type.add(name="PushRequest")
    _field(push, "streams", 1, _F.TYPE_MESSAGE, repeated=True, type_name=".logproto.StreamAdapter")
    return file


def _build() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    timestamp_file = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(timestamp_file)
    pool.Add(timestamp_file)
    pool.Add(_prometheus_file())
    pool.Add(_loki_file())
    names = ("prometheus.WriteRequest", "prometheus.TimeSeries", "logproto.PushRequest")
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(name)) for name in names}


_CLASSES = _build()

WriteRequest: type[Message] = _CLASSES["prometheus.WriteRequest"]
"""Prometheus remote_write 1.0 ``prometheus.WriteRequest``."""

TimeSeries: type[Message] = _CLASSES["prometheus.TimeSeries"]
"""Prometheus ``prometheus.TimeSeries``."""

PushRequest: type[Message] = _CLASSES["logproto.PushRequest"]
"""Loki ``logproto.PushRequest``."""


# ------------------------------------------------------------------------ bounding upb's memory

Schema = dict[int, "Schema"]
"""The message-typed fields of a message, by field number, each with its own schema."""

WRITE_REQUEST_SCHEMA: Schema = {1: {1: {}, 2: {}, 3: {1: {}}}, 3: {}}
"""WriteRequest: timeseries (labels, samples, exemplars with their labels) and metadata."""
PUSH_REQUEST_SCHEMA: Schema = {1: {2: {1: {}, 3: {}}}}
"""PushRequest: streams, their entries, each entry's timestamp and structured metadata."""

_MESSAGE_TAG_BYTES = (b"\x0a", b"\x12", b"\x1a")  # the tags of fields 1-3 as length-delimited


def message_count_at_most(buf: bytes, schema: Schema, limit: int) -> bool:
    """Whether ``buf`` holds at most ``limit`` messages (the outer one not counted), by ``schema``.

    upb builds every message of a body before anything can look at it, at ~50 bytes each, and an
    empty message is 2 bytes on the wire: 64 MiB of ``0a 00`` is 32 million TimeSeries, 1.6 GB. This
    answers before upb is asked. Every message field of both protocols is a field numbered 1 to 3, so
    the count of their tag bytes bounds the count of messages: one C-speed pass decides for any body
    of ordinary size; only a body past the bound is walked, and the walk stops at ``limit`` + 1.
    A body too broken to walk is left for upb to refuse.
    """
    if sum(buf.count(tag) for tag in _MESSAGE_TAG_BYTES) <= limit:
        return True
    count = 0
    stack: list[tuple[int, int, Schema]] = [(0, len(buf), schema)]
    try:
        while stack:
            pos, end, fields = stack.pop()
            while pos < end:
                tag = buf[pos]
                pos += 1
                if tag >= 0x80:
                    tag, pos = _varint(buf, pos - 1)
                wire = tag & 7
                if wire == 2:
                    length = buf[pos]
                    pos += 1
                    if length >= 0x80:
                        length, pos = _varint(buf, pos - 1)
                    inner = fields.get(tag >> 3)
                    if inner is not None:
                        count += 1
                        if count > limit:
                            return False
                        if inner:
                            stack.append((pos, min(pos + length, end), inner))
                    pos += length
                elif wire == 0:
                    _, pos = _varint(buf, pos)
                elif wire == 1:
                    pos += 8
                elif wire == 5:
                    pos += 4
                else:
                    return True  # not protobuf: upb refuses it
    except IndexError:
        return True  # truncated: upb refuses it
    return True


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80 or shift > 63:
            return result, pos
        shift += 7
