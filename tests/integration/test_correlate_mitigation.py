"""A remediation run that succeeds mitigates its incident in the correlate role (and in PostgreSQL)."""

from __future__ import annotations

import asyncio
import time

import pytest

from pipelines.app import create_pipeline
from pipelines.correlate.agent import CorrelateOptions, register_correlate
from services.alerting.config import load_routing
from services.alerting.notification import Notification
from services.core.bus import KafkaPublisher, ensure_topics, read_raw
from services.core.events import Anomaly, IncidentEvent, RemediationEvent
from services.core.paths import REPO_ROOT
from services.store.db import connect, migrate
from services.store.incidents import get_incident

pytestmark = pytest.mark.integration


def test_a_succeeded_remediation_marks_the_incident_mitigated(kafka_ready, fresh_database, settings):
    settings = fresh_database.model_copy(update={"topic_prefix": settings.topic_prefix})
    migrate(settings)
    ensure_topics(settings)
    now = time.time()
    anomaly = Anomaly(
        entity="GPU-mit-1",
        entity_kind="gpu",
        signal="gpu_xid",
        detector="xid_rules",
        score=79,
        threshold=1,
        severity="critical",
        ts=now,
        labels={"node": "node-mit", "gpu": "GPU-mit-1"},
    )
    kinds: dict[str, list[str]] = {}
    notes: list[Notification] = []

    def incident_events() -> list[IncidentEvent]:
        raw = read_raw(settings, [IncidentEvent.topic], max_messages=1000, timeout_s=1)
        return [IncidentEvent.from_bytes(v) for _, _, v in raw]

    async def wait_for_kind(kind: str) -> IncidentEvent | None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for event in await asyncio.to_thread(incident_events):
                kinds.setdefault(event.incident_id, [])
                if event.kind not in kinds[event.incident_id]:
                    kinds[event.incident_id].append(event.kind)
                if event.kind == kind:
                    return event
        return None

    async def run() -> None:
        pipeline = create_pipeline(settings)
        register_correlate(
            pipeline,
            load_routing(REPO_ROOT / "infra" / "config" / "routing.yaml"),
            notify=notes.append,
            options=CorrelateOptions(tick_s=0.5, checkpoint_s=1.0),
        )
        await pipeline.app.start()
        try:
            with KafkaPublisher(settings) as publisher:
                publisher.publish(anomaly)
            opened = await wait_for_kind("opened")
            assert opened is not None, "the anomaly opened no incident"
            with KafkaPublisher(settings) as publisher:
                for status in ("running", "succeeded"):
                    publisher.publish(
                        RemediationEvent(
                            incident_id=opened.incident_id,
                            run_id="run-mit-1",
                            playbook="reboot_node",
                            status=status,
                            level=2,
                            ts=time.time(),  # type: ignore[arg-type]
                        )
                    )
            assert await wait_for_kind("mitigated") is not None, f"no mitigated event: {kinds}"
        finally:
            await pipeline.app.stop()

    asyncio.run(run())

    (incident_id,) = list(kinds)
    assert kinds[incident_id] == ["opened", "mitigated"]
    with connect(settings) as conn:
        stored = get_incident(conn, incident_id)
    assert stored is not None and stored.status == "mitigated"
