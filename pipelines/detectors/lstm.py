"""LSTM forecaster per entity class (pyod ``LSTMAD`` on torch CPU): temporal patterns a point-wise model
misses, such as a slow VRAM leak or an oscillating batch size.

``LSTMAD`` predicts each scrape from the previous ``window`` scrapes and scores the Mahalanobis
distance of the prediction error. Many entities are scored in one network call (each call costs about
the same whatever its size): each entity's last ``window + 1`` scrapes form one segment, and only its
last row is forecast and scored.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from pipelines.detectors.episodes import Episode, EpisodePolicy
from pipelines.detectors.iforest import load_moved_in, shift_z, topology_labels
from pipelines.detectors.scaling import Matrix, RobustScaler
from pipelines.features import FEATURES_BY_CLASS, FeatureVector
from services.core.events import Anomaly, EntityKind
from services.core.fingerprint import fingerprint


@dataclass(frozen=True)
class TrainedLSTM:
    """A fitted LSTMAD for one entity class with its scaler and calibrated threshold."""

    entity_class: str
    window: int
    scaler: RobustScaler
    model: Any
    threshold: float
    n_train: int

    def score_segments(self, segments: Sequence[Matrix]) -> np.ndarray:
        """Score the last row of each ``window + 1``-row segment in one network call.

        The same score ``LSTMAD.decision_function`` gives that row (the Mahalanobis distance of the
        forecast error under the training errors' Gaussian), computed for the segments' last rows
        only: ``decision_function`` over the segments laid end to end would run the network on every
        window of the series, ``window + 1`` times the work for one useful score per segment.
        """
        import torch

        scaled = np.stack([self.scaler.transform(seg) for seg in segments])  # (n, window + 1, channels)
        net = self.model.model_
        net.eval()
        with torch.no_grad():
            forecast = net(torch.tensor(scaled[:, : self.window], dtype=torch.float32)).cpu().numpy()
        diff = scaled[:, self.window] - forecast - self.model.error_mu_
        return np.asarray(np.sum(diff @ self.model.error_cov_inv_ * diff, axis=1), dtype=np.float64)

    def to_bytes(self) -> bytes:
        """Serialise for the detector_models table.

        pyod builds its torch network as a class local to a function, which pickle cannot name, so the
        network travels as a torch ``state_dict`` and the fitted attributes as plain arrays.
        """
        net = self.model.model_._net
        fitted = {k: v for k, v in vars(self.model).items() if k != "model_"}
        payload = {
            "entity_class": self.entity_class,
            "window": self.window,
            "scaler": self.scaler,
            "threshold": self.threshold,
            "n_train": self.n_train,
            "lstm_attrs": fitted,
            "state_dict": {k: v.numpy() for k, v in net.state_dict().items()},
        }
        return pickle.dumps(payload)

    @staticmethod
    def from_bytes(raw: bytes) -> TrainedLSTM:
        """Inverse of :meth:`to_bytes` (only ever fed our own table's rows)."""
        import torch
        from pyod.models.ts_lstm import LSTMAD, _LSTMModel

        payload = pickle.loads(raw)  # only our own detector_models rows, written by train()
        if not isinstance(payload, dict) or "state_dict" not in payload:
            raise TypeError("detector_models row is not an LSTM model")
        attrs = payload["lstm_attrs"]
        model = LSTMAD(window_size=attrs["window_size"], hidden_size=attrs["hidden_size"], n_layers=attrs["n_layers"])
        vars(model).update(attrs)
        net = _LSTMModel(attrs["n_channels_"], attrs["hidden_size"], attrs["n_layers"])
        net._net.load_state_dict({k: torch.from_numpy(v) for k, v in payload["state_dict"].items()})
        net.eval()
        model.model_ = net
        return TrainedLSTM(
            payload["entity_class"],
            payload["window"],
            payload["scaler"],
            model,
            payload["threshold"],
            payload["n_train"],
        )


def train(
    entity_class: str,
    series: Sequence[Matrix],
    *,
    window: int = 12,
    epochs: int = 8,
    contamination: float = 0.005,
    seed: int = 0,
) -> TrainedLSTM:
    """Fit on per-entity series judged normal (each at least ``window + 10`` rows)."""
    import torch
    from pyod.models.ts_lstm import LSTMAD

    torch.manual_seed(seed)
    usable = [s for s in series if len(s) >= window + 10]
    if not usable:
        raise ValueError(f"LSTM training needs series of at least {window + 10} rows")
    scaler = RobustScaler.fit(np.concatenate(usable))
    model = LSTMAD(window_size=window, hidden_size=32, n_layers=1, epochs=epochs, contamination=contamination)
    model.fit(np.concatenate([scaler.transform(s) for s in usable]))
    # calibrate on each series' own valid positions (skip the lookback rows and the seams between series)
    scores = np.concatenate([np.asarray(model.decision_function(scaler.transform(s)))[window:] for s in usable])
    threshold = float(np.quantile(scores, 1.0 - contamination))
    return TrainedLSTM(entity_class, window, scaler, model, threshold, int(sum(len(s) for s in usable)))


@dataclass
class LstmState:
    """Recent rows per entity and whether its anomaly is already raised."""

    windows: dict[str, list[list[float]]] = field(default_factory=dict)
    episodes: dict[str, Episode] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (NaN written as None)."""
        return {
            "windows": {e: [[None if v != v else v for v in r] for r in w] for e, w in self.windows.items()},
            "episodes": {e: ep.to_dict() for e, ep in self.episodes.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LstmState:
        """Inverse of :meth:`to_dict`."""
        return cls(
            windows={
                e: [[float("nan") if v is None else float(v) for v in r] for r in w]
                for e, w in data.get("windows", {}).items()
            },
            episodes={e: Episode.from_dict(v) for e, v in data.get("episodes", {}).items()},
        )


class LstmDetector:
    """Sequence anomalies per entity (signal ``sequence_anomaly``); silent for classes without a model.

    Args:
        models: trained models by entity class.
        episodes: warm-up, persistence and re-arming (see pipelines.detectors.episodes); the warm-up
            counts full windows, so it starts after ``window`` scrapes.
        load_z: a window in which the entity's load moved this many robust sigmas from its first row
            (measured with the least spreads of :func:`pipelines.detectors.iforest.recent_z`), or a pod was
            overloaded (see :func:`pipelines.detectors.iforest.load_explained`), gets no verdict: the
            sequence a traffic burst or an idle spell draws is not a fault.
    """

    name: ClassVar[str] = "lstm"
    consumes: ClassVar[type] = FeatureVector
    signals: ClassVar[frozenset[str]] = frozenset({"sequence_anomaly"})

    def __init__(
        self,
        models: Mapping[str, TrainedLSTM] | None = None,
        *,
        episodes: EpisodePolicy | None = None,
        load_z: float = 3.0,
    ) -> None:
        self.models = dict(models or {})
        self.episodes = episodes or EpisodePolicy(warmup=4)
        self.load_z = load_z

    def initial_state(self) -> LstmState:
        """No entity seen yet."""
        return LstmState()

    def detect(self, batch: Sequence[FeatureVector], state: LstmState) -> tuple[LstmState, list[Anomaly]]:
        """Append each vector to its entity's window and score full windows, one call per class."""
        ready: dict[str, list[tuple[FeatureVector, Matrix]]] = {}
        for vector in batch:
            model = self.models.get(vector.entity_class)
            window = state.windows.setdefault(vector.entity, [])
            window.append(vector.as_row())
            if model is None:
                del window[:-1]
                continue
            del window[: -(model.window + 1)]
            if len(window) == model.window + 1:
                ready.setdefault(vector.entity_class, []).append((vector, np.array(window, dtype=np.float64)))
        anomalies: list[Anomaly] = []
        for cls, items in ready.items():
            model = self.models[cls]
            scores = model.score_segments([segment for _, segment in items])
            names = FEATURES_BY_CLASS[cls]
            for (vector, segment), score in zip(items, scores, strict=True):
                episode = state.episodes.setdefault(vector.entity, Episode())
                over = bool(score > model.threshold)
                if over and self._load_moved(cls, names, segment):
                    over = False
                if episode.update(over, self.episodes):
                    anomalies.append(self._anomaly(vector, float(score), model, segment))
        return state, anomalies

    def _load_moved(self, cls: str, names: Sequence[str], segment: Matrix) -> bool:
        """Whether the entity's load moved anywhere in the window against its first row (a burst or an
        idle spell anywhere in the window shapes the whole sequence the model judges)."""
        later = segment[1:]
        return load_moved_in(cls, names, shift_z(names, segment[0], later), later, self.load_z)

    def _anomaly(self, vector: FeatureVector, score: float, model: TrainedLSTM, segment: Matrix) -> Anomaly:
        kind: EntityKind = "gpu" if vector.entity_class == "gpu" else "pod"
        names = FEATURES_BY_CLASS[vector.entity_class]
        scaled = model.scaler.transform(segment)
        drift = scaled[-1] - scaled[0]  # what moved across the window, in robust units
        order = np.argsort(-np.abs(drift))[:3]
        return Anomaly(
            entity=vector.entity,
            entity_kind=kind,
            signal="sequence_anomaly",
            detector=self.name,
            score=score,
            threshold=model.threshold,
            severity="warning",
            ts=vector.ts,
            labels=topology_labels(vector.labels),
            evidence={
                "features": {k: round(v, 4) for k, v in vector.values.items()},
                "window_drift": {names[i]: round(float(drift[i]), 2) for i in order},
                "window_scrapes": model.window,
            },
            fingerprint=fingerprint(self.name, "sequence_anomaly", vector.entity),
        )
