"""Capacity planner against the simulator's baselines, in process, on traffic-surge scenarios.

Prints one JSON object: per scenario and policy, the mean over seeds of the episode grade, TTFT SLO
attainment, cost, cost per 1k generated tokens, GPU-hours, errors and scale events, plus per-seed rows.
The same seed gives every policy the same traffic and faults.

Scenarios: ``busy`` (shipped: bursty traffic with random faults) and ``surge`` (built here: the
default cluster with no bursts or faults, and the request rate doubled from 10 to 30 minutes).

``planner`` is :class:`services.capacity.planner.CapacityPlanner` driven by an adapter that stands in
for what the stream role will do: it reads each replica's exported vLLM numbers (the counters and
histogram buckets the simulator's ``/metrics`` would show; no fault ground truth), turns them into
per-interval rates and p95s, and applies the planner's desired replicas with ``scale``. As a
load-aware gateway would, it splits each model's router share over its variants in proportion to
their ready capacity. It runs the same fault reflexes as the baselines, so capacity is what differs.

    .venv/bin/python bench/capacity.py [--seeds 0-4] [--duration 3600] [--scenarios busy,surge]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from services.capacity.config import CapacityConfig, load_config
from services.capacity.planner import CapacityPlanner, Plan, PlannerState, ReplicaObservation, Snapshot
from services.simulator.policies import Policy, StaticThresholdPolicy, VariantAwareAutoscaler, _Reflexes
from services.simulator.scenario import Scenario, TrafficSpec, load_scenario
from services.simulator.simulator import Simulator
from services.simulator.sinks import NullSink


def p95(bounds: np.ndarray, delta: np.ndarray) -> float | None:
    """p95 from cumulative bucket deltas, interpolated within the bucket like PromQL's histogram_quantile."""
    total = float(delta[-1]) if delta.size else 0.0
    if total <= 0:
        return None
    rank = 0.95 * total
    i = int(np.searchsorted(delta, rank, side="left"))
    if i >= len(bounds):
        return float(bounds[-1])
    lo_b = 0.0 if i == 0 else float(bounds[i - 1])
    lo_c = 0.0 if i == 0 else float(delta[i - 1])
    hi_c = float(delta[i])
    frac = (rank - lo_c) / (hi_c - lo_c) if hi_c > lo_c else 1.0
    return lo_b + (float(bounds[i]) - lo_b) * frac


@dataclass
class _Counters:
    prompt: float
    gen: float
    done: float
    ttft: np.ndarray
    tpot: np.ndarray


class PlannerPolicy(Policy, _Reflexes):
    """Drives the capacity planner from the simulator's exported serving numbers (see the module docstring)."""

    name = "planner"

    def __init__(self, config: CapacityConfig) -> None:
        _Reflexes.__init__(self)
        self.config = config
        self.planner = CapacityPlanner(config)
        self.state = PlannerState()
        self.last_plan_t = -1e18
        self.prev: dict[str, tuple[float, _Counters]] = {}
        self.plans: list[Plan] = []
        self.shares: dict[str, float] | None = None

    def _counters(self, sim: Simulator, slot: int) -> _Counters:
        s = sim.serving
        done = float(s.ok_stop[slot] + s.ok_length[slot] + s.aborted[slot])
        return _Counters(
            float(s.prompt_tokens[slot]),
            float(s.gen_tokens[slot]),
            done,
            s.hist["ttft"][1][slot].copy(),
            s.hist["tpot"][1][slot].copy(),
        )

    def observe(self, sim: Simulator, obs: dict[str, Any]) -> tuple[ReplicaObservation, ...]:
        """One observation per pod, from counter and bucket deltas since the last plan."""
        c, s = sim.cluster, sim.serving
        out = []
        seen: set[str] = set()
        for name, p in obs["pods"].items():
            seen.add(name)
            if p["phase"] != "Running":
                out.append(ReplicaObservation(p["deployment"], name, loading=True))
                self.prev.pop(name, None)
                continue
            now = self._counters(sim, c.pod_by_name[name].slot)
            before = self.prev.get(name)
            self.prev[name] = (sim.t, now)
            if before is None or before[1].gen > now.gen:  # new pod, or its counters reset (restart)
                ttft = p95(s.hist["ttft"][0], now.ttft)
                itl = p95(s.hist["tpot"][0], now.tpot)
                rate = prompt = gen = 0.0
            else:
                dt = max(1e-9, sim.t - before[0])
                ttft = p95(s.hist["ttft"][0], now.ttft - before[1].ttft)
                itl = p95(s.hist["tpot"][0], now.tpot - before[1].tpot)
                rate = (now.done - before[1].done) / dt
                prompt = (now.prompt - before[1].prompt) / dt
                gen = (now.gen - before[1].gen) / dt
            out.append(
                ReplicaObservation(
                    variant=p["deployment"],
                    replica=name,
                    request_rate=rate,
                    prompt_tokens_per_s=prompt,
                    output_tokens_per_s=gen,
                    ttft_p95_s=ttft,
                    itl_p95_s=itl,
                    kv_cache_usage=p["kv_usage"],
                    num_requests_waiting=p["waiting"],
                )
            )
        for gone in set(self.prev) - seen:
            del self.prev[gone]
        return tuple(out)

    def __call__(self, sim: Simulator) -> None:
        obs = sim.observe()
        self.reflexes(sim, obs, vram_limit=0.95)
        if sim.t - self.last_plan_t < self.config.interval_s:
            return
        self.last_plan_t = sim.t
        deps = obs["deployments"]
        if self.shares is None:
            self.shares = {}
            for name, d in deps.items():
                model = self.config.variants[name].model if name in self.config.variants else name
                self.shares[model] = self.shares.get(model, 0.0) + d["weight"]
        free = sum(n["free_gpus"] for n in obs["nodes"].values() if n["ready"] and not n["cordoned"])
        gpu = sim.scenario.cluster.gpu  # one GPU type per cluster in these scenarios
        snap = Snapshot(sim.t, {n: d["replicas"] for n, d in deps.items()}, self.observe(sim, obs), {gpu: free})
        plan, self.state = self.planner.plan(snap, self.state)
        self.plans.append(plan)
        for d in plan.changes():
            need = (d.desired - d.current) * deps[d.variant]["gpus_per_replica"]
            if need > free:
                continue  # no room: asking would leave a Pending pod
            free -= max(0, need)
            sim.actions.scale(d.variant, d.desired)
        self._route(sim, plan, deps)

    def _route(self, sim: Simulator, plan: Plan, deps: dict[str, Any]) -> None:
        """Split each model's share over its variants by ready capacity (a load-aware gateway)."""
        assert self.shares is not None
        cap = {n: max(1, deps[n]["ready"]) * v.tokens_per_s_per_replica for n, v in plan.views.items()}
        weights: dict[str, float] = {}
        for name, d in deps.items():
            model = self.config.variants[name].model if name in self.config.variants else name
            group = [n for n in deps if (self.config.variants[n].model if n in self.config.variants else n) == model]
            total = sum(cap.get(n, 1.0) for n in group)
            weights[name] = self.shares[model] * cap.get(name, 1.0) / total if total > 0 else d["weight"]
        current = {n: d["weight"] for n, d in deps.items()}
        if max(abs(weights[n] - current[n]) for n in deps) > 0.02:  # every change costs a little disruption
            sim.actions.set_router_weights(weights)


