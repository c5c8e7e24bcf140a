"""Telemetry events built from values the simulator produced itself, without validating them again.

A 1,000-node scrape holds about 270,000 samples. Validating each one (``MetricBatch.model_validate``)
copies and checks every label dict and cost about 80% of a scrape, yet every value here already has
the right type by construction: names are literals, labels are cached ``str -> str`` dicts, values
and timestamps are Python floats taken from float64 arrays. So this module fills the models directly,
the way pydantic's ``model_construct`` does, minus its per-field Python loop (which is slower than
validating a small sample). Anything that comes from outside the simulator still goes through
validation (``services.ingest``, ``Event.from_bytes``).

The contract callers keep:

* ``value`` and ``ts`` are ``float`` (never ``int`` or a numpy scalar): pydantic would have converted
  them, and an ``int`` would serialise as ``5`` instead of ``5.0``;
* ``labels`` is a ``dict[str, str]`` that nobody mutates afterwards (the telemetry caches share one
  dict between every sample of a GPU or pod);
* ``name`` and a batch's ``entity`` are non-empty;
* a log record's ``stream`` is a fresh ``dict[str, str]`` and ``line`` a ``str``.

tests/unit/test_sim_core.py checks that every event of a run serialises to the same bytes and compares
equal to its validated twin, so a change to the event models that this module does not follow fails
there.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from pydantic import BaseModel

from services.core.events import LogRecord, MetricBatch, Sample

# The fields each fast constructor fills, in declaration order. A schema change must be mirrored
# here before the fast path may be used, so a mismatch stops the import.
_EXPECTED: dict[type[BaseModel], tuple[str, ...]] = {
    Sample: ("name", "labels", "value", "ts"),
    MetricBatch: ("schema_version", "entity", "source", "samples"),
    LogRecord: ("schema_version", "stream", "line", "ts", "entity"),
}
for _model, _fields in _EXPECTED.items():
    if tuple(_model.model_fields) != _fields:
        raise ImportError(
            f"services.simulator.trusted builds {_model.__name__}{_fields}, but the model now has "
            f"{tuple(_model.model_fields)}: update the constructors"
        )

# What validation records as explicitly set. Shared by every sample: the models are frozen, and
# pydantic copies the set before changing it (model_copy).
_SAMPLE_SET = set(_EXPECTED[Sample])
_BATCH_VERSION = MetricBatch.model_fields["schema_version"].default
_LOG_VERSION = LogRecord.model_fields["schema_version"].default
_new = object.__new__
# The setters of BaseModel's instance dict and slots, called directly: a scrape builds hundreds of
# samples per simulated GPU node, and ``object.__setattr__`` first looks each name up along the MRO.
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def sample(name: str, labels: dict[str, str], value: float, ts: float) -> Sample:
    """A :class:`Sample` equal to ``Sample.model_validate`` of the same values (see the module contract)."""
    s = _new(Sample)
    _set_dict(s, {"name": name, "labels": labels, "value": value, "ts": ts})
    _set_fields_set(s, _SAMPLE_SET)
    _set_extra(s, None)
    _set_private(s, None)
    return s


def entity_samples(names: Iterable[str], labels: dict[str, str], values: Iterable[float], ts: float) -> list[Sample]:
    """``[sample(n, labels, v, ts) for n, v in zip(names, values)]`` without a call per sample."""
    out = []
    for name, value in zip(names, values, strict=True):
        s = _new(Sample)
        _set_dict(s, {"name": name, "labels": labels, "value": value, "ts": ts})
        _set_fields_set(s, _SAMPLE_SET)
        _set_extra(s, None)
        _set_private(s, None)
        out.append(s)
    return out


def series_samples(name: str, labels: Iterable[dict[str, str]], values: Iterable[float], ts: float) -> list[Sample]:
    """``[sample(name, l, v, ts) for l, v in zip(labels, values)]`` without a call per sample."""
    out = []
    for series, value in zip(labels, values, strict=True):
        s = _new(Sample)
        _set_dict(s, {"name": name, "labels": series, "value": value, "ts": ts})
        _set_fields_set(s, _SAMPLE_SET)
        _set_extra(s, None)
        _set_private(s, None)
        out.append(s)
    return out


def metric_batch(entity: str, source: str, samples: tuple[Sample, ...]) -> MetricBatch:
    """A :class:`MetricBatch` equal to ``MetricBatch.model_validate({"entity", "source", "samples"})``."""
    b = _new(MetricBatch)
    _set_dict(b, {"schema_version": _BATCH_VERSION, "entity": entity, "source": source, "samples": samples})
    _set_fields_set(b, {"entity", "source", "samples"})
    _set_extra(b, None)
    _set_private(b, None)
    return b


def log_record(stream: dict[str, str], line: str, ts: float, entity: str) -> LogRecord:
    """A :class:`LogRecord` equal to ``LogRecord(stream=..., line=..., ts=..., entity=...)``."""
    r = _new(LogRecord)
    _set_dict(r, {"schema_version": _LOG_VERSION, "stream": stream, "line": line, "ts": ts, "entity": entity})
    _set_fields_set(r, {"stream", "line", "ts", "entity"})
    _set_extra(r, None)
    _set_private(r, None)
    return r


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a scrape allocates its samples.

    A scrape creates a few hundred thousand small objects that stay alive until the sinks have them.
    Every 700 allocations the collector would walk the young ones again and, as the heap grows, the
    whole heap: measured at 1,000 nodes, that was more than half of a scrape. None of these objects
    form reference cycles (reference counting frees them), so pausing the collector for the scrape
    frees nothing later than it would have. The previous state is restored, also on error.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
