"""Detector registry: one line per detector, loaded lazily (see services.core.registry)."""

from __future__ import annotations

from services.core.registry import Registry

DETECTORS: Registry[type] = Registry(
    "detector",
    {
        "log_templates": "pipelines.detectors.logtemplates:LogTemplateDetector",
    },
)
