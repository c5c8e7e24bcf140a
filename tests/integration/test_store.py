"""Migrations and pgvector on the real PostgreSQL."""

from __future__ import annotations

import numpy as np
import pytest

from services.store.db import applied_versions, connect, load_migrations, migrate

pytestmark = pytest.mark.integration

TABLES = {
    "incidents", "alerts", "anomalies", "diagnoses", "remediation_runs", "remediation_steps", "approvals",
    "silences", "kb_documents", "kb_chunks", "reports", "detector_models", "schema_migrations",
}


def test_migrations_apply_once_and_run_twice_without_error(fresh_database):
    first = migrate(fresh_database)
    second = migrate(fresh_database)

    assert first == [m.name for m in load_migrations()]
    assert second == []
    with connect(fresh_database) as conn:
        tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        assert TABLES <= tables
        assert applied_versions(conn) == {m.version for m in load_migrations()}
        index = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'kb_chunks_embedding_idx'"
        ).fetchone()
        assert index is not None and "hnsw" in index[0]


def test_pgvector_nearest_neighbour_returns_the_nearest_inserted_vector(fresh_database):
    migrate(fresh_database)
    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(200, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    with connect(fresh_database) as conn:
        conn.execute(
            "INSERT INTO kb_documents (doc_id, kind, title, content_hash) VALUES ('d', 'runbook', 't', 'h')"
        )
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO kb_chunks (doc_id, position, content, embedding) VALUES ('d', %s, %s, %s)",
                [(i, f"chunk {i} about gpu xid", v) for i, v in enumerate(vectors)],
            )
        query = vectors[42] + rng.normal(scale=0.01, size=384).astype(np.float32)
        rows = conn.execute(
            "SELECT position FROM kb_chunks ORDER BY embedding <=> %s LIMIT 5", (query,)
        ).fetchall()
        conn.commit()
    expected = np.argsort(-(vectors @ (query / np.linalg.norm(query))))[:5]
    assert rows[0][0] == 42
    assert [r[0] for r in rows] == list(expected)


def test_full_text_column_is_generated_from_content(fresh_database):
    migrate(fresh_database)
    with connect(fresh_database) as conn:
        conn.execute("INSERT INTO kb_documents (doc_id, kind, title, content_hash) VALUES ('d', 'runbook', 't', 'h')")
        conn.execute(
            "INSERT INTO kb_chunks (doc_id, position, content, embedding) VALUES ('d', 0, %s, %s)",
            ("NCCL watchdog caught collective operation timeout", np.ones(384, dtype=np.float32)),
        )
        hit = conn.execute(
            "SELECT count(*) FROM kb_chunks WHERE tsv @@ plainto_tsquery('english', 'collective timeouts')"
        ).fetchone()
    assert hit is not None and hit[0] == 1
