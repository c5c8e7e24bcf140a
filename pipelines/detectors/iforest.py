"""Isolation forest on per-entity feature vectors (pyod ``IForest``), with a robust-statistics fallback.

One model per entity class (``gpu``, ``pod``) is trained on scrapes judged normal and stored in the
``detector_models`` table; workers warm-start from the latest version. The threshold is the
``1 - contamination`` quantile of the training scores. Until a model exists for a class the detector
falls back to a robust z-score against each entity's recent median (log scale for latencies, queues and
rates, linear for bounded gauges; see :class:`IsolationForestDetector`), so a fresh installation still
catches gross outliers.

Per-scrape verdicts become anomalies through an episode policy (pipelines.detectors.episodes): no
verdicts during an entity's warm-up, ``persistence`` consecutive scrapes over the line to start an
episode, and ``rearm`` calm scrapes to end it.
"""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from pipelines.detectors.episodes import Episode, EpisodePolicy
from pipelines.detectors.scaling import MAD_TO_SIGMA, Matrix, RobustScaler
from pipelines.features import FEATURES_BY_CLASS, FeatureVector
from services.core.events import Anomaly, EntityKind
from services.core.features import FEATURES
from services.core.fingerprint import fingerprint

# The fallback's per-feature tables, from the one declaration of each feature (services.core.features).
FALLBACK_UNITS: dict[str, float] = {f.name: f.unit for f in FEATURES}
"""Fallback scale units: a feature's change of one unit is where it starts to count."""

FALLBACK_LOG_FEATURES = frozenset(f.name for f in FEATURES if f.log_scale)
"""Features the fallback compares on a log scale (they move by factors); the others move by amounts."""

LOAD_FEATURES: dict[str, dict[str, int]] = {
    cls: {f.name: f.load for f in FEATURES if f.entity_class == cls and f.load} for cls in FEATURES_BY_CLASS
}
"""An entity's load, and the direction that counts (+1 up, -1 down): a pod's traffic rising
(admitted prompt tokens, running and waiting requests), a GPU's utilisation falling (an idle spell lowers
its clocks, power and temperature). A GPU getting busier is not excused: a throttled GPU is busier for
the same work, and its heat is what the learned detectors should see. A pod that is slow for another
reason also holds more requests; the rules that judge its latency discount load more carefully
(``latency_regression``)."""
LOAD_DRIVEN: dict[str, frozenset[str]] = {
    cls: frozenset(f.name for f in FEATURES if f.entity_class == cls and f.load_driven) for cls in FEATURES_BY_CLASS
}
"""What a load change moves on a healthy entity: a pod's queues, cache, batch sizes and with them its
latencies; a GPU's power, temperature and clocks. Memory use and the error rate are not among them."""


LOAD_MIN_HISTORY = 8
"""Scrapes of an entity's past (two minutes) before a load change can be told from its history."""


def recent_z(names: Sequence[str], past: Matrix, row: Matrix | Sequence[float], min_scale: float = 0.25) -> np.ndarray:
    """Signed robust z of ``row`` against an entity's ``past`` rows, feature by feature (0 where unknown).

    Latencies, queues and rates (:data:`FALLBACK_LOG_FEATURES`) move by factors and are compared as
    ``log(1 + value / unit)`` with a spread of at least ``min_scale``; bounded gauges move by amounts and
    are compared as they are, with a spread of at least one ``unit`` (:data:`FALLBACK_UNITS`). A raw
    median/MAD z made a queue that is usually empty, or a p99 stuck in one histogram bucket, a
    thousand-sigma event on every traffic burst.
    """
    past_t, least = _on_fallback_scale(names, past, min_scale)
    row_t, _ = _on_fallback_scale(names, row, min_scale)
    if not np.isnan(past_t).any():  # the usual case; nanmedian goes through masked arrays, ten times slower
        median = np.median(past_t, axis=0)
        mad = np.median(np.abs(past_t - median), axis=0) * MAD_TO_SIGMA
    else:
        with warnings.catch_warnings():  # a feature never seen yet is an all-NaN column: z = 0
            warnings.simplefilter("ignore", RuntimeWarning)
            median = np.nanmedian(past_t, axis=0)
            mad = np.nan_to_num(np.nanmedian(np.abs(past_t - median), axis=0), nan=0.0) * MAD_TO_SIGMA
    return np.asarray(np.nan_to_num((row_t - median) / np.maximum(mad, least), nan=0.0), dtype=np.float64)


