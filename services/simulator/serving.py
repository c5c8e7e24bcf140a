"""Fluid model of vLLM continuous batching, vectorised over every replica, plus GPU physics.

Each replica (pod slot) keeps a handful of numbers instead of per-request objects: requests waiting
and running, the mean prompt/output length of each group, and the mean KV-cache tokens a running
sequence holds. One step (normally one simulated second) does what the vLLM scheduler does in
aggregate:

1. new arrivals join the waiting queue;
2. the scheduler admits waiting requests while there is room in the batch (``max_num_seqs``), in the
   KV cache (prompt blocks) and in the prefill budget;
3. the rest of the step decodes: one token per running sequence per decode step, whose duration is
   the time to stream the weights plus every sequence's KV cache from HBM;
4. sequences finish at a rate of (tokens generated / mean output length);
5. when running sequences' KV cache outgrows the pool, the excess is preempted back to the queue;
6. requests that would wait longer than the client timeout abort.

Latency is estimated per step (queue wait by Little's law, prefill time, decode step time) and turned
into Prometheus histograms at scrape time by spreading each interval's mean over a log-normal.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr

from services.simulator.cluster import Cluster
from services.simulator.specs import CONTEXTS

# Context classes requests are routed by: total tokens must fit the replica's max_model_len.
CLASS_BOUNDS: tuple[int, ...] = (CONTEXTS["8k"], CONTEXTS["32k"], CONTEXTS["128k"])

# Subsets of the bucket boundaries vLLM registers for its histograms.
TTFT_BUCKETS = np.array([0.01, 0.02, 0.04, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0])
TPOT_BUCKETS = np.array([0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5])
E2E_BUCKETS = np.array([0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 240.0, 480.0])
# Spread (log-space sigma) of each latency around its interval mean.
_SIGMA = {"ttft": 0.6, "tpot": 0.25, "e2e": 0.5}


@dataclass
class ClassArrivals:
    """Requests that arrived in one step, grouped by context class.

    Attributes:
        n: request count per class (``CLASS_BOUNDS`` order).
        prompt: mean prompt tokens per class.
        output: mean output tokens per class.
        oversize: requests longer than every class (always rejected).
    """

    n: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    oversize: int = 0

    @property
    def total(self) -> int:
        """All requests of the step."""
        return int(self.n.sum()) + self.oversize


@dataclass
class StepStats:
    """What the grader needs from one step, cluster-wide."""

    arrivals: float = 0.0
    errors: float = 0.0
    completions: float = 0.0
    ttft_sum: float = 0.0
    ttft_n: float = 0.0
    e2e_sum: float = 0.0
    e2e_n: float = 0.0
    gen_tokens: float = 0.0


class Serving:
    """Serving state of every pod slot, and the router in front of them.

    Args:
        cluster: the cluster whose pods are served.
        rng: generator for routing draws.
        request_timeout_s: client timeout; requests waiting longer abort.
        gpu_memory_utilization: vLLM's share of GPU memory preallocated for weights + KV cache.
    """

    def __init__(
        self,
        cluster: Cluster,
        rng: np.random.Generator,
        request_timeout_s: float = 60.0,
        gpu_memory_utilization: float = 0.85,
    ) -> None:
        self.cluster = cluster
        self.rng = rng
        self.timeout = request_timeout_s
        self.gmu = gpu_memory_utilization
        n = cluster.max_slots
        self.n = n
        self.dep_names = list(cluster.deployments)
        self.weights = np.full(len(self.dep_names), 1.0 / max(1, len(self.dep_names)))
        z = lambda: np.zeros(n)  # noqa: E731 - short local factory keeps the table below readable
        # configuration refreshed whenever the cluster's pods change
        self.serving = np.zeros(n, dtype=bool)
        self.routable = np.zeros(n, dtype=bool)
        self.fail_fast = np.zeros(n, dtype=bool)
        self.max_seqs, self.kv_cap, self.prefill_rate = z(), z(), z()
        self.dec_base, self.dec_tok, self.lat_factor = z(), z(), z()
        self.extra_latency = z()  # seconds added by network faults on the pod's node
        self.dep_index = np.full(n, -1, dtype=np.int64)
        self.gpu_idx = np.full((n, 1), cluster.gpus.n, dtype=np.int64)
        # queue and batch
        self.wait_n, self.wait_p, self.wait_o = z(), z(), z()
        self.run_n, self.run_ctx, self.run_o = z(), z(), z()
        self.admit_ema, self.ttft_ema, self.tpot_last = z(), z(), z()
        self.busy = z()
        self.kv_usage = z()
        self.arr_n, self.arr_p, self.arr_o = z(), z(), z()
        # Prometheus counters (reset when the engine restarts, like a real process)
        self.prompt_tokens, self.gen_tokens = z(), z()
        self.ok_stop, self.ok_length, self.aborted, self.preemptions = z(), z(), z(), z()
        self.hist = {
            "ttft": (TTFT_BUCKETS, np.zeros((n, len(TTFT_BUCKETS))), z(), z()),
            "tpot": (TPOT_BUCKETS, np.zeros((n, len(TPOT_BUCKETS))), z(), z()),
            "e2e": (E2E_BUCKETS, np.zeros((n, len(E2E_BUCKETS))), z(), z()),
        }
        # per-interval sums turned into histogram buckets at scrape time
        self.iv = {k: (z(), z()) for k in self.hist}
        self.interval_prompt, self.interval_gen = z(), z()
        self._version = -1
        self._dep_slots: list[np.ndarray] = []
        self.dep_max_len = np.zeros(len(self.dep_names))
        self.router_errors = 0.0
        self.router_ok = 0.0
        self._lost_this_step = 0.0
        self.retry_pending = 0.0  # failed requests whose clients will send them again
        self.retry_share = 0.8
        self.up = np.zeros(n + 1, dtype=bool)  # engine process holds GPU memory (Loading or Running)

    # ----------------------------------------------------------------------------- config

    def refresh(self) -> None:
        """Rebuild per-slot configuration from the cluster (only when pods changed)."""
        c = self.cluster
        for slot, graceful in c.down_slots:
            self._drop(slot, graceful)
        for slot in c.started_slots:
            self._reset_counters(slot)
        c.down_slots.clear()
        c.started_slots.clear()
        if c.version == self._version:
            return
        self._version = c.version
        self.serving[:] = False
        self.routable[:] = False
        self.fail_fast[:] = False
        self.dep_index[:] = -1
        self.up[:] = False
        max_tp = max((p.variant.tp for p in c.pods.values()), default=1)
        self.gpu_idx = np.full((self.n, max_tp), c.gpus.n, dtype=np.int64)
        dep_pos = {name: i for i, name in enumerate(self.dep_names)}
        for dep in c.deployments.values():
            if dep.name not in dep_pos:  # deployments are never removed, only added
                dep_pos[dep.name] = len(self.dep_names)
                self.dep_names.append(dep.name)
                self.weights = np.append(self.weights, 0.0)
        self.dep_max_len = np.array([c.deployments[d].variant.max_model_len for d in self.dep_names], dtype=float)
        slots: list[list[int]] = [[] for _ in self.dep_names]
        for slot, pod in c.pods.items():
            dep = c.deployments[pod.deployment]
            v = pod.variant
            self.dep_index[slot] = dep_pos[pod.deployment]
            if pod.gpus:
                self.gpu_idx[slot, : len(pod.gpus)] = pod.gpus
                spec = c.nodes[pod.node].gpu_spec
                self.kv_cap[slot] = v.kv_capacity_tokens(spec, self.gmu)
                self.prefill_rate[slot] = v.prefill_tokens_per_s(spec)
                self.dec_base[slot] = v.decode_base_s(spec)
                self.dec_tok[slot] = v.decode_per_token_s(spec)
            self.max_seqs[slot] = (
                dep.max_num_seqs if pod.revision == dep.revision else self.max_seqs[slot] or dep.max_num_seqs
            )
            self.lat_factor[slot] = dep.latency_factor if pod.revision == dep.revision else 1.0
            if pod.ready and c.nodes[pod.node].ready:
                self.routable[slot] = True
                slots[dep_pos[pod.deployment]].append(slot)
                if pod.engine_dead:
                    self.fail_fast[slot] = True
            self.up[slot] = pod.phase in ("Loading", "Running")
            # A NotReady node is usually a partition: its pods' in-flight requests stall and time out.
            self.serving[slot] = pod.ready and not pod.engine_dead and not pod.hung and c.nodes[pod.node].ready
        self._dep_slots = [np.array(sorted(s), dtype=np.int64) for s in slots]

    def _drop(self, slot: int, graceful: bool = False) -> None:
        """The engine stopped: what was queued or running fails, unless it drained gracefully."""
        lost = 0.0 if graceful else self.wait_n[slot] + self.run_n[slot]
        self.router_errors += lost
        self._lost_this_step += lost
        self.wait_n[slot] = self.run_n[slot] = 0.0
        self.admit_ema[slot] = 0.0
        self.kv_usage[slot] = 0.0

    def _reset_counters(self, slot: int) -> None:
        for arr in (self.prompt_tokens, self.gen_tokens, self.ok_stop, self.ok_length, self.aborted, self.preemptions):
            arr[slot] = 0.0
        for _b, buckets, s, c in self.hist.values():
            buckets[slot] = 0.0
            s[slot] = 0.0
            c[slot] = 0.0
        for s, c in self.iv.values():
            s[slot] = 0.0
            c[slot] = 0.0
        self.wait_n[slot] = self.run_n[slot] = 0.0

    # ----------------------------------------------------------------------------- routing

    def route(self, arrivals: ClassArrivals, stats: StepStats) -> None:
        """Split the step's arrivals over deployments (router weights) and their Ready pods."""
        self.arr_n[:] = 0.0
        self.arr_p[:] = 0.0
        self.arr_o[:] = 0.0
        # Clients retry most failed requests a moment later, so a crash does not shed load.
        if self.retry_pending >= 1.0 and arrivals.n.sum() > 0:
            extra = np.floor(self.retry_pending * arrivals.n / arrivals.n.sum())
            arrivals = ClassArrivals(arrivals.n + extra, arrivals.prompt, arrivals.output, arrivals.oversize)
            self.retry_pending -= float(extra.sum())
        stats.arrivals += arrivals.total
        stats.errors += arrivals.oversize
        has_pods = np.array([len(s) > 0 for s in self._dep_slots], dtype=bool)
        for c, bound in enumerate(CLASS_BOUNDS):
            n = int(arrivals.n[c])
            if n == 0:
                continue
            eligible = has_pods & (self.dep_max_len >= bound) & (self.weights > 0)
            if not eligible.any():
                # No weighted deployment can take it: fall back to any replica that fits the context.
                eligible = has_pods & (self.dep_max_len >= bound)
                w = eligible.astype(float)
            else:
                w = np.where(eligible, self.weights, 0.0)
            if not eligible.any():
                stats.errors += n  # 503 from the gateway (or 400: prompt too long for every model)
                self.router_errors += n
                continue
            per_dep = self.rng.multinomial(n, w / w.sum())
            for d in np.flatnonzero(per_dep):
                slots = self._dep_slots[d]
                k = self.rng.multinomial(int(per_dep[d]), np.full(len(slots), 1.0 / len(slots)))
                self.arr_n[slots] += k
                self.arr_p[slots] += k * arrivals.prompt[c]
                self.arr_o[slots] += k * arrivals.output[c]

    # ------------------------------------------------------------------------------ step

    def step(self, dt: float, arrivals: ClassArrivals, speed: np.ndarray) -> StepStats:
        """Advance every replica by ``dt`` seconds.

        Args:
            dt: step length in seconds.
            arrivals: requests that arrived during the step.
            speed: per-slot multiplier of step time (>= 1 is slower), from GPU health and clocks.

        Returns:
            Cluster-wide statistics for the grader.
        """
        stats = StepStats()
        self._lost_this_step = 0.0
        self.refresh()
        stats.errors += self._lost_this_step
        self.route(arrivals, stats)
        errors_before_step = stats.errors
        # engine-dead pods answer 500 at once
        ff = self.fail_fast & (self.arr_n > 0)
        if ff.any():
            lost = float(self.arr_n[ff].sum())
            stats.errors += lost
            self.router_errors += lost
            self.arr_n[ff] = 0.0
        a = self.arr_n
        tot = self.wait_n + a
        safe = np.maximum(tot, 1e-9)
        self.wait_p = np.where(tot > 0, (self.wait_n * self.wait_p + self.arr_p) / safe, self.wait_p)
        self.wait_o = np.where(tot > 0, (self.wait_n * self.wait_o + self.arr_o) / safe, self.wait_o)
        carried = self.wait_n.copy()
        self.wait_n = tot
        srv = self.serving
        spd = speed * self.lat_factor
        prefill = np.where(srv, self.prefill_rate / np.maximum(spd, 1e-9), 0.0)
        p = np.maximum(self.wait_p, 1.0)
        kv_room = np.maximum(0.0, self.kv_cap * 0.99 - self.run_n * self.run_ctx)  # vLLM's 1% watermark
        seq_room = np.maximum(0.0, self.max_seqs - self.run_n)
        admit = np.minimum.reduce([self.wait_n, seq_room, kv_room / p, prefill * dt * 0.9 / p])
        admit = np.where(srv, admit, 0.0)
        prefill_time = np.where(admit > 0, admit * p / np.maximum(prefill, 1e-9), 0.0)
        new_ctx = p + self.wait_o * 0.5
        run_tot = self.run_n + admit
        rsafe = np.maximum(run_tot, 1e-9)
        self.run_ctx = np.where(run_tot > 0, (self.run_n * self.run_ctx + admit * new_ctx) / rsafe, self.run_ctx)
        self.run_o = np.where(run_tot > 0, (self.run_n * self.run_o + admit * self.wait_o) / rsafe, self.run_o)
        self.run_n = run_tot
        self.wait_n = self.wait_n - admit
        decode_avail = np.maximum(0.0, dt - prefill_time)
        ts = (self.dec_base + self.dec_tok * self.run_n * self.run_ctx) * spd
        tok_per_seq = np.where(srv & (self.run_n > 0), decode_avail / np.maximum(ts, 1e-9), 0.0)
        gen = self.run_n * tok_per_seq
        done = np.minimum(self.run_n, gen / np.maximum(self.run_o, 1.0))
        self.run_n = self.run_n - done
        # Decoding grows every sequence's KV footprint; past the pool size vLLM preempts (recompute).
        over = self.run_n * self.run_ctx - self.kv_cap
        pre = np.where(srv & (over > 0), over / np.maximum(self.run_ctx, 1.0), 0.0)
        # Lengths vary around the fluid mean: within 5% of a full pool some sequence always needs a
        # block that is not there, so a small share of the batch is preempted every step.
        usage = self.run_n * self.run_ctx / np.maximum(self.kv_cap, 1.0)
        pre += np.where(srv, self.run_n * 0.02 * np.clip((usage - 0.95) / 0.05, 0.0, 1.0), 0.0)
        pre = np.minimum(pre, self.run_n)
        self.run_n -= pre
        self.wait_n += pre
        self.preemptions += pre
        self.kv_usage = np.where(
            self.kv_cap > 0, np.minimum(1.0, self.run_n * self.run_ctx / np.maximum(self.kv_cap, 1.0)), 0.0
        )
        # Latency estimates for this step's cohorts.
        self.admit_ema = 0.8 * self.admit_ema + 0.2 * admit / dt
        # Queue wait by Little's law at the faster of the recent and the current admission rate (an
        # idle replica's near-zero average would otherwise turn one queued request into a minute).
        q_wait = np.minimum(self.timeout, carried / np.maximum(np.maximum(self.admit_ema, admit / dt), 1e-3))
        ttft = q_wait + 0.5 * prefill_time + p / np.maximum(prefill, 1e-9) + ts + self.extra_latency
        self.ttft_ema = np.where(admit > 0, 0.7 * self.ttft_ema + 0.3 * ttft, self.ttft_ema)
        tpot = ts * dt / np.maximum(decode_avail, 0.05 * dt)
        self.tpot_last = np.where(gen > 0, tpot, self.tpot_last)
        e2e = self.ttft_ema + self.run_o * tpot + self.extra_latency
        # Clients give up on requests that would wait past their timeout.
        excess = np.maximum(0.0, self.wait_n - self.admit_ema * self.timeout)
        abort = excess * min(1.0, 0.1 * dt)
        self.wait_n -= abort
        self.aborted += abort
        # counters
        self.prompt_tokens += admit * p
        self.gen_tokens += gen
        self.interval_prompt += admit * p
        self.interval_gen += gen
        self.ok_stop += done * 0.92
        self.ok_length += done * 0.08
        s, c = self.iv["ttft"]
        s += admit * ttft
        c += admit
        s, c = self.iv["tpot"]
        s += gen * tpot
        c += gen
        s, c = self.iv["e2e"]
        s += done * e2e
        c += done
        self.busy = np.where(
            srv,
            np.minimum(
                1.0, (prefill_time + (self.run_n > 0) * decode_avail * np.minimum(1.0, 0.6 + self.run_n / 32)) / dt
            ),
            0.0,
        )
        total_abort = float(abort.sum())
        n_done = float(done.sum())
        stats.errors += total_abort
        stats.completions += n_done
        self.router_errors += total_abort
        self.router_ok += n_done
        stats.ttft_sum += float((admit * ttft).sum())
        stats.ttft_n += float(admit.sum())
        stats.e2e_sum += float((done * e2e).sum())
        stats.e2e_n += n_done
        stats.gen_tokens += float(gen.sum())
        self.retry_pending = min(1e7, self.retry_pending + self.retry_share * (stats.errors - errors_before_step))
        self.retry_pending += self.retry_share * errors_before_step
        return stats

    # ----------------------------------------------------------------------------- scrape

    def flush_histograms(self) -> None:
        """Fold the interval's latency sums into cumulative histogram buckets (once per scrape)."""
        for key, (bounds, buckets, hsum, hcount) in self.hist.items():
            s, c = self.iv[key]
            mask = c > 0
            if mask.any():
                mean = s[mask] / c[mask]
                sigma = _SIGMA[key]
                mu = np.log(np.maximum(mean, 1e-6)) - sigma * sigma / 2
                cdf = ndtr((np.log(bounds)[None, :] - mu[:, None]) / sigma)
                buckets[mask] += c[mask, None] * cdf
                hsum[mask] += s[mask]
                hcount[mask] += c[mask]
            s[:] = 0.0
            c[:] = 0.0
        self.interval_prompt[:] = 0.0
        self.interval_gen[:] = 0.0

    def slot_speed(self, gpu_factor: np.ndarray) -> np.ndarray:
        """Per-slot slow-down: the slowest GPU of each replica decides (tensor parallel lock-step)."""
        ext = np.append(gpu_factor, 1.0)
        return ext[self.gpu_idx].max(axis=1)


