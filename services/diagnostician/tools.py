"""Evidence tools: what the diagnosticians know about an incident, each as a plugin returning a ToolResult.

Like HolmesGPT's toolsets, a tool returns a typed result (``ok`` with data, ``no_data``, or ``error``
with a message) and never raises: one broken source (the database is down, an alert carries odd
evidence) must not stop a diagnosis that the other tools can still support.

Tools read the incident's alerts (``AlertRef.evidence`` holds what each detector saw) and, when a
connection is given, the ``anomalies`` table: every anomaly the correlate role consumed, keyed by its
alert's fingerprint and time (``services/store/anomalies.py``; firing occurrences only are read).
:func:`gather_evidence` runs every registered tool and condenses the results
(:func:`services.diagnostician.evidence.condense`) into an
:class:`~services.diagnostician.evidence.Evidence`, the input of both diagnosticians; the evidence
model, and the ways of reading an alert that tools and condensing share, live there.

Registered tools (one line each in :data:`TOOLS`)::

    incident_anomalies   the incident's anomalies and their features
    metric_windows       metric values and windows the detectors recorded, by entity
    log_events           top log templates (with an example line) and Kubernetes events
    topology             neighbours: the nodes, GPUs, pods and models the alerts touch
    recent_changes       rollouts and scaling changes near the incident (alerts, stored anomalies and
                         the Deployment change log, when one is given)
"""

from __future__ import annotations

import logging
import re
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import psycopg

from services.core.events import IncidentEvent, KubeEvent
from services.core.registry import Registry
from services.diagnostician.evidence import (
    ANOMALIES_TOOL,
    Evidence,
    ToolResult,
    alert_record,
    condense,
    event_reason,
    firing_alerts,
    incident_deployments,
    is_number,
    metric_items,
    no_data,
    topology_of,
)

log = logging.getLogger(__name__)

CHANGE_REASONS = frozenset({"ScalingReplicaSet", "SuccessfulCreate", "RollingUpdate", "Rollout", "DeploymentRollback"})
CHANGE_SIGNALS = frozenset({"latency_regression", "revision_regression"})
LOG_DETECTORS = frozenset({"log_templates", "logtemplates"})
EVENT_DETECTORS = frozenset({"kube_events", "k8s_events", "events"})
# The deployment controller's event when it scales a ReplicaSet ("Scaled up replica set web-5d4f8c7b9 to 1",
# newer releases "... from 0 to 1").
_SCALED_REPLICA_SET = re.compile(r"Scaled (?P<direction>up|down) replica set (?P<replica_set>[\w.-]+)")
# How long before an incident's first alert a rollout of one of its deployments counts as a suspect.
CHANGE_LOOKBACK_S = 900.0


@dataclass(frozen=True)
class Change:
    """One change the deployment controller recorded.

    Attributes:
        ts: UNIX time of the event.
        deployment: the Deployment's name.
        replica_set: the ReplicaSet it scaled.
        kind: ``rollout`` when a ReplicaSet other than the deployment's current one was scaled up (a new
            pod template: image, arguments, variant), ``scale`` for a replica count change.
        message: the event's message.
    """

    ts: float
    deployment: str
    replica_set: str
    kind: Literal["rollout", "scale"]
    message: str


class ChangeLog:
    """Deployment changes from the Kubernetes event stream (what ``kubectl get events`` and
    ``kubectl rollout history`` show), for the ``recent_changes`` tool.

    A rollout is the deployment controller scaling up a ReplicaSet that is not the deployment's current
    one: Kubernetes creates a new ReplicaSet whenever the pod template changes, and only then.

    Args:
        replica_sets: each deployment's current ReplicaSet when the log starts (``kubectl get rs``);
            without it a deployment's first scale-up cannot be told from a rollout and counts as a scale.
        horizon_s: changes older than this (before the newest one) are forgotten.
    """

    def __init__(self, replica_sets: Mapping[str, str] | None = None, horizon_s: float = 3600.0) -> None:
        self.current: dict[str, str] = dict(replica_sets or {})
        self.horizon_s = horizon_s
        self.changes: list[Change] = []

    def observe(self, event: KubeEvent) -> Change | None:
        """Record a Deployment's ScalingReplicaSet event; other events are ignored (None)."""
        if event.involved_object.kind != "Deployment" or event.reason != "ScalingReplicaSet":
            return None
        match = _SCALED_REPLICA_SET.search(event.message)
        if match is None:
            return None
        deployment, replica_set = event.involved_object.name, match.group("replica_set")
        known = self.current.get(deployment)
        kind: Literal["rollout", "scale"] = "scale"
        if match.group("direction") == "up":
            if known is not None and known != replica_set:
                kind = "rollout"
            self.current[deployment] = replica_set
        change = Change(event.ts, deployment, replica_set, kind, event.message[:300])
        self.changes.append(change)
        self.changes = [c for c in self.changes if c.ts >= change.ts - self.horizon_s]
        return change

    def between(self, deployments: Iterable[str], start: float, end: float) -> list[Change]:
        """Changes of these deployments with ``start <= ts <= end``, oldest first."""
        wanted = set(deployments)
        return [c for c in self.changes if c.deployment in wanted and start <= c.ts <= end]


