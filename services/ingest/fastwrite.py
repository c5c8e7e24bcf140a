"""The remote_write hot path: a hand-written protobuf walk and JSON written directly.

Why not only the generated classes: at 100,000 samples/s a Python process has about 10 µs per
sample for everything (HTTP, decoding, JSON, the Kafka client). Reading labels through message
objects and validating one pydantic model per sample cost ~15 µs; even parsing the whole body with
upb (C) costs ~1.3 µs a sample. Here instead:

1. Prometheus sends the same series every scrape, and almost always one sample per series, so a
   TimeSeries is nearly always ``<label fields> 12 10 09 <8-byte double> 10 <6-byte varint ms>``
   (or ``<label fields> 12 07 10 <6-byte varint ms>`` when the value is 0, which proto3 leaves out).
   The label fields plus the three tag bytes that follow them are looked up in a bounded cache as one
   byte string, the 6 timestamp bytes in another: labels are decoded, validated and turned into a JSON
   fragment once per series, a timestamp once per scrape. Such a series costs two dict lookups, a
   ``struct`` unpack and one ``repr``.
2. Anything else (a series never seen, several samples, metadata, odd layouts) takes the general
   walk, but only after ``WriteRequest.FromString`` (upb, C) checked the whole body is a well-formed
   WriteRequest with valid UTF-8, so that walk can trust the framing. The caches are only filled by
   that walk, so a series served from them is byte-for-byte one upb accepted before: a body made only
   of such series is valid without parsing it again.
3. Event time is bounded (:mod:`services.ingest.timebounds`): the fast path checks a timestamp once
   per request (a request's samples share a handful of them), when it first meets its 6 bytes, and
   keeps the admitted ones in a per-request map, so a valid sample costs what it cost before; the
   general walk checks each sample.
4. each MetricBatch's JSON is assembled from those fragments (``repr`` of a finite float is valid
   JSON) and carried by :class:`EncodedMetricBatch`, whose ``to_bytes`` returns it.

The JSON is what :meth:`MetricBatch.to_bytes` would write for the same batch; a unit test checks the
two agree on every field.

Wire format reminders: a tag is ``field << 3 | wire type``; wire types 0 varint, 1 fixed64, 2
length-delimited, 5 fixed32. Sample is ``{1: double value, 2: int64 timestamp ms}``.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

from google.protobuf.message import DecodeError as ProtobufDecodeError
from pydantic import PrivateAttr

from services.core.events import MetricBatch
from services.ingest.errors import RejectedInput
from services.ingest.normalise import Limits, entity_of
from services.ingest.protowire import WRITE_REQUEST_SCHEMA, WriteRequest, message_count_at_most
from services.ingest.timebounds import TimeCheck

_DOUBLE = struct.Struct("<d")
_json_string = json.encoder.encode_basestring_ascii  # what json.dumps writes for a str, in C


class EncodedMetricBatch(MetricBatch):
    """A MetricBatch whose JSON was assembled by the receiver; ``samples`` is left empty in memory."""

    _json: bytes = PrivateAttr(default=b"")
    _count: int = PrivateAttr(default=0)

    @classmethod
    def of(cls, entity: str, source: str, samples_json: list[str]) -> EncodedMetricBatch:
        """Wrap the JSON of one batch's samples.

        What ``model_construct`` would build, set directly: ``model_construct`` costs ~15 µs, and a
        remote_write request makes one batch per entity (a unit test checks the two agree).
        """
        head = '{"schema_version":1,"entity":' + _json_string(entity) + ',"source":' + _json_string(source)
        batch = cls.__new__(cls)
        _set = object.__setattr__
        _set(batch, "__dict__", {"schema_version": 1, "entity": entity, "source": source, "samples": ()})
        _set(batch, "__pydantic_fields_set__", {"entity", "source", "samples"})
        _set(batch, "__pydantic_extra__", None)
        _set(
            batch,
            "__pydantic_private__",
            {"_json": (head + ',"samples":[' + ",".join(samples_json) + "]}").encode(), "_count": len(samples_json)},
        )
        return batch

    @property
    def sample_count(self) -> int:
        """How many samples the JSON holds."""
        count: int = self.__pydantic_private__["_count"]  # type: ignore[index]  # skips pydantic's __getattr__
        return count

    def to_bytes(self) -> bytes:
        """The JSON assembled by the receiver."""
        encoded: bytes = self.__pydantic_private__["_json"]  # type: ignore[index]
        return encoded or super().to_bytes()


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    byte = buf[pos]
    if byte < 0x80:
        return byte, pos + 1
    result, shift = byte & 0x7F, 7
    pos += 1
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _skip(buf: bytes, pos: int, wire: int) -> int:
    if wire == 0:
        return _varint(buf, pos)[1]
    if wire == 1:
        return pos + 8
    if wire == 2:
        length, pos = _varint(buf, pos)
        return pos + length
    if wire == 5:
        return pos + 4
    raise RejectedInput(f"unsupported protobuf wire type {wire}", reason="protobuf")


class _Series:
    __slots__ = ("entity", "prefix")

    def __init__(self, entity: str, prefix: str) -> None:
        self.entity = entity
        self.prefix = prefix


def _decode_labels(buf: bytes, spans: list[tuple[int, int]], index: int, max_label_bytes: int) -> _Series:
    labels: dict[str, str] = {}
    size = 0
    for start, end in spans:
        name = value = ""
        pos = start
        while pos < end:
            tag, pos = _varint(buf, pos)
            if tag & 7 == 2:
                length, pos = _varint(buf, pos)
                size += length
                text = buf[pos : pos + length].decode()
                pos += length
                if tag >> 3 == 1:
                    name = text
                elif tag >> 3 == 2:
                    value = text
            else:
                pos = _skip(buf, pos, tag & 7)
        if name in labels:
            raise RejectedInput(f"timeseries {index}: duplicate label name {name!r}", reason="labels")
        labels[name] = value
    if size > max_label_bytes:
        raise RejectedInput(
            f"timeseries {index}: labels of {size} bytes are over the {max_label_bytes}-byte limit"
            " (CLUSTERMEDIC_INGEST_MAX_LABEL_BYTES)",
            status=413,
            reason="labels_too_large",
        )
    metric = labels.pop("__name__", "")
    if not metric:
        raise RejectedInput(f"timeseries {index}: no __name__ label", reason="labels")
    if "" in labels:
        raise RejectedInput(f"timeseries {index}: empty label name", reason="labels")
    entity = entity_of(labels, metric)[0]
    prefix = '{"name":' + json.dumps(metric) + ',"labels":' + json.dumps(labels, separators=(",", ":")) + ',"value":'
    return _Series(entity, prefix)


def _label_spans(buf: bytes, start: int, end: int) -> list[tuple[int, int]] | None:
    """Spans of the Label fields in ``buf[start:end]``; None when another field is among them."""
    spans = []
    pos = start
    while pos < end:
        if buf[pos] != 0x0A:
            return None
        length, pos = _varint(buf, pos + 1)
        spans.append((pos, pos + length))
        pos += length
    return spans if pos == end else None


# what one cached series costs beyond its key and strings: the dict slot, the _Series, str headers
_ENTRY_OVERHEAD = 250


class SeriesCache:
    """Decoded label sets and timestamps keyed by their raw bytes, in bounded maps (cleared when full).

    Three maps, all filled only by the general walk of an upb-validated body:

    - ``one_sample``: label fields + ``12 10 09`` of a one-sample series -> the series;
    - ``zero_sample``: label fields + ``12 07 10`` of a one-sample series whose value is 0 (proto3
      leaves a zero double out: the Sample holds only its timestamp) -> the series;
    - ``series``: the label fields of any other series -> the series;

    and ``stamps``, the 6 bytes of a timestamp varint -> its JSON tail ``,"ts":<seconds>}``, filled
    by :meth:`stamp` (a scrape's samples share one timestamp).

    The maps are bounded by entries and by bytes (keys, entity and JSON prefix, plus a fixed overhead
    per entry): label sets may be large (up to ``max_label_bytes`` each), and 200,000 of them once
    left 529 MB resident.

    Args:
        capacity: most label-set entries kept, the three maps together (timestamps: a tenth of it).
        max_bytes: most bytes the label-set entries hold, the three maps together
            (``ingest_series_cache_bytes``).
        max_label_bytes: a series whose label names and values hold more bytes is refused
            (``ingest_max_label_bytes``): only series within it are ever cached.
    """

    def __init__(
        self,
        capacity: int = 200_000,
        *,
        max_bytes: int = 64 * 1024 * 1024,
        max_label_bytes: int = Limits.max_label_bytes,
    ) -> None:
        self._capacity = capacity
        self._max_bytes = max_bytes
        self.max_label_bytes = max_label_bytes
        self.bytes = 0
        """Bytes the label-set entries hold now (as counted for ``max_bytes``)."""
        self.one_sample: dict[bytes, _Series] = {}
        self.zero_sample: dict[bytes, _Series] = {}
        self.stamps: dict[bytes, str] = {}
        self._series: dict[bytes, _Series] = {}

    def get(self, buf: bytes, first: int, spans: list[tuple[int, int]], index: int) -> _Series:
        """The series for the label fields at ``spans`` (the first field's tag at ``first``)."""
        key = buf[first : spans[-1][1]]
        series = self._series.get(key)
        if series is None:
            series = _decode_labels(buf, spans, index, self.max_label_bytes)
            self._make_room()
            self._series[key] = series
            self.bytes += _cost(key, series)
        return series

    def learn_one_sample(self, buf: bytes, start: int, series_end: int, series: _Series) -> None:
        """Remember a validated series laid out as labels + one sample with a 6-byte timestamp."""
        if series_end - start > 18 and _one_sample_tail(buf, series_end):
            labels_end, known = series_end - 18, self.one_sample
        elif series_end - start > 9 and _zero_sample_tail(buf, series_end):
            labels_end, known = series_end - 9, self.zero_sample
        else:
            return
        if _label_spans(buf, start, labels_end) is None:
            return
        self._make_room()
        key = buf[start : labels_end + 3]
        known[key] = series
        self.bytes += _cost(key, series)

    @property
    def size(self) -> int:
        """Label-set entries held, the three maps together."""
        return len(self._series) + len(self.one_sample) + len(self.zero_sample)

    def _make_room(self) -> None:
        if self.size >= self._capacity or self.bytes >= self._max_bytes:
            self._series.clear()
            self.one_sample.clear()
            self.zero_sample.clear()
            self.bytes = 0

    def stamp(self, raw: bytes) -> str | None:
        """The JSON tail for a 6-byte timestamp varint; None when ``raw`` is not one."""
        ms = six_byte_ms(raw)
        if ms is None:
            return None
        tail = ',"ts":' + repr(ms / 1000.0) + "}"
        if len(self.stamps) >= max(1, self._capacity // 10):
            self.stamps.clear()
        self.stamps[raw] = tail
        return tail


def _cost(key: bytes, series: _Series) -> int:
    """Bytes one cache entry holds, as counted against ``max_bytes`` (entity and prefix share the series)."""
    return len(key) + len(series.prefix) + len(series.entity) + _ENTRY_OVERHEAD


def six_byte_ms(raw: bytes) -> int | None:
    """The milliseconds a 6-byte timestamp varint holds; None when ``raw`` is not one."""
    packed = int.from_bytes(raw, "little")
    if len(raw) != 6 or packed & 0x80_80_80_80_80_80 != 0x00_80_80_80_80_80:
        return None
    ms = 0
    for shift in range(6):
        ms |= (packed >> (8 * shift) & 0x7F) << (7 * shift)
    return ms


def _shown(series: _Series) -> dict[str, object]:
    """A refused sample's name and labels for its dead letter (read back from the cached JSON prefix)."""
    shown: dict[str, object] = json.loads(series.prefix + "0}")
    shown.pop("value", None)
    return shown


def _one_sample_tail(buf: bytes, end: int) -> bool:
    """Whether ``buf[:end]`` ends with one Sample field holding a value and a 6-byte timestamp.

    That is what Prometheus writes for one sample of today's millisecond timestamps (2^35..2^42):
    ``12 10 09 <8-byte double> 10 <6-byte varint>``, 18 bytes.
    """
    return (
        buf[end - 18] == 0x12
        and buf[end - 17] == 0x10
        and buf[end - 16] == 0x09
        and buf[end - 7] == 0x10
        and buf[end - 6] >= 0x80
        and buf[end - 5] >= 0x80
        and buf[end - 4] >= 0x80
        and buf[end - 3] >= 0x80
        and buf[end - 2] >= 0x80
        and buf[end - 1] < 0x80
    )


def _zero_sample_tail(buf: bytes, end: int) -> bool:
    """Whether ``buf[:end]`` ends with one Sample of value 0 (left out) and a 6-byte timestamp.

    ``12 07 10 <6-byte varint>``, 9 bytes.
    """
    return (
        buf[end - 9] == 0x12
        and buf[end - 8] == 0x07
        and buf[end - 7] == 0x10
        and buf[end - 6] >= 0x80
        and buf[end - 5] >= 0x80
        and buf[end - 4] >= 0x80
        and buf[end - 3] >= 0x80
        and buf[end - 2] >= 0x80
        and buf[end - 1] < 0x80
    )


def validate_write_request(buf: bytes) -> None:
    """Check ``buf`` is a well-formed ``prometheus.WriteRequest`` with valid UTF-8 (upb, in C).

    Raises:
        RejectedInput: it is not.
    """
    try:
        WriteRequest.FromString(buf)
    except ProtobufDecodeError as exc:
        raise RejectedInput(f"body is not a prometheus.WriteRequest: {exc}", reason="protobuf") from exc


def _validate_within(buf: bytes, limits: Limits) -> None:
    """:func:`validate_write_request`, once the body's message count is known to be within ``limits``.

    upb builds every message before it answers, at ~50 bytes each, and an empty one is 2 bytes on
    the wire: 64 MiB of empty series would take 1.6 GB.

    Raises:
        RejectedInput: not a WriteRequest, or (413) more messages than ``limits`` allow.
    """
    limits.check_messages(message_count_at_most(buf, WRITE_REQUEST_SCHEMA, limits.max_messages), "protobuf messages")
    validate_write_request(buf)


def walk_write_request(
    buf: bytes,
    cache: SeriesCache,
    *,
    max_samples: int,
    source: str = "remote_write",
    check: TimeCheck | None = None,
    limits: Limits | None = None,
) -> tuple[list[EncodedMetricBatch], int, int]:
    """Turn a decompressed WriteRequest into batches per entity (see the module docstring).

    Series found in the cache take the shortcut; at the first one that does not, the whole body is
    validated with upb (once) and that series takes the general walk, which teaches the cache.
    Samples stamped outside ``check``'s window are left out and counted there. An entity's samples
    are split into batches of at most ``max_samples`` samples and ``limits.max_message_bytes`` bytes.

    Returns:
        ``(batches, samples accepted, samples dropped as non-finite)``.

    Raises:
        RejectedInput: the body is not a valid WriteRequest, a series is invalid, or (413) it is
            over one of ``limits``.
    """
    limits = limits or Limits()
    try:
        return _walk(buf, cache, max_samples, source, check, limits)
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        _validate_within(buf, limits)  # says what is wrong in upb's words, if it can
        raise RejectedInput(f"body is not a prometheus.WriteRequest: {exc}", reason="protobuf") from exc


def _walk(
    buf: bytes, cache: SeriesCache, max_samples: int, source: str, check: TimeCheck | None, limits: Limits
) -> tuple[list[EncodedMetricBatch], int, int]:
    by_entity: dict[str, list[str]] = {}
    accepted = dropped = index = 0
    # samples beyond one per series, so that index + extra is every sample met so far
    extra = 0
    max_records = limits.max_records
    validated = False
    pos, end = 0, len(buf)
    unpack = _DOUBLE.unpack_from
    isfinite = math.isfinite
    one_sample = cache.one_sample.get
    zero_sample = cache.zero_sample.get
    stamps = cache.stamps.get
    # this request's timestamps that passed the bound check: checked once each, then a dict lookup
    admitted: dict[bytes, str] = {}
    admitted_stamp = admitted.get
    while pos < end:
        if buf[pos] == 0x0A:  # a TimeSeries; its length is a 1- or 2-byte varint below 16 KiB
            low = buf[pos + 1]
            if low < 0x80:
                start = pos + 2
                series_end = start + low
            elif buf[pos + 2] < 0x80:
                start = pos + 3
                series_end = start + (low & 0x7F | buf[pos + 2] << 7)
            else:  # 16 KiB or more (a 3+ byte length): never a cached layout, the general walk reads it
                start = series_end = 0
            # both one-sample layouts end with the timestamp: tag 0x10, then a 6-byte varint
            if 9 < series_end - start and series_end <= end and buf[series_end - 7] == 0x10:
                value = 0.0
                series = one_sample(buf[start : series_end - 15]) if series_end - start > 18 else None
                if series is not None:
                    value = unpack(buf, series_end - 15)[0]
                else:
                    series = zero_sample(buf[start : series_end - 6])
                if series is not None:
                    raw_ms = buf[series_end - 6 : series_end]
                    stamp = admitted_stamp(raw_ms)
                    if stamp is None and (stamp := stamps(raw_ms) or cache.stamp(raw_ms)) is not None:
                        ts = (six_byte_ms(raw_ms) or 0) / 1000.0
                        bound = check.bound_of(ts) if check is not None else None
                        if bound is None:
                            admitted[raw_ms] = stamp
                        else:  # refused: this sample only; its neighbours go on
                            pos = series_end
                            index += 1
                            if not isfinite(value):
                                dropped += 1
                            elif check is not None:
                                check.refuse(bound, ts, _shown(series))
                            continue
                    if stamp is not None:
                        pos = series_end
                        index += 1
                        if index > max_records:  # one sample a series: bounded memory, whatever the body
                            limits.check_records(index + extra, "samples")
                        if not isfinite(value):
                            dropped += 1
                            continue
                        bucket = by_entity.get(series.entity)
                        if bucket is None:
                            bucket = by_entity[series.entity] = []
                        bucket.append(series.prefix + repr(value) + stamp)
                        accepted += 1
                        continue
        # the general walk, on a body upb has checked
        if not validated:
            _validate_within(buf, limits)
            validated = True
        tag, pos = _varint(buf, pos)
        if tag != 0x0A:  # not a TimeSeries (metadata, unknown): skip
            pos = _skip(buf, pos, tag & 7)
            continue
        length, start = _varint(buf, pos)
        series_end = start + length
        series, samples = _walk_series(buf, start, series_end, cache, index)
        pos = series_end
        index += 1
        extra += len(samples) - 1
        limits.check_records(index + extra, "samples")
        if len(samples) == 1:
            cache.learn_one_sample(buf, start, series_end, series)
        bucket = by_entity.get(series.entity)
        if bucket is None:
            bucket = by_entity[series.entity] = []
        prefix = series.prefix
        for value, ms in samples:
            if not isfinite(value):
                dropped += 1
                continue
            ms &= 0xFFFF_FFFF_FFFF_FFFF  # a varint may carry more than 64 bits; an int64 keeps the low 64
            if ms >= 1 << 63:  # int64 on the wire is two's complement
                ms -= 1 << 64
            ts = ms / 1000.0
            if check is not None and (bound := check.bound_of(ts)) is not None:
                check.refuse(bound, ts, _shown(series))
                continue
            bucket.append(prefix + repr(value) + ',"ts":' + repr(ts) + "}")
            accepted += 1
    batches = [
        EncodedMetricBatch.of(entity, source, chunk)
        for entity, samples_json in by_entity.items()
        for chunk in _chunks(entity, samples_json, max_samples, limits.max_message_bytes)
    ]
    return batches, accepted, dropped


def _chunks(entity: str, samples_json: list[str], max_samples: int, max_bytes: int) -> list[list[str]]:
    """``samples_json`` cut into runs of at most ``max_samples`` whose batch JSON fits ``max_bytes``.

    A label set may be up to ``ingest_max_label_bytes``, so 1,000 samples can be far more than the
    broker's message size. The fragments are ASCII (``json.dumps`` escapes the rest), so a
    fragment's length is its size in bytes. One sample alone always makes a batch.
    """
    room = max_bytes - len(_json_string(entity)) - 128  # the head, the source and the brackets
    total = sum(map(len, samples_json)) + len(samples_json)
    if total <= room:  # the usual case: only the count splits
        return [samples_json[start : start + max_samples] for start in range(0, len(samples_json), max_samples)]
    chunks: list[list[str]] = []
    chunk: list[str] = []
    size = 0
    for fragment in samples_json:
        if chunk and (len(chunk) >= max_samples or size + len(fragment) + 1 > room):
            chunks.append(chunk)
            chunk, size = [], 0
        chunk.append(fragment)
        size += len(fragment) + 1
    if chunk:
        chunks.append(chunk)
    return chunks


def _walk_series(
    buf: bytes, pos: int, series_end: int, cache: SeriesCache, index: int
) -> tuple[_Series, list[tuple[float, int]]]:
    unpack = _DOUBLE.unpack_from
    spans: list[tuple[int, int]] = []
    samples: list[tuple[float, int]] = []
    first = pos
    while pos < series_end:
        field_start = pos
        tag, pos = _varint(buf, pos)
        if tag == 0x0A:  # Label
            if not spans:
                first = field_start
            length, pos = _varint(buf, pos)
            spans.append((pos, pos + length))
            pos += length
        elif tag == 0x12:  # Sample
            length, pos = _varint(buf, pos)
            sample_end = pos + length
            value, ms = 0.0, 0
            while pos < sample_end:
                stag, pos = _varint(buf, pos)
                if stag == 0x09:
                    value = unpack(buf, pos)[0]
                    pos += 8
                elif stag == 0x10:
                    ms, pos = _varint(buf, pos)
                else:
                    pos = _skip(buf, pos, stag & 7)
            samples.append((value, ms))
        else:
            pos = _skip(buf, pos, tag & 7)
    if not spans:
        raise RejectedInput(f"timeseries {index}: no labels (no __name__)", reason="labels")
    return cache.get(buf, first, spans, index), samples


def decoded(batch: EncodedMetricBatch) -> dict[str, Any]:
    """The batch's JSON as a dict (tests)."""
    result: dict[str, Any] = json.loads(batch.to_bytes())
    return result