def update_gpus(cluster: Cluster, serving: Serving, dt: float) -> np.ndarray:
    """Advance GPU power, temperature, clocks and memory from the replicas' load.

    Returns:
        Per-GPU step-time multiplier (thermal clock loss x link retries), >= 1.
    """
    g = cluster.gpus
    slot = g.pod_slot
    has = slot >= 0
    busy_ext = np.append(serving.busy, 0.0)
    run_ext = np.append(np.minimum(1.0, serving.run_n / np.maximum(serving.max_seqs, 1.0)), 0.0)
    busy = np.where(g.broken, 0.0, busy_ext[slot])
    batch = run_ext[slot]
    clock_ratio = np.where(g.sm_clock > 0, g.sm_clock / np.maximum(g.max_clock, 1.0), 1.0)
    g.power_w = g.idle_w + (g.tdp_w - g.idle_w) * busy * (0.55 + 0.45 * batch) * np.maximum(clock_ratio, 0.4)
    target = 28.0 + 52.0 * g.power_w / g.tdp_w + g.heat_c
    g.temp_c = g.temp_c + (target - g.temp_c) * (1.0 - np.exp(-dt / 60.0))
    hot = g.temp_c >= g.slowdown_c - 1.0
    ratio = np.where(hot, np.clip(1.0 - 0.08 * (g.temp_c - (g.slowdown_c - 1.0)), 0.4, 1.0), 1.0)
    g.sm_clock = np.where(busy > 0.05, g.max_clock * ratio, g.idle_clock)
    reasons = (
        np.where(busy <= 0.05, 0x1, 0) | np.where(hot, 0x20 | 0x40, 0) | np.where(g.power_w >= 0.97 * g.tdp_w, 0x4, 0)
    )
    g.throttle_reasons = reasons.astype(np.int64)
    g.util = np.round(100.0 * busy)
    # vLLM preallocates gpu_memory_utilization of the card once the engine runs; a leak adds to it.
    alloc = np.where(has & serving.up[slot], g.memory_mib * serving.gmu, 0.0)
    g.fb_used_mib = np.where(g.off_bus, 0.0, np.minimum(g.memory_mib, alloc + g.leak_mib + 1.0))
    return g.slowdown / ratio