@dataclass
class ToolContext:
    """What a tool may read: the incident and, optionally, a database connection and a change log."""

    incident: IncidentEvent
    conn: psycopg.Connection | None = None
    lookback_s: float = 3600.0
    changes: ChangeLog | None = None


class EvidenceTool(ABC):
    """A source of evidence about an incident.

    Contract: :meth:`run` never raises; subclasses implement :meth:`collect`, which may raise, and
    return ``None`` (or an empty value) when there is nothing to report.
    """

    name: str = "tool"
    description: str = ""

    def run(self, ctx: ToolContext) -> ToolResult:
        """Collect evidence; failures become ``status='error'`` results."""
        try:
            data = self.collect(ctx)
        except Exception as exc:
            log.warning("diagnostic tool %s failed: %s", self.name, exc)
            if ctx.conn is not None and not ctx.conn.autocommit:
                try:
                    ctx.conn.rollback()
                except psycopg.Error:
                    pass
            return ToolResult(tool=self.name, status="error", error=f"{type(exc).__name__}: {exc}")
        if not data:
            return no_data(self.name)
        return ToolResult(tool=self.name, status="ok", data=data)

    @abstractmethod
    def collect(self, ctx: ToolContext) -> Any:
        """Return the findings (JSON-serialisable) or an empty value."""


class IncidentAnomaliesTool(EvidenceTool):
    """The incident's anomalies, one :func:`~services.diagnostician.evidence.alert_record` per alert (what
    :func:`~services.diagnostician.evidence.condense` reads), plus their stored occurrences."""

    name = ANOMALIES_TOOL
    description = "anomalies behind the incident's alerts, with the features each detector recorded"

    def collect(self, ctx: ToolContext) -> Any:
        out = [alert_record(a) for a in ctx.incident.alerts]
        if ctx.conn is not None and ctx.incident.alerts:
            prints = [a.fingerprint for a in ctx.incident.alerts]
            rows = ctx.conn.execute(
                "SELECT fingerprint, count(*), max(score), max(ts) FROM anomalies"
                " WHERE fingerprint = ANY(%s) AND status = 'firing' GROUP BY fingerprint",
                (prints,),
            ).fetchall()
            if not ctx.conn.autocommit:
                ctx.conn.rollback()
            stored = {row[0]: {"occurrences": int(row[1]), "max_score": row[2]} for row in rows}
            for item, alert in zip(out, ctx.incident.alerts, strict=True):
                if alert.fingerprint in stored:
                    item["history"] = stored[alert.fingerprint]
        return out


class MetricWindowsTool(EvidenceTool):
    """Metric values and windows the detectors put in alert evidence, grouped by entity."""

    name = "metric_windows"
    description = "recent metric values (and windows) of the incident's entities"

    def collect(self, ctx: ToolContext) -> Any:
        by_entity: dict[str, dict[str, Any]] = {}
        for alert in firing_alerts(ctx.incident.alerts):
            metrics = by_entity.setdefault(alert.entity, {})
            for key, value in metric_items(alert.evidence):
                metrics[key] = value
        return {entity: metrics for entity, metrics in by_entity.items() if metrics}


class LogEventsTool(EvidenceTool):
    """Top log templates (count, an example line) and Kubernetes events among the incident's alerts."""

    name = "log_events"
    description = "top log templates with an example line, and Kubernetes events (reason, message)"

    def collect(self, ctx: ToolContext) -> Any:
        templates: Counter[str] = Counter()
        examples: dict[str, str] = {}
        events: Counter[str] = Counter()
        messages: dict[str, str] = {}
        for alert in ctx.incident.alerts:
            ev = alert.evidence
            template = ev.get("template")
            if isinstance(template, str) and (alert.detector in LOG_DETECTORS or template):
                templates[template] += int(ev.get("count", 1)) if is_number(ev.get("count", 1)) else 1
                if isinstance(ev.get("example"), str):
                    examples.setdefault(template, ev["example"])
            reason = event_reason(alert)
            if reason:
                events[reason] += int(ev.get("count", 1)) if is_number(ev.get("count", 1)) else 1
                message = ev.get("message") or (ev.get("event") or {}).get("message", "")
                if isinstance(message, str) and message:
                    messages.setdefault(reason, message)
        if not templates and not events:
            return None
        return {
            "templates": [
                {"template": t, "count": n, "example": examples.get(t, "")} for t, n in templates.most_common(10)
            ],
            "events": [{"reason": r, "count": n, "message": messages.get(r, "")} for r, n in events.most_common(10)],
        }


