"""Detector registry: one line per detector, loaded lazily (see services.core.registry).

Each detector class declares the signals it emits (``signals``, see :class:`pipelines.detectors.base.Detector`);
:func:`signal_catalog` is derived from those declarations, never written out again.
"""

from __future__ import annotations

import functools
from typing import Any

from services.core.registry import Registry

DETECTORS: Registry[type] = Registry(
    "detector",
    {
        "log_templates": "pipelines.detectors.logtemplates:LogTemplateDetector",
        "iforest": "pipelines.detectors.iforest:IsolationForestDetector",
        "lstm": "pipelines.detectors.lstm:LstmDetector",
        "xid_rules": "pipelines.detectors.rules_xid:XidDetector",
        "gpu_rules": "pipelines.detectors.rules_gpu:GpuRuleDetector",
        "serving_rules": "pipelines.detectors.rules_serving:ServingRuleDetector",
        "slo_burn": "pipelines.detectors.rules_slo:SloBurnDetector",
        "revision_rules": "pipelines.detectors.rules_revision:RevisionDetector",
        "kube_events": "pipelines.detectors.rules_kube:KubeEventDetector",
    },
)


@functools.cache
def signal_catalog() -> dict[str, tuple[str, ...]]:
    """Every signal a registered detector declares, with the detectors that emit it (sorted by signal).

    The diagnostician checks the runbooks' ``signals.anomalies`` against it
    (:func:`services.diagnostician.runbooks.check_anomaly_signals`, called by the CLI entrypoints, since
    services do not import the pipeline).
    """
    emitters: dict[str, list[str]] = {}
    for name in DETECTORS.names():
        detector: Any = DETECTORS.load(name)  # a class with the Detector protocol's class attributes
        for signal in detector.signals:
            emitters.setdefault(signal, []).append(name)
    return {signal: tuple(emitters[signal]) for signal in sorted(emitters)}
