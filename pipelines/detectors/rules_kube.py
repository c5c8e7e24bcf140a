"""Kubernetes event rules: the events an SRE running vLLM on Kubernetes is paged for.

==================== ================================================================ ==========
signal               event                                                            severity
==================== ================================================================ ==========
pod_oomkilled        reason ``OOMKilling`` / ``OOMKilled``, or ``OOMKilled`` in the     warning
                     message (the container's memory limit, not CUDA OOM)
pod_crashloop        reason ``CrashLoopBackOff``, or ``BackOff`` restarting a failed   warning
                     container (image-pull back-offs are not crash loops)
node_not_ready       reason ``NodeNotReady`` (entity: the node)                       critical
failed_scheduling    reason ``FailedScheduling``; evidence parses ``0/8 nodes are      warning
                     available: 3 Insufficient nvidia.com/gpu, ...``
pod_evicted          reason ``Evicted``                                              warning
probe_unhealthy      reason ``Unhealthy``; evidence says liveness, readiness or       warning /
                     startup (startup probes fail while a model loads: info)         info
node_flapping        more than flap_threshold NotReady <-> Ready changes of one       warning
                     node within flap_window_s
==================== ================================================================ ==========

Kubernetes repeats an event (``count`` goes up) as long as its cause lasts, so each
(signal, entity) fires at most once per ``hold_s``; ``node_flapping`` once per ``flap_window_s``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pipelines.detectors.rules_common import EntityKind, forget_older, held_back, make_anomaly, plain
from services.core.events import Anomaly, KubeEvent, Severity

DETECTOR_NAME = "kube_events"

_AVAILABLE = re.compile(r"(?P<available>\d+)/(?P<total>\d+) nodes are available")
_INSUFFICIENT = re.compile(r"(?P<nodes>\d+) Insufficient (?P<resource>[\w./-]+)")
_PROBE = re.compile(r"(?i)\b(?P<probe>liveness|readiness|startup) probe (?:failed|errored)")
_CONTAINER = re.compile(r"[Cc]ontainer:? (?P<container>[\w.-]+)")
_EXIT_CODE = re.compile(r"exit code (?P<code>\d+)")
_PROBE_SEVERITY: dict[str, Severity] = {"liveness": "warning", "readiness": "warning", "startup": "info"}
_KINDS: dict[str, EntityKind] = {"pod": "pod", "node": "node"}


@dataclass
class NodeStatus:
    """A node's readiness history.

    Attributes:
        ready: ``"Ready"``, ``"NotReady"`` or '' before the first readiness event.
        last_ts: timestamp of the latest readiness event.
        changes: timestamps of readiness changes within the flap window.
    """

    ready: str = ""
    last_ts: float = 0.0
    changes: list[float] = field(default_factory=list)


@dataclass
class KubeEventsState:
    """The detector's state.

    Attributes:
        fired: ``signal|entity`` -> when it last fired (for the hold period).
        nodes: node name -> its readiness history.
    """

    fired: dict[str, float] = field(default_factory=dict)
    nodes: dict[str, NodeStatus] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return the state as JSON-compatible values."""
        return plain(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KubeEventsState:
        """Rebuild a state written by :meth:`to_dict`."""
        return cls(
            fired={str(k): float(v) for k, v in data.get("fired", {}).items()},
            nodes={
                name: NodeStatus(
                    ready=str(n.get("ready", "")),
                    last_ts=float(n.get("last_ts", 0.0)),
                    changes=[float(t) for t in n.get("changes", [])],
                )
                for name, n in data.get("nodes", {}).items()
            },
        )


def parse_failed_scheduling(message: str) -> dict[str, Any]:
    """Return what a scheduler message says: nodes available, and which resources were short.

    ``"0/8 nodes are available: 3 Insufficient nvidia.com/gpu, 5 Insufficient memory."`` gives
    ``{"nodes_available": 0, "nodes_total": 8, "insufficient": {"nvidia.com/gpu": 3, "memory": 5},
    "insufficient_gpu": True}``. Only the first sentence counts: the scheduler's ``preemption:``
    part repeats the figures.
    """
    head = message.split("preemption:", 1)[0]
    out: dict[str, Any] = {}
    available = _AVAILABLE.search(head)
    if available is not None:
        out["nodes_available"] = int(available.group("available"))
        out["nodes_total"] = int(available.group("total"))
    insufficient: dict[str, int] = {}
    for m in _INSUFFICIENT.finditer(head):
        resource = m.group("resource").rstrip(".,")
        insufficient[resource] = insufficient.get(resource, 0) + int(m.group("nodes"))
    out["insufficient"] = insufficient
    out["insufficient_gpu"] = any(r.startswith("nvidia.com/") for r in insufficient)
    return out


@dataclass(frozen=True)
class KubeEventDetector:
    """Kubernetes event rules: OOM kills, crash loops, node readiness and flapping, scheduling,
    evictions and failing probes.

    Attributes:
        hold_s: a (signal, entity) fires at most once in this many seconds (default 300 s).
        flap_window_s: window in which readiness changes are counted (default 1800 s).
        flap_threshold: a node flaps when it changes readiness more than this often in the
            window (default 2: NotReady → Ready → NotReady, a node that came back and was lost again,
            flaps; one outage and its recovery, a reboot say, does not).
    """

    name: ClassVar[str] = DETECTOR_NAME
    consumes: ClassVar[type] = KubeEvent
    signals: ClassVar[frozenset[str]] = frozenset(
        {
            "pod_oomkilled",
            "pod_crashloop",
            "node_not_ready",
            "failed_scheduling",
            "pod_evicted",
            "probe_unhealthy",
            "node_flapping",
        }
    )

    hold_s: float = 300.0
    flap_window_s: float = 1800.0
    flap_threshold: int = 2

    def initial_state(self) -> KubeEventsState:
        """Return an empty state."""
        return KubeEventsState()

    def detect(self, batch: Sequence[Any], state: KubeEventsState) -> tuple[KubeEventsState, list[Anomaly]]:
        """Classify a micro-batch of Kubernetes events.

        Args:
            batch: :class:`~services.core.events.KubeEvent` items (others are ignored).
            state: the state returned by the previous call (or :meth:`initial_state`).

        Returns:
            The updated state (changed in place) and the anomalies, in event-time order.
        """
        events = sorted((e for e in batch if isinstance(e, KubeEvent)), key=lambda e: e.ts)
        anomalies: list[Anomaly] = []
        for event in events:
            forget_older(state.fired, event.ts, max(self.hold_s, self.flap_window_s))
            for signal, severity, details in self._classify(event):
                entity = event.involved_object.name
                if held_back(state.fired, f"{signal}|{entity}", event.ts, self.hold_s):
                    continue
                anomalies.append(self._anomaly(event, signal, severity, details))
            flap = self._flapping(event, state)
            if flap is not None:
                anomalies.append(flap)
        return state, anomalies

    # -- rules

    def _classify(self, event: KubeEvent) -> list[tuple[str, Severity, dict[str, Any]]]:
        reason = event.reason
        message = event.message
        out: list[tuple[str, Severity, dict[str, Any]]] = []
        if reason in ("OOMKilling", "OOMKilled") or "OOMKilled" in message:
            details: dict[str, Any] = {}
            if (m := _EXIT_CODE.search(message)) is not None:
                details["exit_code"] = int(m.group("code"))
            out.append(("pod_oomkilled", "warning", details))
        if (
            reason == "CrashLoopBackOff"
            or "CrashLoopBackOff" in message
            or (reason == "BackOff" and "pulling image" not in message.lower())
        ):
            out.append(("pod_crashloop", "warning", {"restarts_seen": event.count}))
        if reason == "NodeNotReady":
            out.append(("node_not_ready", "critical", {}))
        if reason == "FailedScheduling":
            out.append(("failed_scheduling", "warning", parse_failed_scheduling(message)))
        if reason == "Evicted":
            out.append(("pod_evicted", "warning", {}))
        if reason == "Unhealthy":
            probe = _PROBE.search(message)
            kind = probe.group("probe").lower() if probe is not None else "unknown"
            out.append(("probe_unhealthy", _PROBE_SEVERITY.get(kind, "warning"), {"probe": kind}))
        for _, _, d in out:
            if (m := _CONTAINER.search(message)) is not None and "container" not in d:
                d["container"] = m.group("container")
        return out

    def _flapping(self, event: KubeEvent, state: KubeEventsState) -> Anomaly | None:
        if event.reason not in ("NodeNotReady", "NodeReady"):
            return None
        name = event.involved_object.name
        node = state.nodes.setdefault(name, NodeStatus())
        ready = "Ready" if event.reason == "NodeReady" else "NotReady"
        # a NodeNotReady event is itself a change (Kubernetes records it when a Ready node is lost);
        # the first NodeReady seen may be a node registering, so it only sets the state
        if ready != node.ready and event.ts >= node.last_ts and (node.ready or ready == "NotReady"):
            node.changes.append(event.ts)
        if event.ts >= node.last_ts:
            node.ready, node.last_ts = ready, event.ts
        node.changes = [t for t in node.changes if t > event.ts - self.flap_window_s]
        changes = len(node.changes)
        if changes <= self.flap_threshold:
            return None
        if held_back(state.fired, f"node_flapping|{name}", event.ts, self.flap_window_s):
            return None
        details = {
            "readiness_changes": changes,
            "window_s": self.flap_window_s,
            "first_change": node.changes[0],
            "now": ready,
            "remediation": "drain_node",
        }
        return self._anomaly(
            event, "node_flapping", "warning", details, score=float(changes), threshold=float(self.flap_threshold)
        )

    # -- output

    def _anomaly(
        self,
        event: KubeEvent,
        signal: str,
        severity: Severity,
        details: dict[str, Any],
        score: float | None = None,
        threshold: float = 1.0,
    ) -> Anomaly:
        obj = event.involved_object
        kind = _KINDS.get(obj.kind.lower(), "other")
        labels = {"kind": obj.kind}
        if obj.namespace:
            labels["namespace"] = obj.namespace
        if kind == "pod":
            labels["pod"] = obj.name
        node = obj.name if kind == "node" else event.node
        if node:
            labels["node"] = node
        evidence: dict[str, Any] = {
            "reason": event.reason,
            "type": event.type,
            "message": event.message[:1000],
            "count": event.count,
            "object": f"{obj.kind}/{obj.namespace + '/' if obj.namespace else ''}{obj.name}",
            "source_component": event.source_component,
            **details,
        }
        return make_anomaly(
            detector=DETECTOR_NAME,
            signal=signal,
            entity=obj.name,
            entity_kind=kind,
            score=float(event.count) if score is None else score,
            threshold=threshold,
            severity=severity,
            ts=event.ts,
            labels=labels,
            evidence=evidence,
        )
