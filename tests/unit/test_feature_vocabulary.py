"""Feature names are declared once (services/core/features.py); extraction, detectors and diagnostician follow."""

from __future__ import annotations

from pipelines import features
from pipelines.detectors import iforest
from services.core.events import MetricBatch
from services.core.features import FEATURE_BY_NAME, FEATURES, FEATURES_BY_CLASS
from services.diagnostician.evidence import FEATURE_METRICS
from services.simulator.scenario import load_scenario
from services.simulator.simulator import Simulator

# Interval means ride in FeatureVector.values beside the model rows (the revision rule compares them).
MEANS = {name for pair in features._MEANS.values() for name in pair}


def test_extraction_computes_exactly_the_declared_features_of_each_class() -> None:
    sim = Simulator(load_scenario("baseline"), seed=3, telemetry=True)
    state: dict[str, features.FeatureState] = {}
    seen: dict[str, set[str]] = {"gpu": set(), "pod": set()}
    try:
        while sim.t < 120:
            for event in sim.step():
                if not isinstance(event, MetricBatch):
                    continue
                state[event.entity], vector = features.extract(event, state.get(event.entity, features.FeatureState()))
                if vector is not None:
                    seen[vector.entity_class] |= set(vector.values)
    finally:
        sim.close()
    for cls, names in FEATURES_BY_CLASS.items():
        assert seen[cls] - MEANS == set(names), cls
    assert features.FEATURES_BY_CLASS is FEATURES_BY_CLASS


def test_every_metric_the_extraction_maps_produce_is_a_declared_feature() -> None:
    produced = set(features._GAUGES.values()) | set(features._COUNTERS.values())
    produced |= {name for quantiles in features._HISTOGRAMS.values() for name, _ in quantiles}
    assert produced | {"mem_used_frac", "error_rate"} == set(FEATURE_BY_NAME)


def test_the_detectors_and_the_diagnostician_derive_their_tables_from_the_declarations() -> None:
    assert set(iforest.FALLBACK_UNITS) == set(FEATURE_BY_NAME)
    assert iforest.LOAD_FEATURES["pod"] == {"requests_waiting": 1, "requests_running": 1, "prompt_tokens_per_s": 1}
    assert iforest.LOAD_FEATURES["gpu"] == {"gpu_util": -1}
    assert "error_rate" not in iforest.LOAD_DRIVEN["pod"] and "mem_used_frac" not in iforest.LOAD_DRIVEN["gpu"]
    # a feature without a harmful direction is never read as evidence of its metric
    assert set(FEATURE_METRICS) == {f.name for f in FEATURES if f.harmful}
    assert FEATURE_METRICS["sm_clock_mhz"] == ("DCGM_FI_DEV_SM_CLOCK", -1)
