"""The knowledge base and the offline ranker on the real PostgreSQL + pgvector, with the real MiniLM.

Embeddings are cached per process (CachingEmbedder), so the model embeds the knowledge base once per
test session however many fresh databases index it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from psycopg.types.json import Jsonb
from typer.testing import CliRunner

from services.core.bus import KafkaPublisher, ensure_topics, read_raw
from services.core.events import AlertRef, DeadLetter, Diagnosis, IncidentEvent, Provenance
from services.core.settings import Settings
from services.diagnostician.cli import app
from services.diagnostician.diagnostician import RankerDiagnostician, diagnose_incident, load_incident
from services.diagnostician.documents import default_knowledge_dir
from services.diagnostician.embedder import CachingEmbedder, MiniLMEmbedder
from services.diagnostician.kb import configure_session, index_incident, index_knowledge, kb_counts, search
from services.diagnostician.service import run
from services.store.db import connect

pytestmark = pytest.mark.integration

T0 = 1_760_000_000.0


@pytest.fixture(scope="module")
def embedder() -> CachingEmbedder:
    return CachingEmbedder(MiniLMEmbedder())


@pytest.fixture
def indexed(fresh_database: Settings, embedder: CachingEmbedder) -> Settings:
    report = index_knowledge(fresh_database, embedder)
    assert len(report.added) >= 33
    return fresh_database


@pytest.fixture
def conn(indexed: Settings) -> Iterator[Any]:
    with connect(indexed) as connection:
        configure_session(connection)
        yield connection


def xid79_incident(incident_id: str = "inc-xid79") -> IncidentEvent:
    labels = {"node": "h100-a-07", "gpu": "5", "pod": "llama-70b-3", "model": "llama-70b"}
    return IncidentEvent(
        incident_id=incident_id,
        kind="opened",
        severity="critical",
        title="GPU 5 on h100-a-07 stopped responding",
        labels={"node": "h100-a-07"},
        alerts=(
            AlertRef(
                fingerprint="xid:h100-a-07:5",
                entity="GPU-5",
                signal="gpu_xid",
                detector="log_templates",
                severity="critical",
                starts_at=T0,
                labels=labels,
                evidence={
                    "xid": 79,
                    "example": "NVRM: Xid (PCI:0000:9b:00): 79, pid=2231, name=python3, GPU has fallen off the bus.",
                },
                # the node's kernel stream: a trusted GPU source (docs/security.md)
                provenance=Provenance(source="kernel_log", trusted=("gpu_fault", "topology")),
            ),
        ),
        opened_at=T0,
        ts=T0,
    )


def test_reindex_is_incremental(fresh_database: Settings, embedder: CachingEmbedder, tmp_path: Path) -> None:
    root = tmp_path / "knowledge"
    shutil.copytree(default_knowledge_dir(), root)
    first = index_knowledge(fresh_database, embedder, root)
    assert len(first.added) >= 33 and first.chunks > 100

    again = index_knowledge(fresh_database, embedder, root)
    assert (again.added, again.updated, again.removed, again.chunks) == ((), (), (), 0)
    assert len(again.unchanged) == len(first.added)

    runbook = root / "runbooks" / "gpu" / "gpu-thermal-throttling.md"
    runbook.write_text(runbook.read_text() + "\nCheck the rack's inlet temperature sensor first.\n")
    (root / "postmortems" / "pm-2025-05-02-startup-probe-cache.md").unlink()
    changed = index_knowledge(fresh_database, embedder, root)
    assert changed.updated == ("gpu-thermal-throttling",)
    assert changed.removed == ("pm-2025-05-02-startup-probe-cache",)
    assert changed.added == ()

    with connect(fresh_database) as c:
        counts = kb_counts(c)
        rows = c.execute(
            "SELECT count(*), bool_and(content LIKE '%%inlet temperature%%' OR position <> "
            "(SELECT max(position) FROM kb_chunks WHERE doc_id = 'gpu-thermal-throttling'))"
            " FROM kb_chunks WHERE doc_id = 'gpu-thermal-throttling'"
        ).fetchone()
        orphans = c.execute(
            "SELECT count(*) FROM kb_chunks WHERE doc_id = 'pm-2025-05-02-startup-probe-cache'"
        ).fetchone()
        vector = c.execute("SELECT embedding FROM kb_chunks LIMIT 1").fetchone()[0]
    assert counts["postmortem"] == 2 and counts["runbook"] >= 30
    assert rows[0] > 3 and rows[1]
    assert orphans[0] == 0
    assert np.linalg.norm(np.asarray(vector.to_numpy())) == pytest.approx(1.0, abs=1e-4)


def test_hybrid_search_finds_the_xid79_runbook(conn: Any, embedder: CachingEmbedder) -> None:
    text = "GPU fell off the bus"
    hits = search(conn, embedder.embed_one(text), text, k=5)
    assert hits[0].doc_id == "gpu-xid-79-fallen-off-bus"
    assert hits[0].vector_rank is not None and hits[0].title.startswith("GPU has fallen off the bus")
    assert len({h.doc_id for h in hits}) == len(hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)

    text = "KV cache full, requests preempted, queue growing"
    hits = search(conn, embedder.embed_one(text), text, k=3)
    assert "serving-kv-cache-exhaustion" in [h.doc_id for h in hits]


def test_label_and_kind_filters_apply_to_both_branches(conn: Any, embedder: CachingEmbedder) -> None:
    text = "GPU fell off the bus"
    vector = embedder.embed_one(text)
    serving = search(conn, vector, text, k=5, labels={"area": "serving"})
    assert serving and all(h.metadata["area"] == "serving" for h in serving)
    past = search(conn, vector, text, k=3, kinds=["postmortem", "incident"])
    assert past[0].doc_id == "pm-2025-03-14-xid79-tp-replica-loss"
    assert all(h.kind in ("postmortem", "incident") for h in past)


def test_similar_past_incidents_are_retrieved(conn: Any, embedder: CachingEmbedder) -> None:
    report = index_incident(conn, embedder, xid79_incident("inc-past-1"), "gpu_xid_79", "cordoned and rebooted")
    assert report.added == ("inc-past-1",)
    again = index_incident(conn, embedder, xid79_incident("inc-past-1"), "gpu_xid_79", "cordoned and rebooted")
    assert again.chunks == 0 and again.unchanged == ("inc-past-1",)
    text = "Xid 79 GPU has fallen off the bus on h100"
    hits = search(conn, embedder.embed_one(text), text, k=3, kinds=["incident"])
    assert [h.doc_id for h in hits] == ["inc-past-1"] and hits[0].root_cause == "gpu_xid_79"


def test_ranker_with_retrieval_stores_and_publishes(
    indexed: Settings, embedder: CachingEmbedder, settings: Settings, kafka_ready: None
) -> None:
    both = indexed.model_copy(update={"topic_prefix": settings.topic_prefix})
    ensure_topics(both, [both.topic(Diagnosis.topic)])
    doctor = RankerDiagnostician(both, embedder=embedder)
    with KafkaPublisher(both) as publisher:
        diagnosis = diagnose_incident(xid79_incident(), both, diagnostician=doctor, publisher=publisher)
    doctor.close()
    top = diagnosis.hypotheses[0]
    assert top.cause == "gpu_xid_79" and top.confidence > 0.5
    cited = {c.doc_id for c in top.citations}
    assert "gpu-xid-79-fallen-off-bus" in cited and "pm-2025-03-14-xid79-tp-replica-loss" in cited
    assert diagnosis.proposed_playbook == "evict_gpu_pods" and diagnosis.proposed_params == {"node": "h100-a-07"}

    with connect(both) as c:
        row = c.execute(
            "SELECT diagnostician, proposed_playbook, level, hypotheses FROM diagnoses WHERE incident_id = %s",
            ("inc-xid79",),
        ).fetchone()
    assert row[:3] == ("ranker", "evict_gpu_pods", 1) and row[3][0]["cause"] == "gpu_xid_79"

    messages = list(read_raw(both, [Diagnosis.topic], max_messages=1, timeout_s=20))
    assert len(messages) == 1
    published = Diagnosis.from_bytes(messages[0][2])
    assert published.incident_id == "inc-xid79" and published.hypotheses[0].cause == "gpu_xid_79"


def test_cli_index_search_and_diagnose(indexed: Settings, embedder: CachingEmbedder) -> None:
    incident = xid79_incident("inc-cli")
    with connect(indexed) as c:
        c.execute(
            "INSERT INTO incidents (incident_id, title, status, severity, labels, opened_at, updated_at)"
            " VALUES (%s, %s, 'opened', 'critical', %s, to_timestamp(%s), to_timestamp(%s))",
            (incident.incident_id, incident.title, Jsonb(incident.labels), T0, T0),
        )
        alert = incident.alerts[0]
        c.execute(
            "INSERT INTO alerts (fingerprint, incident_id, entity, signal, detector, severity, status, labels,"
            " evidence, starts_at, last_seen_at, provenance) VALUES (%s, %s, %s, %s, %s, %s, 'firing', %s, %s,"
            " to_timestamp(%s), to_timestamp(%s), %s)",
            (
                alert.fingerprint,
                incident.incident_id,
                alert.entity,
                alert.signal,
                alert.detector,
                alert.severity,
                Jsonb(alert.labels),
                Jsonb(alert.evidence),
                T0,
                T0,
                Jsonb(alert.provenance.model_dump(mode="json")),
            ),
        )
        c.commit()
        loaded = load_incident(c, "inc-cli")
    assert loaded is not None and loaded.alerts[0].evidence["xid"] == 79
    assert loaded.alerts[0].provenance.trusts("gpu_fault")  # re-read as believed on incidents.v1

    runner = CliRunner()
    env = {"CLUSTERMEDIC_DATABASE_URL": indexed.database_url or ""}
    result = runner.invoke(app, ["index"], env=env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["chunks_written"] == 0  # indexed by the fixture: nothing to do

    result = runner.invoke(app, ["search", "GPU fell off the bus", "--k", "3"], env=env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["doc_id"] == "gpu-xid-79-fallen-off-bus"

    result = runner.invoke(app, ["diagnose", "inc-cli"], env=env)
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["hypotheses"][0]["cause"] == "gpu_xid_79" and body["proposed_playbook"] == "evict_gpu_pods"

    result = runner.invoke(app, ["diagnose", "no-such-incident"], env=env)
    assert result.exit_code == 1


def test_service_consumes_incidents_and_dead_letters_garbage(
    indexed: Settings, embedder: CachingEmbedder, settings: Settings, kafka_ready: None
) -> None:
    both = indexed.model_copy(update={"topic_prefix": settings.topic_prefix, "faust_app_id": settings.topic_prefix})
    ensure_topics(both, [both.topic(t) for t in (IncidentEvent.topic, Diagnosis.topic, DeadLetter.topic)])
    with KafkaPublisher(both) as publisher:
        publisher.publish(xid79_incident("inc-svc"))
        publisher.send_raw(IncidentEvent.topic, b"bad", b"{not json")
    doctor = RankerDiagnostician(both, embedder=embedder)
    assert run(both, diagnostician=doctor, max_messages=2) == 2
    doctor.close()

    (diagnosis,) = [
        Diagnosis.from_bytes(v) for _, _, v in read_raw(both, [Diagnosis.topic], max_messages=1, timeout_s=20)
    ]
    assert diagnosis.incident_id == "inc-svc" and diagnosis.hypotheses[0].cause == "gpu_xid_79"
    (letter,) = [
        DeadLetter.from_bytes(v) for _, _, v in read_raw(both, [DeadLetter.topic], max_messages=1, timeout_s=20)
    ]
    assert letter.raw == b"{not json" and letter.consumer == "diagnostician"
    with connect(both) as c:
        assert c.execute("SELECT count(*) FROM diagnoses WHERE incident_id = 'inc-svc'").fetchone()[0] == 1
