"""Every stored fact about one incident, read from PostgreSQL with the owning roles' readers.

A report states only what the pipeline stored: the incident and its linked alerts (correlate,
``services/store/incidents.py``), the anomaly history of those alerts (correlate,
``services/store/anomalies.py``), the diagnoses (the diagnostician, migrations 0003/0006/0009), and each
remediation run with its steps, approval and audit entries (``services/remediation/store.py``). Where a
role has a reader it is used; the two lists no role reads back yet (an incident's diagnoses, an
incident's run ids) are read here with parametrised SQL.

Times are UNIX seconds on the incident's own clock (event time), as the stores keep them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter

from services.core.events import Hypothesis
from services.core.settings import Settings
from services.remediation.store import ApprovalRow, RunRow, RunStore, StepRow
from services.reports.errors import IncidentNotFound
from services.store.anomalies import AnomalyRow, list_anomalies
from services.store.db import connect
from services.store.incidents import AlertRow, IncidentRow, get_incident

ANOMALIES_PER_ALERT = 1000
"""Most anomaly-history rows read per alert (newest first): a flapping alert cannot make a report unbounded."""
RUNS_PER_INCIDENT = 100
"""Most remediation runs read per incident."""
DIAGNOSES_PER_INCIDENT = 200
"""Most diagnoses read per incident (every update is re-diagnosed; the latest are kept)."""

_HYPOTHESES = TypeAdapter(tuple[Hypothesis, ...])


@dataclass(frozen=True)
class DiagnosisFact:
    """One stored diagnosis.

    Attributes:
        id: the ``diagnoses`` row id.
        at: when it was made, event time (``diagnosed_at``); a row from before migration 0009 has only the
            database's wall time (``created_at``), and then ``event_time`` is False.
        event_time: whether ``at`` is on the incident's clock.
    """

    id: int
    incident_id: str
    diagnostician: str
    hypotheses: tuple[Hypothesis, ...]
    proposed_playbook: str | None
    proposed_params: dict[str, Any]
    level: int | None
    notes: tuple[str, ...]
    at: float
    event_time: bool


@dataclass(frozen=True)
class RunFacts:
    """One remediation run with what was recorded about it."""

    run: RunRow
    steps: tuple[StepRow, ...]
    approval: ApprovalRow | None
    audit: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class IncidentFacts:
    """Everything stored about one incident.

    Attributes:
        incident: the incident row, with its linked alerts.
        anomalies: the history rows of its alerts' fingerprints, oldest first.
        diagnoses: oldest first.
        runs: oldest first.
        nearby: other incidents' runs created while this one was open (give or take the report's margins),
            oldest first: the report keeps those that touched the same nodes, pods, GPUs or models, since
            their actions show in this incident's telemetry too.
        truncated: which lists hit their bound (the report says so).
    """

    incident: IncidentRow
    anomalies: tuple[AnomalyRow, ...] = ()
    diagnoses: tuple[DiagnosisFact, ...] = ()
    runs: tuple[RunFacts, ...] = ()
    nearby: tuple[RunFacts, ...] = ()
    truncated: tuple[str, ...] = field(default=())

    @property
    def alerts(self) -> tuple[AlertRow, ...]:
        """The incident's linked alerts, oldest start first."""
        return self.incident.alerts


def load_facts(settings: Settings, incident_id: str) -> IncidentFacts:
    """Read every stored fact about ``incident_id``.

    Raises:
        IncidentNotFound: no such incident is stored.
        InfraNotReady: PostgreSQL is unreachable.
        StoreError: a remediation query failed.
    """
    truncated: list[str] = []
    with connect(settings) as conn:
        incident = get_incident(conn, incident_id)
        if incident is None:
            raise IncidentNotFound(incident_id)
        anomalies: list[AnomalyRow] = []
        for fingerprint in dict.fromkeys(a.fingerprint for a in incident.alerts):
            rows = list_anomalies(conn, fingerprint=fingerprint, limit=ANOMALIES_PER_ALERT)
            if len(rows) >= ANOMALIES_PER_ALERT:
                truncated.append(f"anomaly history of alert {fingerprint} (the newest {ANOMALIES_PER_ALERT} rows)")
            anomalies.extend(rows)
        diagnoses = _diagnoses(conn, incident_id)
        if len(diagnoses) >= DIAGNOSES_PER_INCIDENT:
            truncated.append(f"diagnoses (the newest {DIAGNOSES_PER_INCIDENT})")
        run_ids = [
            str(r[0])
            for r in conn.execute(
                "SELECT run_id FROM remediation_runs WHERE incident_id = %s ORDER BY created_at, run_id LIMIT %s",
                (incident_id, RUNS_PER_INCIDENT),
            ).fetchall()
        ]
        end = incident.resolved_at or incident.updated_at
        nearby_ids = [
            str(r[0])
            for r in conn.execute(
                "SELECT run_id FROM remediation_runs WHERE incident_id <> %s"
                " AND created_at BETWEEN %s - interval '10 minutes' AND %s + interval '5 minutes'"
                " ORDER BY created_at, run_id LIMIT %s",
                (incident_id, incident.opened_at, end, RUNS_PER_INCIDENT),
            ).fetchall()
        ]
        conn.rollback()
    if len(run_ids) >= RUNS_PER_INCIDENT:
        truncated.append(f"remediation runs (the first {RUNS_PER_INCIDENT})")
    runs: list[RunFacts] = []
    nearby: list[RunFacts] = []
    if run_ids or nearby_ids:
        store = RunStore(settings)
        try:
            runs = _runs(store, run_ids)
            nearby = _runs(store, nearby_ids, audit=False)
        finally:
            store.close()
    anomalies.sort(key=lambda a: (a.ts, a.fingerprint))
    return IncidentFacts(
        incident=incident,
        anomalies=tuple(anomalies),
        diagnoses=tuple(diagnoses),
        runs=tuple(runs),
        nearby=tuple(nearby),
        truncated=tuple(truncated),
    )


def _runs(store: RunStore, run_ids: list[str], *, audit: bool = True) -> list[RunFacts]:
    out: list[RunFacts] = []
    for run_id in run_ids:
        run = store.get_run(run_id)
        if run is None:  # deleted between the two reads
            continue
        out.append(
            RunFacts(
                run=run,
                steps=tuple(store.steps(run_id)),
                approval=store.get_approval(run_id),
                audit=tuple(store.audit_log(run_id)) if audit else (),
            )
        )
    return out


def _diagnoses(conn: Any, incident_id: str) -> list[DiagnosisFact]:
    rows = conn.execute(
        "SELECT id, incident_id, diagnostician, hypotheses, proposed_playbook, proposed_params, level, notes,"
        " extract(epoch FROM coalesce(diagnosed_at, created_at)), diagnosed_at IS NOT NULL"
        " FROM diagnoses WHERE incident_id = %s ORDER BY id DESC LIMIT %s",
        (incident_id, DIAGNOSES_PER_INCIDENT),
    ).fetchall()
    out = [
        DiagnosisFact(
            id=int(r[0]),
            incident_id=str(r[1]),
            diagnostician=str(r[2]),
            hypotheses=_HYPOTHESES.validate_python(r[3] or []),
            proposed_playbook=r[4],
            proposed_params=dict(r[5] or {}),
            level=r[6],
            notes=tuple(r[7] or ()),
            at=float(r[8]),
            event_time=bool(r[9]),
        )
        for r in rows
    ]
    out.sort(key=lambda d: (d.at, d.id))
    return out