def shift_z(names: Sequence[str], reference: Sequence[float], rows: Matrix, min_scale: float = 0.25) -> Matrix:
    """Signed z of each of ``rows`` against one ``reference`` row, on :func:`recent_z`'s scales and least
    spreads (one row has no spread of its own); vectorised, for a whole window at once."""
    ref_t, least = _on_fallback_scale(names, reference, min_scale)
    rows_t, _ = _on_fallback_scale(names, rows, min_scale)
    return np.asarray(np.nan_to_num((rows_t - ref_t) / least, nan=0.0), dtype=np.float64)


def _on_fallback_scale(
    names: Sequence[str], values: Matrix | Sequence[float], min_scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """``values`` (rows or one row) with :data:`FALLBACK_LOG_FEATURES` as ``log(1 + value / unit)``, and
    each feature's least spread: ``min_scale`` on the log scale, one ``unit`` on the linear one."""
    units = np.array([FALLBACK_UNITS.get(name, 1.0) for name in names], dtype=np.float64)
    logged = np.array([name in FALLBACK_LOG_FEATURES for name in names], dtype=bool)
    arr = np.asarray(values, dtype=np.float64)
    return np.where(logged, np.log1p(np.maximum(arr, 0.0) / units), arr), np.where(logged, min_scale, units)


def load_moved_in(entity_class: str, names: Sequence[str], z_rows: Matrix, rows: Matrix, load_z: float) -> bool:
    """Whether any of ``rows`` shows the load moved; ``z_rows`` are their signed z (:func:`shift_z` or
    :func:`recent_z`). The rule is :func:`load_explained`'s, which asks it about one row."""
    index = {name: j for j, name in enumerate(names)}
    if entity_class == "pod" and "requests_waiting" in index:
        waiting = np.asarray(rows, dtype=np.float64)[:, index["requests_waiting"]]
        if np.any(np.nan_to_num(waiting, nan=0.0) >= OVERLOAD_QUEUE):
            return True
    for name, direction in LOAD_FEATURES.get(entity_class, {}).items():
        if name in index:
            column = z_rows[:, index[name]]
            if np.any((direction * column if direction else np.abs(column)) >= load_z):
                return True
    return False


OVERLOAD_QUEUE = 10.0
"""A pod with this many requests waiting is over its capacity, whatever its history (the queue rule's
``queue_min_waiting``)."""


def load_explained(
    entity_class: str, names: Sequence[str], z: np.ndarray, load_z: float, row: Sequence[float] | None = None
) -> np.ndarray | None:
    """Features a load change explains, as a mask over ``names``; None when the load did not move.

    ``z`` is :func:`recent_z` of the row. The load moved when one of the class's :data:`LOAD_FEATURES`
    is ``load_z`` or more robust sigmas from the entity's recent median, in the direction that counts,
    or (given the raw ``row``) when a pod's queue holds :data:`OVERLOAD_QUEUE` requests or more.
    """
    rows = np.full((1, len(names)), np.nan) if row is None else np.asarray(row, dtype=np.float64)[None, :]
    if not load_moved_in(entity_class, names, np.asarray(z, dtype=np.float64)[None, :], rows, load_z):
        return None
    return np.array([n in LOAD_DRIVEN.get(entity_class, ()) for n in names], dtype=bool)


@dataclass(frozen=True)
class TrainedIForest:
    """A fitted model for one entity class with its scaler and calibrated threshold."""

    entity_class: str
    scaler: RobustScaler
    model: Any
    threshold: float
    spread: float
    n_train: int
    contamination: float

    def score(self, rows: Matrix) -> np.ndarray:
        """Forest outlier scores (higher is more anomalous) for raw feature rows, in one scorer call."""
        return np.asarray(self.model.decision_function(self.scaler.transform(rows)), dtype=np.float64)

    def normalised(self, rows: Matrix, z_limit: float) -> np.ndarray:
        """Scores where 1.0 is the alarm line: the forest's, or the largest robust z over ``z_limit``.

        An isolation forest picks split features at random, so a value far outside the training range
        on one feature among many is isolated only when that feature happens to be drawn; it can score
        below multivariate-but-mild training outliers. The z term catches those single-feature breaches.
        """
        forest = 1.0 + (self.score(rows) - self.threshold) / self.spread
        max_z = np.abs(self.scaler.transform(rows)).max(axis=1)
        return np.asarray(np.maximum(forest, max_z / z_limit), dtype=np.float64)

    def to_bytes(self) -> bytes:
        """Serialise for the detector_models table."""
        return pickle.dumps(self)

    @staticmethod
    def from_bytes(raw: bytes) -> TrainedIForest:
        """Inverse of :meth:`to_bytes` (only ever fed our own table's rows)."""
        model = pickle.loads(raw)  # only our own detector_models rows, written by train()
        if not isinstance(model, TrainedIForest):
            raise TypeError("detector_models row is not an isolation-forest model")
        return model


def train(entity_class: str, rows: Matrix, *, contamination: float = 0.005, seed: int = 0) -> TrainedIForest:
    """Fit the scaler, the forest and the threshold on rows judged normal."""
    from pyod.models.iforest import IForest

    scaler = RobustScaler.fit(rows)
    model = IForest(n_estimators=100, contamination=contamination, random_state=seed, n_jobs=1)
    model.fit(scaler.transform(rows))
    scores = np.asarray(model.decision_function(scaler.transform(rows)), dtype=np.float64)
    threshold = float(np.quantile(scores, 1.0 - contamination))
    spread = float(np.std(scores)) or 1.0
    return TrainedIForest(entity_class, scaler, model, threshold, spread, len(rows), contamination)


@dataclass
class EntityHistory:
    """Per-entity memory: recent rows for the fallback and the current run of exceedances."""

    rows: list[list[float]] = field(default_factory=list)
    episode: Episode = field(default_factory=Episode)


@dataclass
class IForestState:
    """Detector state: one history per entity (JSON-safe through to_dict/from_dict)."""

    entities: dict[str, EntityHistory] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (NaN written as None)."""
        return {
            e: {"rows": [[None if v != v else v for v in r] for r in h.rows], "episode": h.episode.to_dict()}
            for e, h in self.entities.items()
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> IForestState:
        """Inverse of :meth:`to_dict`."""
        return cls(
            {
                e: EntityHistory(
                    rows=[[float("nan") if v is None else float(v) for v in r] for r in h["rows"]],
                    episode=Episode.from_dict(h["episode"]),
                )
                for e, h in data.items()
            }
        )


class IsolationForestDetector:
    """Multivariate outliers per entity scrape (signal ``metric_outlier``).

    Args:
        models: trained models by entity class; missing classes use the robust fallback.
        episodes: warm-up, persistence and re-arming (see pipelines.detectors.episodes).
        z_limit: robust z (against the training data) that alone makes a scrape anomalous.
        fallback_z: robust z-score the fallback needs on some feature.
        fallback_history: rows the fallback keeps per entity (and needs half of before judging).
        fallback_min_scale: the smallest spread the fallback assumes on the log scale (default 0.25:
            a latency must move by a factor of e^2, about 7, to reach ``fallback_z`` = 8 on a series
            that never moved; a 15-second p99 sits in one histogram bucket for minutes, then jumps).
        load_z: when an entity's load (:data:`LOAD_FEATURES`: a pod's traffic up, a GPU's utilisation
            down) is this many robust sigmas from its recent median, the verdict (model or fallback)
            leaves out the features a load change moves (:data:`LOAD_DRIVEN`) and judges the rest (a
            pod's error rate, a GPU's memory): a traffic burst or an idle spell is not a fault, and when a
            burst saturates a pod the queue, cache and SLO rules say so with calibrated limits.

    The fallback compares each feature with the entity's recent median: latencies, queues and rates
    (:data:`FALLBACK_LOG_FEATURES`) as ``log(1 + value / unit)``, bounded gauges as they are, where
    ``unit`` (:data:`FALLBACK_UNITS`) is the size of a change too small to matter for that feature
    (two requests, 0.1 s, 2 °C...) and the least spread a gauge is assumed to have.
    """

    name: ClassVar[str] = "iforest"
    consumes: ClassVar[type] = FeatureVector
    signals: ClassVar[frozenset[str]] = frozenset({"metric_outlier"})

    def __init__(
        self,
        models: Mapping[str, TrainedIForest] | None = None,
        *,
        episodes: EpisodePolicy | None = None,
        z_limit: float = 10.0,
        fallback_z: float = 8.0,
        fallback_history: int = 40,
        fallback_min_scale: float = 0.25,
        load_z: float = 3.0,
    ) -> None:
        self.models = dict(models or {})
        self.episodes = episodes or EpisodePolicy()
        self.z_limit = z_limit
        self.fallback_z = fallback_z
        self.fallback_history = fallback_history
        self.fallback_min_scale = fallback_min_scale
        self.load_z = load_z

    def initial_state(self) -> IForestState:
        """No entity seen yet."""
        return IForestState()

    def detect(self, batch: Sequence[FeatureVector], state: IForestState) -> tuple[IForestState, list[Anomaly]]:
        """Score a micro-batch of vectors: one model call per entity class present."""
        anomalies: list[Anomaly] = []
        by_class: dict[str, list[FeatureVector]] = {}
        for vector in batch:
            by_class.setdefault(vector.entity_class, []).append(vector)
        for cls, vectors in by_class.items():
            names = FEATURES_BY_CLASS[cls]
            rows = np.array([v.as_row() for v in vectors], dtype=np.float64)
            model = self.models.get(cls)
            if model is not None:
                scores = model.normalised(rows, self.z_limit)
                thresholds = np.ones(len(vectors))
                deviations = [model.scaler.top_deviations(row, names) for row in rows]
                # only a row over the line needs its load judged (the history's medians cost more than the forest)
                for i in np.flatnonzero(scores > thresholds):
                    seen = self._recent(vectors[i], rows[i], names, state)
                    mask = None if seen is None else load_explained(cls, names, seen[1], self.load_z, rows[i])
                    if mask is not None:
                        # the forest weighs every feature at once: judge only what the load does not explain
                        trained_z = np.abs(model.scaler.transform(rows[i : i + 1]))[0]
                        scores[i] = float(np.where(mask, 0.0, trained_z).max()) / self.z_limit
            else:
                recent = [self._recent(v, row, names, state) for v, row in zip(vectors, rows, strict=True)]
                explained = [
                    None if z is None else load_explained(cls, names, z[1], self.load_z, row)
                    for z, row in zip(recent, rows, strict=True)
                ]
                scores, thresholds, deviations = self._fallback(names, recent, explained)
            for vector, row, score, threshold, deviation in zip(
                vectors, rows, scores, thresholds, deviations, strict=True
            ):
                history = state.entities.setdefault(vector.entity, EntityHistory())
                history.rows = [*history.rows, row.tolist()][-self.fallback_history :]
                if history.episode.update(bool(score > threshold), self.episodes):
                    anomalies.append(self._anomaly(vector, float(score), float(threshold), deviation, model))
        return state, anomalies

    def _recent(
        self, vector: FeatureVector, row: np.ndarray, names: Sequence[str], state: IForestState
    ) -> tuple[int, np.ndarray] | None:
        """How many recent rows the entity has, and the row's signed z against them (None before 8)."""
        history = state.entities.get(vector.entity)
        if history is None or len(history.rows) < LOAD_MIN_HISTORY:
            return None
        past = np.array(history.rows, dtype=np.float64)
        return len(past), recent_z(names, past, row, self.fallback_min_scale)

    def _fallback(
        self,
        names: tuple[str, ...],
        recent: Sequence[tuple[int, np.ndarray] | None],
        explained: Sequence[np.ndarray | None],
    ) -> tuple[np.ndarray, np.ndarray, list[dict[str, float]]]:
        scores = np.zeros(len(recent))
        deviations: list[dict[str, float]] = []
        for i, (seen, mask) in enumerate(zip(recent, explained, strict=True)):
            if seen is None or seen[0] < self.fallback_history // 2:  # too little past to judge
                deviations.append({})
                continue
            signed = seen[1]
            z = np.abs(signed) if mask is None else np.where(mask, 0.0, np.abs(signed))
            scores[i] = float(z.max())
            order = np.argsort(-z)[:3]
            deviations.append({names[j]: round(float(z[j]), 2) for j in order if z[j] > 0})
        return scores, np.full(len(recent), self.fallback_z), deviations

    def _anomaly(
        self,
        vector: FeatureVector,
        score: float,
        threshold: float,
        deviation: dict[str, float],
        model: TrainedIForest | None,
    ) -> Anomaly:
        kind: EntityKind = "gpu" if vector.entity_class == "gpu" else "pod"
        labels = topology_labels(vector.labels)
        return Anomaly(
            entity=vector.entity,
            entity_kind=kind,
            signal="metric_outlier",
            detector=self.name,
            score=score,
            threshold=threshold,
            severity="warning",
            ts=vector.ts,
            labels=labels,
            evidence={
                "features": {k: round(v, 4) for k, v in vector.values.items()},
                "top_deviations": deviation,
                "model": "robust_fallback" if model is None else f"iforest n_train={model.n_train}",
            },
            fingerprint=fingerprint(self.name, "metric_outlier", vector.entity),
        )


def topology_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """Routing/topology labels from DCGM or vLLM labels: node, gpu, pod, namespace, model."""
    out: dict[str, str] = {}
    node = labels.get("Hostname") or labels.get("hostname") or labels.get("node")
    if node:
        out["node"] = node
    if labels.get("UUID"):
        out["gpu"] = labels["UUID"]
    for key in ("pod", "namespace"):
        if labels.get(key):
            out[key] = labels[key]
    model = labels.get("model_name") or labels.get("modelName_deployment") or labels.get("model")
    if model:
        out["model"] = model
    return out
