"""Post-incident reports of a genuine closed-loop incident: a simulated XID 79, detected, correlated, diagnosed and
remedied in process (evals/record.py), every fact written with the roles' own store functions to a fresh database,
and the simulator's metric batches published to a fresh ``telemetry.metrics.v1`` with their event time as the
record timestamp, as ingest writes them live. The report is then read back from PostgreSQL and Kafka.
"""

from __future__ import annotations

import io
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient
from psycopg import sql
from typer.testing import CliRunner

from evals.record import RecordedEpisode, record_episode
from services.api.app import create_app
from services.auth.tokens import Role
from services.core.bus import ensure_topics
from services.core.events import MetricBatch
from services.core.settings import Settings
from services.diagnostician.ranker import runbook_index
from services.reports.build import Report
from services.reports.cli import app as reports_cli
from services.reports.service import build_incident_report, render_report
from services.reports.telemetry import KafkaMetricSource
from services.simulator.scenario import load_scenario
from services.store.db import connect, migrate
from services.store.incidents import get_incident, save_incident_events
from tests.api_auth import auth_headers
from tests.chromium import chromium_binary, open_page
from tests.conftest import _with_dbname

pytestmark = pytest.mark.integration

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass
class Stored:
    """The recorded episode, its settings (database and topics) and the XID 79 incident's id."""

    settings: Settings
    episode: RecordedEpisode
    incident_id: str


