"""From an anomaly on the broker to a webhook delivered by the real Celery worker: the correlate role,
given the notify the CLI gives it (enqueue on the notify stage), and the worker posts Alertmanager's
webhook v4 body."""

from __future__ import annotations

import asyncio
import time

import pytest

from pipelines.app import create_pipeline
from pipelines.correlate.agent import CorrelateOptions, register_correlate
from services.alerting.config import loads_routing
from services.celery_app import configure
from services.core.bus import KafkaPublisher, ensure_topics
from services.core.events import Anomaly
from services.notify.tasks import enqueue
from services.store.db import migrate
from tests.unit.test_notify_vendor_server import WEBHOOK, vendor_server

pytestmark = pytest.mark.integration


def test_an_anomaly_reaches_a_webhook_receiver_through_correlate_and_the_notify_worker(
    kafka_ready, celery_worker, fresh_database, settings
):
    settings = fresh_database.model_copy(update={"topic_prefix": settings.topic_prefix})
    migrate(settings)
    ensure_topics(settings)
    configure(settings)  # as `medic pipeline --role correlate` does before it injects enqueue
    entity = f"GPU-notify-{time.time_ns()}"
    with vendor_server() as vendor:
        config = loads_routing(
            f"""
route: {{receiver: hook, group_by: [alertname, node], group_wait: 1s, group_interval: 5s, repeat_interval: 1h}}
receivers:
  - name: hook
    webhook_configs: [{{url: "{vendor.url}{WEBHOOK}"}}]
"""
        )
        delivered: list[object] = []

        async def run() -> None:
            pipeline = create_pipeline(settings)
            register_correlate(
                pipeline,
                config,
                notify=lambda notification: enqueue(notification, config),
                options=CorrelateOptions(tick_s=0.3, checkpoint_s=1.0),
            )
            await pipeline.app.start()
            try:
                with KafkaPublisher(settings) as publisher:
                    publisher.publish(
                        Anomaly(
                            entity=entity,
                            entity_kind="gpu",
                            signal="gpu_xid",
                            detector="xid_rules",
                            score=79,
                            threshold=1,
                            severity="critical",
                            ts=time.time(),
                            labels={"node": "node-notify"},
                        )
                    )
                deadline = time.monotonic() + 60
                while not delivered and time.monotonic() < deadline:
                    delivered.extend(vendor.to(WEBHOOK))
                    await asyncio.sleep(0.2)
            finally:
                await pipeline.app.stop()

        asyncio.run(run())

    assert delivered, "no webhook reached the receiver"
    request = delivered[0]
    assert request.status == 200, request  # type: ignore[attr-defined]
    body = request.body  # type: ignore[attr-defined]
    assert body["version"] == "4" and body["receiver"] == "hook" and body["status"] == "firing"
    assert [a["labels"]["entity"] for a in body["alerts"]] == [entity]
