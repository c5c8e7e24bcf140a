"""Ingest benchmark: remote_write samples/s accepted and published to Kafka, and latency to the ack.

    python bench/ingest.py [--seconds 10] [--concurrency 8] [--samples-per-request 500]

Starts `medic ingest serve` (services.ingest.cli) as a subprocess against the local Kafka broker with
fresh topics, then sends pre-encoded remote_write requests shaped like a DCGM + vLLM fleet from
``--concurrency`` connections, as Prometheus' remote-write shards do. The receiver answers 204 only
after Kafka acknowledged every batch of the request, so a request's round trip is the end-to-end
latency from receipt to the Kafka ack (plus loopback). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from services.core.bus import ensure_topics  # noqa: E402
from services.core.events import MetricBatch  # noqa: E402
from services.core.settings import Settings  # noqa: E402
from services.ingest.normalise import encode_remote_write  # noqa: E402

HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}
DCGM = [
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
]  # fmt: skip
VLLM = [
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total",
]  # fmt: skip


def _series() -> list[tuple[dict[str, str], str]]:
    out: list[tuple[dict[str, str], str]] = []
    for node in range(16):
        for gpu in range(8):
            base = {
                "UUID": f"GPU-{node:04d}{gpu:04d}-0000-0000-0000-000000000000",
                "gpu": str(gpu),
                "device": f"nvidia{gpu}",
                "modelName": "NVIDIA H100 80GB HBM3",
                "Hostname": f"gpu-node-{node}",
                "instance": f"10.0.{node}.1:9400",
                "job": "dcgm-exporter",
                "namespace": "gpu-operator",
            }
            out += [({"__name__": name, **base}, name) for name in DCGM]
        for replica in range(2):
            base = {
                "pod": f"llama-70b-{node}-{replica}",
                "model_name": "llama-70b",
                "instance": f"10.1.{node}.{replica}:8000",
                "job": "vllm",
            }
            out += [({"__name__": name, **base}, name) for name in VLLM]
            for le in ("0.1", "0.5", "1", "2.5", "5", "10", "+Inf"):
                out.append(({"__name__": "vllm:e2e_request_latency_seconds_bucket", "le": le, **base}, "bucket"))
    return out


def _payloads(samples_per_request: int, count: int) -> list[bytes]:
    series = _series()
    now_ms = int(time.time() * 1000)
    payloads = []
    cursor = 0
    for i in range(count):
        chunk = []
        for j in range(samples_per_request):
            labels, _ = series[(cursor + j) % len(series)]
            chunk.append((labels, [(float((i * 7 + j) % 1000), now_ms + i)]))
        cursor += samples_per_request
        payloads.append(encode_remote_write(chunk))
    return payloads


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _load(url: str, payloads: list[bytes], concurrency: int, seconds: float) -> tuple[int, int, list[float]]:
    latencies: list[float] = []
    ok = refused = 0
    deadline = time.perf_counter() + seconds
    counter = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal ok, refused, counter
        while time.perf_counter() < deadline:
            body = payloads[counter % len(payloads)]
            counter += 1
            t0 = time.perf_counter()
            response = await client.post(url, content=body, headers=HEADERS)
            if response.status_code == 204:
                latencies.append(time.perf_counter() - t0)
                ok += 1
            else:
                refused += 1

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return ok, refused, latencies


def _metric(text: str, name: str) -> float:
    total = 0.0
    for match in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M):
        total += float(match.group(1))
    return total


def _end_offsets(settings: Settings, topic: str) -> int:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=settings.bootstrap_servers)
    try:
        name = settings.topic(topic)
        parts = [TopicPartition(name, p) for p in consumer.partitions_for_topic(name) or ()]
        return int(sum(consumer.end_offsets(parts).values()))
    finally:
        consumer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--samples-per-request", type=int, default=500)
    args = parser.parse_args()

    settings = Settings(topic_prefix=f"bench.{uuid.uuid4().hex[:8]}.")
    ensure_topics(settings)
    port = _free_port()
    env = {**os.environ, "CLUSTERMEDIC_TOPIC_PREFIX": settings.topic_prefix, "CLUSTERMEDIC_LOG_LEVEL": "WARNING"}
    server = subprocess.Popen(
        [sys.executable, "-m", "services.ingest.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=REPO,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("ingest server did not start")
            time.sleep(0.1)
        payloads = _payloads(args.samples_per_request, 200)
        asyncio.run(_load(f"{base}/api/v1/write", payloads, args.concurrency, args.warmup))
        before = httpx.get(f"{base}/metrics").text
        t0 = time.perf_counter()
        ok, refused, latencies = asyncio.run(_load(f"{base}/api/v1/write", payloads, args.concurrency, args.seconds))
        elapsed = time.perf_counter() - t0
        after = httpx.get(f"{base}/metrics").text
    finally:
        server.terminate()
        server.wait(30)
    samples = _metric(after, "clustermedic_ingest_received_total") - _metric(
        before, "clustermedic_ingest_received_total"
    )
    published = _metric(after, "clustermedic_ingest_published_total") - _metric(
        before, "clustermedic_ingest_published_total"
    )
    lat = np.asarray(latencies) * 1000
    print(
        json.dumps(
            {
                "benchmark": "ingest.remote_write",
                "cpus": os.cpu_count(),
                "concurrency": args.concurrency,
                "samples_per_request": args.samples_per_request,
                "seconds": round(elapsed, 2),
                "requests_ok": ok,
                "requests_refused_503": refused,
                "samples_accepted_and_published_per_s": round(samples / elapsed),
                "kafka_messages_published_per_s": round(published / elapsed),
                "kafka_messages_on_topic": _end_offsets(settings, MetricBatch.topic),
                "latency_ms_receipt_to_kafka_ack_p50": round(float(np.percentile(lat, 50)), 2) if ok else None,
                "latency_ms_receipt_to_kafka_ack_p99": round(float(np.percentile(lat, 99)), 2) if ok else None,
            }
        )
    )


if __name__ == "__main__":
    main()
