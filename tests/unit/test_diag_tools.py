"""Evidence condensing: what the ranker learns from latency findings, pod names, topology, the Deployment
change log and node readiness changes."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from services.core.events import AlertRef, IncidentEvent, KubeEvent, ObjectRef
from services.diagnostician.evidence import blast_radius, deployment_of, replica_sets
from services.diagnostician.ranker import WEIGHTS, rank, runbook_index, signal_scores
from services.diagnostician.runbooks import Signals
from services.diagnostician.tools import CHANGE_LOOKBACK_S, ChangeLog, gather_evidence

T0 = 1_760_000_000.0


def alert(signal: str, pod: str, node: str = "gpu-node-1", status: str = "firing", **evidence: Any) -> AlertRef:
    return AlertRef(
        fingerprint=f"{signal}:{pod}",
        entity=pod,
        signal=signal,
        detector="serving_rules",
        severity="warning",
        status=status,  # type: ignore[arg-type]
        starts_at=T0,
        labels={"pod": pod, "node": node},
        evidence=evidence,
    )


def incident(*alerts: AlertRef) -> IncidentEvent:
    return IncidentEvent(
        incident_id="inc-tools", kind="opened", severity="warning", title="t", alerts=alerts, opened_at=T0, ts=T0
    )


def ttft_regression(pod: str, node: str = "gpu-node-1") -> AlertRef:
    slower = {"ttft": {"mean_s": 1.9, "baseline_mean_s": 0.1, "ratio": 19.0}}
    return alert("latency_regression", pod, node, slower=slower, waiting=0.0, running=1.0)


def test_a_latency_finding_names_the_latency_that_regressed_not_the_load_it_was_judged_against() -> None:
    evidence = gather_evidence(incident(ttft_regression("llama-8b-abc12-x1")))
    assert "vllm:time_to_first_token_seconds" in evidence.metrics
    # the queue (waiting=0) is context showing load does not explain the slowdown, not a symptom
    assert "vllm:num_requests_waiting" not in evidence.metrics
    assert "vllm:inter_token_latency_seconds" not in evidence.metrics
    queue = gather_evidence(incident(alert("queue_saturation", "llama-8b-abc12-x1", waiting=30.0)))
    assert "vllm:num_requests_waiting" in queue.metrics


def test_blast_radius_tells_a_node_from_a_deployment_from_a_pod() -> None:
    assert deployment_of("llama-70b-int4-fc99cq8565-xbbnz") == "llama-70b-int4"
    on_one_node = [ttft_regression("llama-70b-int4-fc99cq8565-xbbnz"), ttft_regression("llama-8b-fp16-ps2ff-kcb5n")]
    assert blast_radius(on_one_node) == "node"
    across_nodes = [ttft_regression("llama-8b-fp16-ps2ff-kcb5n"), ttft_regression("llama-8b-fp16-ps2ff-aaaa1", "n2")]
    assert blast_radius(across_nodes) == "deployment"
    assert blast_radius([ttft_regression("llama-8b-fp16-ps2ff-kcb5n")]) == "pod"
    # several replicas of one deployment at once, all on one node: the node is what they share
    two_pods_one_node = [ttft_regression("llama-8b-fp16-ps2ff-kcb5n"), ttft_regression("llama-8b-fp16-ps2ff-vpqsf")]
    assert blast_radius(two_pods_one_node) == "node"
    spread = [*on_one_node, ttft_regression("llama-8b-fp16-ps2ff-aaaa1", "n2")]
    assert blast_radius(spread) == ""


def test_pods_of_two_replica_sets_of_one_deployment_are_a_rollout() -> None:
    old = alert("ttft_slo_burn", "llama-70b-int4-7m6ppjfgdw-k4gft", status="resolved")
    new = alert("error_rate", "llama-70b-int4-fc99cq8565-xbbnz", error_ratio=0.7)
    assert replica_sets([old, new]) == {"llama-70b-int4": {"7m6ppjfgdw", "fc99cq8565"}}
    assert "ScalingReplicaSet" in gather_evidence(incident(old, new)).event_reasons
    assert "ScalingReplicaSet" not in gather_evidence(incident(new)).event_reasons


def test_first_token_latency_regressing_on_every_model_of_one_node_points_at_the_node_network() -> None:
    inc = incident(
        ttft_regression("llama-70b-int4-fc99cq8565-xbbnz"),
        ttft_regression("llama-8b-fp16-ps2ffdmslc-kcb5n"),
        ttft_regression("llama-8b-fp16-ps2ffdmslc-vpqsf"),
    )
    causes = [h.cause for h in rank(gather_evidence(inc), runbook_index())]
    assert causes[0] == "network_latency", causes[:5]
    # one replica slowing down on its own is not the node's network
    alone = [
        h.cause for h in rank(gather_evidence(incident(ttft_regression("llama-8b-fp16-ps2ff-kcb5n"))), runbook_index())
    ]
    assert alone[0] != "network_latency", alone[:5]


def test_a_runbook_scope_must_be_a_known_blast_radius() -> None:
    assert Signals(metrics=("vllm:num_requests_waiting",), scope=("node", "pod")).scope == ("node", "pod")
    with pytest.raises(ValidationError):
        Signals(metrics=("vllm:num_requests_waiting",), scope=("cluster",))  # type: ignore[arg-type]


def test_the_blast_radius_only_adds_to_a_runbook_whose_own_signals_match() -> None:
    # a learned detector's "something is odd" on one replica matches noisy_neighbour only generically
    odd = alert("metric_outlier", "llama-8b-fp16-ps2ff-kcb5n", top_deviations={"gpu_util": -0.5})
    scores = signal_scores(gather_evidence(incident(odd)), runbook_index())
    assert "scope" not in scores["noisy_neighbour"].parts
    slow = signal_scores(gather_evidence(incident(ttft_regression("llama-8b-fp16-ps2ff-kcb5n"))), runbook_index())
    assert slow["noisy_neighbour"].parts.get("scope") == WEIGHTS["scope"]


def scaled(deployment: str, replica_set: str, ts: float, direction: str = "up", to: int = 1) -> KubeEvent:
    return KubeEvent(
        reason="ScalingReplicaSet",
        involved_object=ObjectRef(kind="Deployment", name=deployment, namespace="llm-serving"),
        message=f"Scaled {direction} replica set {replica_set} to {to}",
        ts=ts,
        source_component="deployment-controller",
    )


def test_the_change_log_tells_a_rollout_from_a_scale() -> None:
    log = ChangeLog({"llama-70b-int4": "llama-70b-int4-7m6ppjfgdw"})
    scale = log.observe(scaled("llama-70b-int4", "llama-70b-int4-7m6ppjfgdw", T0 - 600, to=4))
    rollout = log.observe(scaled("llama-70b-int4", "llama-70b-int4-fc99cq8565", T0 - 60))
    old_down = log.observe(scaled("llama-70b-int4", "llama-70b-int4-7m6ppjfgdw", T0 - 50, "down", 3))
    assert scale is not None and scale.kind == "scale"
    assert rollout is not None and rollout.kind == "rollout" and rollout.replica_set == "llama-70b-int4-fc99cq8565"
    assert old_down is not None and old_down.kind == "scale"
    # the new ReplicaSet is now the current one: scaling it further is no second rollout
    more = log.observe(scaled("llama-70b-int4", "llama-70b-int4-fc99cq8565", T0 - 40, to=2))
    assert more is not None and more.kind == "scale"
    # a deployment the log has no ReplicaSet for cannot be judged: its first scale-up is a scale
    first = log.observe(scaled("llama-8b-fp16", "llama-8b-fp16-ps2ffdmslc", T0 - 30))
    assert first is not None and first.kind == "scale"
    assert log.observe(KubeEvent(reason="Started", involved_object=ObjectRef(kind="Pod", name="p"), ts=T0)) is None
    assert [c.kind for c in log.between(["llama-70b-int4"], T0 - 100, T0)] == ["rollout", "scale", "scale"]


def test_a_rollout_of_the_alerting_deployment_just_before_its_alerts_is_rollout_evidence() -> None:
    errors = alert("error_rate", "llama-70b-int4-fc99cq8565-xbbnz", error_ratio=0.7)
    queue = alert("queue_saturation", "llama-70b-int4-fc99cq8565-xbbnz", waiting=33.0)
    log = ChangeLog({"llama-70b-int4": "llama-70b-int4-7m6ppjfgdw", "llama-8b-fp16": "llama-8b-fp16-ps2ffdmslc"})
    log.observe(scaled("llama-70b-int4", "llama-70b-int4-fc99cq8565", T0 - 120))
    evidence = gather_evidence(incident(errors, queue), changes=log)
    assert "ScalingReplicaSet" in evidence.event_reasons
    assert any("rollout of llama-70b-int4" in fact for fact in evidence.facts)
    causes = [h.cause for h in rank(evidence, runbook_index())]
    assert causes[0] == "bad_rollout", causes[:5]
    # without the change log the same alerts read as something else
    assert rank(gather_evidence(incident(errors, queue)), runbook_index())[0].cause != "bad_rollout"


@pytest.mark.parametrize(
    ("deployment", "at"),
    [
        ("llama-8b-fp16", T0 - 120),  # another deployment's rollout
        ("llama-70b-int4", T0 - CHANGE_LOOKBACK_S - 60),  # long before the alerts
        ("llama-70b-int4", T0 + 60),  # after them: not a cause
    ],
)
def test_an_unrelated_or_distant_rollout_is_no_evidence(deployment: str, at: float) -> None:
    log = ChangeLog({"llama-70b-int4": "llama-70b-int4-7m6ppjfgdw", "llama-8b-fp16": "llama-8b-fp16-ps2ffdmslc"})
    log.observe(scaled(deployment, f"{deployment}-newhash123", at))
    errors = alert("error_rate", "llama-70b-int4-7m6ppjfgdw-xbbnz", error_ratio=0.7)
    assert "ScalingReplicaSet" not in gather_evidence(incident(errors), changes=log).event_reasons


def node_alert(signal: str, reason: str, **evidence: Any) -> AlertRef:
    return AlertRef(
        fingerprint=f"{signal}:gpu-node-003",
        entity="gpu-node-003",
        signal=signal,
        detector="kube_events",
        severity="warning",
        starts_at=T0,
        labels={"node": "gpu-node-003", "kind": "Node"},
        evidence={"reason": reason, **evidence},
    )


def test_a_node_lost_again_after_recovering_is_flapping_not_a_single_loss() -> None:
    lost = node_alert("node_not_ready", "NodeNotReady")
    flapping = node_alert("node_flapping", "NodeNotReady", readiness_changes=3, window_s=600.0)
    evidence = gather_evidence(incident(lost, flapping))
    assert {"NodeNotReady", "NodeReady"} <= evidence.event_reasons
    assert any("NodeNotReady then NodeReady then NodeNotReady" in fact for fact in evidence.facts)
    top = rank(evidence, runbook_index())[0]
    assert top.cause == "node_flapping"
    assert any("NodeNotReady then NodeReady then NodeNotReady" in e for e in top.evidence)
    # one loss, no recovery seen: a node that is not ready
    assert rank(gather_evidence(incident(lost)), runbook_index())[0].cause == "node_not_ready"
