"""Detection benchmark: metric samples/s through one detect worker, and detection latency.

    python bench/detect.py [--seconds 1800] [--scenario busy] [--seeds 1-2]

1. Throughput: simulator telemetry (metric batches) is published to fresh topics first, then one detect
   worker (every registered detector, learned models from the database when trained) consumes it; the
   figure is samples processed per wall second from the first batch to the last.
2. Latency: an XID-79 scenario is replayed in real time with timestamps rewritten to the wall clock;
   latency is from a sample's timestamp to the moment its anomaly is read back from anomalies.v1.

Needs the local infrastructure (`make up`). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
import uuid

import numpy as np

from pipelines.app import create_pipeline
from pipelines.detect import build_detectors, register_detect
from services.core.bus import KafkaPublisher, ensure_topics, read_raw
from services.core.events import Anomaly, MetricBatch, Sample
from services.core.settings import Settings


def simulate(scenario: str, seeds: list[int], seconds: float) -> list[MetricBatch]:
    """Metric batches of seeded simulator runs."""
    from services.simulator.scenario import load_scenario
    from services.simulator.simulator import Simulator

    batches: list[MetricBatch] = []
    for seed in seeds:
        sim = Simulator(load_scenario(scenario), seed=seed)
        while sim.t < seconds:
            batches.extend(e for e in sim.step() if isinstance(e, MetricBatch))
        sim.close()
    return batches


def throughput(settings: Settings, batches: list[MetricBatch]) -> dict[str, float]:
    """Samples/s of one detect worker over pre-published batches."""
    ensure_topics(settings)
    with KafkaPublisher(settings, linger_ms=20) as publisher:
        for batch in batches:
            publisher.publish(batch)
    total = len(batches)
    samples = sum(len(b.samples) for b in batches)
    seen = {"n": 0, "first": 0.0, "last": 0.0}
    done = threading.Event()

    def on_batch(_: MetricBatch) -> None:
        now = time.perf_counter()
        if seen["n"] == 0:
            seen["first"] = now
        seen["n"] += 1
        seen["last"] = now
        if seen["n"] >= total:
            done.set()

    async def run() -> None:
        pipeline = create_pipeline(settings)
        register_detect(pipeline, build_detectors(settings), on_batch=on_batch)
        await pipeline.app.start()
        try:
            await asyncio.to_thread(done.wait, 600)
        finally:
            await pipeline.app.stop()

    asyncio.run(run())
    elapsed = seen["last"] - seen["first"]
    processed = seen["n"]
    return {
        "batches": processed,
        "samples": samples * processed // total,
        "seconds": elapsed,
        "samples_per_s": samples * processed / total / elapsed if elapsed > 0 else 0.0,
        "batches_per_s": processed / elapsed if elapsed > 0 else 0.0,
    }


def latency(settings: Settings, speed: float) -> dict[str, float]:
    """Replay the xid79 scenario at ``speed`` x real time with wall-clock timestamps; time each anomaly."""
    from services.simulator.scenario import load_scenario
    from services.simulator.simulator import Simulator

    ensure_topics(settings)
    sim = Simulator(load_scenario("xid79"), seed=3)
    # warm up to just before the fault at 300 s, then stream 120 s around it
    pre = []
    while sim.t < 240:
        pre.extend(e for e in sim.step() if isinstance(e, MetricBatch))
    latencies: list[float] = []
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            for _, _, value in read_raw(
                settings, [Anomaly.topic], max_messages=10_000, timeout_s=1.0, from_beginning=False
            ):
                anomaly = Anomaly.from_bytes(value)
                latencies.append(time.time() - anomaly.ts)

    async def run() -> None:
        pipeline = create_pipeline(settings)
        register_detect(pipeline, build_detectors(settings), max_wait_s=0.25)
        await pipeline.app.start()
        reader = threading.Thread(target=consume, daemon=True)
        try:
            with KafkaPublisher(settings) as publisher:
                for batch in pre:  # state warm-up, timestamps rewritten to the recent past
                    publisher.publish(
                        _restamp(batch, time.time() - (240 - (batch.samples[0].ts - sim.telemetry.epoch)))
                    )
                publisher.flush()
                await asyncio.sleep(3)  # let the worker digest the warm-up before timing starts
                reader.start()
                start = time.monotonic()
                while sim.t < 420:
                    events = [e for e in sim.step() if isinstance(e, MetricBatch)]
                    for batch in events:
                        publisher.publish(_restamp(batch, time.time()))
                    publisher.flush()
                    ahead = (sim.t - 240) / speed - (time.monotonic() - start)
                    if ahead > 0:
                        await asyncio.sleep(ahead)  # pacing the replay, not synchronisation
                await asyncio.sleep(3)
        finally:
            stop.set()
            reader.join(5)
            await pipeline.app.stop()

    asyncio.run(run())
    if not latencies:
        return {"anomalies": 0}
    arr = np.asarray(latencies) * 1000
    return {
        "anomalies": len(latencies),
        "p50_ms": float(np.percentile(arr, 50)),
        "p99_ms": float(np.percentile(arr, 99)),
    }


def _restamp(batch: MetricBatch, ts: float) -> MetricBatch:
    return batch.model_copy(
        update={"samples": tuple(Sample(name=s.name, labels=s.labels, value=s.value, ts=ts) for s in batch.samples)}
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=1800, help="simulated seconds per seed")
    parser.add_argument("--scenario", default="busy")
    parser.add_argument("--seeds", default="1-2")
    parser.add_argument("--speed", type=float, default=4.0, help="replay speed of the latency phase")
    args = parser.parse_args()
    low, _, high = args.seeds.partition("-")
    seeds = list(range(int(low), int(high or low) + 1))
    base = Settings()
    print("[bench] simulating...", file=sys.stderr, flush=True)
    batches = simulate(args.scenario, seeds, args.seconds)
    print(f"[bench] {len(batches)} batches; throughput phase...", file=sys.stderr, flush=True)
    out: dict[str, object] = {
        "scenario": args.scenario,
        "seeds": seeds,
        "throughput": throughput(base.model_copy(update={"topic_prefix": f"bench.{uuid.uuid4().hex[:8]}."}), batches),
    }
    print("[bench] latency phase...", file=sys.stderr, flush=True)
    out["latency"] = latency(base.model_copy(update={"topic_prefix": f"bench.{uuid.uuid4().hex[:8]}."}), args.speed)
    out["latency"]["note"] = (
        "sample timestamp -> anomaly read back from anomalies.v1; scrape interval 15 s not included"  # type: ignore[index]
    )
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
