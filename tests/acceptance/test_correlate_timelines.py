"""Acceptance timelines of the correlate role through the real broker and PostgreSQL.

Every timeline runs at once against one correlate role (in-process, manual acks, checkpoints), each on
its own cluster label: group_wait / group_interval / repeat_interval, inhibition by a node-down alert,
a silence created and expired through the API, a flapping signal that pages once, an N-of-M route, and
an Alertmanager webhook alert that fires, is redelivered and resolves.
See tests/acceptance/timeline.py for how a timeline is judged.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from fastapi.testclient import TestClient
from psycopg import sql

from pipelines.app import create_pipeline
from pipelines.correlate.agent import CorrelateOptions, Correlator, register_correlate
from services.alerting.config import loads_routing
from services.api.app import create_app
from services.core.bus import ensure_topics
from services.core.settings import Settings
from services.store.db import migrate
from tests.acceptance.timeline import (
    Push,
    Recorder,
    Step,
    Timeline,
    Want,
    WebhookPush,
    ready,
    run_timelines,
    wait_for,
)
from tests.api_auth import auth_headers

pytestmark = pytest.mark.integration

ROUTING = loads_routing(
    """
global:
  resolve_timeout: 5m
route:
  receiver: team
  group_by: [alertname, node]
  group_wait: 1s
  group_interval: 2s
  repeat_interval: 6s
  routes:
    - matchers: ['alertname="log_burst"']
      receiver: team
      min_occurrences: 3
      occurrence_window: 10s
    - matchers: ['alertname="link_flap"']
      receiver: team
      repeat_interval: 1h
receivers:
  - name: team
    webhook_configs: [{url: "http://127.0.0.1:9/hook"}]
inhibit_rules:
  - source_matchers: ['alertname="node_down"']
    target_matchers: ['alertname!="node_down"', 'node!=""']
    equal: [node]
correlation:
  flap_detection: {enabled: true, window: 20s, high: 4, low: 1}
  topology: {enabled: true, window: 1m}
  incidents:
    resolve_after: 1m
    escalation: {warning_members: null, after: null}
