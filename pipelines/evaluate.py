"""Detection evaluation on seeded simulator scenarios, with the detect role's own code paths.

:class:`OfflineDetect` feeds events through exactly the objects the Faust agents use
(:class:`EntityDetection`, :class:`FeatureScorer`, the log and event detectors), without a broker, so an
evaluation over hours of simulated time takes seconds. The integration tests run the same scenarios
through the real broker.

For each fault the report gives the first anomaly on the right entity (the fault's GPU, pod, node or
deployment, directly or through an anomaly's topology labels) and its delay after onset; for fault-free
runs, anomalies per entity-hour.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipelines.detect import DetectorSet, EntityDetection, FeatureScorer
from services.core.events import Anomaly, Event, KubeEvent, LogRecord, MetricBatch


class OfflineDetect:
    """The detect role without Kafka: events in, anomalies out, state kept in memory."""

    def __init__(self, detectors: DetectorSet) -> None:
        self.entity = EntityDetection(detectors)
        self.scorer = FeatureScorer(detectors.feature)
        self.detectors = detectors
        self.saved: dict[str, dict[str, Any]] = {}
        self.log_states = {d.name: d.initial_state() for d in detectors.log}
        self.event_states = {d.name: d.initial_state() for d in detectors.event}

    def feed(self, events: Iterable[Event]) -> list[Anomaly]:
        """Process one step's events; feature vectors are scored together at the end of the step."""
        anomalies: list[Anomaly] = []
        logs: list[LogRecord] = []
        for event in events:
            if isinstance(event, MetricBatch):
                saved, vector, found = self.entity.on_batch(event, self.saved.get(event.entity))
                if saved is not None:
                    self.saved[event.entity] = saved
                anomalies.extend(found)
                if vector is not None and vector.serving and self.scorer.detectors:
                    self.scorer.add(vector, 0.0)
            elif isinstance(event, LogRecord):
                logs.append(event)
            elif isinstance(event, KubeEvent):
                for d in self.detectors.event:
                    self.event_states[d.name], found = d.detect([event], self.event_states[d.name])
                    anomalies.extend(found)
        if logs:
            for d in self.detectors.log:
                self.log_states[d.name], found = d.detect(logs, self.log_states[d.name])
                anomalies.extend(found)
        anomalies.extend(self.scorer.flush())
        return anomalies


def matches(fault: Any, anomaly: Anomaly) -> bool:
    """Whether an anomaly points at the fault's entity, directly or through topology labels."""
    target, kind = fault.entity, fault.entity_kind
    if not target:
        return False
    labels = anomaly.labels
    if anomaly.entity == target or target in labels.values():
        return True
    if kind == "deployment":
        prefix = target + "-"
        return anomaly.entity.startswith(prefix) or labels.get("pod", "").startswith(prefix)
    return False


@dataclass
class FaultResult:
    """How one fault was detected."""

    scenario: str
    seed: int
    fault_id: str
    fault_type: str
    entity: str
    onset: float
    first_anomaly: str | None = None
    delay_s: float | None = None

    @property
    def detected_within(self) -> float | None:
        """Delay of the first matching anomaly (None: missed)."""
        return self.delay_s


@dataclass
class ScenarioResult:
    """Everything one seeded run produced."""

    scenario: str
    seed: int
    duration_s: float
    faults: list[FaultResult] = field(default_factory=list)
    anomalies: list[tuple[float, Anomaly]] = field(default_factory=list)

    def per_entity_hour(self) -> float:
        """Most firing anomalies any single entity got per simulated hour."""
        counts: dict[str, int] = defaultdict(int)
        for _, a in self.anomalies:
            if a.status == "firing":
                counts[a.entity] += 1
        return max(counts.values(), default=0) / (self.duration_s / 3600.0)


def run_scenario(scenario: str, seed: int, detectors: DetectorSet, duration_s: float | None = None) -> ScenarioResult:
    """Run one seeded scenario through :class:`OfflineDetect` and score each fault's detection."""
    from services.simulator.scenario import load_scenario
    from services.simulator.simulator import Simulator

    spec = load_scenario(scenario)
    sim = Simulator(spec, seed=seed)
    duration = duration_s if duration_s is not None else spec.duration_s
    offline = OfflineDetect(detectors)
    result = ScenarioResult(scenario, seed, duration)
    try:
        while sim.t < duration:
            t = sim.t
            for anomaly in offline.feed(sim.step()):
                result.anomalies.append((t, anomaly))
        for fault in sim.fault_list():
            if fault.started_at is None:
                continue
            fr = FaultResult(scenario, seed, fault.id, fault.type, fault.entity, fault.started_at)
            for t, anomaly in result.anomalies:
                if t >= fault.started_at and anomaly.status == "firing" and matches(fault, anomaly):
                    fr.first_anomaly = f"{anomaly.detector}/{anomaly.signal}"
                    fr.delay_s = t - fault.started_at
                    break
            result.faults.append(fr)
    finally:
        sim.close()
    return result


def summarise(results: Sequence[ScenarioResult], within_s: float = 60.0) -> dict[str, Any]:
    """Detection rate within ``within_s`` per fault type and the noisiest fault-free entity-hour."""
    by_type: dict[str, list[FaultResult]] = defaultdict(list)
    for r in results:
        for f in r.faults:
            by_type[f.fault_type].append(f)
    per_type = {
        t: {
            "faults": len(fs),
            "detected_within": sum(1 for f in fs if f.delay_s is not None and f.delay_s <= within_s),
            "median_delay_s": sorted(f.delay_s for f in fs if f.delay_s is not None)[len(fs) // 2]
            if any(f.delay_s is not None for f in fs)
            else None,
            "first_signals": sorted({f.first_anomaly for f in fs if f.first_anomaly}),
        }
        for t, fs in sorted(by_type.items())
    }
    quiet = [r for r in results if not r.faults]
    return {
        "within_s": within_s,
        "fault_types": per_type,
        "fault_free_max_anomalies_per_entity_hour": max((r.per_entity_hour() for r in quiet), default=None),
    }
