"""One realistic example of every event, used by ``make demo``, tests and benchmarks.

The story is a single GPU fault: XID 79 on GPU 3 of node gpu-node-1, as DCGM, the kernel log, the
kubelet and each later pipeline stage would report it.
"""

from __future__ import annotations

from services.core.events import (
    AlertRef,
    Anomaly,
    Citation,
    DeadLetter,
    Diagnosis,
    Event,
    Hypothesis,
    IncidentEvent,
    KubeEvent,
    LogRecord,
    MetricBatch,
    ObjectRef,
    RemediationEvent,
    Sample,
)

GPU_UUID = "GPU-5f1c2a7e-0d3b-4c1e-9a55-1b2c3d4e5f60"
NODE = "gpu-node-1"
POD = "llama-70b-fp16-7c9d8-x2k4q"
INCIDENT = "inc-20261129-0001"


def example_events(ts: float) -> list[Event]:
    """Return one event per topic, all describing the same XID 79 fault at time ``ts``."""
    gpu_labels = {
        "gpu": "3",
        "UUID": GPU_UUID,
        "device": "nvidia3",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": NODE,
        "pod": POD,
        "namespace": "llm",
        "container": "vllm",
    }
    anomaly = Anomaly(
        entity=GPU_UUID,
        entity_kind="gpu",
        signal="gpu_xid",
        detector="xid_rules",
        score=79.0,
        threshold=1.0,
        severity="critical",
        ts=ts,
        labels={"node": NODE, "gpu": GPU_UUID, "pod": POD, "namespace": "llm"},
        evidence={"xid": 79, "meaning": "GPU has fallen off the bus", "action": "reboot node"},
        fingerprint="f-xid79-" + GPU_UUID[-12:],
    )
    alert = AlertRef(
        fingerprint=anomaly.fingerprint,
        entity=anomaly.entity,
        signal=anomaly.signal,
        detector=anomaly.detector,
        severity=anomaly.severity,
        starts_at=ts,
        labels=anomaly.labels,
        evidence=anomaly.evidence,
    )
    return [
        MetricBatch(
            entity=GPU_UUID,
            source="example",
            samples=(
                Sample(name="DCGM_FI_DEV_XID_ERRORS", labels=gpu_labels, value=79.0, ts=ts),
                Sample(name="DCGM_FI_DEV_GPU_TEMP", labels=gpu_labels, value=61.0, ts=ts),
                Sample(name="DCGM_FI_DEV_FB_USED", labels=gpu_labels, value=71234.0, ts=ts),
            ),
        ),
        LogRecord(
            stream={"job": "kernel", "node": NODE},
            line="NVRM: Xid (PCI:0000:9b:00): 79, pid=41873, GPU has fallen off the bus.",
            ts=ts,
            entity=GPU_UUID,
        ),
        KubeEvent(
            reason="BackOff",
            type="Warning",
            involved_object=ObjectRef(kind="Pod", name=POD, namespace="llm"),
            message="Back-off restarting failed container vllm in pod " + POD,
            count=3,
            ts=ts,
            node=NODE,
            source_component="kubelet",
        ),
        anomaly,
        IncidentEvent(
            incident_id=INCIDENT,
            kind="opened",
            severity="critical",
            title=f"XID 79 on {NODE} GPU 3",
            group_key="{}:{node=\"" + NODE + "\"}",
            labels={"node": NODE},
            alerts=(alert,),
            opened_at=ts,
            ts=ts,
        ),
        Diagnosis(
            incident_id=INCIDENT,
            diagnostician="ranker",
            hypotheses=(
                Hypothesis(
                    cause="gpu_xid_79",
                    confidence=0.93,
                    summary="GPU 3 fell off the PCIe bus; the node needs a reboot",
                    evidence=("DCGM_FI_DEV_XID_ERRORS=79", "kernel: NVRM Xid 79"),
                    citations=(Citation(doc_id="gpu-xid-79-fallen-off-bus", title="GPU has fallen off the bus"),),
                    playbook="drain_node",
                    level=2,
                ),
            ),
            proposed_playbook="drain_node",
            proposed_params={"node": NODE},
            level=2,
            latency_ms=12.5,
            ts=ts,
        ),
        RemediationEvent(
            incident_id=INCIDENT,
            run_id="run-0001",
            playbook="drain_node",
            status="awaiting_approval",
            level=2,
            detail="drain gpu-node-1, then reboot",
            ts=ts,
        ),
        DeadLetter.of(
            raw=b"{not json", source_topic="telemetry.metrics.v1", error="not UTF-8 JSON", consumer="example", ts=ts
        ),
    ]
