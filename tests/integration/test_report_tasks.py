"""Post-incident reports made automatically, and learnt from (issue 17 items 4 and 5).

A genuine closed-loop XID 79 incident (scenario ``xid79``, seed 1, recorded by evals/record.py into a fresh
database, its metrics on a fresh ``telemetry.metrics.v1``) is followed by the notifier's own decisions
(:class:`~services.notify.service.IncidentFollower`, with the real Celery ``enqueue``) against a real
``medic worker`` and the local Slack stand-in, which checks every request against Slack's schema. When the
incident resolves, the worker renders its report once, stores it, posts its summary in the incident's Slack
thread with a link, and indexes it; the diagnosis of a new XID 79 incident (another episode, a day later) then
cites it.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from psycopg import sql
from typer.testing import CliRunner

from evals.record import RecordedEpisode, record_episode
from services.alerting.config import loads_routing
from services.celery_app import configure
from services.core.bus import ensure_topics
from services.core.events import IncidentEvent, MetricBatch
from services.core.settings import Settings
from services.diagnostician.cli import app as kb_cli
from services.diagnostician.diagnostician import RankerDiagnostician
from services.diagnostician.documents import default_knowledge_dir, report_doc_id
from services.diagnostician.embedder import CachingEmbedder, MiniLMEmbedder
from services.diagnostician.kb import index_knowledge
from services.diagnostician.ranker import runbook_index
from services.notify.service import IncidentFollower, Outgoing
from services.notify.state import RedisIncidentStore
from services.notify.tasks import enqueue
from services.notify.threads import RedisThreadStore
from services.reports.archive import archive_report
from services.reports.tasks import enqueue_report, render
from services.reports.telemetry import NoMetricSource
from services.simulator.scenario import load_scenario
from services.store.db import connect, migrate
from tests.conftest import _with_dbname, poll
from tests.integration.test_remediation_harness import Worker
from tests.unit.test_notify_vendor_server import SLACK_POST, SLACK_TOKEN, VendorServer, vendor_server

pytestmark = pytest.mark.integration

CHANNEL = "#sre-gpu"
EXTERNAL_URL = "https://medic.example.test"
REDIS_DB = 11
"""A Redis database of this module's own: its worker consumes only what this module enqueues."""


@dataclass
class Recorded:
    """One recorded xid79 episode in a fresh database, with the knowledge base indexed."""

    settings: Settings
    episode: RecordedEpisode
    incident_id: str

    def events(self) -> list[IncidentEvent]:
        """The XID 79 incident's events, in the order correlate emitted them."""
        return [e for e in self.episode.incidents if e.incident_id == self.incident_id]


@pytest.fixture(scope="module")
def embedder() -> CachingEmbedder:
    return CachingEmbedder(MiniLMEmbedder())


