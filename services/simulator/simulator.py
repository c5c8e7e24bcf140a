"""The simulator: one object that owns the cluster, traffic, faults, telemetry, actuators and grader.

One :meth:`Simulator.step` advances ``dt`` simulated seconds in this order: faults start/act/end,
finished actions land, the Kubernetes lifecycle moves, GPU physics updates, requests arrive and are
served, the grader scores the step, and every ``scrape_interval`` a scrape's worth of telemetry goes
to the sinks along with the step's logs and events.

Randomness: the seed feeds one ``numpy.random.SeedSequence`` spawned into independent streams
(topology, traffic, routing, faults, actions, messages), so a policy's actions never shift the
traffic or the faults another policy would see with the same seed.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import numpy as np

from services.core.events import Event
from services.simulator.actuators import Actuators
from services.simulator.cluster import Cluster
from services.simulator.emitter import Emitter
from services.simulator.faults import Fault, FaultEngine, random_faults
from services.simulator.grader import Grade, Grader, StepRecord
from services.simulator.scenario import Scenario
from services.simulator.serving import Serving, update_gpus
from services.simulator.telemetry import Telemetry
from services.simulator.traffic import SyntheticTraffic, TraceTraffic, Traffic

EPOCH = 1_764_000_000.0  # 2025-11-24T16:00:00Z: simulated second 0 (a multiple of 60)


class Sink(Protocol):
    """Where telemetry goes (see services.simulator.sinks)."""

    def emit(self, events: list[Event]) -> None:
        """Take one step's events."""

    def close(self) -> None:
        """Flush and release resources."""


