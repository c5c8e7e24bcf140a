"""Training the learned detectors on a baseline judged normal.

The baseline comes from a fault-free simulator run (``--source simulator``) or from a time range of the
metrics topic (``--source kafka``). Every scrape becomes a feature vector (pipelines.features); the
isolation forest learns the vectors of each entity class, the LSTM each entity's sequence. Models are
stored as new versions in ``detector_models``; running detect workers pick them up without a restart.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from pipelines.detectors import iforest, lstm
from pipelines.features import FeatureState, FeatureVector, extract
from services.core.events import MetricBatch
from services.core.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class Baseline:
    """Feature rows per entity class and entity, in scrape order."""

    series: dict[str, dict[str, list[list[float]]]] = field(default_factory=dict)
    scrapes: int = 0

    def add(self, vector: FeatureVector) -> None:
        """Append one vector to its entity's series."""
        self.series.setdefault(vector.entity_class, {}).setdefault(vector.entity, []).append(vector.as_row())
        self.scrapes += 1

    def rows(self, entity_class: str) -> np.ndarray:
        """All rows of a class stacked."""
        return np.array([r for s in self.series.get(entity_class, {}).values() for r in s], dtype=np.float64)


def vectors_from_batches(batches: Iterable[MetricBatch]) -> Baseline:
    """Turn metric batches (any order of entities, each entity in time order) into a baseline."""
    states: dict[str, FeatureState] = {}
    baseline = Baseline()
    for batch in batches:
        states[batch.entity], vector = extract(batch, states.get(batch.entity, FeatureState()))
        if vector is not None and vector.serving:
            baseline.add(vector)
    return baseline


def simulator_baseline(seeds: Iterable[int], duration_s: float, scenario: str = "baseline") -> Baseline:
    """Run the simulator without faults once per seed (each seed draws another cluster and load)."""
    from services.simulator.scenario import load_scenario
    from services.simulator.simulator import Simulator

    batches: list[MetricBatch] = []
    for seed in seeds:
        sim = Simulator(load_scenario(scenario), seed=seed)
        try:
            while sim.t < duration_s:
                # entity names embed the seed's random suffixes, so series of different seeds never mix
                batches.extend(e for e in sim.step() if isinstance(e, MetricBatch))
        finally:
            sim.close()
    return vectors_from_batches(batches)


@dataclass(frozen=True)
class TrainingReport:
    """What one training run stored."""

    versions: dict[str, int]
    scrapes: int
    seconds: float


def train_and_store(
    settings: Settings,
    baseline: Baseline,
    *,
    source: str,
    contamination: float = 0.005,
    lstm_window: int = 12,
    lstm_epochs: int = 8,
    lstm_max_series: int = 24,
) -> TrainingReport:
    """Train both learned detectors for every entity class in the baseline and store new versions."""
    from services.store.detector_models import save_model

    start = time.monotonic()
    versions: dict[str, int] = {}
    for cls, per_entity in baseline.series.items():
        rows = baseline.rows(cls)
        meta = {"source": source, "rows": len(rows), "entities": len(per_entity), "contamination": contamination}
        log.info("training iforest for %s on %d rows", cls, len(rows))
        forest = iforest.train(cls, rows, contamination=contamination)
        versions[f"iforest/{cls}"] = save_model(
            settings,
            detector="iforest",
            entity_class=cls,
            model=forest.to_bytes(),
            training=meta,
            threshold=forest.threshold,
        )
        series = [np.array(s, dtype=np.float64) for s in per_entity.values() if len(s) >= lstm_window + 10]
        # the LSTM learns dynamics, not the fleet: a bounded, evenly spread subset keeps training short
        series = series[:: max(1, len(series) // lstm_max_series)][:lstm_max_series]
        if series:
            log.info("training lstm for %s on %d series", cls, len(series))
            seq = lstm.train(cls, series, window=lstm_window, epochs=lstm_epochs, contamination=contamination)
            versions[f"lstm/{cls}"] = save_model(
                settings,
                detector="lstm",
                entity_class=cls,
                model=seq.to_bytes(),
                training={**meta, "window": lstm_window, "epochs": lstm_epochs},
                threshold=seq.threshold,
            )
    return TrainingReport(versions, baseline.scrapes, time.monotonic() - start)