class TopologyTool(EvidenceTool):
    """The nodes, GPUs, pods and models the alerts touch, and which alerts share each of them."""

    name = "topology"
    description = "topology neighbours (node, GPU, pod, model) of the incident's entities"

    def collect(self, ctx: ToolContext) -> Any:
        values: dict[str, Counter[str]] = {}
        for labels in [ctx.incident.labels, *(a.labels for a in ctx.incident.alerts)]:
            for key, value in topology_of(labels).items():
                values.setdefault(key, Counter())[value] += 1
        out: dict[str, Any] = {key: sorted(counter) for key, counter in values.items()}
        if ctx.conn is not None and values.get("node"):
            nodes = sorted(values["node"])
            since = datetime.fromtimestamp(ctx.incident.opened_at - ctx.lookback_s, UTC)
            rows = ctx.conn.execute(
                "SELECT entity, signal, min(provenance->>'source') FROM anomalies"
                " WHERE ts >= %s AND status = 'firing'"
                " AND (labels->>'node' = ANY(%s) OR labels->>'Hostname' = ANY(%s))"
                " GROUP BY entity, signal ORDER BY entity, signal LIMIT 50",
                (since, nodes, nodes),
            ).fetchall()
            if not ctx.conn.autocommit:
                ctx.conn.rollback()
            own = {(a.entity, a.signal) for a in ctx.incident.alerts}
            neighbours = [
                {"entity": r[0], "signal": r[1], "source": r[2] or "unknown"} for r in rows if (r[0], r[1]) not in own
            ]
            if neighbours:
                out["neighbour_anomalies"] = neighbours
        return out


class RecentChangesTool(EvidenceTool):
    """Rollouts and scaling near the incident: latency-regression alerts, rollout-type events, and the
    change log's rollouts of the incident's deployments shortly before its first alert."""

    name = "recent_changes"
    description = "recent changes: rollouts (latency_regression, ScalingReplicaSet events, Deployment changes)"

    def collect(self, ctx: ToolContext) -> Any:
        changes = [
            {"entity": a.entity, "signal": a.signal, "reason": event_reason(a), "at": a.starts_at}
            for a in ctx.incident.alerts
            if a.signal in CHANGE_SIGNALS or event_reason(a) in CHANGE_REASONS
        ]
        if ctx.changes is not None and ctx.incident.alerts:
            starts = [a.starts_at for a in ctx.incident.alerts]
            deployments = incident_deployments(ctx.incident.alerts)
            changes.extend(
                {
                    "entity": c.deployment,
                    "signal": "",
                    "reason": "ScalingReplicaSet",
                    "at": c.ts,
                    "kind": c.kind,
                    "replica_set": c.replica_set,
                    "message": c.message,
                }
                for c in ctx.changes.between(deployments, min(starts) - CHANGE_LOOKBACK_S, max(starts))
            )
        if ctx.conn is not None:
            since = datetime.fromtimestamp(ctx.incident.opened_at - ctx.lookback_s, UTC)
            rows = ctx.conn.execute(
                "SELECT entity, signal, evidence->>'reason', extract(epoch FROM ts), provenance->>'source'"
                " FROM anomalies WHERE ts >= %s AND status = 'firing'"
                " AND (signal = ANY(%s) OR evidence->>'reason' = ANY(%s))"
                " ORDER BY ts DESC LIMIT 20",
                (since, sorted(CHANGE_SIGNALS), sorted(CHANGE_REASONS)),
            ).fetchall()
            if not ctx.conn.autocommit:
                ctx.conn.rollback()
            seen = {(c["entity"], c["signal"]) for c in changes}
            for r in rows:  # newest first: one entry per entity and signal, at its latest occurrence
                if (r[0], r[1]) not in seen:
                    seen.add((r[0], r[1]))
                    changes.append(
                        {
                            "entity": r[0],
                            "signal": r[1],
                            "reason": r[2] or "",
                            "at": float(r[3]),
                            "source": r[4] or "unknown",
                        }
                    )
        return changes


TOOLS: Registry[type[EvidenceTool]] = Registry(
    "diagnostic tool",
    {
        "incident_anomalies": "services.diagnostician.tools:IncidentAnomaliesTool",
        "metric_windows": "services.diagnostician.tools:MetricWindowsTool",
        "log_events": "services.diagnostician.tools:LogEventsTool",
        "topology": "services.diagnostician.tools:TopologyTool",
        "recent_changes": "services.diagnostician.tools:RecentChangesTool",
    },
    base=EvidenceTool,
)


def gather_evidence(
    incident: IncidentEvent,
    conn: psycopg.Connection | None = None,
    tools: Iterable[str] | None = None,
    changes: ChangeLog | None = None,
) -> Evidence:
    """Run the tools (default: all registered) and condense their results."""
    ctx = ToolContext(incident=incident, conn=conn, changes=changes)
    results: dict[str, ToolResult] = {}
    for name in tools if tools is not None else TOOLS.names():
        try:
            tool = TOOLS.load(name)()
        except Exception as exc:
            results[name] = ToolResult(tool=name, status="error", error=str(exc))
            continue
        results[name] = tool.run(ctx)
    return condense(incident, results)
