"""Simulator benchmark: simulated seconds per wall second, and the baseline policy table.

Prints one JSON object: speed at 3 and 1,000 nodes (8 GPUs each) with telemetry on. ``--policies``
adds the 20-seed table (mean episode grade per policy on the ``busy`` scenario, and on how many
seeds the autoscaler beats each baseline); ``--seeds``/``--duration`` size it.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from services.simulator.policies import make_policy
from services.simulator.scenario import ClusterSpec, Scenario, load_scenario
from services.simulator.simulator import Simulator
from services.simulator.sinks import NullSink

POLICY_NAMES = ("noop", "static", "autoscaler")


def speed(nodes: int, seconds: float) -> dict[str, float]:
    """Sim-seconds per wall-second with telemetry generation on (events built, sent to a null sink).

    Also reports sim-seconds per CPU-second of this process: on a shared machine the wall figure
    drops with other people's load, the CPU figure much less.
    """
    sim = Simulator(Scenario(cluster=ClusterSpec(nodes=nodes, gpus_per_node=8)), seed=0, sinks=[NullSink()])
    start, cpu_start = time.perf_counter(), time.process_time()
    sim.run(seconds)
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    return {
        "nodes": nodes,
        "gpus": sim.cluster.gpus.n,
        "pods": len(sim.cluster.pods),
        "sim_seconds": seconds,
        "wall_seconds": round(wall, 3),
        "sim_per_wall": round(seconds / wall, 1),
        "cpu_seconds": round(cpu, 3),
        "sim_per_cpu": round(seconds / cpu, 1),
        "events": sim.events_emitted,
    }


def policy_table(seeds: int, duration: float) -> dict[str, dict[str, float]]:
    """Mean and std of episode grades per baseline policy over seeds ``0..seeds-1``.

    Every policy sees the same seeds, hence the same traffic and faults, so the table also counts
    the seeds on which the autoscaler's grade beats each other policy's (a paired comparison).
    """
    scores: dict[str, list[float]] = {}
    for name in POLICY_NAMES:
        scores[name] = [
            Simulator(load_scenario("busy"), seed=s, telemetry=False).run(duration, policy=make_policy(name)).score
            for s in range(seeds)
        ]
    out: dict[str, dict[str, float]] = {}
    for name, values in scores.items():
        out[name] = {"mean": round(float(np.mean(values)), 5), "std": round(float(np.std(values)), 5)}
        if name != "autoscaler":
            out[name]["autoscaler_wins"] = sum(a > b for a, b in zip(scores["autoscaler"], values, strict=True))
    return out


def main() -> None:
    """Run the benchmark and print JSON."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--policies", action="store_true", help="also run the policy table")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--duration", type=float, default=1800.0)
    args = ap.parse_args()
    result: dict[str, object] = {"speed_3_nodes": speed(3, 3600.0), "speed_1000_nodes": speed(1000, 60.0)}
    if args.policies:
        result["policies_busy"] = policy_table(args.seeds, args.duration)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
