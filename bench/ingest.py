"""Ingest benchmark: remote_write samples/s accepted and published to Kafka, and latency to the ack.

    python bench/ingest.py [--seconds 10] [--concurrency 8] [--samples-per-request 500]
                           [--publisher aiokafka|kafka-python]

Starts the ingest service as a subprocess against the local Kafka broker with fresh topics, then
sends pre-encoded remote_write requests shaped like a DCGM + vLLM fleet from ``--concurrency``
connections, as Prometheus' remote-write shards do. The receiver answers 204 only after Kafka
acknowledged every batch of the request, so a request's round trip is the end-to-end latency from
receipt to the Kafka ack (plus loopback). Prints one JSON object.

The machine is shared (the load generator, the Kafka broker and other work run beside the server),
so the JSON also gives the 1-minute load average before the run and the CPU seconds the server used:
``server_cpu_us_per_sample`` is the cost that does not depend on how much CPU the server was given.

The server is the ingest app as `medic ingest serve` builds it (:func:`services.ingest.http.create_app`,
same uvicorn options) around the publisher ``--publisher`` names: ``aiokafka`` (default,
:class:`services.ingest.aiopublisher.AioKafkaPublisher`) or ``kafka-python``
(:class:`services.core.bus.KafkaPublisher`).
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


async def _load(
    host: str, port: int, payloads: list[bytes], concurrency: int, seconds: float
) -> tuple[int, int, int, list[float]]:
    """Post payloads from ``concurrency`` keep-alive connections until the deadline.

    A minimal HTTP/1.1 client on asyncio streams, with each request's bytes built beforehand: the load
    generator shares the CPUs with the server under test, and httpx spent ~2 ms of CPU a request.

    Returns:
        ``(204 answers, 503 answers, other answers, latencies of the 204s in seconds)``.
    """
    latencies: list[float] = []
    ok = refused = other = 0
    deadline = time.perf_counter() + seconds
    counter = 0
    head = "".join(f"{name}: {value}\r\n" for name, value in HEADERS.items())
    requests = [
        f"POST /api/v1/write HTTP/1.1\r\nHost: {host}\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
        for body in payloads
    ]

    async def worker() -> None:
        nonlocal ok, refused, other, counter
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while time.perf_counter() < deadline:
                request = requests[counter % len(requests)]
                counter += 1
                t0 = time.perf_counter()
                writer.write(request)
                status_line, _, header_block = (await reader.readuntil(b"\r\n\r\n")).partition(b"\r\n")
                length = re.search(rb"(?im)^content-length:\s*(\d+)", header_block)
                if length:
                    await reader.readexactly(int(length.group(1)))
                status = int(status_line.split()[1])
                if status == 204:
                    latencies.append(time.perf_counter() - t0)
                    ok += 1
                elif status == 503:
                    refused += 1
                else:
                    other += 1
        finally:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ok, refused, other, latencies


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


def _serve(host: str, port: int, publisher_name: str) -> None:
    """What `medic ingest serve` runs, around the named publisher (in the server subprocess)."""
    import logging

    import uvicorn

    from services.core.bus import KafkaPublisher
    from services.ingest.aiopublisher import AioKafkaPublisher
    from services.ingest.http import create_app
    from services.ingest.sink import Publisher

    settings = Settings(ingest_host=host, ingest_port=port)
    logging.basicConfig(level=settings.log_level)
    ensure_topics(settings)
    publisher: Publisher = AioKafkaPublisher(settings) if publisher_name == "aiokafka" else KafkaPublisher(settings)
    web = create_app(settings, publisher)
    uvicorn.run(web, host=host, port=port, log_level=settings.log_level.lower(), access_log=False)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux ``/proc``; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:  # the server subprocess: --serve HOST PORT PUBLISHER
        _serve(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--samples-per-request", type=int, default=500)
    parser.add_argument("--publisher", choices=["aiokafka", "kafka-python"], default="aiokafka")
    args = parser.parse_args()

    load_before = round(os.getloadavg()[0], 2)
    settings = Settings(topic_prefix=f"bench.{uuid.uuid4().hex[:8]}.")
    ensure_topics(settings)
    port = _free_port()
    env = {**os.environ, "CLUSTERMEDIC_TOPIC_PREFIX": settings.topic_prefix, "CLUSTERMEDIC_LOG_LEVEL": "WARNING"}
    command = [sys.executable, str(Path(__file__).resolve()), "--serve", "127.0.0.1", str(port), args.publisher]
    server = subprocess.Popen(command, cwd=REPO, env=env)
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
        asyncio.run(_load("127.0.0.1", port, payloads, args.concurrency, args.warmup))
        before = httpx.get(f"{base}/metrics").text
        server_cpu0, client_cpu0 = _cpu_seconds(server.pid), time.process_time()
        t0 = time.perf_counter()
        ok, refused, other, latencies = asyncio.run(_load("127.0.0.1", port, payloads, args.concurrency, args.seconds))
        elapsed = time.perf_counter() - t0
        server_cpu, client_cpu = _cpu_seconds(server.pid) - server_cpu0, time.process_time() - client_cpu0
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
                "load_average_1m_before": load_before,
                "publisher": args.publisher,
                "concurrency": args.concurrency,
                "samples_per_request": args.samples_per_request,
                "seconds": round(elapsed, 2),
                "requests_ok": ok,
                "requests_refused_503": refused,
                "requests_other_status": other,
                "samples_accepted_and_published_per_s": round(samples / elapsed),
                "kafka_messages_published_per_s": round(published / elapsed),
                "kafka_messages_on_topic": _end_offsets(settings, MetricBatch.topic),
                "latency_ms_receipt_to_kafka_ack_p50": round(float(np.percentile(lat, 50)), 2) if ok else None,
                "latency_ms_receipt_to_kafka_ack_p99": round(float(np.percentile(lat, 99)), 2) if ok else None,
                "server_cpu_s": round(server_cpu, 2),
                "server_cpu_us_per_sample": round(server_cpu / samples * 1e6, 2) if samples else None,
                "load_client_cpu_s": round(client_cpu, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
