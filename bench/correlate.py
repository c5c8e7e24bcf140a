"""Correlation benchmark: anomalies/s through the engine and the correlate agent's path with N active
groups, and the p99 from anomaly to notification enqueue beyond group_wait.

The agent path is :class:`pipelines.correlate.correlator.Correlator` (per-cluster engine, redelivery
filter, checkpoint serialisation) plus what the agent does with each action (incident events
serialised for Kafka, notifications handed to the notify callable); the broker round trips are not
included (the acceptance timelines show them: tens of milliseconds). Prints one JSON object.

* ``build``: the anomalies that create the N groups (each a new alert, group and incident).
* ``repeat``: anomalies for alerts that already exist (the common case: detectors re-fire).
* ``new_group``: anomalies that create one more group while N are active.
* ``latency``: new groups at a steady rate, the engine ticked every ``tick_s`` in real time as the
  agent does; the time from the anomaly to the notify call, minus group_wait.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np

from pipelines.correlate.correlator import Correlator
from services.alerting.config import loads_routing
from services.alerting.notification import Notification
from services.core.events import Anomaly, IncidentEvent

ROUTING = """
route: {receiver: team, group_by: [alertname, node], group_wait: 1s, group_interval: 5m, repeat_interval: 4h}
receivers: [{name: team, webhook_configs: [{url: "http://127.0.0.1:9/hook"}]}]
"""
BASE = 1_700_000_000.0


def _anomaly(i: int, ts: float) -> Anomaly:
    return Anomaly(
        entity=f"GPU-{i}",
        entity_kind="gpu",
        signal=f"sig{i % 7}",
        detector="bench",
        score=2.0,
        threshold=1.0,
        ts=ts,
        labels={"node": f"node-{i}", "UUID": f"GPU-{i}"},
        evidence={"i": i},
    )


class Sink:
    """What the agent does with actions, minus the broker: serialise incident events, hand notifications over."""

    def __init__(self) -> None:
        self.notified: list[tuple[float, Notification]] = []
        self.bytes = 0

    def __call__(self, actions: list) -> None:  # type: ignore[type-arg]
        for action in actions:
            if isinstance(action, IncidentEvent):
                self.bytes += len(action.to_bytes())
            elif isinstance(action, Notification):
                self.notified.append((time.perf_counter(), action))


def main() -> None:
    """Run the benchmark and print JSON."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=10_000, help="active groups before measuring")
    ap.add_argument("--repeat", type=int, default=2_000, help="anomalies on existing alerts")
    ap.add_argument("--new", type=int, default=200, help="anomalies creating new groups")
    ap.add_argument("--latency-groups", type=int, default=50, help="new groups for the latency figure")
    ap.add_argument("--tick-s", type=float, default=1.0, help="the agent's tick interval")
    args = ap.parse_args()
    config = loads_routing(ROUTING)
    corr = Correlator(config)
    sink = Sink()
    rng = random.Random(7)

    start = time.perf_counter()
    for i in range(args.groups):
        sink(corr.ingest("bench", _anomaly(i, BASE + i * 0.0001)))
    build_s = time.perf_counter() - start
    engine = corr.engines["bench"]
    clock = engine.clock or BASE
    state_bytes = len(corr.state("bench"))

    start = time.perf_counter()
    for _ in range(args.repeat):
        clock += 0.001
        sink(corr.ingest("bench", _anomaly(rng.randrange(args.groups), clock)))
    repeat_s = time.perf_counter() - start

    start = time.perf_counter()
    for n in range(args.new):
        clock += 0.001
        sink(corr.ingest("bench", _anomaly(args.groups + n, clock)))
    new_s = time.perf_counter() - start

    # latency: engine time follows the wall clock from here, as for live anomalies
    group_wait = config.route.group_wait or 0.0
    offset = clock + 1.0 - time.perf_counter()
    sent: dict[str, float] = {}
    first = args.groups + args.new
    sink.notified.clear()
    next_tick = time.perf_counter() + args.tick_s
    rate_gap = 0.05
    n = 0
    deadline = time.perf_counter() + args.latency_groups * rate_gap + group_wait + 10 * args.tick_s

    def done() -> int:
        return sum(1 for _, note in sink.notified if note.alerts and note.alerts[0].entity in sent)

    while time.perf_counter() < deadline and done() < args.latency_groups:
        now = time.perf_counter()
        if n < args.latency_groups:
            anomaly = _anomaly(first + n, now + offset)
            sink(corr.ingest("bench", anomaly))
            sent[f"GPU-{first + n}"] = now
            n += 1
        if now >= next_tick:
            sink(corr.tick("bench", now + offset))
            next_tick += args.tick_s
        time.sleep(rate_gap)  # pacing the synthetic input, not synchronisation
    beyond = [
        (at - sent[note.alerts[0].entity]) - group_wait
        for at, note in sink.notified
        if note.alerts and note.alerts[0].entity in sent
    ]
    result = {
        "active_groups": len(engine.groups),
        "alerts": len(engine.alerts),
        "incidents": len(engine.incidents),
        "checkpoint_bytes": state_bytes,
        "build_anomalies_per_s": round(args.groups / build_s, 1),
        "repeat_anomalies_per_s": round(args.repeat / repeat_s, 1),
        "new_group_anomalies_per_s": round(args.new / new_s, 1),
        "latency_beyond_group_wait_s": {
            "tick_s": args.tick_s,
            "samples": len(beyond),
            "p50": round(float(np.percentile(beyond, 50)), 3) if beyond else None,
            "p99": round(float(np.percentile(beyond, 99)), 3) if beyond else None,
        },
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