@pytest.fixture(scope="module")
def stored(database_url: str, kafka_ready: None) -> Iterator[Stored]:
    """xid79 (seed 1) through the closed loop, stored; its telemetry on a fresh topic. Dropped afterwards."""
    from kafka import KafkaProducer

    name = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    settings = Settings(database_url=_with_dbname(database_url, name), topic_prefix=f"test.{uuid.uuid4().hex[:10]}.")
    try:
        migrate(settings)
        ensure_topics(settings, [MetricBatch.topic])
        producer = KafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks="all", linger_ms=20)
        topic = settings.topic(MetricBatch.topic)

        def publish(batch: MetricBatch) -> None:
            stamp = int(batch.samples[0].ts * 1000) if batch.samples else None
            producer.send(topic, key=batch.entity.encode(), value=batch.to_bytes(), timestamp_ms=stamp)

        # a recent epoch: the records' timestamps must be within the topic's retention
        epoch = float(int(time.time() // 60) * 60 - 7200)
        episode = record_episode(
            settings, load_scenario("xid79"), 1, index=runbook_index(None), epoch=epoch, metrics=publish
        )
        producer.flush(timeout=60)
        producer.close()
        xid = [e for e in episode.incidents if any(a.signal == "gpu_xid" for a in e.alerts)]
        assert xid, "the XID 79 incident did not open"
        yield Stored(settings, episode, xid[0].incident_id)
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _row_exists(conn: psycopg.Connection, table: str, key: str) -> bool:
    if table == "alerts":
        incident, fingerprint = key.split("/", 1)
        q, args = "SELECT 1 FROM alerts WHERE incident_id = %s AND fingerprint = %s", (incident, fingerprint)
    elif table == "anomalies":
        fingerprint, at = key.split("@", 1)
        q, args = "SELECT 1 FROM anomalies WHERE fingerprint = %s AND ts = %s::timestamptz", (fingerprint, at)
    elif table == "incidents":
        q, args = "SELECT 1 FROM incidents WHERE incident_id = %s", (key,)
    elif table == "diagnoses":
        q, args = "SELECT 1 FROM diagnoses WHERE id = %s", (int(key),)
    elif table == "remediation_runs":
        q, args = "SELECT 1 FROM remediation_runs WHERE run_id = %s", (key,)
    elif table == "remediation_steps":
        q, args = "SELECT 1 FROM remediation_steps WHERE step_id = %s", (key,)
    elif table == "approvals":
        q, args = "SELECT 1 FROM approvals WHERE run_id = %s", (key,)
    else:
        raise AssertionError(f"a timeline entry names an unknown table {table!r}")
    return conn.execute(q, args).fetchone() is not None


def _decodes_as_png(data: bytes) -> tuple[int, int]:
    from PIL import Image

    assert data[:8] == PNG_MAGIC
    with Image.open(io.BytesIO(data)) as image:
        image.load()  # decodes every pixel: a truncated or corrupt file raises here
        assert image.format == "PNG"
        return image.size


def test_the_report_of_a_closed_loop_xid79_incident_in_every_format(stored: Stored, tmp_path: Path) -> None:
    chromium = chromium_binary()
    telemetry = KafkaMetricSource(stored.settings)
    md = render_report(stored.settings, stored.incident_id, "md", tmp_path, telemetry=telemetry)
    html = render_report(stored.settings, stored.incident_id, "html", tmp_path, telemetry=telemetry)
    pdf = render_report(stored.settings, stored.incident_id, "pdf", tmp_path, telemetry=telemetry, chromium=chromium)
    report = md.report
    assert report.telemetry is not None and report.telemetry.problem == "", report.telemetry
    assert report.telemetry.batches, "no telemetry came back from Kafka"

    # every timeline entry comes from a stored row, and the incident's story is all there
    with connect(stored.settings) as conn:
        missing = [str(e.source) for e in report.timeline if not _row_exists(conn, e.source.table, e.source.key)]
        incident = get_incident(conn, stored.incident_id)
    assert missing == [], f"timeline entries without a stored row: {missing}"
    assert incident is not None
    texts = [e.text for e in report.timeline]
    for alert in incident.alerts:
        assert any(alert.signal in t and t.startswith("Alert fired") for t in texts), alert.signal
    assert any(t.startswith("Action cordon: succeeded") for t in texts)
    assert any(t.startswith("Action evict ") and "succeeded" in t for t in texts)
    assert any(t.startswith("Verified replaced llama-70b-fp16: succeeded") for t in texts)
    assert [t for t in texts if t.startswith("Incident ")] == [
        "Incident opened (critical)",
        "Incident mitigated",
        "Incident resolved",
    ]
    kinds = {e.kind for e in report.timeline}
    assert {"alert", "incident", "diagnosis", "decision", "action", "verification", "run"} <= kinds
    times = [e.at for e in report.timeline]
    assert times == sorted(times)
    # an alert ends when it resolved, not when its incident did (the store kept re-stamping its end)
    crashloop_end = next(e.at for e in report.timeline if e.text.startswith("Alert resolved: pod_crashloop"))
    assert incident.resolved_at is not None and crashloop_end < incident.resolved_at.timestamp() - 60

    # the Markdown: sections with their facts, and the plots beside it, each a valid PNG
    text = md.main.read_text()
    for heading in ("Summary", "Detection", "Timeline", "Root cause", "Actions", "Impact", "Follow-ups", "Plots"):
        assert f"\n## {heading}\n" in text
    assert "`gpu_xid_79`" in text and "gpu/gpu-xid-79-fallen-off-bus.md" in text
    assert "**MTTD" in text and "**Time to mitigate**: 3 min" in text
    assert "Prevention (GPU has fallen off the bus (XID 79)" in text and "PCIE_REPLAY_COUNTER" in text
    pngs = [p for p in md.files if p.suffix == ".png"]
    assert {p.name for p in pngs} == {"signals.png", "gpu.png", "serving.png"}
    for png in pngs:
        assert f"]({png.name})" in text
        width, height = _decodes_as_png(png.read_bytes())
        assert width >= 900 and height >= 300, (png.name, width, height)
    # the lost GPU stopped reporting its temperature and power: the report says so, it draws no line on
    assert "Telemetry gap: GPU GPU-" in text and "temperature (DCGM_FI_DEV_GPU_TEMP)" in text

    # the HTML is self-contained and shows cleanly in a browser
    page_html = html.main.read_text()
    assert "<script" not in page_html and 'src="http' not in page_html and 'href="http' not in page_html
    assert page_html.count('src="data:image/png;base64,') == 3
    page = open_page(html.main.as_uri())
    assert page.errors() == []
    shot_w, shot_h = _decodes_as_png(page.screenshot)
    assert shot_w == 1200 and shot_h > 3000, (shot_w, shot_h)
    (tmp_path / "screenshot.png").write_bytes(page.screenshot)

    data = pdf.main.read_bytes()
    assert data.startswith(b"%PDF-") and data.rstrip().endswith(b"%%EOF") and len(data) > 50_000


def test_an_incident_nobody_diagnosed_says_so(stored: Stored, tmp_path: Path) -> None:
    # the same alerts under an incident of its own that no diagnostician saw and no run answered
    first = next(e for e in stored.episode.incidents if e.incident_id == stored.incident_id)
    alone = first.model_copy(update={"incident_id": f"inc-undiagnosed-{uuid.uuid4().hex[:6]}"})
    save_incident_events(stored.settings, [alone])
    done = render_report(
        stored.settings, alone.incident_id, "md", tmp_path, telemetry=KafkaMetricSource(stored.settings)
    )
    text = done.main.read_text()
    assert "> **Missing:** No diagnosis is stored for this incident" in text
    assert "> **Missing:** No remediation run is stored for this incident" in text
    assert "**Resolved**: no; the incident is opened" in text
    assert any("No diagnosis is stored" in m for m in done.report.missing)
    root = text.split("## Root cause", 1)[1].split("\n## ", 1)[0]
    assert "| rank |" not in root  # no ranking invented


def test_when_telemetry_is_missing_the_report_says_what_is_missing(stored: Stored, tmp_path: Path) -> None:
    # a topic that was never written (its retention dropped the window, or another cluster's prefix)
    empty = stored.settings.model_copy(update={"topic_prefix": f"test.{uuid.uuid4().hex[:10]}."})
    report = build_incident_report(stored.settings, stored.incident_id, telemetry=KafkaMetricSource(empty))
    problem = report.telemetry.problem if report.telemetry is not None else ""
    # the broker may create the topic on the metadata request (auto.create.topics.enable): either answer is clear
    assert "does not exist" in problem or "holds no record between" in problem, problem
    assert report.document is not None
    names = [f.name for f in report.document.figures()]
    assert names == ["signals.png"], "only the plot drawn from stored alerts can be drawn without telemetry"
    assert any("Failed and slowed requests are not known: telemetry unavailable" in m for m in report.missing)

    # a broker that does not answer: a clear line, not a crash
    down = stored.settings.model_copy(update={"kafka_bootstrap": "127.0.0.1:9"})
    report = build_incident_report(stored.settings, stored.incident_id, telemetry=KafkaMetricSource(down))
    assert report.telemetry is not None and report.telemetry.problem.startswith("cannot read"), report.telemetry
    assert any(m.startswith("Telemetry: cannot read") for m in report.missing)


def test_an_unknown_incident_is_a_clear_error_on_the_cli_and_404_on_the_api(stored: Stored, tmp_path: Path) -> None:
    env = {
        "CLUSTERMEDIC_DATABASE_URL": stored.settings.database_url or "",
        "CLUSTERMEDIC_TOPIC_PREFIX": stored.settings.topic_prefix,
    }
    runner = CliRunner()
    gone = runner.invoke(reports_cli, ["report", "inc-does-not-exist", "--out", str(tmp_path)], env=env)
    assert gone.exit_code == 2
    assert "no incident 'inc-does-not-exist' is stored" in gone.output
    assert not (tmp_path / "inc-does-not-exist").exists()

    ok = runner.invoke(reports_cli, ["report", stored.incident_id, "--format", "html", "--out", str(tmp_path)], env=env)
    assert ok.exit_code == 0, ok.output
    written = Path(ok.stdout.strip().splitlines()[-1])
    assert written == tmp_path / stored.incident_id / "report.html" and written.stat().st_size > 100_000

    api = TestClient(create_app(stored.settings), headers=auth_headers(stored.settings, "report-reader", Role.VIEWER))
    anonymous = TestClient(create_app(stored.settings)).get(f"/api/v1/incidents/{stored.incident_id}/report")
    assert anonymous.status_code == 401  # behind the API's authentication, as every route
    missing = api.get("/api/v1/incidents/inc-does-not-exist/report")
    assert missing.status_code == 404 and "no incident" in missing.json()["detail"]
    md = api.get(f"/api/v1/incidents/{stored.incident_id}/report", params={"format": "md"})
    assert md.status_code == 200 and md.headers["content-type"].startswith("text/markdown")
    assert md.text.count("](data:image/png;base64,") == 3
    html = api.get(f"/api/v1/incidents/{stored.incident_id}/report")
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    bad = api.get(f"/api/v1/incidents/{stored.incident_id}/report", params={"format": "docx"})
    assert bad.status_code == 422


def test_the_same_stored_incident_gives_the_same_report(stored: Stored) -> None:
    # what the Celery task of item 4 will rely on: rendering again after a redelivery changes nothing
    first: Report = build_incident_report(
        stored.settings, stored.incident_id, telemetry=KafkaMetricSource(stored.settings)
    )
    again: Report = build_incident_report(
        stored.settings, stored.incident_id, telemetry=KafkaMetricSource(stored.settings)
    )
    from services.reports.render import to_markdown

    assert first.document is not None and again.document is not None
    assert to_markdown(first.document) == to_markdown(again.document)
    assert [f.png for f in first.document.figures()] == [f.png for f in again.document.figures()]
    assert json.dumps([str(e.source) for e in first.timeline]) == json.dumps([str(e.source) for e in again.timeline])
