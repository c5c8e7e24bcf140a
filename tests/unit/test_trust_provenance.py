"""Provenance on every signal: defaults, metric and webhook sources, carried by correlate (docs/security.md)."""

from __future__ import annotations

import json

from pipelines.correlate.engine import Engine
from pipelines.detect import DetectorSet, EntityDetection, metric_provenance
from pipelines.detectors.rules_xid import XidDetector
from services.alerting.config import loads_routing
from services.core.events import AlertRef, Anomaly, IncidentEvent, MetricBatch, Provenance, Sample
from services.ingest.normalise import alertmanager_webhook
from tests.made_up_xids import made_up_xid_catalog

GPU = "GPU-5d4c3b2a-0000-1111-2222-333344445555"
NODE = "gpu-node-3"
ROUTING = """
route: {receiver: sre, group_by: [alertname], group_wait: 0s}
receivers: [{name: sre}]
"""


def test_a_message_without_provenance_is_trusted_for_nothing() -> None:
    old = {"entity": GPU, "signal": "gpu_xid", "detector": "xid_rules", "score": 79, "threshold": 1, "ts": 1.0}
    anomaly = Anomaly.from_bytes(json.dumps(old))
    assert anomaly.provenance == Provenance()
    assert not anomaly.provenance.trusts("gpu_fault") and not anomaly.provenance.trusts("topology")
    ref = AlertRef.model_validate(
        {
            "fingerprint": "f",
            "entity": GPU,
            "signal": "gpu_xid",
            "detector": "x",
            "severity": "critical",
            "starts_at": 1.0,
        }
    )
    assert ref.provenance.trusted == ()


def test_provenance_round_trips_and_tolerates_new_sources() -> None:
    prov = Provenance(source="some_future_exporter", stream="x", trusted=("gpu_fault",))
    anomaly = Anomaly(entity="e", signal="s", detector="d", score=1, threshold=1, ts=1, provenance=prov)
    assert Anomaly.from_bytes(anomaly.to_bytes()).provenance == prov


def dcgm_batch(code: int, ts: float, source: str = "scrape") -> MetricBatch:
    labels = {"UUID": GPU, "gpu": "0", "Hostname": NODE}
    return MetricBatch(
        entity=GPU, source=source, samples=(Sample(name="DCGM_FI_DEV_XID_ERRORS", labels=labels, value=code, ts=ts),)
    )


def test_dcgm_and_nvml_metrics_are_trusted_gpu_sources_other_metrics_are_not() -> None:
    assert metric_provenance(dcgm_batch(79, 1.0)).source == "dcgm"
    assert metric_provenance(dcgm_batch(79, 1.0)).trusts("gpu_fault")
    nvml = MetricBatch(entity=GPU, source="nvml", samples=(Sample(name="gpu_temp", value=80, ts=1.0),))
    assert metric_provenance(nvml).source == "nvml" and metric_provenance(nvml).trusts("gpu_fault")
    vllm = MetricBatch(
        entity="pod-a", source="scrape", samples=(Sample(name="vllm:num_requests_waiting", value=9, ts=1),)
    )
    assert metric_provenance(vllm).source == "prometheus"
    assert not metric_provenance(vllm).trusts("gpu_fault") and metric_provenance(vllm).trusts("topology")


def test_the_detect_role_stamps_a_dcgm_xid_as_trusted() -> None:
    detection = EntityDetection(DetectorSet.of([XidDetector(made_up_xid_catalog())]))
    detection.on_batch(dcgm_batch(0, 1.0), None)
    _, _, anomalies = detection.on_batch(dcgm_batch(79, 16.0, source="simulator"), None)
    assert [(a.signal, a.provenance.source, a.provenance.stream) for a in anomalies] == [
        ("gpu_xid", "dcgm", "simulator")
    ]
    assert anomalies[0].provenance.trusts("gpu_fault")


def webhook(labels: dict[str, str]) -> bytes:
    return json.dumps(
        {
            "version": "4",
            "groupKey": '{}:{alertname="X"}',
            "status": "firing",
            "receiver": "clustermedic",
            "alerts": [{"status": "firing", "labels": labels, "startsAt": "2026-01-01T00:00:00Z"}],
        }
    ).encode()


def test_webhook_alerts_are_trusted_for_nothing() -> None:
    (anomaly,) = alertmanager_webhook(webhook({"alertname": "gpu_xid", "node": NODE, "xid": "79"}))
    assert anomaly.provenance.source == "alertmanager_webhook"
    assert anomaly.provenance.trusted == ()


def test_correlate_carries_provenance_onto_the_incident_alerts() -> None:
    engine = Engine(loads_routing(ROUTING))
    prov = Provenance(source="kernel_log", stream='{unit="kernel"}', trusted=("gpu_fault", "topology"))
    anomaly = Anomaly(
        entity=GPU,
        entity_kind="gpu",
        signal="gpu_xid",
        detector="log_templates",
        score=1,
        threshold=1,
        severity="critical",
        ts=0.0,
        labels={"node": NODE},
        evidence={"xid": 79},
        provenance=prov,
    )
    actions = [*engine.ingest(anomaly, 0.0), *engine.tick(1.0)]
    incidents = [a for a in actions if isinstance(a, IncidentEvent)]
    assert incidents and incidents[0].alerts[0].provenance == prov
    # and through the JSON the changelog-backed tables keep
    again = IncidentEvent.from_bytes(incidents[0].to_bytes())
    assert again.alerts[0].provenance.trusts("gpu_fault")
