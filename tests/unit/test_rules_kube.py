"""Kubernetes event rules."""

from __future__ import annotations

import json

import pytest

from pipelines.detectors.rules_kube import KubeEventDetector, KubeEventsState, parse_failed_scheduling
from services.core.events import Anomaly, KubeEvent, ObjectRef

POD = "vllm-llama-70b-5c8d-x2k9q"


def pod_event(reason: str, message: str, ts: float = 100.0, type_: str = "Warning", count: int = 1) -> KubeEvent:
    return KubeEvent(
        reason=reason,
        type="Warning" if type_ == "Warning" else "Normal",
        involved_object=ObjectRef(kind="Pod", name=POD, namespace="llm-serving"),
        message=message,
        count=count,
        ts=ts,
        node="gpu-node-4",
        source_component="kubelet",
    )


def node_event(reason: str, ts: float, node: str = "gpu-node-4") -> KubeEvent:
    return KubeEvent(
        reason=reason,
        type="Warning" if reason == "NodeNotReady" else "Normal",
        involved_object=ObjectRef(kind="Node", name=node),
        message=f"Node {node} status is now: {reason}",
        ts=ts,
        node=node,
    )


def detect(events: list[KubeEvent], detector: KubeEventDetector | None = None) -> list[Anomaly]:
    detector = detector or KubeEventDetector()
    _, anomalies = detector.detect(events, detector.initial_state())
    return anomalies


def test_oomkilled_pod() -> None:
    [a] = detect([pod_event("OOMKilled", "Container vllm was OOMKilled (exit code 137)")])
    assert (a.detector, a.signal, a.entity, a.entity_kind) == ("kube_events", "pod_oomkilled", POD, "pod")
    assert a.evidence["exit_code"] == 137
    assert a.evidence["container"] == "vllm"
    assert a.labels == {"kind": "Pod", "namespace": "llm-serving", "pod": POD, "node": "gpu-node-4"}
    assert a.ts == 100.0


def test_oom_in_message_only() -> None:
    [a] = detect([pod_event("Killing", "Container vllm terminated: OOMKilled")])
    assert a.signal == "pod_oomkilled"


def test_crashloop_backoff_but_not_image_pull_backoff() -> None:
    [a] = detect([pod_event("BackOff", f"Back-off restarting failed container vllm in pod {POD}", count=7)])
    assert a.signal == "pod_crashloop"
    assert a.score == 7.0
    assert detect([pod_event("BackOff", 'Back-off pulling image "vllm/vllm-openai:v0.10.1"')]) == []


def test_node_not_ready_is_a_critical_node_anomaly() -> None:
    [a] = detect([node_event("NodeNotReady", 50.0)])
    assert (a.signal, a.entity, a.entity_kind, a.severity) == ("node_not_ready", "gpu-node-4", "node", "critical")
    assert a.labels["node"] == "gpu-node-4"


def test_failed_scheduling_parses_insufficient_gpu() -> None:
    message = (
        "0/8 nodes are available: 3 Insufficient nvidia.com/gpu, 5 node(s) had untolerated taint "
        "{node.kubernetes.io/unreachable: }. preemption: 0/8 nodes are available: 3 No preemption victims "
        "found for incoming pod, 5 Preemption is not helpful for scheduling."
    )
    [a] = detect([pod_event("FailedScheduling", message)])
    assert a.signal == "failed_scheduling"
    assert a.evidence["insufficient_gpu"] is True
    assert a.evidence["insufficient"] == {"nvidia.com/gpu": 3}
    assert (a.evidence["nodes_available"], a.evidence["nodes_total"]) == (0, 8)


def test_failed_scheduling_for_memory_is_not_gpu() -> None:
    parsed = parse_failed_scheduling("0/3 nodes are available: 3 Insufficient memory.")
    assert parsed["insufficient"] == {"memory": 3}
    assert parsed["insufficient_gpu"] is False


def test_evicted_pod() -> None:
    [a] = detect([pod_event("Evicted", "The node was low on resource: memory.")])
    assert (a.signal, a.severity) == ("pod_evicted", "warning")