@pytest.fixture
def recorded(database_url: str, kafka_ready: None, redis_ready: None, embedder: CachingEmbedder) -> Iterator[Recorded]:
    """xid79 (seed 1) through the closed loop into a fresh database, its metrics on a fresh topic."""
    from kafka import KafkaProducer

    name = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    base = Settings()
    settings = Settings(
        database_url=_with_dbname(database_url, name),
        topic_prefix=f"test.{uuid.uuid4().hex[:10]}.",
        redis_url=f"redis://127.0.0.1:{base.redis_port}/{REDIS_DB}",
    )
    try:
        migrate(settings)
        index_knowledge(settings, embedder)
        ensure_topics(settings, [MetricBatch.topic])
        producer = KafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks="all", linger_ms=20)
        topic = settings.topic(MetricBatch.topic)

        def publish(batch: MetricBatch) -> None:
            stamp = int(batch.samples[0].ts * 1000) if batch.samples else None
            producer.send(topic, key=batch.entity.encode(), value=batch.to_bytes(), timestamp_ms=stamp)

        epoch = float(int(time.time() // 60) * 60 - 7200)  # recent: within the topic's retention
        episode = record_episode(
            settings, load_scenario("xid79"), 1, index=runbook_index(None), epoch=epoch, metrics=publish
        )
        producer.flush(timeout=60)
        producer.close()
        xid = [e for e in episode.incidents if any(a.signal == "gpu_xid" for a in e.alerts)]
        assert xid, "the XID 79 incident did not open"
        recorded = Recorded(settings, episode, xid[0].incident_id)
        assert recorded.events()[-1].kind == "resolved", "the XID 79 incident did not resolve"
        yield recorded
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def worker(recorded: Recorded, tmp_path: Path) -> Iterator[Worker]:
    """A real ``medic worker`` on the recorded database and this module's Redis database."""
    settings = recorded.settings
    redis.Redis.from_url(settings.broker_url).flushdb()  # this module's database: no queue or thread of a past run
    env = {
        **os.environ,
        "CLUSTERMEDIC_DATABASE_URL": str(settings.database_url),
        "CLUSTERMEDIC_REDIS_URL": settings.broker_url,
        "CLUSTERMEDIC_TOPIC_PREFIX": settings.topic_prefix,
        "CLUSTERMEDIC_NOTIFY_EXTERNAL_URL": EXTERNAL_URL,
        "CLUSTERMEDIC_LOG_LEVEL": "INFO",
    }
    box = Worker(env, tmp_path / "worker.log")
    box.start()
    configure(settings)
    try:
        yield box
    finally:
        box.stop()
        configure(Settings())


@pytest.fixture
def vendor() -> Iterator[VendorServer]:
    with vendor_server() as server:
        yield server


def _routing(url: str) -> Any:
    return loads_routing(f"""
route: {{receiver: slack-sre}}
receivers:
  - name: slack-sre
    slack_configs:
      - {{app_token: "{SLACK_TOKEN}", channel: "{CHANNEL}", app_url: "{url}{SLACK_POST}", send_resolved: true}}
""")


def _report_posts(vendor: VendorServer) -> list[Any]:
    return [r for r in vendor.to(SLACK_POST) if "Post-incident report" in str(r.body.get("text"))]


def _citations(doctor: RankerDiagnostician, incident: IncidentEvent) -> dict[str, list[str]]:
    return {h.cause: [c.doc_id for c in h.citations] for h in doctor.diagnose(incident).hypotheses}


def test_a_resolved_incident_gets_one_report_posted_in_its_slack_thread_and_indexed(
    recorded: Recorded, worker: Worker, vendor: VendorServer
) -> None:
    settings = recorded.settings
    routing = _routing(vendor.url)
    client = redis.Redis.from_url(settings.broker_url)
    threads = RedisThreadStore(client, 3600)  # where the worker's Slack deliveries keep the incident's thread
    store = RedisIncidentStore(client, 3600)

    def send(out: Outgoing) -> None:
        enqueue(out.notification, routing, diagnosis=out.diagnosis, remediation=out.remediation, event=out.event)

    def report(event: IncidentEvent, receivers: tuple[str, ...]) -> None:
        enqueue_report(event.incident_id, event.ts, routing, receivers)

    follower = IncidentFollower(routing, store, send, report)
    *before, resolved = recorded.events()
    for event in before:
        follower.on_incident(event)
    for diagnosis in recorded.episode.diagnoses:  # the notifier posts the diagnosis: the thread's parent
        if diagnosis.incident_id == recorded.incident_id:
            follower.on_diagnosis(diagnosis)
    parent = poll(lambda: threads.get(CHANNEL, recorded.incident_id), 60, what="the incident's Slack thread")
    follower.on_incident(resolved)

    posts = poll(lambda: _report_posts(vendor), 120, what="the report's summary in Slack")
    body = posts[0].body
    assert body["thread_ts"] == parent.ts and body["channel"] == parent.channel
    link = f"{EXTERNAL_URL}/api/v1/incidents/{recorded.incident_id}/report?format=html"
    section = body["blocks"][0]["text"]["text"]
    assert f"<{link}|" in section and "gpu_xid_79" in section and "Resolved*: yes" in section
    assert vendor.violations == []

    with connect(settings) as conn:
        rows = conn.execute(
            "SELECT r.version, i.updated_at, r.body_md, r.body_html, r.kb_doc_id, r.posted, r.root_cause"
            " FROM reports r JOIN incidents i USING (incident_id) WHERE incident_id = %s",
            (recorded.incident_id,),
        ).fetchall()
        doc = conn.execute(
            "SELECT kind, metadata->>'root_cause', (SELECT count(*) FROM kb_chunks c WHERE c.doc_id = d.doc_id)"
            " FROM kb_documents d WHERE doc_id = %s",
            (report_doc_id(recorded.incident_id),),
        ).fetchone()
    assert len(rows) == 1
    version, updated_at, md, html, kb_doc_id, posted, root_cause = rows[0]
    assert version == updated_at  # one report per stored incident version
    assert md.startswith("# Post-incident report") and "## Timeline" in md and html.startswith("<!DOCTYPE html>")
    assert kb_doc_id == report_doc_id(recorded.incident_id) and root_cause == "gpu_xid_79"
    assert set(posted) == {CHANNEL} and posted[CHANNEL] not in ("", parent.ts)  # the reply's own ts
    assert doc is not None and doc[0] == "report" and doc[1] == "gpu_xid_79" and doc[2] > 1

    # a redelivered resolved event asks again: the same stored report, nothing posted twice
    follower.on_incident(resolved)
    again = render.apply_async(args=[recorded.incident_id, resolved.ts, [], {}], queue="reports").get(timeout=120)
    assert again["created"] is False and again["posted"] == {CHANNEL: posted[CHANNEL]}
    with connect(settings) as conn:
        count = conn.execute("SELECT count(*) FROM reports WHERE incident_id = %s", (recorded.incident_id,)).fetchone()
    assert count == (1,)
    assert len(_report_posts(vendor)) == 1

    # an incident that is not stored is no crash and no endless retry: the task says so
    unknown = render.apply_async(args=["inc-not-stored", resolved.ts, [], {}], queue="reports").get(timeout=60)
    assert "no incident 'inc-not-stored' is stored" in unknown["skipped"]


def test_a_new_xid79_incident_cites_the_indexed_report_of_the_last_one(
    recorded: Recorded, embedder: CachingEmbedder
) -> None:
    settings = recorded.settings
    # another XID 79 a day later (seed 2: another episode of the scenario), stored beside the first
    later = record_episode(
        settings, load_scenario("xid79"), 2, index=runbook_index(None), epoch=recorded.episode.epoch + 86400
    )
    new = next(e for e in later.incidents if e.kind == "opened" and any(a.signal == "gpu_xid" for a in e.alerts))
    assert new.incident_id != recorded.incident_id
    doctor = RankerDiagnostician(settings, embedder=embedder)
    try:
        cited_before = _citations(doctor, new)
        report = report_doc_id(recorded.incident_id)
        assert not any(report in ids for ids in cited_before.values())

        stored = archive_report(
            settings, recorded.incident_id, embedder=embedder, telemetry=NoMetricSource("not needed here")
        )
        assert stored.created and stored.kb_doc_id == report

        cited_after = _citations(doctor, new)
    finally:
        doctor.close()
    top = next(iter(cited_after))
    assert top == "gpu_xid_79"
    assert report in cited_after["gpu_xid_79"]


def _postmortem(tmp_path: Path, front: str, body: str = "## Summary\n\nGPU 2 fell off the bus.\n") -> Path:
    path = tmp_path / "pm.md"
    path.write_text(f"---\n{front}---\n{body}", encoding="utf-8")
    return path


def test_a_person_written_postmortem_is_imported_and_bad_front_matter_is_refused(
    fresh_database: Settings, embedder: CachingEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    knowledge = tmp_path / "knowledge"
    shutil.copytree(default_knowledge_dir(), knowledge)
    for key, value in {
        "CLUSTERMEDIC_DATABASE_URL": str(fresh_database.database_url),
        "CLUSTERMEDIC_KB_DIR": str(knowledge),
    }.items():
        monkeypatch.setenv(key, value)
    runner = CliRunner()
    good = _postmortem(
        tmp_path,
        "id: pm-2026-11-30-xid79-node-12\ntitle: GPU 2 on node 12 fell off the bus\nroot_cause: gpu_xid_79\n"
        "date: 2026-11-30\nseverity: critical\nservices: [llama-70b]\n"
        "playbooks_run:\n  - {name: cordon_node, level: 1, status: succeeded}\nduration_minutes: 25\n",
    )
    result = runner.invoke(kb_cli, ["import-postmortem", str(good)])
    assert result.exit_code == 0, result.output
    assert (knowledge / "postmortems" / "pm-2026-11-30-xid79-node-12.md").read_text() == good.read_text()
    with connect(fresh_database) as conn:
        row = conn.execute(
            "SELECT kind, metadata->>'root_cause' FROM kb_documents WHERE doc_id = 'pm-2026-11-30-xid79-node-12'"
        ).fetchone()
    assert row == ("postmortem", "gpu_xid_79")
    # it is a file of the knowledge folder now: a full re-index keeps it
    assert "pm-2026-11-30-xid79-node-12" not in index_knowledge(fresh_database, embedder, knowledge).removed

    bad = {
        "root_cause: gpu_xid_79\n": "id",  # no id, no title
        "id: PM One\ntitle: t\nroot_cause: gpu_xid_79\n": "not kebab-case",
        "id: pm-x\ntitle: t\nroot_cause: gpu_melted\n": "gpu_melted",
        "id: pm-x\ntitle: t\nroot_cause: gpu_xid_79\nseverty: critical\n": "severty",
        "id: pm-x\ntitle: t\nroot_cause: gpu_xid_79\nplaybooks_run:\n  - {name: cordon_node, level: 7}\n": "level",
        "id: pm-x\ntitle: t\nroot_cause: gpu_xid_79\ndate: yesterday\n": "date",
        "id: pm-x\ntitle: [unclosed\n": "not valid YAML",
    }
    for front, says in bad.items():
        result = runner.invoke(kb_cli, ["import-postmortem", str(_postmortem(tmp_path, front))])
        assert result.exit_code == 2 and says in result.output and "pm.md" in result.output, (front, result.output)
    assert sorted(p.name for p in (knowledge / "postmortems").glob("*.md")) == sorted(
        [*(p.name for p in (default_knowledge_dir() / "postmortems").glob("*.md")), "pm-2026-11-30-xid79-node-12.md"]
    )
