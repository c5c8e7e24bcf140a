"""A closed-loop simulator episode written to the stores, as the stack's roles would have written it.

:func:`evals.loop.run_episode` judges the loop and keeps only the remediation runs in Postgres. A
post-incident report (services/reports) needs the rest too: the incidents and their alerts, the anomaly
history, the diagnoses, and the telemetry behind the plots. :func:`record_episode` runs the same loop
(the detect and correlate roles' objects, the offline ranker, the remediation executor on the simulator,
the simulated human for level-2 approvals) and writes each fact with the store function of the role that
owns it:

* incidents and alerts: :func:`services.store.incidents.save_incident_events` (the correlate role),
  in UNIX seconds, as the stack stores them;
* the anomaly history: :func:`services.store.anomalies.write_anomalies`, each anomaly resolved to its GPU
  and stamped with its alert's fingerprint by the correlate role's own objects;
* diagnoses: :func:`services.diagnostician.diagnostician.store_diagnosis` (the diagnostician);
* runs, steps, approvals and audit: the executor's :class:`~services.remediation.store.RunStore`.

The metric batches go to ``metrics`` when given (the tests and the bench publish them to
``telemetry.metrics.v1`` with their event time as the record timestamp, as ingest would have written them
live). Nothing here is service code: services never import ``evals``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from evals.loop import APPROVAL_DELAY_S, LoopDispatcher, LoopEvents, _simulated_human, simulated_executor
from services.core.events import Diagnosis, IncidentEvent, KubeEvent, MetricBatch
from services.core.paths import REPO_ROOT
from services.core.settings import Settings
from services.diagnostician.ranker import RunbookIndex
from services.remediation.store import RunStore
from services.simulator.scenario import Scenario
from services.simulator.simulator import EPOCH, Simulator


@dataclass
class RecordedEpisode:
    """What one recorded episode wrote (all times UNIX seconds).

    Attributes:
        incidents: every incident event, in the order correlate emitted it.
        diagnoses: every diagnosis stored, in order.
        run_ids: the remediation runs submitted, in order (repeats removed).
        anomalies: how many anomalies went into the history.
        epoch: the simulation's UNIX time at its second 0.
        end: the simulated UNIX time the episode stopped at.
    """

    incidents: list[IncidentEvent] = field(default_factory=list)
    diagnoses: list[Diagnosis] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    anomalies: int = 0
    epoch: float = EPOCH
    end: float = EPOCH

    def incident_ids(self) -> list[str]:
        """The incidents, in the order they opened."""
        return list(dict.fromkeys(e.incident_id for e in self.incidents))


def record_episode(
    settings: Settings,
    spec: Scenario,
    seed: int,
    *,
    index: RunbookIndex,
    duration_s: float | None = None,
    epoch: float = EPOCH,
    approval_delay_s: float = APPROVAL_DELAY_S,
    diagnose: bool = True,
    metrics: Callable[[MetricBatch], None] | None = None,
) -> RecordedEpisode:
    """Run the closed loop on a scenario and write every fact a role would store to ``settings``' database.

    Args:
        settings: a migrated database of this episode's own.
        spec: the scenario.
        seed: the episode seed.
        index: the runbook index the ranker uses.
        duration_s: simulated seconds to run (default: the scenario's duration).
        epoch: UNIX time of simulated second 0.
        approval_delay_s: simulated seconds before the simulated human approves a level-2 run.
        diagnose: False leaves the diagnostician out (an incident nobody diagnosed: no diagnosis, no run).
        metrics: called with every metric batch, in order (the telemetry behind the plots).
    """
    # the cluster OfflineCorrelate's engine runs under (evals.correlate names it, wherever the role defines it)
    from evals.correlate import DEFAULT_CLUSTER, OfflineCorrelate
    from evals.detect import OfflineDetect
    from pipelines.correlate.history import AnomalyHistory
    from pipelines.detect import build_detectors
    from services.alerting.config import load_routing
    from services.diagnostician.diagnostician import RankerDiagnostician, store_diagnosis
    from services.diagnostician.tools import ChangeLog
    from services.store.anomalies import write_anomalies
    from services.store.db import connect
    from services.store.incidents import upsert_incident_events

    duration = duration_s if duration_s is not None else spec.duration_s
    sim = Simulator(spec, seed=seed, epoch=epoch)
    offline = OfflineDetect(build_detectors(settings))
    correlate = OfflineCorrelate(load_routing(REPO_ROOT / "infra" / "config" / "routing.yaml"), sim.epoch)
    doctor = RankerDiagnostician(settings, index=index, use_database=False)
    doctor.change_log = ChangeLog({n: f"{n}-{d.template_hash}" for n, d in sim.cluster.deployments.items()})
    history = AnomalyHistory(settings.anomaly_retention_s)
    sink = LoopEvents()
    store = RunStore(settings)
    executor = simulated_executor(sim, store, sink)
    dispatcher = executor.dispatcher
    assert isinstance(dispatcher, LoopDispatcher)
    out = RecordedEpisode(epoch=sim.epoch)
    awaiting: dict[str, float] = {}
    conn = connect(settings)

    def unix(event: IncidentEvent) -> IncidentEvent:
        # OfflineCorrelate hands back simulated seconds; the stack stores UNIX time
        return event.model_copy(update={"ts": event.ts + sim.epoch, "opened_at": event.opened_at + sim.epoch})

    def keep(events: list[IncidentEvent]) -> None:
        stored = [unix(e) for e in events]
        upsert_incident_events(conn, stored)
        out.incidents.extend(stored)

    try:
        while sim.t < duration:
            now = sim.t
            batch = sim.step()
            for item in batch:
                if isinstance(item, KubeEvent):
                    doctor.change_log.observe(item)
                elif metrics is not None and isinstance(item, MetricBatch):
                    metrics(item)
            found = offline.feed(batch)
            events = correlate.feed(batch, found, now)
            for anomaly in found:  # after the feed, so the topology has learnt the GPU a kernel log names
                history.add(correlate.correlator.resolve(DEFAULT_CLUSTER, anomaly))
            if len(history):
                pending = history.take()
                rejected = write_anomalies(conn, pending, max_evidence_bytes=settings.anomaly_evidence_max_bytes)
                out.anomalies += len(pending) - len(rejected)
            keep(events)
            for event in events:
                if not diagnose or event.kind not in ("opened", "updated"):
                    continue  # the diagnostician service's rule
                diagnosis = doctor.diagnose(event).model_copy(update={"ts": sim.epoch + now})
                store_diagnosis(conn, unix(event), diagnosis)
                out.diagnoses.append(diagnosis)
                run_id, decision = executor.submit(diagnosis)
                if run_id not in out.run_ids:
                    out.run_ids.append(run_id)
                if decision.outcome == "await_approval":
                    awaiting.setdefault(run_id, now)
            for run_id, asked in list(awaiting.items()):
                if now - asked >= approval_delay_s:
                    del awaiting[run_id]
                    _simulated_human(executor, store, run_id)
            dispatcher.pump()
            while sink.runs:
                keep(correlate.run(*sink.runs.pop(0)))
        out.end = sim.epoch + sim.t
    finally:
        conn.close()
        store.close()
        executor.actuator.close()
        sim.close()
        doctor.close()
    return out