def surge_scenario(duration: float) -> Scenario:
    """The default cluster, steady traffic, the rate doubled from 600 s to 1800 s (added per run)."""
    return Scenario(
        name="surge",
        description="default fleet; request rate x2 from 10 to 30 minutes",
        duration_s=duration,
        traffic=TrafficSpec(kind="synthetic", base_rps=6.0, bursts_per_hour=0.0, diurnal_amplitude=0.0),
    )


def episode(scenario: str, seed: int, policy: str, duration: float, config: CapacityConfig) -> dict[str, Any]:
    """Run one episode and measure it."""
    sc = surge_scenario(duration) if scenario == "surge" else load_scenario(scenario)
    sim = Simulator(sc, seed=seed, sinks=[NullSink()])
    if scenario == "surge":
        sim.traffic.add_surge(600.0, 1800.0, 2.0)
    pol: Policy = {
        "static": StaticThresholdPolicy,
        "autoscaler": VariantAwareAutoscaler,
    }.get(policy, lambda: PlannerPolicy(config))()
    grade = sim.run(duration, policy=pol)
    recs = sim.grader.records
    weight = sum(r.arrivals for r in recs) or 1.0
    ok = sum(r.arrivals for r in recs if r.ttft_mean <= sc.slo.ttft_s and r.e2e_mean <= sc.slo.e2e_s)
    scale_events = sum(
        1 for a in sim.actions.log if a.kind == "scale" and a.accepted and len(set(a.message.split(" -> "))) == 2
    )
    return {
        "scenario": scenario,
        "seed": seed,
        "policy": policy,
        "score": grade.score,
        "latency_component": grade.components["latency"],
        "slo_attainment": round(ok / weight, 4),
        "cost_usd": grade.cost_usd,
        "cost_per_1k_tokens": round(grade.cost_usd / max(1.0, grade.gen_tokens) * 1000.0, 6),
        "gpu_hours": round(grade.cost_usd / 4.0, 3),
        "error_share": round(grade.errors / max(1.0, grade.requests), 5),
        "scale_events": scale_events,
    }


def parse_seeds(text: str) -> list[int]:
    """``0-4`` or ``1,3,5``."""
    if "-" in text:
        a, b = text.split("-", 1)
        return list(range(int(a), int(b) + 1))
    return [int(x) for x in text.split(",")]


def main() -> None:
    """Parse arguments, run every episode, print the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0-4")
    ap.add_argument("--duration", type=float, default=3600.0)
    ap.add_argument("--scenarios", default="surge,busy")
    ap.add_argument(
        "--ttft-p95",
        type=float,
        default=4.0,
        help="the planner's TTFT p95 target; the grade scores mean TTFT against 2 s, and a p95 of 4 s "
        "is about what a 2 s mean has under the spread of real TTFTs",
    )
    args = ap.parse_args()
    base = load_config()
    config = base.model_copy(update={"slo": base.slo.model_copy(update={"ttft_p95_s": args.ttft_p95})})
    rows = [
        episode(sc, seed, pol, args.duration, config)
        for sc in args.scenarios.split(",")
        for seed in parse_seeds(args.seeds)
        for pol in ("static", "autoscaler", "planner")
    ]
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for sc in args.scenarios.split(","):
        summary[sc] = {}
        for pol in ("static", "autoscaler", "planner"):
            mine = [r for r in rows if r["scenario"] == sc and r["policy"] == pol]
            keys = [k for k in mine[0] if isinstance(mine[0][k], float | int) and k != "seed"]
            summary[sc][pol] = {k: round(float(np.mean([r[k] for r in mine])), 6) for k in keys}
    out = {"seeds": args.seeds, "duration_s": args.duration, "ttft_p95_target_s": args.ttft_p95, "summary": summary}
    print(json.dumps({**out, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
