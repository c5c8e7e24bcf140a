"""Streaming anomaly score for one metric series: value records and shape novelty, one setting for all.

For every new sample the detector asks two questions, each answered in units that mean the same on
any series, so that one weight and one threshold serve CPU percent, bytes per second and tweet counts
alike (no parameter depends on what the series is):

1. **Record** (``record``): does the value leave the range of the last ``record_span`` rows, and by
   what share of that range? ``max(x - max(past), min(past) - x, 0) / (max(past) - min(past))``.
   Spikes, drops and level shifts break the range at their first row; a series that keeps inside its
   own history never does. Dividing by the range makes the figure scale-free.
2. **Novelty** (``novelty``): is the shape of the last ``embed`` samples unlike anything in the last
   ``history`` rows, and more unlike than anything else recently was? The Euclidean distance of the
   subsequence ending now to its nearest earlier subsequence (skipping the ``exclusion`` overlapping
   ones; a matrix-profile "discord", computed exactly) is divided by the largest such distance of the
   previous ``reference`` rows: ``novelty = max(d / max(recent d) - 1, 0)``. This catches changes of
   rhythm or variance that stay inside the value range, and quietens itself after an event, since a
   shape once seen is no longer novel. Distances of the first ``discord_warmup`` rows are inflated by
   the short history they are searched in, so they are left out of the reference (and score 0).

``combined = max(record, novelty_weight * novelty)``; a row *alerts* when ``combined >= threshold``
and no alert was raised in the previous ``suppress`` rows (one event, one alert: NAB rewards only
the first detection in a window and charges every later one outside it, and an SRE wants one page).
The score is ``combined / (combined + threshold)``, in ``[0, 1]``: an alert scores at least 0.5, and a
row whose combined value crosses the threshold inside a suppression span scores 0 (already reported).
The first ``warmup`` rows only learn (NAB calls this the probationary period).

``novelty_weight`` and ``threshold`` are the only fitted values: ``bench/nab.py`` chooses them on the
NAB corpus by a documented grid search and reports the leave-one-category-out figures (docs/nab.md).
Everything else is a constant with a reason given where it is defined.

It is honest streaming: the score at row ``t`` depends only on rows ``<= t``, and everything the
next call needs is in :class:`UnivariateState`, so scoring a series in one call or in micro-batches of
any size gives identical scores. Work is vectorised per micro-batch, never per point, except the
suppression pass over the (few) rows above the threshold.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

# Queries per distance matrix: bounds memory at chunk * (history + chunk) * embed floats.
_QUERY_CHUNK = 128


@dataclass(frozen=True)
class UnivariateConfig:
    """The one setting of the detector. Row counts suit 1-5 minute samples (NAB: 5 minutes).

    Attributes:
        embed: subsequence length in samples (16 = 80 minutes at 5-minute sampling).
        history: how many past subsequences are searched for the nearest neighbour.
        reference: rows over which the largest recent distance is remembered; a shape is reported
            again only once this span has passed without anything as novel.
        exclusion: subsequences ending this close to the query are skipped, since they overlap it
            and match trivially; ``None`` means ``embed``.
        record_span: rows whose range a value must leave to be a record (5000 = 17 days at 5 minutes):
            long enough that an ordinary busy day is inside it.
        warmup: rows that only learn and always score 0 (150: shorter than NAB's probationary
            period on any of its files, which is 15% of the file).
        discord_warmup: rows whose neighbour distances are kept out of the novelty reference
            (300, about a day at 5 minutes: until a daily pattern has been seen once, its every
            shape is "new").
        novelty_weight: how much a unit of novelty counts against a unit of record (fitted).
        threshold: combined value at which a row alerts (fitted).
        suppress: rows after an alert during which no new alert is raised (25 = two hours).
    """

    embed: int = 16
    history: int = 4000
    reference: int = 1000
    exclusion: int | None = None
    record_span: int = 5000
    warmup: int = 150
    discord_warmup: int = 300
    novelty_weight: float = 0.16
    threshold: float = 0.017
    suppress: int = 25

    def __post_init__(self) -> None:
        if min(self.embed, self.history, self.reference, self.record_span) < 1:
            raise ValueError("embed, history, reference and record_span must be positive")
        if self.exclusion is not None and self.exclusion < 1:
            raise ValueError("exclusion must be positive")
        if min(self.warmup, self.discord_warmup, self.suppress) < 0:
            raise ValueError("warmup, discord_warmup and suppress must not be negative")
        if not (self.threshold > 0 and self.novelty_weight >= 0):
            raise ValueError("threshold must be positive and novelty_weight not negative")

    @property
    def skip(self) -> int:
        """Effective exclusion zone."""
        return self.embed if self.exclusion is None else self.exclusion

    @property
    def keep(self) -> int:
        """Values remembered between calls: what the neighbour search and the record range need."""
        return max(self.history + self.embed - 1, self.record_span)


def _empty() -> FloatArray:
    return np.zeros(0, dtype=np.float64)


@dataclass(frozen=True)
class UnivariateState:
    """Everything the detector remembers about one series between micro-batches.

    Treat as immutable: :func:`detect` returns a new state and never changes the one it was given.

    Attributes:
        config: detector setting, fixed for the life of the series.
        seen: rows consumed so far.
        first: the first value ever seen; windows reaching before the series start are padded with
            it (so the first rows do not look like a jump from zero).
        last: the last finite value, used in place of missing (NaN) samples.
        values: the most recent ``config.keep`` values.
        distances: the most recent ``reference`` nearest-neighbour distances (0 for rows before
            ``discord_warmup``, which never count as a reference).
        last_alert: row index of the latest alert, ``None`` before the first.
        last_timestamp: timestamp of the last row, kept for callers that check ordering.
    """

    config: UnivariateConfig = field(default_factory=UnivariateConfig)
    seen: int = 0
    first: float = 0.0
    last: float = 0.0
    values: FloatArray = field(default_factory=_empty)
    distances: FloatArray = field(default_factory=_empty)
    last_alert: int | None = None
    last_timestamp: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form, for a state table."""
        cfg = self.config
        return {
            "config": {name: getattr(cfg, name) for name in cfg.__dataclass_fields__},
            "seen": self.seen,
            "first": self.first,
            "last": self.last,
            "values": self.values.tolist(),
            "distances": self.distances.tolist(),
            "last_alert": self.last_alert,
            "last_timestamp": self.last_timestamp,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UnivariateState:
        """Inverse of :meth:`to_dict`."""
        last_alert = data.get("last_alert")
        return cls(
            config=UnivariateConfig(**data["config"]),
            seen=int(data["seen"]),
            first=float(data["first"]),
            last=float(data["last"]),
            values=np.asarray(data["values"], dtype=np.float64),
            distances=np.asarray(data["distances"], dtype=np.float64),
            last_alert=None if last_alert is None else int(last_alert),
            last_timestamp=data.get("last_timestamp"),
        )


@dataclass(frozen=True)
class UnivariateScores:
    """What :func:`detect` says about each row of a micro-batch.

    Attributes:
        scores: ``combined / (combined + threshold)`` in ``[0, 1]``; at least 0.5 exactly on alerts,
            0 where the threshold was crossed inside a suppression span.
        alerts: rows that raise an alert.
        record: the record component (share of the recent range the value lies outside it).
        novelty: the novelty component (how far the shape's distance exceeds the recent largest).
    """

    scores: FloatArray
    alerts: BoolArray
    record: FloatArray
    novelty: FloatArray


def combine(record: FloatArray, novelty: FloatArray, novelty_weight: float) -> FloatArray:
    """The combined value a threshold is applied to: ``max(record, novelty_weight * novelty)``.

    A maximum rather than a sum: either kind of evidence alone is an anomaly, and neither dilutes
    the other.
    """
    return np.maximum(record, novelty_weight * novelty)


def suppress(
    combined: FloatArray, threshold: float, span: int, first_row: int = 0, last_alert: int | None = None
) -> tuple[BoolArray, int | None]:
    """Rows that alert: ``combined >= threshold`` and no alert in the ``span`` rows before.

    Args:
        combined: combined values of consecutive rows, the first being row ``first_row``.
        threshold: the alert threshold.
        span: rows after an alert in which no new alert is raised.
        first_row: global index of ``combined[0]``.
        last_alert: global index of the latest alert before these rows, if any.

    Returns:
        ``(alerts, last_alert)``: the alert mask and the index of the latest alert so far.
    """
    alerts = np.zeros(len(combined), dtype=bool)
    for j in np.flatnonzero(combined >= threshold).tolist():
        row = first_row + j
        if last_alert is None or row - last_alert > span:
            alerts[j] = True
            last_alert = row
    return alerts, last_alert


def score(
    values: npt.ArrayLike,
    timestamps: npt.ArrayLike,
    state: UnivariateState | None = None,
) -> tuple[UnivariateState, FloatArray]:
    """Score a micro-batch of consecutive samples of one series: :func:`detect`'s scores alone."""
    new_state, result = detect(values, timestamps, state)
    return new_state, result.scores


def detect(
    values: npt.ArrayLike,
    timestamps: npt.ArrayLike,
    state: UnivariateState | None = None,
) -> tuple[UnivariateState, UnivariateScores]:
    """Score a micro-batch of consecutive samples of one series and say which rows alert.

    Args:
        values: the new samples, oldest first. NaN or infinite samples are replaced by the last
            finite value (a gap should not look like a spike) and score 0.
        timestamps: UNIX seconds of the samples, same length. Rows are assumed evenly spaced and in
            order; the detector reasons in rows, and the timestamps are only remembered.
        state: what the previous call returned; ``None`` starts a new series with the default setting.

    Returns:
        ``(new_state, result)``.

    Raises:
        ValueError: ``values`` and ``timestamps`` differ in length or are not one-dimensional.
    """
    st = state if state is not None else UnivariateState()
    cfg = st.config
    raw = np.asarray(values, dtype=np.float64)
    ts = np.asarray(timestamps, dtype=np.float64)
    if raw.ndim != 1 or ts.shape != raw.shape:
        raise ValueError(f"values {raw.shape} and timestamps {ts.shape} must be equal-length 1-D arrays")
    n = len(raw)
    if n == 0:
        return st, UnivariateScores(_empty(), np.zeros(0, dtype=bool), _empty(), _empty())

    finite = np.isfinite(raw)
    batch, last = _fill_gaps(raw, finite, st.last if st.seen else None)
    first = st.first if st.seen else float(batch[0])
    rows = np.arange(st.seen, st.seen + n)

    # Global row index of ctx[0]; while ctx still holds the series start, windows reaching before
    # it are padded with the first value, which is in every such window anyway.
    start = st.seen - len(st.values)
    ctx = np.concatenate([st.values, batch])

    record = _record(ctx, start, len(st.values), first, cfg.record_span)
    record[(rows < cfg.warmup) | ~finite] = 0.0

    dist = _distances(ctx, start, st.seen, first, cfg)
    # Rows before discord_warmup never serve as a reference: store their distances as 0, which
    # leaves every maximum unchanged (distances are >= 0) and makes "no reference yet" 0.
    eligible = np.where(rows >= cfg.discord_warmup, dist, 0.0)
    past = np.concatenate([st.distances, eligible])
    lead = np.concatenate([np.zeros(cfg.reference), past])
    spans = np.lib.stride_tricks.sliding_window_view(lead, cfg.reference)
    ref = spans[len(st.distances) : len(st.distances) + n].max(axis=1)
    ratio = np.divide(dist, ref, out=np.ones(n), where=ref > 0)
    novelty = np.maximum(ratio - 1.0, 0.0)
    novelty[(rows < max(cfg.warmup, cfg.discord_warmup)) | ~finite] = 0.0

    combined = combine(record, novelty, cfg.novelty_weight)
    alerts, last_alert = suppress(combined, cfg.threshold, cfg.suppress, st.seen, st.last_alert)
    with np.errstate(invalid="ignore"):  # inf / inf: a flat series that first moves scores 1
        scores = np.where(np.isinf(combined), 1.0, combined / (combined + cfg.threshold))
    scores[(combined >= cfg.threshold) & ~alerts] = 0.0

    new_state = replace(
        st,
        seen=st.seen + n,
        first=first,
        last=last,
        values=ctx[-cfg.keep :].copy(),
        distances=past[-cfg.reference :].copy(),
        last_alert=last_alert,
        last_timestamp=float(ts[-1]),
    )
    return new_state, UnivariateScores(scores, alerts, record, novelty)


def _fill_gaps(raw: FloatArray, finite: BoolArray, last: float | None) -> tuple[FloatArray, float]:
    """Carry the last finite value forward over NaN/inf samples; return the values and the last one."""
    if finite.all():
        return raw, float(raw[-1])
    out = raw.copy()
    # A series that starts with a gap has nothing to carry: use its first finite value, else 0.
    prev = last if last is not None else (float(raw[finite][0]) if finite.any() else 0.0)
    for i in range(len(raw)):
        if finite[i]:
            prev = float(raw[i])
        else:
            out[i] = prev
    return out, prev


def _record(ctx: FloatArray, start: int, offset: int, first: float, span: int) -> FloatArray:
    """Record component of the rows ``ctx[offset:]``, against the ``span`` values before each.

    ``inf`` when the past is flat and the value leaves it (a flat series that first moves).
    """
    pad = span if start == 0 else 0
    padded = np.concatenate([np.full(pad, first), ctx]) if pad else ctx
    # windows[i] = padded[i : i + span]: the past of ctx[k] is windows[pad + k - span].
    lo = pad + offset - span
    windows = np.lib.stride_tricks.sliding_window_view(padded, span)[lo : lo + len(ctx) - offset]
    hi_v = windows.max(axis=1)
    lo_v = windows.min(axis=1)
    x = ctx[offset:]
    excess = np.maximum(np.maximum(x - hi_v, lo_v - x), 0.0)
    width = hi_v - lo_v
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(width > 0, excess / np.where(width > 0, width, 1.0), np.where(excess > 0, np.inf, 0.0))
    return np.asarray(out, dtype=np.float64)


def _distances(ctx: FloatArray, start: int, seen: int, first: float, cfg: UnivariateConfig) -> FloatArray:
    """Nearest-neighbour distance of the subsequences ending at the rows ``seen..`` of ``ctx``."""
    pad = cfg.embed - 1 if start == 0 else 0
    padded = np.concatenate([np.full(pad, first), ctx])
    # windows[k] is the subsequence ending at global row first_end + k.
    windows = np.lib.stride_tricks.sliding_window_view(padded, cfg.embed)
    first_end = start + cfg.embed - 1 - pad
    n = start + len(ctx) - seen
    dist = np.empty(n, dtype=np.float64)
    for lo in range(0, n, _QUERY_CHUNK):
        hi = min(n, lo + _QUERY_CHUNK)
        dist[lo:hi] = _nearest(windows, first_end, seen + lo, seen + hi, cfg)
    return dist


def _nearest(
    windows: npt.NDArray[np.float64], first_end: int, q_lo: int, q_hi: int, cfg: UnivariateConfig
) -> FloatArray:
    """Nearest-neighbour distance of the subsequences ending at rows ``q_lo..q_hi-1``.

    Candidates for the query ending at row ``g`` are the subsequences ending in
    ``[g - history, g - skip]``; rows with none get distance 0 (nothing to compare with yet).
    """
    c_lo = max(first_end, q_lo - cfg.history)
    c_hi = q_hi - cfg.skip  # exclusive
    out = np.zeros(q_hi - q_lo, dtype=np.float64)
    if c_hi <= c_lo:
        return out
    queries = windows[q_lo - first_end : q_hi - first_end]
    cands = windows[c_lo - first_end : c_hi - first_end]
    # Direct differences rather than |q|^2 + |c|^2 - 2qc: no cancellation on large-valued series
    # (bytes/s near 1e8), and each pair is computed the same way whatever the batch split.
    d2 = np.square(queries[:, None, :] - cands[None, :, :]).sum(axis=2)
    g = np.arange(q_lo, q_hi)[:, None]
    c = np.arange(c_lo, c_hi)[None, :]
    d2[(c > g - cfg.skip) | (c < g - cfg.history)] = np.inf
    best = d2.min(axis=1)
    np.sqrt(best, out=best)
    out[np.isfinite(best)] = best[np.isfinite(best)]
    return out
