"""Robust z-score detector for generic per-series service metrics (CPU, memory, latency, call latency).

The learned detectors score the fixed GPU and vLLM feature vectors of ``pipelines.features``; a
microservice's pod metrics (CPU percent, memory, syscalls, sidecar latencies) and its call-edge
latencies have no feature vector there. This detector judges every numeric sample of a
:class:`MetricBatch` against that series' own recent past, with the statistic the isolation forest
uses before a model exists (pipelines/detectors/iforest.py): a rolling median and a MAD-based scale,
floored at a share of the median so a flat series does not turn every wiggle into an outlier.

For a series of the entity, the score of a new value ``x`` is ``|x - median| / scale`` over the last
``history`` values. The scale is the largest of the MAD and the interquartile range (each as a standard
deviation; the IQR keeps a series that sits on one value half the time from getting a zero scale),
``relative_floor`` times the median and ``absolute_floor``. Both spreads ignore up to a quarter of the
history being an earlier incident, so one incident does not mask the next. Episodes
(pipelines/detectors/episodes.py) turn per-sample verdicts into one anomaly per abnormal stretch of a
series: by default a series is judged from its 11th sample, one sample over the line starts an
episode and two calm samples end it (per-minute data: faults minutes apart are separate episodes).

Each anomaly has signal ``metric_outlier`` and names its metric in ``evidence["metrics"]`` (the key the
diagnostician's evidence tools read), with the direction of the change, the baseline median and the
z-score. The fingerprint includes the metric, so two metrics of one pod are two alerts.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from pipelines.detectors.episodes import Episode, EpisodePolicy
from pipelines.detectors.scaling import MAD_TO_SIGMA
from services.core.events import Anomaly, EntityKind, MetricBatch, Sample
from services.core.fingerprint import fingerprint

FloatArray = npt.NDArray[np.float64]

# A series is judged once it has this many past values.
_MIN_PAST = 4
# Interquartile range of a normal distribution, in standard deviations.
_IQR_SIGMAS = 1.349


@dataclass
class SeriesHistory:
    """Recent values of one series and its episode counters."""

    values: list[float] = field(default_factory=list)
    episode: Episode = field(default_factory=Episode)


@dataclass
class ServiceMetricState:
    """Detector state: one history per ``entity|metric`` series (JSON-safe through to_dict/from_dict)."""

    series: dict[str, SeriesHistory] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        return {key: {"values": h.values, "episode": h.episode.to_dict()} for key, h in self.series.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServiceMetricState:
        """Inverse of :meth:`to_dict`."""
        return cls(
            {
                key: SeriesHistory([float(v) for v in h["values"]], Episode.from_dict(h["episode"]))
                for key, h in data.items()
            }
        )


class ServiceMetricDetector:
    """Per-series robust outliers in generic service metrics (signal ``metric_outlier``).

    Args:
        history: values kept per series; the median and scale are taken over them.
        z_limit: robust z-score a value needs to be over the line.
        relative_floor: the scale is at least this share of the median's magnitude.
        absolute_floor: and at least this much, in the metric's own unit.
        episodes: warm-up (in samples of the series), persistence and re-arming.

    An anomaly's ``entity_kind`` is ``pod`` when the sample has a ``pod`` label, else ``service``.
    """

    name: ClassVar[str] = "service_metrics"
    consumes: ClassVar[type] = MetricBatch
    signals: ClassVar[frozenset[str]] = frozenset({"metric_outlier"})

    def __init__(
        self,
        *,
        history: int = 60,
        z_limit: float = 6.0,
        relative_floor: float = 0.05,
        absolute_floor: float = 1e-3,
        episodes: EpisodePolicy | None = None,
    ) -> None:
        if history < _MIN_PAST:
            raise ValueError(f"history must be at least {_MIN_PAST} values")
        self.history = history
        self.z_limit = z_limit
        self.relative_floor = relative_floor
        self.absolute_floor = absolute_floor
        self.episodes = episodes or EpisodePolicy(warmup=10, persistence=1, rearm=2)

    def initial_state(self) -> ServiceMetricState:
        """No series seen yet."""
        return ServiceMetricState()

    def detect(
        self, batch: Sequence[MetricBatch], state: ServiceMetricState
    ) -> tuple[ServiceMetricState, list[Anomaly]]:
        """Judge every finite sample against its series' history, then add it to the history.

        The samples of one batch whose histories have the same length are scored in one vectorised
        call (a batch is one scrape of one entity, so that is usually all of them).
        """
        anomalies: list[Anomaly] = []
        for metrics in batch:
            by_length: dict[int, list[tuple[Sample, SeriesHistory]]] = defaultdict(list)
            for sample in metrics.samples:
                if math.isfinite(sample.value):
                    series = state.series.setdefault(f"{metrics.entity}|{sample.name}", SeriesHistory())
                    by_length[len(series.values)].append((sample, series))
            for length, group in by_length.items():
                values = np.array([sample.value for sample, _ in group], dtype=np.float64)
                if length >= _MIN_PAST:
                    past = np.array([series.values for _, series in group], dtype=np.float64)
                    zs, medians = self.robust_z_many(past, values)
                else:
                    zs, medians = np.zeros(len(group)), values
                for (sample, series), z, median in zip(group, zs.tolist(), medians.tolist(), strict=True):
                    if series.episode.update(z > self.z_limit, self.episodes):
                        anomalies.append(
                            self._anomaly(
                                metrics.entity, sample.name, sample.value, sample.ts, z, median, sample.labels
                            )
                        )
                    series.values = [*series.values, sample.value][-self.history :]
        return state, anomalies

    def robust_z(self, past: Sequence[float], value: float) -> tuple[float, float]:
        """Return ``(|value - median| / scale, median)`` against ``past`` (0 while past is too short)."""
        if len(past) < _MIN_PAST:
            return 0.0, value
        zs, medians = self.robust_z_many(np.asarray([past], dtype=np.float64), np.asarray([value], dtype=np.float64))
        return float(zs[0]), float(medians[0])

    def robust_z_many(self, past: FloatArray, values: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Row-wise :meth:`robust_z`: ``past`` is (series, history), ``values`` one new value per series."""
        q25, median, q75 = np.percentile(past, [25.0, 50.0, 75.0], axis=1)
        mad = np.median(np.abs(past - median[:, None]), axis=1) * MAD_TO_SIGMA
        scale = np.maximum.reduce(
            [
                mad,
                (q75 - q25) / _IQR_SIGMAS,
                np.abs(median) * self.relative_floor,
                np.full_like(mad, self.absolute_floor),
            ]
        )
        return np.abs(values - median) / scale, median

    def _anomaly(
        self, entity: str, metric: str, value: float, ts: float, z: float, median: float, labels: dict[str, str]
    ) -> Anomaly:
        kind: EntityKind = "pod" if labels.get("pod") else "service"
        return Anomaly(
            entity=entity,
            entity_kind=kind,
            signal="metric_outlier",
            detector=self.name,
            score=round(z, 3),
            threshold=self.z_limit,
            severity="warning",
            ts=ts,
            labels=dict(labels),
            evidence={
                "metrics": {metric: value},
                "metric": metric,
                "direction": "up" if value > median else "down",
                "baseline_median": median,
                "z": round(z, 3),
                "model": "robust_median_mad",
            },
            fingerprint=fingerprint(self.name, "metric_outlier", entity, metric),
        )