class Simulator:
    """A seeded, stochastic GPU inference cluster.

    Args:
        scenario: cluster, fleet, traffic and faults.
        seed: the episode seed.
        sinks: receivers of telemetry events.
        telemetry: generate metric batches and logs (off: grading only, much faster).
        scrape_interval: simulated seconds between scrapes.
        dt: simulated seconds per step.
        epoch: UNIX time of simulated second 0 (a fixed date by default, so a seed's telemetry is
            the same every run; ``medic sim serve`` starts it at the current minute).
    """

    def __init__(
        self,
        scenario: Scenario,
        seed: int = 0,
        sinks: Iterable[Sink] = (),
        telemetry: bool = True,
        scrape_interval: float = 15.0,
        dt: float = 1.0,
        epoch: float = EPOCH,
    ) -> None:
        self.scenario = scenario
        self.epoch = epoch
        self.seed = seed
        self.dt = dt
        self.scrape_interval = scrape_interval
        self.telemetry_on = telemetry
        self.sinks = list(sinks)
        self.t = 0.0
        topo, traffic_rng, route_rng, fault_rng, action_rng, msg_rng = (
            np.random.Generator(np.random.PCG64(s)) for s in np.random.SeedSequence(seed).spawn(6)
        )
        self.emitter = Emitter(msg_rng, epoch)
        cs = scenario.cluster
        node_specs = cs.node_gpus or [cs.gpu] * cs.nodes
        fleet = scenario.fleet()
        self.cluster = Cluster(
            topo,
            node_specs,
            cs.gpus_per_node,
            [(d.name, d.variant, d.replicas, d.max_num_seqs) for d in fleet],
            self.emitter,
        )
        self.serving = Serving(self.cluster, route_rng)
        w = np.array([d.weight for d in fleet], dtype=float)
        self.serving.weights = w / w.sum() if w.sum() > 0 else np.full(len(w), 1.0 / len(w))
        self.traffic = self._traffic(traffic_rng)
        faults = scenario.pinned_faults()
        if scenario.random_faults:
            faults += random_faults(fault_rng, scenario.duration_s, scenario.faults_per_hour)
        self.faults = FaultEngine(self.cluster, self.traffic, self.emitter, fault_rng, faults)
        self.actions = Actuators(self, action_rng)
        self.grader = Grader(scenario.slo)
        self.telemetry = Telemetry(self.cluster, self.serving, self.emitter, epoch)
        self._gpu_factor = np.ones(self.cluster.gpus.n)
        self._slot_node = np.full(self.serving.n, -1, dtype=np.int64)
        self._slot_node_version = -1
        self._held_version = -1
        self._latency_set = False  # extra_latency may be non-zero (only _apply_network_latency writes it)
        self._held: tuple[np.ndarray, np.ndarray, float] = (np.zeros(0, dtype=np.int64), np.zeros(0), 0.0)
        self.last_stats: dict[str, float] = {}
        self._gpu_node: dict[str, str] | None = None
        self.events_emitted = 0

    def _traffic(self, rng: np.random.Generator) -> Traffic:
        ts = self.scenario.traffic
        if ts.kind == "trace":
            scale = self.scenario.cluster.nodes * self.scenario.cluster.gpus_per_node / 24.0
            copies = max(1, round(scale))
            return TraceTraffic(rng, ts.trace, ts.time_scale, copies)
        return SyntheticTraffic(
            rng,
            base_rps=self.scenario.base_rps(),
            diurnal_amplitude=ts.diurnal_amplitude,
            bursts_per_hour=ts.bursts_per_hour,
            burst_factor=ts.burst_factor,
        )

    # ---------------------------------------------------------------------------------- step

    def step(self) -> list[Event]:
        """Advance one ``dt``; return the telemetry events produced (already sent to sinks)."""
        t, dt = self.t, self.dt
        self.actions.disruption_this_step = self.actions.disruption_this_step  # actions taken before this step
        self.faults.step(t, dt)
        self.actions.tick(t)
        self.cluster.tick(t)
        self._apply_network_latency()
        self._gpu_factor = update_gpus(self.cluster, self.serving, dt)
        speed = self.serving.slot_speed(self._gpu_factor)
        arrivals = self.traffic.arrivals(t, dt)
        stats = self.serving.step(dt, arrivals, speed)
        g = self.cluster.gpus
        held, held_memory, cost_per_s = self._held_gpus()
        vram = float((g.fb_used_mib[held] / held_memory).max()) if held.size else 0.0
        rec = StepRecord(
            t=t,
            arrivals=stats.arrivals,
            errors=stats.errors,
            ttft_mean=stats.ttft_sum / stats.ttft_n if stats.ttft_n > 0 else 0.0,
            e2e_mean=stats.e2e_sum / stats.e2e_n if stats.e2e_n > 0 else 0.0,
            gen_tokens=stats.gen_tokens,
            cost_usd=cost_per_s * dt,
            vram_max=vram,
            # degraded share of the fleet's GPUs: thermally throttled, or broken (XID) under a pod
            # (the mean of the flags: their count, exact in float64, over the held GPUs)
            throttled_frac=np.count_nonzero(((g.throttle_reasons[held] & 0x40) > 0) | g.broken[held]) / held.size
            if held.size
            else 0.0,
            disruption=self.actions.disruption_this_step,
        )
        self.actions.disruption_this_step = 0.0
        self.last_stats = self.grader.record(rec)
        events: list[Event] = []
        if self.telemetry_on:
            if int(t) % int(self.scrape_interval) == 0:
                events.extend(self.telemetry.scrape(t, self.scrape_interval))
            events.extend(self.emitter.drain())
            for sink in self.sinks:
                sink.emit(events)
            self.events_emitted += len(events)
        else:
            self.emitter.drain()
        self.t = t + dt
        return events

    def _held_gpus(self) -> tuple[np.ndarray, np.ndarray, float]:
        """GPUs held by pods (ascending indices), their memory, and what they cost per second.

        Only scheduling and releasing pods change which GPUs are held, and both bump the cluster's
        version, so this is recomputed only then.
        """
        c = self.cluster
        if self._held_version != c.version:
            held = np.flatnonzero(c.gpus.pod_slot >= 0)
            self._held = (held, c.gpus.memory_mib[held], c.gpu_cost_per_s())
            self._held_version = c.version
        return self._held

    def _apply_network_latency(self) -> None:
        s = self.serving
        if not self.faults.latency_by_node:
            if self._latency_set:
                s.extra_latency[:] = 0.0
                self._latency_set = False
            return
        self._latency_set = True
        if self._slot_node_version != self.cluster.version:
            self._slot_node[:] = -1
            for slot, pod in self.cluster.pods.items():
                self._slot_node[slot] = pod.node
            self._slot_node_version = self.cluster.version
        s.extra_latency[:] = 0.0
        for node, seconds in self.faults.latency_by_node.items():
            s.extra_latency[self._slot_node == node] += seconds

    def run(
        self,
        duration_s: float | None = None,
        policy: Callable[[Simulator], None] | None = None,
        decision_interval: float = 15.0,
        on_step: Callable[[Simulator, list[Event]], None] | None = None,
    ) -> Grade:
        """Run until ``duration_s`` (default: the scenario's), letting ``policy`` act periodically.

        The cyclic garbage collector (if enabled) is paused during each step until its events have been handed
        to the sinks and ``on_step`` and dropped (see ``trusted.gc_paused``): a scrape's samples
        are freed by reference counting, and a collection that ran while they were still held
        would walk them all, then move them to older generations that are walked again, whole,
        later (a sixth of a 3-node run's time). Collections run between steps as usual.
        """
        end = self.scenario.duration_s if duration_s is None else duration_s
        collect = gc.isenabled()
        try:
            while self.t < end:
                gc.disable()
                if policy is not None and int(self.t) % int(decision_interval) == 0 and self.t > 0:
                    policy(self)
                events = self.step()
                if on_step is not None:
                    on_step(self, events)
                del events
                if collect:
                    gc.enable()
        finally:
            if collect:
                gc.enable()
        return self.grade(getattr(policy, "name", type(policy).__name__ if policy else "noop"))

    def close(self) -> None:
        """Close every sink."""
        for sink in self.sinks:
            sink.close()

    # ------------------------------------------------------------------------------ queries

    def node_of(self, entity: str) -> str:
        """The node a GPU UUID, a pod or a node name is on ('' when unknown or not scheduled)."""
        c = self.cluster
        if self._gpu_node is None:  # GPUs never move between nodes: built once
            self._gpu_node = {u: c.nodes[int(c.gpus.node[i])].name for i, u in enumerate(c.gpu_uuids)}
        if entity in self._gpu_node:
            return self._gpu_node[entity]
        pod = c.pod_by_name.get(entity)
        if pod is not None:
            return str(c.nodes[pod.node].name) if pod.node >= 0 else ""
        return entity if entity in self._node_names() else ""

    def _node_names(self) -> frozenset[str]:
        return frozenset(n.name for n in self.cluster.nodes)

    def mark_detected(self, fault_id: str) -> bool:
        """A policy says it has detected ``fault_id`` (records MTTD)."""
        return self.faults.mark_detected(fault_id, self.t)

    def mark_detected_entity(self, entity: str) -> list[str]:
        """Mark every active fault on ``entity`` (GPU UUID, pod, node, deployment) as detected."""
        hit = [f.id for f in self.faults.active() if f.entity == entity]
        for fid in hit:
            self.mark_detected(fid)
        return hit

    def fault_list(self) -> list[Fault]:
        """All faults of the episode (planned, active, resolved)."""
        return list(self.faults.faults)

    def grade(self, policy: str = "") -> Grade:
        """The episode grade so far."""
        return self.grader.grade(self.scenario.name, self.seed, policy, [f.summary() for f in self.faults.faults])

    def observe(self) -> dict[str, Any]:
        """What an operator's dashboards show: per deployment, node and GPU (no fault ground truth)."""
        c, s = self.cluster, self.serving
        s.refresh()
        g = c.gpus
        deps: dict[str, Any] = {}
        for i, name in enumerate(s.dep_names):
            dep = c.deployments[name]
            pods = c.pods_of(name)
            slots = np.array([p.slot for p in pods], dtype=np.int64)
            run = [p for p in pods if p.phase == "Running"]
            rs = np.array([p.slot for p in run], dtype=np.int64)
            # a drained replica's last TTFT is stale: it admits nothing new
            fresh = np.array([p.slot for p in run if not p.drained], dtype=np.int64)
            deps[name] = {
                "variant": dep.variant.key,
                "replicas": dep.replicas,
                "ready": len(run),
                "in_rotation": sum(1 for p in run if c.in_rotation(p)),
                "drained": sum(1 for p in pods if p.drained),
                "pending": sum(1 for p in pods if p.phase == "Pending"),
                "loading": sum(1 for p in pods if p.phase == "Loading"),
                "crashed": sum(1 for p in pods if p.phase == "Crashed"),
                "max_num_seqs": dep.max_num_seqs,
                "weight": float(s.weights[i]),
                "cost_per_hour": float(sum(g.cost_per_s[list(p.gpus)].sum() for p in pods)) * 3600.0,
                "gpus_per_replica": dep.variant.tp,
                "max_model_len": dep.variant.max_model_len,
                "kv_usage": float(s.kv_usage[rs].mean()) if rs.size else 0.0,
                "waiting": float(s.wait_n[slots].sum()) if slots.size else 0.0,
                "running": float(s.run_n[slots].sum()) if slots.size else 0.0,
                "ttft_s": float(s.ttft_ema[fresh].mean()) if fresh.size else 0.0,
                "revision": dep.revision,
            }
        pods_view = {
            p.name: {
                "deployment": p.deployment,
                "phase": p.phase,
                "node": c.nodes[p.node].name if p.node >= 0 else "",
                "gpus": [c.gpu_uuids[i] for i in p.gpus],
                "restarts": p.restarts,
                "drained": p.drained,
                "in_rotation": c.in_rotation(p),
                "kv_usage": float(s.kv_usage[p.slot]),
                "waiting": float(s.wait_n[p.slot]),
                "errors_fast": bool(s.fail_fast[p.slot]),
                "progress_stalled": bool(p.phase == "Running" and s.wait_n[p.slot] > 0 and s.admit_ema[p.slot] < 1e-3),
            }
            for p in (c.pods[k] for k in sorted(c.pods))
        }
        gpus_view = {
            c.gpu_uuids[i]: {
                "node": c.nodes[int(g.node[i])].name,
                "xid": int(g.xid[i]),
                "fb_used_frac": float(g.fb_used_mib[i] / g.memory_mib[i]),
                "temp_c": float(g.temp_c[i]),
                "throttle": int(g.throttle_reasons[i]),
                "ecc_dbe": float(g.ecc_dbe[i]),
                "ecc_sbe": float(g.ecc_sbe[i]),
                "nvlink_crc": float(g.nvlink_crc[i]),
                "pod": c.pods[int(g.pod_slot[i])].name if g.pod_slot[i] >= 0 else "",
            }
            for i in range(g.n)
            if g.pod_slot[i] >= 0 or g.xid[i] or g.broken[i]
        }
        nodes_view = {
            n.name: {
                "ready": n.ready,
                "cordoned": n.cordoned,
                "rebooting": bool(n.rebooting_until),
                "free_gpus": int(sum(1 for i in n.gpus if g.pod_slot[i] < 0 and not g.broken[i])),
            }
            for n in c.nodes
        }
        return {
            "t": self.t,
            "deployments": deps,
            "pods": pods_view,
            "gpus": gpus_view,
            "nodes": nodes_view,
            "arrival_rate": float(self.grader.records[-1].arrivals / self.dt) if self.grader.records else 0.0,
            "recent_arrivals": [r.arrivals for r in self.grader.records[-120:]],
            "error_rate": float(self.grader.records[-1].errors / max(1.0, self.grader.records[-1].arrivals))
            if self.grader.records
            else 0.0,
            "score": self.last_stats.get("score", 1.0),
        }
