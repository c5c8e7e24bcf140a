"""Correlation: anomalies become deduplicated alerts, Alertmanager-style notifications and incidents.

The core (:class:`~pipelines.correlate.engine.Engine`) is pure and clock-injected; the Faust agents
in :mod:`pipelines.correlate.agent` feed it from ``anomalies.v1`` and publish ``incidents.v1``.
The Alertmanager model it runs on (routing config, matchers, silences, time intervals, the
:class:`~services.alerting.notification.Notification` it decides) lives in :mod:`services.alerting`,
below every package that uses it. See docs/correlation.md.
"""

from pipelines.correlate.engine import Engine
from pipelines.correlate.model import Action

__all__ = ["Action", "Engine"]
