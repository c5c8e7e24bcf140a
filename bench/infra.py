"""Infrastructure benchmark: Kafka throughput, Celery round trip, pgvector top-5 latency.

    python bench/infra.py [--messages N] [--vectors N] [--celery N]

Needs the local infrastructure (`make up`, or run through `make bench`). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid

import numpy as np

from services.core.settings import Settings


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def _payload() -> bytes:
    body = {"entity": "GPU-0", "source": "bench", "samples": [], "pad": ""}
    raw = json.dumps(body)
    body["pad"] = "x" * (1024 - len(raw))
    return json.dumps(body).encode()


def kafka_python_throughput(settings: Settings, n: int) -> dict[str, float]:
    from kafka import KafkaConsumer, KafkaProducer

    from services.core.bus import ensure_topics

    topic = settings.topic("bench.kafka-python")
    ensure_topics(settings, [topic])
    value = _payload()
    producer = KafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks=1, linger_ms=5, batch_size=256 * 1024)
    t0 = time.perf_counter()
    for i in range(n):
        producer.send(topic, key=str(i % 64).encode(), value=value)
    producer.flush()
    produce_s = time.perf_counter() - t0
    producer.close()
    consumer = KafkaConsumer(
        topic, bootstrap_servers=settings.bootstrap_servers, auto_offset_reset="earliest", consumer_timeout_ms=5000,
        fetch_max_bytes=50 * 1024 * 1024, max_partition_fetch_bytes=10 * 1024 * 1024,
    )
    t0 = time.perf_counter()
    got = 0
    for _ in consumer:
        got += 1
        if got == n:
            break
    consume_s = time.perf_counter() - t0
    consumer.close()
    return {"produce_msgs_per_s": n / produce_s, "consume_msgs_per_s": got / consume_s, "consumed": got}


def aiokafka_throughput(settings: Settings, n: int) -> dict[str, float]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    from services.core.bus import ensure_topics

    topic = settings.topic("bench.aiokafka")
    ensure_topics(settings, [topic])
    value = _payload()

    async def run() -> dict[str, float]:
        producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks=1, linger_ms=5,
                                    max_batch_size=256 * 1024)
        await producer.start()
        t0 = time.perf_counter()
        futures = [await producer.send(topic, key=str(i % 64).encode(), value=value) for i in range(n)]
        await asyncio.gather(*futures)
        produce_s = time.perf_counter() - t0
        await producer.stop()
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=settings.bootstrap_servers, auto_offset_reset="earliest",
                                    fetch_max_bytes=50 * 1024 * 1024, max_partition_fetch_bytes=10 * 1024 * 1024)
        await consumer.start()
        t0 = time.perf_counter()
        got = 0
        while got < n and time.perf_counter() - t0 < 60:
            batches = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            got += sum(len(records) for records in batches.values())
        consume_s = time.perf_counter() - t0
        await consumer.stop()
        return {"produce_msgs_per_s": n / produce_s, "consume_msgs_per_s": got / consume_s, "consumed": got}

    return asyncio.run(run())


def celery_round_trip(settings: Settings, n: int) -> dict[str, float]:
    import subprocess

    from services.celery_app import configure, ping

    configure(settings)
    worker = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "worker", "--concurrency", "1", "--queues", "default",
         "--name", f"bench-{uuid.uuid4().hex[:6]}@%h"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        ping.delay().get(timeout=60)  # warm-up: waits for the worker to come up
        latencies = []
        for _ in range(n):
            t0 = time.perf_counter()
            ping.delay().get(timeout=30)
            latencies.append((time.perf_counter() - t0) * 1000)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    return {"round_trips": n, "p50_ms": _pct(latencies, 50), "p99_ms": _pct(latencies, 99)}


def pgvector_top5(settings: Settings, n_vectors: int, n_queries: int = 200) -> dict[str, float]:
    import psycopg
    from psycopg import sql

    from services.store.db import connect, migrate
    from services.store.embedded import database_url

    admin_url = database_url(settings)
    name = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    from urllib.parse import urlsplit, urlunsplit

    bench = settings.model_copy(update={"database_url": urlunsplit(urlsplit(admin_url)._replace(path=f"/{name}"))})
    try:
        migrate(bench)
        rng = np.random.default_rng(0)
        vectors = rng.normal(size=(n_vectors, 384)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        with connect(bench) as conn:
            conn.execute("INSERT INTO kb_documents (doc_id, kind, title, content_hash) VALUES ('b','runbook','b','h')")
            # load first, index after: building HNSW once is much faster than maintaining it per row
            conn.execute("DROP INDEX kb_chunks_embedding_idx")
            t0 = time.perf_counter()
            with conn.cursor().copy(
                "COPY kb_chunks (doc_id, position, content, embedding) FROM STDIN WITH (FORMAT BINARY)"
            ) as copy:
                copy.set_types(["text", "int4", "text", "vector"])
                for i, v in enumerate(vectors):
                    copy.write_row(("b", i, f"chunk {i}", v))
            load_s = time.perf_counter() - t0
            conn.execute("SET maintenance_work_mem = '512MB'")
            t0 = time.perf_counter()
            conn.execute("CREATE INDEX kb_chunks_embedding_idx ON kb_chunks USING hnsw (embedding vector_cosine_ops)")
            index_s = time.perf_counter() - t0
            conn.commit()
            latencies = []
            hits = 0
            for q in range(n_queries):
                target = int(rng.integers(n_vectors))
                query = vectors[target] + rng.normal(scale=0.02, size=384).astype(np.float32)
                t0 = time.perf_counter()
                rows = conn.execute(
                    "SELECT position FROM kb_chunks ORDER BY embedding <=> %s LIMIT 5", (query,)
                ).fetchall()
                latencies.append((time.perf_counter() - t0) * 1000)
                hits += rows[0][0] == target
                del q
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    return {
        "vectors": n_vectors,
        "load_s": load_s,
        "hnsw_build_s": index_s,
        "queries": n_queries,
        "p50_ms": _pct(latencies, 50),
        "p99_ms": _pct(latencies, 99),
        "recall_at_1": hits / n_queries,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000, help="Kafka messages per client (1 KB JSON)")
    parser.add_argument("--vectors", type=int, default=100_000, help="vectors in the pgvector table")
    parser.add_argument("--celery", type=int, default=300, help="Celery round trips")
    args = parser.parse_args()
    settings = Settings(topic_prefix=f"bench.{uuid.uuid4().hex[:8]}.")
    out: dict[str, object] = {"machine": {"cores": __import__("os").cpu_count()}}
    for name, fn in [
        ("kafka_python", lambda: kafka_python_throughput(settings, args.messages)),
        ("aiokafka", lambda: aiokafka_throughput(settings, args.messages)),
        ("celery", lambda: celery_round_trip(settings, args.celery)),
        ("pgvector", lambda: pgvector_top5(settings, args.vectors)),
    ]:
        print(f"[bench] {name}...", file=sys.stderr, flush=True)
        out[name] = fn()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
