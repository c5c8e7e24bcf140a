"""Detector registry: one line per detector, loaded lazily (see services.core.registry)."""

from __future__ import annotations

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
