"""Evidence tools: what the diagnosticians know about an incident, each as a plugin returning a ToolResult.

Like HolmesGPT's toolsets, a tool returns a typed result (``ok`` with data, ``no_data``, or ``error``
with a message) and never raises: one broken source (the database is down, an alert carries odd
evidence) must not stop a diagnosis that the other tools can still support.

Tools read the incident's alerts (``AlertRef.evidence`` holds what each detector saw) and, when a
connection is given, the ``anomalies`` table: every anomaly the correlate role consumed, keyed by its
alert's fingerprint and time (``services/store/anomalies.py``; firing occurrences only are read).
:func:`gather_evidence` runs every registered tool and condenses the results into an :class:`Evidence`,
the input of both diagnosticians.

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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import psycopg
from pydantic import BaseModel, ConfigDict

from services.core.events import FACT_GPU_FAULT, AlertRef, IncidentEvent, KubeEvent
from services.core.features import FEATURES
from services.core.registry import Registry
from services.diagnostician.runbooks import METRIC_NAME

log = logging.getLogger(__name__)

TOPOLOGY_LABELS: tuple[str, ...] = ("cluster", "node", "gpu", "pod", "model", "namespace", "deployment")
_NODE_LABELS = ("node", "Hostname", "hostname", "instance")
_GPU_LABELS = ("gpu", "UUID", "gpu_uuid")
CHANGE_REASONS = frozenset({"ScalingReplicaSet", "SuccessfulCreate", "RollingUpdate", "Rollout", "DeploymentRollback"})
CHANGE_SIGNALS = frozenset({"latency_regression", "revision_regression"})
LOG_DETECTORS = frozenset({"log_templates", "logtemplates"})
EVENT_DETECTORS = frozenset({"kube_events", "k8s_events", "events"})
_XID_IN_LINE = re.compile(r"Xid \((?:PCI:)?[^)]{0,40}\): (\d{1,4})(?!\d)")
# XID text however it is quoted (JSON-escaped, mid-line): never a GPU fault outside a trusted GPU source.
_XID_TEXT = re.compile(r"NVRM:\s{0,8}Xid|\bXid\s{0,8}\(\s{0,8}(?:PCI:)?[0-9a-fA-F]{2,8}:", re.IGNORECASE)
# Signals that state a GPU fault (XID, ECC, NVLink, fell off the bus): believed only from an alert whose
# provenance is trusted for GPU faults (a DCGM or NVML metric, the node's kernel log).
GPU_FAULT_SIGNALS = frozenset(
    {
        "gpu_xid",
        "ecc_sbe_rate",
        "ecc_dbe",
        "row_remap_pending",
        "row_remap_failure",
        "nvlink_errors",
        "gpu_fallen_off_bus",
    }
)
# How a note names a source that is not trusted for GPU faults.
SOURCE_DESCRIPTIONS: dict[str, str] = {
    "app_log": "an application log",
    "alertmanager_webhook": "an alert from the Alertmanager webhook",
    "kube_api": "a Kubernetes event",
    "prometheus": "a metric that is not a GPU exporter's",
    "detector": "a learned detector's finding",
}
XID_TEXT_NOTE = "XID text in an application log; not a trusted source"
"""The note a diagnosis carries when an application log quoted an XID (issue 13's acceptance sentence)."""
# The deployment controller's event when it scales a ReplicaSet ("Scaled up replica set web-5d4f8c7b9 to 1",
# newer releases "... from 0 to 1").
_SCALED_REPLICA_SET = re.compile(r"Scaled (?P<direction>up|down) replica set (?P<replica_set>[\w.-]+)")
# How long before an incident's first alert a rollout of one of its deployments counts as a suspect.
CHANGE_LOOKBACK_S = 900.0

# Learned detectors (iforest, lstm) report which features deviated (``top_deviations``, z-scores, or
# ``window_drift``). A deviation in the direction a failure pushes a feature is evidence of the metric
# behind it: a GPU running hot, filling its memory, or a pod's queue growing. Features, their metric and
# their harmful direction are declared in services.core.features.
FEATURE_METRICS: dict[str, tuple[str, int]] = {f.name: (f.metric, f.harmful) for f in FEATURES if f.harmful}
DEVIATION_Z = 2.0
# Evidence keys the rule detectors use for the metric they measured (rules_serving, rules_gpu, slo_burn).
EVIDENCE_KEY_METRICS: dict[str, str] = {
    "kv_cache_usage": "vllm:kv_cache_usage_perc",
    "waiting": "vllm:num_requests_waiting",
    "preemptions_in_window": "vllm:num_preemptions_total",
    "error_ratio": "vllm:request_success_total",
    "used_mib": "DCGM_FI_DEV_FB_USED",
}
# Latency findings (rules_serving's latency_regression, rules_revision's revision_regression) name which
# latency regressed under ``slower``.
SLOWER_METRICS: dict[str, str] = {
    "ttft": "vllm:time_to_first_token_seconds",
    "tpot": "vllm:inter_token_latency_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
}
# A latency finding also records the load it was judged against (queue, running requests) to show the
# load does not explain it: that context is not a metric gone wrong.
LOAD_CONTEXT_KEYS = frozenset({"waiting", "running"})
# Detector signal names that runbooks know under another name.
SIGNAL_ALIASES: dict[str, str] = {"vram_pressure": "vram_leak", "log_rare_template": "log_new_template"}


class ToolResult(BaseModel):
    """What a tool found.

    Attributes:
        tool: the tool's registry name.
        status: ``ok`` (data holds the findings), ``no_data`` (nothing relevant) or ``error``.
        data: the findings, JSON-serialisable.
        error: what went wrong, for ``error``.
    """

    model_config = ConfigDict(frozen=True)

    tool: str
    status: Literal["ok", "error", "no_data"]
    data: Any = None
    error: str = ""


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
            return ToolResult(tool=self.name, status="no_data")
        return ToolResult(tool=self.name, status="ok", data=data)

    @abstractmethod
    def collect(self, ctx: ToolContext) -> Any:
        """Return the findings (JSON-serialisable) or an empty value."""


def _firing(incident: IncidentEvent) -> tuple[AlertRef, ...]:
    firing = tuple(a for a in incident.alerts if a.status == "firing")
    return firing or incident.alerts


def _scalar(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class IncidentAnomaliesTool(EvidenceTool):
    """The incident's anomalies (one per alert) with their detector features, plus stored occurrences."""

    name = "incident_anomalies"
    description = "anomalies behind the incident's alerts, with the features each detector recorded"

    def collect(self, ctx: ToolContext) -> Any:
        out: list[dict[str, Any]] = [
            {
                "entity": a.entity,
                "signal": a.signal,
                "detector": a.detector,
                "severity": a.severity,
                "status": a.status,
                "starts_at": a.starts_at,
                "labels": dict(a.labels),
                "features": dict(a.evidence),
            }
            for a in ctx.incident.alerts
        ]
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
        for alert in _firing(ctx.incident):
            metrics = by_entity.setdefault(alert.entity, {})
            for key, value in _metric_items(alert.evidence):
                metrics[key] = value
        return {entity: metrics for entity, metrics in by_entity.items() if metrics}


def _metric_items(evidence: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    for key, value in evidence.items():
        if key in ("metrics", "window", "windows") and isinstance(value, Mapping):
            for name, inner in value.items():
                if _scalar(inner) or (isinstance(inner, list) and all(_scalar(x) for x in inner[:100])):
                    yield str(name), inner[-60:] if isinstance(inner, list) else inner
        elif key == "metric" and isinstance(value, str):
            yield value, evidence.get("value")
        elif METRIC_NAME.match(key) and (_scalar(value) or isinstance(value, list)):
            yield key, value
        elif _scalar(value) and key not in ("score", "threshold", "since", "samples", "template_id", "count"):
            yield key, value


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
                templates[template] += int(ev.get("count", 1)) if _scalar(ev.get("count", 1)) else 1
                if isinstance(ev.get("example"), str):
                    examples.setdefault(template, ev["example"])
            reason = _event_reason(alert)
            if reason:
                events[reason] += int(ev.get("count", 1)) if _scalar(ev.get("count", 1)) else 1
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


def _event_reason(alert: AlertRef) -> str:
    ev = alert.evidence
    for candidate in (ev.get("reason"), ev.get("event_reason"), (ev.get("event") or {}).get("reason")):
        if isinstance(candidate, str) and candidate:
            return candidate
    return ""


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


def topology_of(labels: Mapping[str, str]) -> dict[str, str]:
    """The topology labels of an alert (cluster, node, gpu, pod, model...), DCGM's Hostname/UUID folded in."""
    out: dict[str, str] = {}
    for key in TOPOLOGY_LABELS:
        if labels.get(key):
            out[key] = labels[key]
    for key in _NODE_LABELS:
        if labels.get(key) and "node" not in out:
            out["node"] = labels[key]
    for key in _GPU_LABELS:
        if labels.get(key) and "gpu" not in out:
            out["gpu"] = labels[key]
    return out


class RecentChangesTool(EvidenceTool):
    """Rollouts and scaling near the incident: latency-regression alerts, rollout-type events, and the
    change log's rollouts of the incident's deployments shortly before its first alert."""

    name = "recent_changes"
    description = "recent changes: rollouts (latency_regression, ScalingReplicaSet events, Deployment changes)"

    def collect(self, ctx: ToolContext) -> Any:
        changes = [
            {"entity": a.entity, "signal": a.signal, "reason": _event_reason(a), "at": a.starts_at}
            for a in ctx.incident.alerts
            if a.signal in CHANGE_SIGNALS or _event_reason(a) in CHANGE_REASONS
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


# ----------------------------------------------------------------------------------- condensed


@dataclass
class Evidence:
    """The evidence about one incident, condensed for matching against runbook signals.

    Attributes:
        incident: the incident.
        signals: anomaly signal names of the alerts.
        metrics: metric names seen in alert evidence.
        xids: XID codes.
        event_reasons: Kubernetes event reasons.
        scope: the blast radius of the replicas the alerts name (see :func:`blast_radius`), empty when
            it says nothing.
        log_lines: log templates and example lines (untrusted text).
        untrusted: claims the evidence makes that come from a source not trusted for them (an XID quoted
            in an application log), each as a sentence saying why it was not believed.
        facts: short human-readable statements a hypothesis can cite.
        results: every tool's raw result, by tool name.
    """

    incident: IncidentEvent
    signals: set[str] = field(default_factory=set)
    metrics: set[str] = field(default_factory=set)
    xids: set[int] = field(default_factory=set)
    event_reasons: set[str] = field(default_factory=set)
    scope: set[str] = field(default_factory=set)
    log_lines: list[str] = field(default_factory=list)
    untrusted: list[str] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)
    results: dict[str, ToolResult] = field(default_factory=dict)

    def query_text(self) -> str:
        """A retrieval query built from the evidence: title, signals, XIDs, reasons, metric names, logs."""
        parts = [self.incident.title]
        parts.extend(sorted(s.replace("_", " ") for s in self.signals))
        parts.extend(f"XID {code}" for code in sorted(self.xids))
        parts.extend(sorted(self.event_reasons))
        parts.extend(sorted(self.metrics)[:10])
        parts.extend(line[:200] for line in self.log_lines[:5])
        return "\n".join(p for p in parts if p)


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


def condense(incident: IncidentEvent, results: Mapping[str, ToolResult]) -> Evidence:
    """Build :class:`Evidence` from the incident and tool results (alerts are read directly too)."""
    ev = Evidence(incident=incident, results=dict(results))
    for alert in _firing(incident):
        # The trust model (docs/security.md): GPU facts only from a source trusted for them.
        gpu_trusted = alert.provenance.trusts(FACT_GPU_FAULT)
        signal = SIGNAL_ALIASES.get(alert.signal, alert.signal)
        if signal in GPU_FAULT_SIGNALS and not gpu_trusted:
            _untrusted(ev, f"{signal} on {alert.entity} from {source_description(alert)}; not a trusted GPU source")
        else:
            ev.signals.add(signal)
        if alert.signal == "untrusted_xid_text":
            _untrusted(ev, xid_text_note(alert))
        facts = [f"{alert.signal} on {alert.entity} ({alert.detector}, {alert.severity})"]
        data = alert.evidence
        code: Any = data.get("xid")
        if _scalar(code) and int(code) > 0:
            if gpu_trusted:
                ev.xids.add(int(code))
                facts.append(f"XID {int(code)} on {alert.entity}")
            else:
                _untrusted(ev, f"XID {int(code)} claimed by {source_description(alert)}; not a trusted source")
        for key, value in _metric_items(data):
            if METRIC_NAME.match(key):
                ev.metrics.add(key)
                if _scalar(value):
                    facts.append(f"{key}={value:g} on {alert.entity}")
        slower = data.get("slower")
        for key, metric in EVIDENCE_KEY_METRICS.items():
            if _scalar(data.get(key)) and not (isinstance(slower, Mapping) and key in LOAD_CONTEXT_KEYS):
                ev.metrics.add(metric)
        if isinstance(slower, Mapping):
            for key in slower:
                if key in SLOWER_METRICS:
                    ev.metrics.add(SLOWER_METRICS[key])
                    facts.append(f"{key} latency regressed on {alert.entity}")
        sli = data.get("sli")
        if isinstance(sli, str) and METRIC_NAME.match(sli):
            ev.metrics.add(sli)
        for metric, fact in _deviating_metrics(data, alert.entity):
            ev.metrics.add(metric)
            facts.append(fact)
        reason = _event_reason(alert)
        if reason:
            ev.event_reasons.add(reason)
            facts.append(f"event {reason} on {alert.entity}")
        for key in ("template", "example", "line", "message"):
            text = data.get(key)
            if not isinstance(text, str) or not text:
                continue
            if not gpu_trusted and _XID_TEXT.search(text[:4096]):
                # kept out of the log lines too: a runbook's NVRM template must not match a quoted XID
                _untrusted(ev, xid_text_note(alert))
                continue
            ev.log_lines.append(text[:2000])
            if gpu_trusted:
                for match in _XID_IN_LINE.finditer(text[:4096]):
                    ev.xids.add(int(match.group(1)))
        for fact in facts:
            if fact not in ev.facts:
                ev.facts.append(fact)
    _condense_changes(ev, results.get("recent_changes"))
    _condense_flapping(ev)
    for deployment, hashes in sorted(replica_sets(incident.alerts).items()):
        if len(hashes) >= 2:
            # the event a Deployment records when it moves between ReplicaSets; kube_events does not
            # alert on Normal events, the pod names still show it
            ev.event_reasons.add("ScalingReplicaSet")
            ev.facts.append(f"pods of {len(hashes)} ReplicaSets of {deployment}: a rollout")
    scope = blast_radius(_firing(incident))
    if scope:
        ev.scope.add(scope)
        ev.facts.append(f"blast radius: {scope}")
    return ev


def source_description(alert: AlertRef) -> str:
    """How a note names where an alert came from ("an application log", "an alert from the ... webhook")."""
    return SOURCE_DESCRIPTIONS.get(alert.provenance.source, "a signal of unknown provenance")


def xid_text_note(alert: AlertRef) -> str:
    """The note for XID text in an alert not trusted for GPU faults (:data:`XID_TEXT_NOTE` for an app log)."""
    return f"XID text in {source_description(alert)}; not a trusted source"


def _untrusted(ev: Evidence, note: str) -> None:
    if note not in ev.untrusted:
        ev.untrusted.append(note)


def _condense_changes(ev: Evidence, result: ToolResult | None) -> None:
    """A rollout of one of the incident's deployments just before its alerts: the ScalingReplicaSet event."""
    if result is None or result.status != "ok" or not isinstance(result.data, list):
        return
    for change in result.data:
        if isinstance(change, Mapping) and change.get("kind") == "rollout":
            ev.event_reasons.add("ScalingReplicaSet")
            fact = f"rollout of {change.get('entity')} to ReplicaSet {change.get('replica_set')} before the alerts"
            if fact not in ev.facts:
                ev.facts.insert(0, fact)


def _condense_flapping(ev: Evidence) -> None:
    """A node lost again after it recovered has logged NodeNotReady, NodeReady, NodeNotReady.

    ``kube_events`` alerts on NodeNotReady but not on the Normal NodeReady between the losses; its
    ``node_flapping`` alert counts the readiness changes, and two or more losses imply the recovery.
    """
    for alert in _firing(ev.incident):
        value = alert.evidence.get("readiness_changes")
        changes = int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0
        if alert.signal == "node_flapping" and changes >= 2:
            ev.event_reasons.update(("NodeNotReady", "NodeReady"))
            sequence = "NodeNotReady then NodeReady" + (" then NodeNotReady" if changes >= 3 else "")
            fact = f"{alert.entity}: {sequence} ({changes} readiness changes)"
            if fact not in ev.facts:
                ev.facts.insert(0, fact)


def incident_deployments(alerts: Iterable[AlertRef]) -> set[str]:
    """The deployments whose pods (or which, by label) the alerts name."""
    out: set[str] = set()
    for alert in alerts:
        if alert.labels.get("deployment"):
            out.add(alert.labels["deployment"])
        pod = alert.labels.get("pod", "")
        if pod:
            out.add(deployment_of(pod))
    return out


def deployment_of(pod: str) -> str:
    """The deployment behind a pod name (``<deployment>-<pod-template-hash>-<suffix>``), or the name itself."""
    parts = pod.rsplit("-", 2)
    return parts[0] if len(parts) == 3 and parts[0] else pod


# Kubernetes names a Deployment's pods <deployment>-<pod-template-hash>-<suffix>, both generated from
# this alphabet (no vowels, no 0, 1, 3): the hash up to 10 characters (a uint32's digits), the suffix 5.
_K8S_NAME_CHARS = "[bcdfghjklmnpqrstvwxz2456789]"
_DEPLOYMENT_POD = re.compile(rf"(?P<deployment>[a-z0-9][a-z0-9.-]*)-{_K8S_NAME_CHARS}{{1,10}}-{_K8S_NAME_CHARS}{{5}}")


def deployment_of_pod(pod: str) -> str:
    """The Deployment a pod name names, only when it has a Deployment pod's shape ("" otherwise).

    Stricter than :func:`deployment_of`: an action's target comes from it, and ``llama-70b-0`` (a
    StatefulSet's pod) must not become the Deployment ``llama``.
    """
    match = _DEPLOYMENT_POD.fullmatch(pod)
    return match["deployment"] if match else ""


def replica_sets(alerts: Iterable[AlertRef]) -> dict[str, set[str]]:
    """Pod-template hashes seen per deployment among the alerts' pods (firing or resolved).

    Two hashes for one deployment mean pods of two ReplicaSets, old and new: a rollout under way.
    """
    out: dict[str, set[str]] = {}
    for alert in alerts:
        pod = alert.labels.get("pod", "")
        parts = pod.rsplit("-", 2)
        if len(parts) == 3 and all(parts):
            out.setdefault(parts[0], set()).add(parts[1])
    return out


def blast_radius(alerts: Iterable[AlertRef]) -> str:
    """Which replicas the alerts touch: 'pod', 'deployment', 'node', or '' when that says nothing.

    ``node``: two or more replicas, all on one node, of one deployment or several (a node-level cause:
    its network, power, cooling; a noisy neighbour or a bad process slows one replica). ``deployment``:
    replicas of one deployment on two or more nodes (a cause shared by the deployment: its release, its
    load). ``pod``: one replica.

    Only alerts on the replicas themselves count (entity = pod): a GPU's alert names the pod using the
    GPU, and the learned detectors' alerts on idle or busy GPUs would spread any incident over its node.
    """
    pods: set[str] = set()
    nodes: set[str] = set()
    for alert in alerts:
        pod = alert.labels.get("pod")
        if not pod or alert.entity != pod:
            continue
        pods.add(pod)
        node = topology_of(alert.labels).get("node")
        if node:
            nodes.add(node)
    deployments = {deployment_of(p) for p in pods}
    if len(pods) >= 2 and len(nodes) == 1:
        # several replicas at once, on one node only: what they share is the node
        return "node"
    if len(deployments) == 1 and len(nodes) >= 2:
        return "deployment"
    if len(pods) == 1:
        return "pod"
    return ""


def _deviating_metrics(evidence: Mapping[str, Any], entity: str) -> list[tuple[str, str]]:
    """Metrics behind the features a learned detector saw deviate in their harmful direction."""
    deviations = evidence.get("top_deviations") or evidence.get("window_drift")
    if not isinstance(deviations, Mapping):
        return []
    out: list[tuple[str, str]] = []
    # a GPU whose utilisation collapsed also drops its clock and power: that is idleness, not throttling
    idle = _scalar(deviations.get("gpu_util")) and deviations["gpu_util"] <= -DEVIATION_Z
    for feature, z in deviations.items():
        if feature not in FEATURE_METRICS or not _scalar(z):
            continue
        metric, sign = FEATURE_METRICS[feature]
        if z * sign < DEVIATION_Z or (idle and feature in ("sm_clock_mhz", "power_w")):
            continue
        out.append((metric, f"{feature} {z:+.1f} sigma on {entity} ({metric})"))
    return out
