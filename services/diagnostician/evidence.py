"""The evidence model: what the diagnosticians know about an incident, condensed from the tools' results.

The evidence tools (:mod:`services.diagnostician.tools`) each return a :class:`ToolResult`;
:func:`condense` turns the results into an :class:`Evidence`, the input of both diagnosticians: signal
names, metric names, XID codes, event reasons, log lines, the blast radius, facts to cite, and notes on
what was not believed. It reads the alerts from the ``incident_anomalies`` result (one
:func:`alert_record` each) and the rollouts from ``recent_changes``, so that recorded tool output
condenses as it did live.

Trust (docs/security.md): XID codes, GPU-fault signals and XID-bearing lines count only from alerts
whose provenance is trusted for GPU faults; anything else becomes an :attr:`Evidence.untrusted` note.

Also here, because the tools and the ranker read alerts the same way: :func:`metric_items`,
:func:`event_reason`, :func:`topology_of`, the pod-name helpers (:func:`deployment_of`,
:func:`deployment_of_pod`, :func:`replica_sets`) and :func:`blast_radius`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from services.core.events import FACT_GPU_FAULT, AlertRef, IncidentEvent, Provenance
from services.core.features import FEATURES
from services.diagnostician.runbooks import METRIC_NAME

log = logging.getLogger(__name__)

TOPOLOGY_LABELS: tuple[str, ...] = ("cluster", "node", "gpu", "pod", "model", "namespace", "deployment")
_NODE_LABELS = ("node", "Hostname", "hostname", "instance")
_GPU_LABELS = ("gpu", "UUID", "gpu_uuid")
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


def firing_alerts(alerts: tuple[AlertRef, ...]) -> tuple[AlertRef, ...]:
    """The firing alerts; all of them when none fires (a resolved incident is still diagnosed)."""
    firing = tuple(a for a in alerts if a.status == "firing")
    return firing or alerts


def is_number(value: Any) -> bool:
    """An int or float that is not a bool (evidence values come from JSON)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def metric_items(evidence: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    """The metric values and windows of an alert's evidence: ``metrics``/``window`` maps, ``metric`` +
    ``value``, keys that are metric names, and numeric features (not the detector's own bookkeeping)."""
    for key, value in evidence.items():
        if key in ("metrics", "window", "windows") and isinstance(value, Mapping):
            for name, inner in value.items():
                if is_number(inner) or (isinstance(inner, list) and all(is_number(x) for x in inner[:100])):
                    yield str(name), inner[-60:] if isinstance(inner, list) else inner
        elif key == "metric" and isinstance(value, str):
            yield value, evidence.get("value")
        elif METRIC_NAME.match(key) and (is_number(value) or isinstance(value, list)):
            yield key, value
        elif is_number(value) and key not in ("score", "threshold", "since", "samples", "template_id", "count"):
            yield key, value


def event_reason(alert: AlertRef) -> str:
    """The Kubernetes event reason an alert's evidence names (``reason``, ``event_reason``, ``event.reason``), or ""."""
    ev = alert.evidence
    for candidate in (ev.get("reason"), ev.get("event_reason"), (ev.get("event") or {}).get("reason")):
        if isinstance(candidate, str) and candidate:
            return candidate
    return ""


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


# ------------------------------------------------------------------------------------ the alerts

ANOMALIES_TOOL = "incident_anomalies"
"""The tool whose result lists the incident's alerts, one record each (:func:`alert_record`)."""


def alert_record(alert: AlertRef) -> dict[str, Any]:
    """What the ``incident_anomalies`` tool reports of one alert, and all that :func:`condense` reads of it.

    JSON-serialisable, so that a recorded tool output replays: entity, signal, detector, severity,
    status, start, labels, the detector's features (its evidence), and the provenance (``source`` and
    the fact kinds it is ``trusted`` for, the trust model of docs/security.md). The provenance comes
    last, and the fingerprint is left out (condensing needs no identity): the LLM reads these records
    in a prompt of bounded length, where every key pushes later evidence out.
    """
    return {
        "entity": alert.entity,
        "signal": alert.signal,
        "detector": alert.detector,
        "severity": alert.severity,
        "status": alert.status,
        "starts_at": alert.starts_at,
        "labels": dict(alert.labels),
        "features": dict(alert.evidence),
        "provenance": {"source": alert.provenance.source, "trusted": list(alert.provenance.trusted)},
    }


def anomalies_result(alerts: Iterable[AlertRef]) -> ToolResult:
    """The ``incident_anomalies`` result of these alerts alone (without the stored history)."""
    records = [alert_record(a) for a in alerts]
    return ToolResult(tool=ANOMALIES_TOOL, status="ok", data=records) if records else no_data(ANOMALIES_TOOL)


def no_data(tool: str) -> ToolResult:
    """A tool's result when it found nothing relevant."""
    return ToolResult(tool=tool, status="no_data")


_RECORD_FIELDS = ("entity", "signal", "detector", "severity", "status", "starts_at", "labels")


def reported_alerts(incident: IncidentEvent, results: Mapping[str, ToolResult]) -> tuple[AlertRef, ...]:
    """The alerts the ``incident_anomalies`` result reports; the incident's own when it reports none.

    A record that is not an alert's (a recorded file edited by hand) is left out, and logged.
    """
    result = results.get(ANOMALIES_TOOL)
    if result is None or result.status != "ok" or not isinstance(result.data, list):
        return incident.alerts
    alerts: list[AlertRef] = []
    for i, record in enumerate(result.data):
        if not isinstance(record, Mapping):
            log.warning("%s record %d is not an object: left out of the evidence", ANOMALIES_TOOL, i)
            continue
        try:
            alerts.append(
                AlertRef.model_validate(
                    {
                        "fingerprint": "",  # not in the record: condensing reads no alert's identity
                        **{k: record[k] for k in _RECORD_FIELDS if k in record},
                        "evidence": record.get("features", {}),
                        "provenance": Provenance.model_validate(record.get("provenance") or {}),
                    }
                )
            )
        except ValidationError as exc:
            log.warning("%s record %d is not an alert (%s): left out of the evidence", ANOMALIES_TOOL, i, exc)
    return tuple(alerts)


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


def condense(incident: IncidentEvent, results: Mapping[str, ToolResult]) -> Evidence:
    """Build :class:`Evidence` from the tool results about ``incident``.

    The alerts are those the ``incident_anomalies`` result reports (:func:`reported_alerts`: signal,
    detector, features, labels and provenance of each), the rollouts those of ``recent_changes``; so
    evidence replayed from recorded tool output condenses as it did live. Only when
    ``incident_anomalies`` reported nothing usable (not run, or failed: the database read of its
    history broke) do the incident's own alerts stand in, so a broken database never empties a diagnosis.
    """
    ev = Evidence(incident=incident, results=dict(results))
    alerts = reported_alerts(incident, results)
    firing = firing_alerts(alerts)
    for alert in firing:
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
        if is_number(code) and int(code) > 0:
            if gpu_trusted:
                ev.xids.add(int(code))
                facts.append(f"XID {int(code)} on {alert.entity}")
            else:
                _untrusted(ev, f"XID {int(code)} claimed by {source_description(alert)}; not a trusted source")
        for key, value in metric_items(data):
            if METRIC_NAME.match(key):
                ev.metrics.add(key)
                if is_number(value):
                    facts.append(f"{key}={value:g} on {alert.entity}")
        slower = data.get("slower")
        for key, metric in EVIDENCE_KEY_METRICS.items():
            if is_number(data.get(key)) and not (isinstance(slower, Mapping) and key in LOAD_CONTEXT_KEYS):
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
        reason = event_reason(alert)
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
    _condense_flapping(ev, firing)
    for deployment, hashes in sorted(replica_sets(alerts).items()):
        if len(hashes) >= 2:
            # the event a Deployment records when it moves between ReplicaSets; kube_events does not
            # alert on Normal events, the pod names still show it
            ev.event_reasons.add("ScalingReplicaSet")
            ev.facts.append(f"pods of {len(hashes)} ReplicaSets of {deployment}: a rollout")
    scope = blast_radius(firing)
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


def _condense_flapping(ev: Evidence, firing: Iterable[AlertRef]) -> None:
    """A node lost again after it recovered has logged NodeNotReady, NodeReady, NodeNotReady.

    ``kube_events`` alerts on NodeNotReady but not on the Normal NodeReady between the losses; its
    ``node_flapping`` alert counts the readiness changes, and two or more losses imply the recovery.
    """
    for alert in firing:
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
    idle = is_number(deviations.get("gpu_util")) and deviations["gpu_util"] <= -DEVIATION_Z
    for feature, z in deviations.items():
        if feature not in FEATURE_METRICS or not is_number(z):
            continue
        metric, sign = FEATURE_METRICS[feature]
        if z * sign < DEVIATION_Z or (idle and feature in ("sm_clock_mhz", "power_w")):
            continue
        out.append((metric, f"{feature} {z:+.1f} sigma on {entity} ({metric})"))
    return out
