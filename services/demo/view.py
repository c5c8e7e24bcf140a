"""The demo's live terminal view: what flows through ClusterMedic, as it happens.

:class:`LiveView` follows every topic of the run from a consumer group of its own (it only reads:
the roles do the work) and polls the simulator's ``/live`` for simulated time and the SLO score. It
draws, with rich: the telemetry rate, the latest anomalies, incidents, diagnoses with their
confidence and evidence, remediation runs step by step, notifications, and the SLO score over time.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaConsumer
from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from services.core.events import (
    EVENTS_BY_TOPIC,
    Anomaly,
    Diagnosis,
    Event,
    IncidentEvent,
    KubeEvent,
    LogRecord,
    MetricBatch,
    RemediationEvent,
)
from services.core.settings import Settings
from services.simulator.faults import points_at, symptom_onset

SPARK = "▁▂▃▄▅▆▇█"
# How a fault's runs are listed in the summary: what helped first.
RUN_RANK = {
    "succeeded": 0,
    "running": 1,
    "approved": 2,
    "awaiting_approval": 3,
    "paged": 4,
    "failed": 5,
    "rolled_back": 6,
}


@dataclass
class RunView:
    """One remediation run as the view shows it."""

    run_id: str
    incident_id: str
    playbook: str
    level: int
    status: str = ""
    steps: list[str] = field(default_factory=list)
    first_ts: float = 0.0
    succeeded_at: float | None = None  # simulated second the view saw it succeed


class LiveView:
    """Everything the demo saw, updated by a consumer thread (see the module docstring).

    Args:
        settings: Kafka address and the run's topic prefix.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.lock = threading.Lock()
        self.samples = 0
        self.log_lines = 0
        self.kube_events = 0
        self.rate: deque[tuple[float, int]] = deque(maxlen=20)
        self.anomalies: list[Anomaly] = []
        self.incidents: dict[str, IncidentEvent] = {}
        self.diagnosis_log: dict[str, list[Diagnosis]] = {}  # every diagnosis of each incident, in arrival order
        self.runs: dict[str, RunView] = {}
        self.scores: deque[tuple[float, float]] = deque(maxlen=600)
        self.sim: dict[str, Any] = {}
        self.gpu_node: dict[str, str] = {}
        self.notes: deque[str] = deque(maxlen=6)
        self._stop = threading.Event()
        topics = [settings.topic(cls.topic) for cls in EVENTS_BY_TOPIC.values() if cls.topic != "deadletter.v1"]
        self._consumer = KafkaConsumer(
            *topics,
            bootstrap_servers=settings.bootstrap_servers,
            group_id=f"{settings.topic_prefix}demo-view",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        self._thread = threading.Thread(target=self._run, name="demo-view", daemon=True)

    def start(self) -> LiveView:
        """Start following the topics."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop following them."""
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()

    @property
    def diagnoses(self) -> dict[str, Diagnosis]:
        """The latest diagnosis of each incident."""
        return {incident_id: log[-1] for incident_id, log in self.diagnosis_log.items()}

    def say(self, line: str) -> None:
        """A line in the view's narration (approvals, pages, what the demo is doing)."""
        with self.lock:
            self.notes.append(line)

    def _run(self) -> None:
        by_topic = {self.settings.topic(cls.topic): cls for cls in EVENTS_BY_TOPIC.values()}
        while not self._stop.is_set():
            for records in self._consumer.poll(timeout_ms=300, max_records=2000).values():
                for record in records:
                    cls = by_topic.get(record.topic)
                    if cls is None:
                        continue
                    try:
                        event = cls.from_bytes(record.value)
                    except Exception:  # the view shows what it can read; the roles dead-letter the rest
                        continue
                    self.take(event)
            with self.lock:
                self.rate.append((time.monotonic(), self.samples))

    def take(self, event: Event) -> None:
        """Record one event."""
        with self.lock:
            if isinstance(event, MetricBatch):
                self.samples += len(event.samples)
            elif isinstance(event, LogRecord):
                self.log_lines += 1
            elif isinstance(event, KubeEvent):
                self.kube_events += 1
            elif isinstance(event, Anomaly):
                if event.status == "firing":
                    self.anomalies.append(event)
            elif isinstance(event, IncidentEvent):
                self.incidents[event.incident_id] = event
            elif isinstance(event, Diagnosis):
                self.diagnosis_log.setdefault(event.incident_id, []).append(event)
            elif isinstance(event, RemediationEvent):
                run = self.runs.setdefault(
                    event.run_id,
                    RunView(event.run_id, event.incident_id, event.playbook, event.level, first_ts=event.ts),
                )
                run.status = event.status
                if event.status == "succeeded" and run.succeeded_at is None:
                    run.succeeded_at = float(self.sim.get("t", 0.0))
                if event.step or event.detail:
                    run.steps.append(f"{event.status}: {event.step + ' ' if event.step else ''}{event.detail}"[:160])

    # ------------------------------------------------------------------ per fault, for the summary

    def _onset(self, fault: dict[str, Any]) -> float | None:
        """The fault's symptom onset as a UNIX time (event time), or None before it started."""
        onset, epoch = symptom_onset(fault), self.sim.get("epoch")
        return None if onset is None or epoch is None else float(epoch) + onset

    def _matching_alerts(self, fault: dict[str, Any]) -> list[tuple[IncidentEvent, Any]]:
        """The fault's alerts (and their incidents) that started after its symptom onset."""
        onset = self._onset(fault)
        if onset is None:
            return []
        # a GPU's kernel log reaches ClusterMedic as its node's stream: the node's own alerts count too
        node = self.gpu_node.get(str(fault["entity"])) if fault.get("entity_kind") == "gpu" else None
        return [
            (incident, alert)
            for incident in self.incidents.values()
            for alert in incident.alerts
            if alert.starts_at >= onset - 1
            and (points_at(fault, alert.entity, alert.labels) or (node is not None and alert.entity == node))
        ]

    def detected_after(self, fault: dict[str, Any]) -> float | None:
        """Simulated seconds from the fault's symptom onset to its first alert in an incident."""
        onset = self._onset(fault)
        starts = [a.starts_at for _, a in self._matching_alerts(fault)]
        return round(min(starts) - onset, 1) if starts and onset is not None else None

    def incidents_of(self, fault: dict[str, Any]) -> list[str]:
        """The incidents holding the fault's alerts, its own first (the one with its earliest alert)."""
        first: dict[str, float] = {}
        for incident, alert in self._matching_alerts(fault):
            first[incident.incident_id] = min(first.get(incident.incident_id, alert.starts_at), alert.starts_at)
        return sorted(first, key=lambda i: (first[i], i))

    def recovered_after(self, fault: dict[str, Any]) -> float | None:
        """Simulated seconds from onset until the SLO score is back after a successful run.

        Back: within 0.02 of its mean over the 120 s before the onset. A fault the simulator records
        as repaired counts from its repair.
        """
        started = fault.get("started_at")
        if started is None:
            return None
        if fault.get("resolved_at") is not None and fault.get("resolved_by") not in ("expired", "no_target"):
            return float(fault["resolved_at"]) - float(started)  # an action repaired it
        done = [r.succeeded_at for r in self._acted(self.incidents_of(fault)) if r.succeeded_at is not None]
        if not done:
            return None
        before = [s for t, s in self.scores if started - 120 <= t < started]
        baseline = sum(before) / len(before) if before else 1.0
        back = [t for t, s in self.scores if t >= min(done) and s >= baseline - 0.02]
        return round(min(back) - float(started), 1) if back else None

    def diagnosis_for(self, fault: dict[str, Any]) -> str:
        """The root cause ClusterMedic acted on for the fault's own incident, with its confidence.

        That is the latest diagnosis proposing the playbook of the incident's best run (succeeded
        first, see :data:`RUN_RANK`, the latest success of several); without a run, the latest diagnosis.
        """
        for incident_id in self.incidents_of(fault):
            log = [d for d in self.diagnosis_log.get(incident_id, []) if d.hypotheses]
            if not log:
                continue
            runs = sorted(  # best outcome first; of two that succeeded, the later one (it ended the fault)
                self._acted([incident_id]), key=lambda r: (RUN_RANK.get(r.status, 9), -(r.succeeded_at or 0.0))
            )
            acted = [d for d in log if runs and d.proposed_playbook == runs[0].playbook]
            top = (acted or log)[-1].hypotheses[0]
            return f"{top.cause} ({top.confidence:.0%})"
        return "-"

    def run_for(self, fault: dict[str, Any]) -> str:
        """The remediations of the fault's incidents that did something, best outcome first."""
        runs = sorted(self._acted(self.incidents_of(fault)), key=lambda r: RUN_RANK.get(r.status, 9))
        shown = list(dict.fromkeys(f"{r.playbook} (L{r.level}): {r.status}" for r in runs))
        return "; ".join(shown[:3]) or "-"

    def paged(self, fault: dict[str, Any]) -> bool:
        """Whether the fault's incident was handed to a human (a level-3 run)."""
        return any(r.status == "paged" for r in self._acted(self.incidents_of(fault)))

    def _acted(self, incidents: list[str]) -> list[RunView]:
        """The runs of these incidents that did something (not blocked), in the order they were seen."""
        wanted = set(incidents)
        return [r for r in self.runs.values() if r.incident_id in wanted and r.status not in ("blocked", "")]

    def slo_impact(self, fault: dict[str, Any]) -> str:
        """The lowest SLO score while the fault was active."""
        started, ended = fault.get("started_at"), fault.get("resolved_at")
        if started is None:
            return "-"
        window = [s for t, s in self.scores if t >= started and (ended is None or t <= ended)]
        return f"min score {min(window):.2f}" if window else "-"

    # ------------------------------------------------------------------ drawing

    def render(self) -> Group:
        """The whole view."""
        with self.lock:
            now = time.monotonic()
            old = next(((t, n) for t, n in self.rate if now - t <= 10), None)
            rate = (self.samples - old[1]) / max(0.5, now - old[0]) if old else 0.0
            t = float(self.sim.get("t", 0.0))
            head = Text(
                f"simulated t={t:6.0f} s   speed {self.sim.get('speed', 0):g}x   "
                f"telemetry {rate:8.0f} samples/s   {self.log_lines} log lines   {self.kube_events} k8s events",
                style="bold",
            )
            spark = "".join(SPARK[min(7, int(s * 7.99))] for _, s in list(self.scores)[-60:])
            score = self.scores[-1][1] if self.scores else 1.0
            slo = Text(f"SLO score {score:.2f}  {spark}", style="green" if score >= 0.9 else "red")

            anomalies = Table("t", "entity", "signal", "detector", "sev", title="anomalies", expand=True)
            epoch = float(self.sim.get("epoch", 0.0))
            for a in self.anomalies[-6:]:
                anomalies.add_row(f"{a.ts - epoch:.0f}", a.entity[:28], a.signal, a.detector, a.severity)
            incidents = Table("incident", "title", "status", "alerts", title="incidents", expand=True)
            for i in list(self.incidents.values())[-5:]:
                incidents.add_row(i.incident_id[:12], i.title[:48], i.kind, str(len(i.alerts)))
            diagnoses = Table("incident", "root cause", "evidence", "action", title="diagnoses", expand=True)
            for d in list(self.diagnoses.values())[-4:]:
                top = d.hypotheses[0] if d.hypotheses else None
                evidence = "; ".join(top.evidence[:2]) if top else ""
                action = f"{d.proposed_playbook} L{d.level}" if d.proposed_playbook else ("; ".join(d.notes) or "-")
                cause = f"{top.cause} {top.confidence:.0%}" if top else "-"
                diagnoses.add_row(d.incident_id[:12], cause, evidence[:60], action[:50])
            runs = Table("run", "playbook", "L", "status", "last step", title="remediation", expand=True)
            for r in list(self.runs.values())[-5:]:
                runs.add_row(r.run_id[-10:], r.playbook, str(r.level), r.status, (r.steps[-1] if r.steps else "")[:70])
            notes = Text("\n".join(self.notes), style="cyan")
        return Group(head, slo, anomalies, incidents, diagnoses, runs, Panel(notes, title="demo"))