""",
    source="acceptance routing",
)


def group_timeline() -> Timeline:
    # Two disks on one node: one group. First after group_wait, the second disk at the next
    # group_interval, then unchanged until repeat_interval has passed since the last notification.
    n1 = {"node": "n1"}
    return Timeline(
        "group",
        pushes=[Push(0.0, "disk_full", "disk-a", n1), Push(1.5, "disk_full", "disk-b", n1)],
        wants=[
            Want(1.0, 1.0, frozenset({"disk-a"}), "first"),
            Want(3.0, 3.0, frozenset({"disk-a", "disk-b"}), "update"),
            Want(9.0, 9.0, frozenset({"disk-a", "disk-b"}), "repeat"),
        ],
        end=10.0,
    )


def inhibition_timeline() -> Timeline:
    # Node n1 is down: its GPU's ECC alert is muted; the same alert on n2 is not.
    return Timeline(
        "inhibit",
        pushes=[
            Push(0.0, "node_down", "n1", {"node": "n1"}, severity="critical", entity_kind="node"),
            Push(0.3, "gpu_ecc", "GPU-a", {"node": "n1"}, entity_kind="gpu"),
            Push(0.3, "gpu_ecc", "GPU-b", {"node": "n2"}, entity_kind="gpu"),
        ],
        wants=[
            Want(1.0, 1.0, frozenset({"n1"}), "first"),
            Want(1.3, 1.3, frozenset({"GPU-b"}), "first"),
        ],
        end=6.0,
    )


def flapping_timeline() -> Timeline:
    # A link that goes up and down every ~0.6 s: the first two episodes end before their group
    # flushes; from the fourth state change on it is flapping and held firing, and pages once.
    toggles = [0.0, 0.4, 1.2, 1.6, 2.4, 3.0, 3.6, 4.2, 4.8, 5.4, 6.0]
    pushes = [
        Push(t, "link_flap", "eth0@n3", {"node": "n3"}, status="firing" if i % 2 == 0 else "resolved")
        for i, t in enumerate(toggles)
    ]
    return Timeline("flap", pushes=pushes, wants=[Want(3.4, 3.4, frozenset({"eth0@n3"}), "first")], end=8.0)


def n_of_m_timeline() -> Timeline:
    # log_burst needs 3 occurrences within 10 s. pod-a reaches it at t=4 and, having started more
    # than group_wait before, is sent at once; pod-b occurs twice and is never sent.
    return Timeline(
        "n_of_m",
        pushes=[
            Push(0.0, "log_burst", "pod-a", {"node": "n4"}),
            Push(0.5, "log_burst", "pod-b", {"node": "n5"}),
            Push(2.0, "log_burst", "pod-a", {"node": "n4"}),
            Push(2.5, "log_burst", "pod-b", {"node": "n5"}),
            Push(4.0, "log_burst", "pod-a", {"node": "n4"}),
        ],
        wants=[Want(4.0, 4.0, frozenset({"pod-a"}), "first")],
        end=7.0,
    )


def webhook_timeline() -> Timeline:
    # An Alertmanager alert fires (t=0), an HA peer delivers it again (t=0.5, the same alert state:
    # nothing changes), and its resolved form arrives at t=2: one alert throughout, so the resolution
    # resolves it there and then, and the group's next flush (t=3) says so, long before the 5 minutes
    # of resolve_timeout.
    labels = {"node": "n8", "severity": "critical"}
    return Timeline(
        "webhook",
        pushes=[
            WebhookPush(0.0, "GpuXidError", labels),
            WebhookPush(0.5, "GpuXidError", labels),
            WebhookPush(2.0, "GpuXidError", labels, status="resolved"),
        ],
        wants=[
            Want(1.0, 1.0, frozenset({"n8"}), "first"),
            Want(3.0, 3.0, frozenset({"n8"}), "resolved"),
        ],
        end=7.5,  # past repeat_interval (t=7): a still-firing alert would repeat
    )


@dataclass
class SilenceCase:
    """A silence made through the API before the timeline starts and expired through it at t=4."""

    api: TestClient
    correlator: Correlator | None = None
    silence_id: str = ""

    async def create(self) -> None:
        body = {
            "matchers": ['alertname="disk_full"', 'cluster="tl-silence"'],
            "duration": "1h",
            "comment": "replacing the disk",
        }
        response = await asyncio.to_thread(self.api.post, "/api/v1/silences", json=body)
        assert response.status_code == 201, response.text
        self.silence_id = response.json()["silence_id"]
        correlator = self.correlator
        assert correlator is not None
        await wait_for(lambda: any(s.id == self.silence_id for s in correlator.silences), 15, "the agent's poll")

    def expire(self) -> None:
        response = self.api.delete(f"/api/v1/silences/{self.silence_id}")
        assert response.status_code == 200 and response.json()["state"] == "expired", response.text

    def timeline(self) -> Timeline:
        # disk_full on n6 is silenced; the fan alert beside it is not. Once the silence is expired
        # (t=4, seen by the agent within its 0.5 s poll), the next group_interval flush (t=5) sends it.
        return Timeline(
            "silence",
            pushes=[
                Push(0.0, "disk_full", "disk-s", {"node": "n6"}),
                Push(0.0, "fan_failure", "fan-1", {"node": "n7"}),
            ],
            steps=[Step(4.0, self.expire)],
            wants=[
                Want(1.0, 1.0, frozenset({"fan-1"}), "first"),
                Want(5.0, 5.0, frozenset({"disk-s"}), "first"),
            ],
            setup=self.create,
            end=6.5,
        )


@pytest.fixture(scope="module")
def module_database(database_url: str) -> Iterator[Settings]:
    name = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    from urllib.parse import urlsplit, urlunsplit

    url = urlunsplit(urlsplit(database_url)._replace(path=f"/{name}"))
    try:
        yield Settings(database_url=url, topic_prefix=f"test.{uuid.uuid4().hex[:10]}.")
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def played(kafka_ready: None, module_database: Settings) -> dict[str, Timeline]:
    """Every timeline, played once against one correlate role."""
    settings = module_database
    migrate(settings)
    ensure_topics(settings)
    api = TestClient(create_app(settings), headers=auth_headers(settings, "acceptance"))
    silence = SilenceCase(api)
    timelines = [
        group_timeline(),
        inhibition_timeline(),
        flapping_timeline(),
        n_of_m_timeline(),
        silence.timeline(),
        webhook_timeline(),
    ]
    recorder = Recorder(timelines)

    async def main() -> None:
        pipeline = create_pipeline(settings)
        silence.correlator = register_correlate(
            pipeline,
            ROUTING,
            notify=recorder,
            options=CorrelateOptions(tick_s=0.2, checkpoint_s=1.0, silence_poll_s=0.5),
        )
        await pipeline.app.start()
        try:
            await ready(pipeline, silence.correlator)
            await run_timelines(pipeline, timelines)
        finally:
            await pipeline.app.stop()

    asyncio.run(main())
    return {t.name: t for t in timelines} | {"_api": api}  # type: ignore[dict-item]


def _judge(timeline: Timeline) -> None:
    problems = timeline.check()
    assert not problems, "\n".join([f"timeline {timeline.name}:", *problems, "seen:", *map(str, timeline.seen)])


def test_group_wait_then_group_interval_then_repeat_interval(played):
    _judge(played["group"])


def test_group_incident_links_both_disks_in_postgres(played):
    api = played["_api"]
    notification = played["group"].seen[-1].notification
    response = api.get(f"/api/v1/incidents/{notification.incident_id}")
    assert response.status_code == 200, response.text
    incident = response.json()
    assert incident["status"] in ("opened", "updated")
    assert sorted(a["entity"] for a in incident["alerts"]) == ["disk-a", "disk-b"]


def test_a_node_down_alert_inhibits_the_alerts_on_that_node_only(played):
    _judge(played["inhibit"])


def test_a_silence_made_through_the_api_mutes_until_it_is_expired(played):
    _judge(played["silence"])


def test_a_flapping_signal_pages_once(played):
    timeline = played["flap"]
    _judge(timeline)
    evidence = timeline.seen[0].notification.alerts[0].evidence
    assert evidence.get("flapping") is True


def test_n_of_m_sends_only_once_the_threshold_is_met(played):
    _judge(played["n_of_m"])


def test_alertmanager_firing_then_resolved_resolves_the_alert_at_once(played):
    timeline = played["webhook"]
    _judge(timeline)
    first, resolved = (s.notification for s in timeline.seen)
    assert [a.fingerprint for a in resolved.alerts] == [a.fingerprint for a in first.alerts]
    assert [a.status for a in resolved.alerts] == ["resolved"]
    # the incident's alert in PostgreSQL ended when the resolved form said, not at resolve_timeout
    incident = played["_api"].get(f"/api/v1/incidents/{first.incident_id}").json()
    (alert,) = incident["alerts"]
    assert alert["status"] == "resolved" and alert["fingerprint"].startswith("alertmanager:")