@pytest.mark.parametrize(
    ("message", "probe", "severity"),
    [
        ('Liveness probe failed: Get "http://10.0.0.5:8000/health": context deadline exceeded', "liveness", "warning"),
        ("Readiness probe failed: connect: connection refused", "readiness", "warning"),
        ("Startup probe failed: HTTP probe failed with statuscode: 503", "startup", "info"),
    ],
)
def test_probe_kind_in_evidence(message: str, probe: str, severity: str) -> None:
    [a] = detect([pod_event("Unhealthy", message)])
    assert (a.signal, a.evidence["probe"], a.severity) == ("probe_unhealthy", probe, severity)


def test_normal_events_are_quiet() -> None:
    events = [
        pod_event("Scheduled", "Successfully assigned llm-serving/x to gpu-node-4", type_="Normal"),
        pod_event("Pulled", 'Container image "vllm/vllm-openai:v0.10.1" already present', type_="Normal"),
        pod_event("Started", "Started container vllm", type_="Normal"),
        node_event("NodeReady", 10.0),
    ]
    assert detect(events) == []


def test_repeated_event_is_held() -> None:
    detector = KubeEventDetector(hold_s=300.0)
    message = f"Back-off restarting failed container vllm in pod {POD}"
    events = [pod_event("BackOff", message, ts=t, count=n) for n, t in enumerate((100.0, 160.0, 390.0, 401.0), 1)]
    assert [a.ts for a in detect(events, detector)] == [100.0, 401.0]


def test_node_flapping_more_than_k_changes() -> None:
    detector = KubeEventDetector(hold_s=0.0, flap_window_s=600.0, flap_threshold=3)
    reasons = ["NodeNotReady", "NodeReady", "NodeNotReady", "NodeReady", "NodeNotReady", "NodeReady"]
    events = [node_event(r, 60.0 * k) for k, r in enumerate(reasons)]
    anomalies = detect(events, detector)
    flaps = [a for a in anomalies if a.signal == "node_flapping"]
    # changes at t=0 (a Ready node lost), 60, 120, 180 (the 4th, > 3) fires; later ones are held back
    assert [a.ts for a in flaps] == [180.0]
    assert flaps[0].evidence["readiness_changes"] == 4
    assert flaps[0].evidence["remediation"] == "drain_node"
    assert (flaps[0].entity, flaps[0].entity_kind) == ("gpu-node-4", "node")


def test_by_default_a_node_lost_again_after_recovering_flaps_and_one_outage_does_not() -> None:
    detector = KubeEventDetector()
    once = [node_event("NodeReady", 0.0), node_event("NodeNotReady", 30.0), node_event("NodeReady", 90.0)]
    assert "node_flapping" not in [a.signal for a in detect(once, detector)]
    again = [*once, node_event("NodeNotReady", 120.0)]
    flaps = [a for a in detect(again, detector) if a.signal == "node_flapping"]
    assert [a.ts for a in flaps] == [120.0]


def test_slow_readiness_changes_are_not_flapping() -> None:
    detector = KubeEventDetector(flap_window_s=600.0, flap_threshold=3)
    reasons = ["NodeNotReady", "NodeReady"] * 4
    events = [node_event(r, 400.0 * k) for k, r in enumerate(reasons)]
    assert [a.signal for a in detect(events, detector)] == ["node_not_ready"] * 4


def test_state_survives_json() -> None:
    detector = KubeEventDetector(hold_s=0.0, flap_window_s=600.0, flap_threshold=4)
    reasons = ["NodeNotReady", "NodeReady", "NodeNotReady", "NodeReady"]
    state, _ = detector.detect([node_event(r, 60.0 * k) for k, r in enumerate(reasons)], detector.initial_state())
    restored = KubeEventsState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state
    _, anomalies = detector.detect([node_event("NodeNotReady", 240.0)], restored)
    assert "node_flapping" in [a.signal for a in anomalies]
