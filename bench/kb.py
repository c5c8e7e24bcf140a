"""Benchmark the knowledge base: hybrid retrieval at 100,000 chunks, diagnosis latency, indexing throughput.

In a fresh database it creates (and drops at the end) on the configured PostgreSQL server:

1. indexes the real runbooks and post-mortems with the real MiniLM embedder: chunks/s (embedding and
   COPY together, the model already loaded) and the model's load time;
2. adds synthetic chunks (random unit vectors, text drawn from the runbooks' vocabulary) up to
   ``--chunks`` in total, COPYs them, and rebuilds the HNSW index: rows/s and index build time;
3. times ``search`` (the one-round-trip hybrid query: HNSW + full text + RRF) for random queries,
   unfiltered and with a label filter, and the MiniLM query embedding;
4. times the offline ranker's full diagnosis (evidence tools, query embedding, retrieval, ranking) on
   hand-made incidents over that knowledge base.

Prints JSON. Usage::

    python bench/kb.py [--chunks 100000] [--queries 300]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.core.events import AlertRef, IncidentEvent
from services.core.settings import Settings
from services.diagnostician.diagnostician import RankerDiagnostician
from services.diagnostician.documents import load_documents
from services.diagnostician.embedder import EMBEDDING_DIM, MiniLMEmbedder, normalise
from services.diagnostician.kb import configure_session, copy_chunks, embedder_salt, index_documents, search
from services.store.db import connect, migrate
from services.store.embedded import database_url

T0 = 1_760_000_000.0


def percentiles(samples_s: list[float]) -> dict[str, float]:
    ms = np.asarray(samples_s) * 1000
    return {
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
        "max_ms": round(float(ms.max()), 2),
        "n": len(samples_s),
    }


def timed(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def synthetic_rows(
    n: int, vocab: list[str], rng: np.random.Generator, docs: int
) -> Iterator[tuple[str, int, str, dict[str, Any]]]:
    per_doc = max(1, n // docs)
    for i in range(n):
        words = rng.choice(vocab, size=60)
        doc = i // per_doc
        yield (
            f"synthetic-{doc}",
            i % per_doc,
            "Synthetic report\nIncident; synthetic\n\n" + " ".join(words),
            {"kind": "report", "cluster": f"c{doc % 10}"},
        )


def incidents() -> list[IncidentEvent]:
    def ref(signal: str, **evidence: Any) -> AlertRef:
        return AlertRef(
            fingerprint=signal,
            entity="e",
            signal=signal,
            detector="rules",
            severity="critical",
            starts_at=T0,
            labels={"node": "n1", "pod": "p1", "model": "m"},
            evidence=evidence,
        )

    def inc(*alerts: AlertRef) -> IncidentEvent:
        return IncidentEvent(
            incident_id=f"bench-{uuid.uuid4().hex[:6]}",
            kind="opened",
            severity="critical",
            title="bench incident",
            alerts=alerts,
            opened_at=T0,
            ts=T0,
        )

    return [
        inc(
            ref("gpu_xid", xid=79, example="NVRM: Xid (PCI:0000:9b:00): 79, pid=1, name=x, GPU has fallen off the bus.")
        ),
        inc(ref("kv_cache_saturation", kv_cache_usage=0.99), ref("preemption_storm"), ref("queue_saturation")),
        inc(ref("node_flapping"), ref("node_not_ready", reason="NodeNotReady")),
        inc(ref("latency_regression"), ref("ttft_slo_burn"), ref("kube_event", reason="ScalingReplicaSet")),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=100_000, help="total chunks in the knowledge base")
    parser.add_argument("--queries", type=int, default=300, help="timed queries per measurement")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)

    base = database_url(Settings())
    name = f"bench_kb_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    settings = Settings(database_url=urlunsplit(urlsplit(base)._replace(path=f"/{name}")))
    out: dict[str, Any] = {"chunks_target": args.chunks}
    try:
        migrate(settings)
        embedder = MiniLMEmbedder()
        started = time.perf_counter()
        embedder.embed_one("warm up")
        out["minilm_load_s"] = round(time.perf_counter() - started, 2)

        documents = load_documents(salt=embedder_salt(embedder))
        with connect(settings) as conn:
            started = time.perf_counter()
            report = index_documents(conn, embedder, documents)
            elapsed = time.perf_counter() - started
            out["indexing"] = {
                "documents": len(documents),
                "chunks": report.chunks,
                "seconds": round(elapsed, 2),
                "chunks_per_s": round(report.chunks / elapsed, 2),
                "embedder": "minilm (all-MiniLM-L6-v2, CPU, 1 thread)",
            }
            started = time.perf_counter()
            again = index_documents(conn, embedder, documents)
            out["reindex_unchanged_s"] = round(time.perf_counter() - started, 3)
            assert again.chunks == 0

            # synthetic bulk: drop the HNSW index, COPY, rebuild (how a bulk load should be done)
            n_synth = max(0, args.chunks - report.chunks)
            vocab = sorted(
                {w.lower() for d in documents for c in d.chunks for w in re.findall(r"[A-Za-z]{3,}", c.content)}
            )
            docs = max(1, n_synth // 10)
            conn.execute(
                "INSERT INTO kb_documents (doc_id, kind, title, content_hash)"
                " SELECT 'synthetic-' || g, 'report', 'Synthetic report ' || g, 'x' FROM generate_series(0, %s) g",
                (docs,),
            )
            conn.execute("DROP INDEX kb_chunks_embedding_idx")
            vectors = normalise(rng.normal(size=(n_synth, EMBEDDING_DIM)).astype(np.float32))
            started = time.perf_counter()
            copy_chunks(conn, synthetic_rows(n_synth, vocab, rng, docs), vectors)
            conn.commit()
            copy_s = time.perf_counter() - started
            conn.execute("SET maintenance_work_mem = '1GB'")
            conn.execute("SET max_parallel_maintenance_workers = 2")
            started = time.perf_counter()
            conn.execute("CREATE INDEX kb_chunks_embedding_idx ON kb_chunks USING hnsw (embedding vector_cosine_ops)")
            conn.commit()
            build_s = time.perf_counter() - started
            conn.execute("ANALYZE kb_chunks")
            conn.commit()
            total = conn.execute("SELECT count(*) FROM kb_chunks").fetchone()
            out["bulk_load"] = {
                "synthetic_chunks": n_synth,
                "copy_rows_per_s": round(n_synth / copy_s, 1) if copy_s else None,
                "hnsw_build_s": round(build_s, 2),
                "total_chunks": int(total[0]) if total else 0,
            }

        with connect(settings) as conn:
            configure_session(conn)
            queries = [
                (normalise(rng.normal(size=(1, EMBEDDING_DIM)))[0], " ".join(rng.choice(vocab, size=8)))
                for _ in range(args.queries)
            ]
            it = iter(queries * 2)
            for q, text in queries[:10]:  # warm the caches
                search(conn, q, text, k=8)
            out["retrieval_hybrid"] = percentiles(timed(lambda: search(conn, *next(it), k=8), args.queries))
            it = iter(queries)
            out["retrieval_hybrid_label_filter"] = percentiles(
                timed(lambda: search(conn, *next(it), k=8, labels={"cluster": "c3"}), args.queries)
            )
            texts = ["GPU fell off the bus", "KV cache full and requests preempted", "node keeps flapping NotReady"]
            tx = iter(texts * args.queries)
            out["query_embedding_minilm"] = percentiles(timed(lambda: embedder.embed_one(next(tx)), args.queries))
            text = "GPU fell off the bus"
            hits = search(conn, embedder.embed_one(text), text, k=3)
            out["sanity_top_hit_for_gpu_fell_off_the_bus"] = hits[0].doc_id if hits else None

        doctor = RankerDiagnostician(settings, embedder=embedder)
        cases = incidents()
        for inc in cases:
            doctor.diagnose(inc)
        ci = iter(cases * args.queries)
        samples = timed(lambda: doctor.diagnose(next(ci)), args.queries)
        out["diagnosis_ranker_with_retrieval"] = percentiles(samples)
        doctor.close()
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
