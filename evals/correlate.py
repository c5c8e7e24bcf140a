"""The correlate role's objects without a broker, for the harnesses that replay a simulation in process.

:class:`OfflineCorrelate` drives the role's own :class:`~pipelines.correlate.correlator.Correlator` (one
engine per cluster, redelivery dedup, a kernel-log XID resolved to its GPU by PCI address) and its
:class:`~pipelines.correlate.correlator.TopologyFilter` over the metric batches, exactly as the
``correlate-topology`` and ``correlate`` agents feed them. Engine time is event time, the telemetry's
simulated UNIX seconds, as in the stack.

The harnesses measure in simulated seconds since the simulation's epoch (a fault's onset, the
simulator's ``t``), so the incident events come back with ``ts`` and ``opened_at`` in those seconds;
their alerts keep UNIX ``starts_at``, as the stack stores them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pipelines.correlate.correlator import DEFAULT_CLUSTER, Correlator, TopologyFilter
from services.alerting.config import RoutingConfig
from services.core.events import Anomaly, IncidentEvent, MetricBatch


class OfflineCorrelate:
    """Feed one simulation's telemetry and anomalies to the correlate role's objects.

    Args:
        config: the routing config (``infra/config/routing.yaml`` in the harnesses).
        epoch: the simulation's epoch (UNIX seconds at its ``t = 0``).
    """

    def __init__(self, config: RoutingConfig, epoch: float) -> None:
        # the wall clock only paces the agent's ticks; here every tick names its engine time
        self.correlator = Correlator(config, clock=lambda: 0.0)
        self.topology = TopologyFilter()
        self.epoch = epoch

    def feed(self, batch: Iterable[Any], anomalies: Sequence[Anomaly], t: float) -> list[IncidentEvent]:
        """One simulated second: topology facts from its metric batches, its anomalies, then the timers
        due by ``t`` (simulated seconds); the incident events this produced, in simulated seconds."""
        for item in batch:
            if isinstance(item, MetricBatch):
                facts = self.topology.facts(item.to_bytes())
                if facts is not None:
                    self.correlator.observe(*facts)
        actions: list[Any] = []
        for anomaly in anomalies:
            actions.extend(self.correlator.ingest(DEFAULT_CLUSTER, anomaly))
        actions.extend(self.correlator.tick(DEFAULT_CLUSTER, self.epoch + t))
        return [self._local(a) for a in actions if isinstance(a, IncidentEvent)]

    def run(self, incident_id: str, run_id: str, status: str) -> list[IncidentEvent]:
        """Follow a run's run-level progress as the correlate role's remediation agent does: a run acting
        holds its incident open, and a run that succeeded mitigates it."""
        actions = self.correlator.run(DEFAULT_CLUSTER, incident_id, run_id, status)
        return [self._local(a) for a in actions if isinstance(a, IncidentEvent)]

    def _local(self, event: IncidentEvent) -> IncidentEvent:
        return event.model_copy(update={"ts": event.ts - self.epoch, "opened_at": event.opened_at - self.epoch})
