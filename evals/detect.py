"""Detection evaluation on seeded simulator scenarios, with the detect role's own code paths.

:class:`OfflineDetect` feeds events through exactly the objects the Faust agents use
(:class:`EntityDetection`, :class:`FeatureScorer`, the log and event detectors), without a broker, so an
evaluation over hours of simulated time takes seconds. The integration tests run the same scenarios
through the real broker.

For each fault the report gives the first anomaly on the right entity (the fault's GPU, pod, node or
deployment, directly or through an anomaly's topology labels; for a bad rollout, a pod of the new
ReplicaSet) and its delay after onset (for a bad rollout, after the new revision's first pod is Ready:
see :func:`symptom_onset`), and which share
of the anomalies raised in the minute after onset point at that entity; for fault-free runs, anomalies
per entity-hour (every firing anomaly of a fault-free run is a false positive).

``medic detect evaluate`` runs :func:`evaluate` and prints :func:`summarise`'s table and JSON.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipelines.detect import KUBE_PROVENANCE, DetectorSet, EntityDetection, FeatureScorer, stamped
from services.core.events import Anomaly, Event, KubeEvent, LogRecord, MetricBatch
from services.simulator.faults import points_at
from services.simulator.faults import symptom_onset as faults_symptom_onset

FAULT_FREE_SCENARIO = "baseline"
"""The shipped scenario whose runs measure false positives."""


def fault_scenarios() -> list[str]:
    """Shipped scenarios that plant at least one fault (random-fault scenarios excluded: their faults overlap)."""
    from services.simulator.scenario import list_scenarios, load_scenario

    return [name for name in list_scenarios() if load_scenario(name).faults and not load_scenario(name).random_faults]


def scenario_per_fault_type() -> dict[str, str]:
    """One shipped scenario for each fault type (the first by name where several plant it)."""
    from services.simulator.scenario import load_scenario

    out: dict[str, str] = {}
    for name in fault_scenarios():
        for fault in load_scenario(name).faults:
            out.setdefault(fault.type, name)
    return out


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
                    anomalies.extend(stamped(found, KUBE_PROVENANCE))
        if logs:
            for d in self.detectors.log:
                self.log_states[d.name], found = d.detect(logs, self.log_states[d.name])
                anomalies.extend(found)
        anomalies.extend(self.scorer.flush())
        return anomalies


def symptom_onset(fault: Any) -> float:
    """When the fault's effect can first reach telemetry (:meth:`Fault.symptom_onset`: a bad rollout
    counts from its new revision's first Ready pod)."""
    record = {"type": fault.type, "started_at": fault.started_at, "serving_at": fault.state.get("serving_at")}
    onset = faults_symptom_onset(record)
    return float(fault.started_at) if onset is None else onset


def matches(fault: Any, anomaly: Anomaly) -> bool:
    """Whether an anomaly points at the fault's entity (:func:`services.simulator.faults.points_at`)."""
    record = {
        "entity": fault.entity,
        "entity_kind": fault.entity_kind,
        "type": getattr(fault, "type", ""),
        "replica_set": getattr(fault, "state", {}).get("replica_set"),
    }
    return points_at(record, anomaly.entity, anomaly.labels)


@dataclass
class FaultResult:
    """How one fault was detected."""

    scenario: str
    seed: int
    fault_id: str
    fault_type: str
    entity: str
    onset: float  # when the fault's symptom can first be seen (see symptom_onset); delays count from it
    first_anomaly: str | None = None
    delay_s: float | None = None
    early_anomalies: int = 0  # firing anomalies raised within the judging window after onset
    early_on_target: int = 0  # ... of which point at the fault's entity

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
    entities: set[str] = field(default_factory=set)  # every entity that reported telemetry
    first_seen: dict[str, float] = field(default_factory=dict)  # entity -> simulated second of its first scrape
    requests: float = 0.0  # requests that arrived (the simulator's ground truth)
    failed: float = 0.0  # of which failed: aborted, errored or lost in a crash
    availability_objective: float = 0.999  # the scenario's availability SLO

    @property
    def slo_breached(self) -> bool:
        """Whether the run failed more requests than its availability SLO allows: a real incident.

        A run with no planted fault can still have one: a traffic burst beyond the fleet's capacity
        aborts requests. Its anomalies are true alarms, so fault-free figures leave such runs out
        (and :func:`summarise` lists them).
        """
        return self.requests > 0 and self.failed / self.requests > 1.0 - self.availability_objective

    def firing_by_entity(self) -> dict[str, int]:
        """Firing anomalies per entity."""
        counts: dict[str, int] = defaultdict(int)
        for _, a in self.anomalies:
            if a.status == "firing":
                counts[a.entity] += 1
        return dict(counts)

    def per_entity_hour(self) -> float:
        """Most firing anomalies any single entity got per simulated hour."""
        return max(self.firing_by_entity().values(), default=0) / (self.duration_s / 3600.0)

    def mean_per_entity_hour(self) -> float:
        """Firing anomalies per entity-hour over every entity that reported (the false-positive rate)."""
        firing = sum(self.firing_by_entity().values())
        entities = max(1, len(self.entities | set(self.firing_by_entity())))
        return firing / (entities * self.duration_s / 3600.0)


