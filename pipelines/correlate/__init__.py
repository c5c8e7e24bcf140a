"""Correlation: anomalies become deduplicated alerts, Alertmanager-style notifications and incidents.

The core (:class:`~pipelines.correlate.engine.Engine`) is pure and clock-injected; the Faust agents
in :mod:`pipelines.correlate.agent` feed it from ``anomalies.v1`` and publish ``incidents.v1``.
See docs/correlation.md.
"""

from pipelines.correlate.config import RoutingConfig, load_routing, loads_routing
from pipelines.correlate.engine import Engine
from pipelines.correlate.errors import IncidentNotFound, SilenceError
from pipelines.correlate.model import Action, Notification
from pipelines.correlate.silences import Silence, Silences

__all__ = [
    "Action",
    "Engine",
    "IncidentNotFound",
    "Notification",
    "RoutingConfig",
    "Silence",
    "SilenceError",
    "Silences",
    "load_routing",
    "loads_routing",
]
