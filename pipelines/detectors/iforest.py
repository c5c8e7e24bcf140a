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
from services.core.fingerprint import fingerprint

FALLBACK_UNITS: dict[str, float] = {
    # the size of a change too small to matter, per feature (pipelines.features names)
    "gpu_util": 5.0,
    "mem_used_frac": 0.02,
    "temp_c": 2.0,
    "power_w": 20.0,
    "sm_clock_mhz": 50.0,
    "kv_cache_usage": 0.05,
    "requests_waiting": 2.0,
    "requests_running": 2.0,
    "ttft_p50_s": 0.1,
    "ttft_p99_s": 0.1,
    "tpot_p50_s": 0.005,
    "e2e_p99_s": 0.5,
    "prompt_tokens_per_s": 20.0,
    "generation_tokens_per_s": 20.0,
    "preemptions_per_s": 0.1,
    "error_rate": 0.01,
}
"""Fallback scale units: a feature's change of one unit is where it starts to count."""

FALLBACK_LOG_FEATURES = frozenset(
    {
        "kv_cache_usage",
        "requests_waiting",
        "requests_running",
        "ttft_p50_s",
        "ttft_p99_s",
        "tpot_p50_s",
        "e2e_p99_s",
        "prompt_tokens_per_s",
        "generation_tokens_per_s",
        "preemptions_per_s",
    }
)
"""Features the fallback compares on a log scale (they move by factors); the others move by amounts."""


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

    The fallback compares each feature with the entity's recent median: latencies, queues and rates
    (:data:`FALLBACK_LOG_FEATURES`) as ``log(1 + value / unit)``, bounded gauges as they are, where
    ``unit`` (:data:`FALLBACK_UNITS`) is the size of a change too small to matter for that feature
    (two requests, 0.1 s, 2 °C...) and the least spread a gauge is assumed to have.
    """

    name: ClassVar[str] = "iforest"
    consumes: ClassVar[type] = FeatureVector

    def __init__(
        self,
        models: Mapping[str, TrainedIForest] | None = None,
        *,
        episodes: EpisodePolicy | None = None,
        z_limit: float = 10.0,
        fallback_z: float = 8.0,
        fallback_history: int = 40,
        fallback_min_scale: float = 0.25,
    ) -> None:
        self.models = dict(models or {})
        self.episodes = episodes or EpisodePolicy()
        self.z_limit = z_limit
        self.fallback_z = fallback_z
        self.fallback_history = fallback_history
        self.fallback_min_scale = fallback_min_scale

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
            else:
                scores, thresholds, deviations = self._fallback(vectors, rows, names, state)
            for vector, row, score, threshold, deviation in zip(
                vectors, rows, scores, thresholds, deviations, strict=True
            ):
                history = state.entities.setdefault(vector.entity, EntityHistory())
                history.rows = [*history.rows, row.tolist()][-self.fallback_history :]
                if history.episode.update(bool(score > threshold), self.episodes):
                    anomalies.append(self._anomaly(vector, float(score), float(threshold), deviation, model))
        return state, anomalies

    @staticmethod
    def _units(names: tuple[str, ...]) -> np.ndarray:
        return np.array([FALLBACK_UNITS.get(name, 1.0) for name in names], dtype=np.float64)

    @staticmethod
    def _logged(names: tuple[str, ...]) -> np.ndarray:
        return np.array([name in FALLBACK_LOG_FEATURES for name in names], dtype=bool)

    def _fallback(
        self, vectors: Sequence[FeatureVector], rows: Matrix, names: tuple[str, ...], state: IForestState
    ) -> tuple[np.ndarray, np.ndarray, list[dict[str, float]]]:
        scores = np.zeros(len(vectors))
        deviations: list[dict[str, float]] = []
        for i, (vector, row) in enumerate(zip(vectors, rows, strict=True)):
            history = state.entities.get(vector.entity)
            past = np.array(history.rows, dtype=np.float64) if history and history.rows else np.empty((0, len(names)))
            if len(past) < self.fallback_history // 2:
                deviations.append({})
                continue
            # Latencies, queues and rates move by factors: compare them on a log scale, so a queue that
            # is usually empty does not make every request it ever holds a thousand-sigma event.
            # Bounded gauges (temperature, utilisation, power) move by amounts: linear scale.
            units, logged = self._units(names), self._logged(names)
            past_t = np.where(logged, np.log1p(np.maximum(past, 0.0) / units), past)
            row_t = np.where(logged, np.log1p(np.maximum(row, 0.0) / units), row)
            with warnings.catch_warnings():  # a feature never seen yet is an all-NaN column: z = 0
                warnings.simplefilter("ignore", RuntimeWarning)
                median = np.nanmedian(past_t, axis=0)
                mad = np.nan_to_num(np.nanmedian(np.abs(past_t - median), axis=0), nan=0.0) * MAD_TO_SIGMA
            scale = np.maximum(mad, np.where(logged, self.fallback_min_scale, units))
            z = np.nan_to_num(np.abs(row_t - median) / scale, nan=0.0)
            scores[i] = float(z.max())
            order = np.argsort(-z)[:3]
            deviations.append({names[j]: round(float(z[j]), 2) for j in order if z[j] > 0})
        return scores, np.full(len(vectors), self.fallback_z), deviations

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