def run_scenario(
    scenario: str, seed: int, detectors: DetectorSet, duration_s: float | None = None, within_s: float = 60.0
) -> ScenarioResult:
    """Run one seeded scenario through :class:`OfflineDetect` and score each fault's detection.

    ``within_s`` is the window after onset whose anomalies decide the right-entity share.
    """
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
            events = sim.step()
            for event in events:
                if isinstance(event, MetricBatch) and event.entity not in result.entities:
                    result.entities.add(event.entity)
                    result.first_seen[event.entity] = t
            for anomaly in offline.feed(events):
                result.anomalies.append((t, anomaly))
        result.requests = float(sum(r.arrivals for r in sim.grader.records))
        result.failed = float(sum(r.errors for r in sim.grader.records))
        result.availability_objective = spec.slo.availability
        for fault in sim.fault_list():
            if fault.started_at is None:
                continue
            onset = symptom_onset(fault)
            fr = FaultResult(scenario, seed, fault.id, fault.type, fault.entity, onset)
            for t, anomaly in result.anomalies:
                if t < onset or anomaly.status != "firing":
                    continue
                hit = matches(fault, anomaly)
                if t - onset <= within_s:
                    fr.early_anomalies += 1
                    fr.early_on_target += hit
                if hit and fr.delay_s is None:
                    fr.first_anomaly = f"{anomaly.detector}/{anomaly.signal}"
                    fr.delay_s = t - onset
            result.faults.append(fr)
    finally:
        sim.close()
    return result


def evaluate(
    scenarios: Sequence[str],
    seeds: Sequence[int],
    detectors: DetectorSet,
    *,
    duration_s: float | None = None,
    fault_free_duration_s: float = 3600.0,
    within_s: float = 60.0,
    progress: Any = None,
) -> list[ScenarioResult]:
    """Run every scenario for every seed; a scenario without faults runs ``fault_free_duration_s``.

    ``duration_s`` overrides every run's length; ``progress`` (optional) is called with each result.
    """
    from services.simulator.scenario import load_scenario

    results = []
    for scenario in scenarios:
        planted = bool(load_scenario(scenario).faults)
        for seed in seeds:
            length = duration_s if duration_s is not None else (None if planted else fault_free_duration_s)
            result = run_scenario(scenario, seed, detectors, length, within_s)
            if progress is not None:
                progress(result)
            results.append(result)
    return results


def summarise(results: Sequence[ScenarioResult], within_s: float = 60.0) -> dict[str, Any]:
    """Per fault type: detection rate within ``within_s``, delays, right-entity share; false positives.

    A fault counts as detected when an anomaly points at its entity within ``within_s`` of onset. The
    delays (p50, max) are over the faults detected at all, so a late detection still shows how late.
    ``right_entity_rate`` is the share of all anomalies fired in the ``within_s`` after onset that point
    at the fault's entity. Fault-free runs report firing anomalies per entity-hour over all entities
    (``false_positives_per_entity_hour``) and for the noisiest entity of the noisiest run. A run with no
    planted fault that broke its availability SLO (``ScenarioResult.slo_breached``) had a real incident:
    it is listed under ``overloaded_runs`` and left out of the false-positive figures.
    """
    by_type: dict[str, list[FaultResult]] = defaultdict(list)
    for r in results:
        for f in r.faults:
            by_type[f.fault_type].append(f)
    per_type: dict[str, Any] = {}
    for fault_type, faults in sorted(by_type.items()):
        delays = [f.delay_s for f in faults if f.delay_s is not None]
        early = sum(f.early_anomalies for f in faults)
        detected = sum(1 for f in faults if f.delay_s is not None and f.delay_s <= within_s)
        per_type[fault_type] = {
            "faults": len(faults),
            "detected_within": detected,
            "detection_rate": round(detected / len(faults), 4),
            "delay_p50_s": statistics.median(delays) if delays else None,
            "delay_max_s": max(delays) if delays else None,
            "missed": sorted(
                f"{f.scenario}/seed={f.seed}" for f in faults if f.delay_s is None or f.delay_s > within_s
            ),
            "right_entity_rate": round(sum(f.early_on_target for f in faults) / early, 4) if early else None,
            "first_signals": sorted({f.first_anomaly for f in faults if f.first_anomaly}),
        }
    no_fault = [r for r in results if not r.faults]
    quiet = [r for r in no_fault if not r.slo_breached]
    fault_free: dict[str, Any] = {
        "runs": len(quiet),
        # runs with no planted fault whose traffic still broke the availability SLO: real incidents
        "overloaded_runs": {
            f"{r.scenario}/seed={r.seed}": {
                "failed_share": round(r.failed / r.requests, 4),
                "anomalies": sum(r.firing_by_entity().values()),
                "max_per_entity_hour": round(r.per_entity_hour(), 3),
            }
            for r in no_fault
            if r.slo_breached
        },
    }
    if quiet:
        hours = sum(r.duration_s for r in quiet) / 3600.0
        entity_hours = sum(len(r.entities) * r.duration_s / 3600.0 for r in quiet)
        firing = sum(sum(r.firing_by_entity().values()) for r in quiet)
        noisiest = max(quiet, key=lambda r: r.per_entity_hour())
        signals: dict[str, int] = defaultdict(int)
        for r in quiet:
            for _, a in r.anomalies:
                if a.status == "firing":
                    signals[f"{a.detector}/{a.signal}"] += 1
        fault_free.update(
            {
                "simulated_hours": round(hours, 3),
                "entity_hours": round(entity_hours, 1),
                "anomalies": firing,
                "false_positives_per_entity_hour": round(firing / entity_hours, 4) if entity_hours else None,
                "max_per_entity_hour": round(noisiest.per_entity_hour(), 3),
                "max_per_entity_hour_by_seed": {
                    f"{r.scenario}/seed={r.seed}": round(r.per_entity_hour(), 3) for r in quiet
                },
                "by_signal": dict(sorted(signals.items(), key=lambda kv: -kv[1])),
            }
        )
    return {"within_s": within_s, "fault_types": per_type, "fault_free": fault_free}
