"""Pull-client benchmark: what parsing, normalising and queueing cost per sample / line, broker-free.

    python bench/ingest_pull.py [--repeat 5]

Runs the three pull clients of services/ingest/sources/ against in-process fakes (httpx MockTransport)
with a MemoryPublisher behind the real PublishQueue, so the figures are the clients' own CPU cost,
not Kafka's or the network's:

- ``scrape``: the simulator's per-node exposition (DCGM + vLLM, all nodes), scraped as 16 targets;
- ``query_range``: a matrix answer of 64 series x 500 evaluation times;
- ``loki``: 20,000 entries in 16 streams from a minimal forward-paging fake, pages of 1000.

Prints one JSON object: items/s (best of ``--repeat``) and the 1-minute load average before the run
(the reference machine is shared; compare runs at similar load).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from services.core.events import MetricBatch  # noqa: E402
from services.ingest.memory import MemoryPublisher  # noqa: E402
from services.ingest.pull import Delivery  # noqa: E402
from services.ingest.sink import IngestMetrics, PublishQueue  # noqa: E402
from services.ingest.sources.loki import LokiPuller  # noqa: E402
from services.ingest.sources.prometheus import PrometheusPuller  # noqa: E402
from services.ingest.sources.scrape import Scraper  # noqa: E402
from services.simulator.scenario import Scenario  # noqa: E402
from services.simulator.simulator import Simulator  # noqa: E402
from services.simulator.sinks import MemorySink, render_exposition  # noqa: E402

NS = 1_000_000_000


def _delivery() -> Delivery:
    metrics = IngestMetrics()
    queue = PublishQueue(MemoryPublisher(), metrics, capacity=10_000_000)
    queue.start()
    return Delivery(queue, metrics, timeout_s=60.0, deadletter_max_bytes=1024)


def _best(run: Callable[[], int], repeat: int) -> tuple[int, float]:
    best = float("inf")
    items = 0
    for _ in range(repeat):
        started = time.perf_counter()
        items = run()
        best = min(best, time.perf_counter() - started)
    return items, best


def bench_scrape(repeat: int) -> dict[str, float]:
    sim = Simulator(Scenario(), seed=0)
    memory = MemorySink()
    sim.sinks.append(memory)
    sim.run(20)
    sim.close()
    latest = {e.entity: e for e in memory.events if isinstance(e, MetricBatch)}  # what /metrics would serve
    text = render_exposition(list(latest.values()))
    targets = [f"http://node-{i}:9400/metrics" for i in range(16)]
    client = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(200, text=text)))
    delivery = _delivery()
    scraper = Scraper(targets, delivery, client=client)
    items, seconds = _best(scraper.poll, repeat)
    delivery.queue.stop()
    return {"samples": items, "seconds": round(seconds, 4), "samples_per_s": round(items / seconds)}


def bench_query_range(repeat: int) -> dict[str, float]:
    def answer(request: httpx.Request) -> httpx.Response:
        start, end = float(request.url.params["start"]), float(request.url.params["end"])
        times = [start + k for k in range(int(end - start) + 1)]
        result = [
            {
                "metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "UUID": f"GPU-{g:04d}", "Hostname": f"node-{g // 8}"},
                "values": [[t, f"{40 + g % 30}.5"] for t in times],
            }
            for g in range(64)
        ]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "matrix", "result": result}})

    client = httpx.Client(transport=httpx.MockTransport(answer))
    delivery = _delivery()

    def run() -> int:
        puller = PrometheusPuller(
            "http://prom:9090", {"t": "DCGM_FI_DEV_GPU_TEMP"}, delivery, step_s=1, lookback_s=499, client=client
        )
        return puller.poll()

    items, seconds = _best(run, repeat)
    delivery.queue.stop()
    return {"samples": items, "seconds": round(seconds, 4), "samples_per_s": round(items / seconds)}


def bench_loki(repeat: int) -> dict[str, float]:
    now = time.time_ns()
    entries = [(now - 60 * NS + k * 1000, f"vllm-{k % 16}", f"request {k} finished 200") for k in range(20_000)]
    times = [ns for ns, _, _ in entries]

    def answer(request: httpx.Request) -> httpx.Response:
        # a minimal forward-paging Loki over sorted entries (bisect), so the figure is the client's cost
        params = request.url.params
        first = bisect.bisect_left(times, int(params["start"]))
        last = bisect.bisect_left(times, int(params["end"]))
        page = entries[first : min(last, first + int(params["limit"]))]
        streams: dict[str, list[list[str]]] = {}
        for ns, pod, line in page:
            streams.setdefault(pod, []).append([str(ns), line])
        result = [{"stream": {"namespace": "llm", "pod": pod}, "values": values} for pod, values in streams.items()]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "streams", "result": result}})

    client = httpx.Client(transport=httpx.MockTransport(answer))
    delivery = _delivery()

    def run() -> int:
        puller = LokiPuller(
            "http://loki:3100", '{namespace="llm"}', delivery, limit=1000, lookback_s=120, client=client
        )
        return puller.poll()

    items, seconds = _best(run, repeat)
    delivery.queue.stop()
    return {"lines": items, "seconds": round(seconds, 4), "lines_per_s": round(items / seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    figures = {
        "load_avg_1m_before": round(load, 2),
        "cpus": os.cpu_count(),
        "scrape": bench_scrape(args.repeat),
        "query_range": bench_query_range(args.repeat),
        "loki": bench_loki(args.repeat),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
