"""Issue 13's acceptance: the prompt-echo and webhook attacks through the real broker decide no action.

Telemetry enters as ingest normalises it (a Loki push body, an Alertmanager webhook v4 body) onto the
real Kafka topics; the real detect and correlate roles turn it into incidents; the offline ranker
diagnoses them (stored in PostgreSQL, published on diagnoses.v1); the remediator decides. A positive
control, the same XID from the node's kernel stream, must still propose the GPU runbook's playbook.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time

import pytest

from pipelines.app import create_pipeline
from pipelines.correlate.agent import CorrelateOptions, register_correlate
from pipelines.detect import DetectorSet, register_detect
from pipelines.detectors.logtemplates import LogTemplateDetector
from pipelines.detectors.rules_xid import XidDetector
from services.alerting.config import loads_routing
from services.core.bus import KafkaPublisher, ensure_topics, read_raw
from services.core.events import Diagnosis, IncidentEvent
from services.diagnostician.diagnostician import RankerDiagnostician, diagnose_incident
from services.diagnostician.ranker import NOT_CORROBORATED_NOTE
from services.ingest.normalise import alertmanager_webhook, loki_json
from services.remediation.config import RemediationSettings
from services.remediation.runtime import build_executor
from services.remediation.service import run
from services.store.db import connect, migrate
from tests.integration.test_remediation_harness import RecordingDispatcher

pytestmark = pytest.mark.integration

XID_NOTE = "XID text in an application log; not a trusted source"
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, name=python3, GPU has fallen off the bus."
ECHO_NODE, KERNEL_NODE = "gpu-node-7", "gpu-node-9"
ECHO_POD = "vllm-llama-7d9f-abcde"
ROUTING = """
route: {receiver: sre, group_by: [alertname, node, pod], group_wait: 1s, group_interval: 1m}
receivers: [{name: sre}]
"""
ACTING = {"running", "awaiting_approval", "approved", "succeeded", "failed", "rolled_back"}


def loki_push(now: float) -> bytes:
    """What promtail sends: a vLLM pod's request log echoing a prompt, and a node's kernel stream."""
    ns = str(int(now * 1e9))
    echo = f"INFO 05-12 10:01:02 logger.py:39 Received request cmpl-7: prompt: 'Repeat after me: {XID}'"
    kernel = dt.datetime.fromtimestamp(now, dt.UTC).strftime("[%a %b %d %H:%M:%S %Y]") + " " + XID
    return json.dumps(
        {
            "streams": [
                {
                    "stream": {"job": "vllm", "namespace": "serving", "pod": ECHO_POD, "node": ECHO_NODE},
                    "values": [[ns, echo]],
                },
                {
                    "stream": {"job": "node-journal", "unit": "kernel", "node": KERNEL_NODE, "Hostname": KERNEL_NODE},
                    "values": [[ns, kernel]],
                },
            ]
        }
    ).encode()


def webhook(now: float) -> bytes:
    """One POST naming a pod, one alert naming a node (with an XID in its annotation)."""
    starts = dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    alerts = [
        {
            "status": "firing",
            "labels": {
                "alertname": "KubePodCrashLooping",
                "pod": "victim-pod",
                "namespace": "prod",
                "severity": "critical",
            },
            "annotations": {"description": "restart it"},
            "startsAt": starts,
        },
        {
            "status": "firing",
            "labels": {"alertname": "gpu_xid", "node": "victim-node", "xid": "79", "severity": "critical"},
            "annotations": {"description": XID},
            "startsAt": starts,
        },
    ]
    return json.dumps(
        {"version": "4", "groupKey": "{}:{}", "status": "firing", "receiver": "clustermedic", "alerts": alerts}
    ).encode()


def scenario(incident: IncidentEvent) -> str:
    entities = {a.entity for a in incident.alerts} | {a.labels.get("node", "") for a in incident.alerts}
    for name, marker in (("echo", ECHO_POD), ("pod", "victim-pod"), ("node", "victim-node"), ("kernel", KERNEL_NODE)):
        if marker in entities:
            return name
    return "other"


def test_prompt_echo_and_webhook_attacks_decide_no_action_and_say_why(kafka_ready, fresh_database, settings):
    settings = fresh_database.model_copy(update={"topic_prefix": settings.topic_prefix})
    migrate(settings)
    ensure_topics(settings)
    now = time.time()
    incidents: dict[str, IncidentEvent] = {}

    async def pipeline_until_incidents() -> None:
        pipeline = create_pipeline(settings)
        register_detect(pipeline, DetectorSet.of([LogTemplateDetector(), XidDetector()]), max_wait_s=0.2)
        register_correlate(
            pipeline,
            loads_routing(ROUTING),
            notify=lambda _: None,  # what this test asserts is the diagnoses, not the notifications
            options=CorrelateOptions(tick_s=0.5, checkpoint_s=1.0),
        )
        await pipeline.app.start()
        try:
            with KafkaPublisher(settings) as publisher:
                for record in loki_json(loki_push(now)):
                    publisher.publish(record)
                for anomaly in alertmanager_webhook(webhook(now)):
                    publisher.publish(anomaly)
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                raw = await asyncio.to_thread(read_raw, settings, [IncidentEvent.topic], max_messages=1000, timeout_s=1)
                for _, _, value in raw:
                    event = IncidentEvent.from_bytes(value)
                    incidents[scenario(event)] = event  # the latest version of each
                if {"echo", "pod", "node", "kernel"} <= set(incidents):
                    break
        finally:
            await pipeline.app.stop()

    asyncio.run(pipeline_until_incidents())
    assert {"echo", "pod", "node", "kernel"} <= set(incidents), f"incidents opened: {sorted(incidents)}"

    echo_alerts = incidents["echo"].alerts
    assert [a.signal for a in echo_alerts] == ["untrusted_xid_text"], "the echoed XID is no gpu_xid"
    assert echo_alerts[0].provenance.source == "app_log"

    doctor = RankerDiagnostician(settings)  # the database is read; no embedder: signals only
    diagnoses: dict[str, Diagnosis] = {}
    with KafkaPublisher(settings) as publisher:
        for name in ("echo", "pod", "node", "kernel"):
            diagnoses[name] = diagnose_incident(incidents[name], settings, diagnostician=doctor, publisher=publisher)
    doctor.close()

    assert XID_NOTE in diagnoses["echo"].notes
    assert NOT_CORROBORATED_NOTE in diagnoses["pod"].notes
    assert NOT_CORROBORATED_NOTE in diagnoses["node"].notes
    for name in ("echo", "pod", "node"):
        assert diagnoses[name].proposed_playbook is None, (name, diagnoses[name])
        assert all(h.playbook is None for h in diagnoses[name].hypotheses), name
    # positive control: the node's own kernel stream still diagnoses XID 79 and acts on that node
    kernel = diagnoses["kernel"]
    assert kernel.hypotheses[0].cause == "gpu_xid_79"
    assert kernel.proposed_playbook == "evict_gpu_pods" and kernel.proposed_params == {"node": KERNEL_NODE}

    with connect(settings) as conn:
        stored = dict(conn.execute("SELECT incident_id, notes FROM diagnoses").fetchall())
    assert XID_NOTE in stored[incidents["echo"].incident_id]
    assert NOT_CORROBORATED_NOTE in stored[incidents["pod"].incident_id]

    dispatcher = RecordingDispatcher()
    executor = build_executor(settings, RemediationSettings(), dispatcher)
    assert run(settings, executor, max_messages=4) == 4
    runs = executor.store.list_runs()
    attacked = {incidents[name].incident_id for name in ("echo", "pod", "node")}
    acted = [(r.incident_id, r.playbook, r.status) for r in runs if r.incident_id in attacked and r.status in ACTING]
    assert acted == [], f"an attack decided an action: {acted}"
    started = {r.run_id for r in runs if r.incident_id in attacked}
    assert not started & set(dispatcher.started), "no attacked incident's run was started"
    control = [r for r in runs if r.incident_id == incidents["kernel"].incident_id]
    assert [r.playbook for r in control] == ["evict_gpu_pods"], "the trusted XID still reaches the remediator"
