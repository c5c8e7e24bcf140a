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

import math
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

# Per-slot floats a step reads and writes (queue, batch, latency state, counters, interval sums), in
# the order Serving._step_few unpacks them ...
_STEP_ROWS: tuple[str, ...] = (
    "wait_n",
    "wait_p",
    "wait_o",
    "run_n",
    "run_ctx",
    "run_o",
    "admit_ema",
    "ttft_ema",
    "tpot_last",
    "busy",
    "kv_usage",
    "prompt_tokens",
    "gen_tokens",
    "ok_stop",
    "ok_length",
    "aborted",
    "preemptions",
    "interval_prompt",
    "interval_gen",
    "iv_ttft_sum",
    "iv_ttft_count",
    "iv_tpot_sum",
    "iv_tpot_count",
    "iv_e2e_sum",
    "iv_e2e_count",
)
# ... and the per-slot floats it only reads: routed arrivals (three consecutive rows) and configuration.
_INPUT_ROWS: tuple[str, ...] = (
    "arr_n",
    "arr_p",
    "arr_o",
    "max_seqs",
    "kv_cap",
    "prefill_rate",
    "dec_base",
    "dec_tok",
    "lat_factor",
    "extra_latency",
)

_ARR_ROW = len(_STEP_ROWS)  # the row of arr_n in Serving._rows


def pairwise_sum(values: list[float]) -> float:
    """``float(np.sum(np.array(values)))``, bit for bit, in plain Python (for a handful of values).

    numpy adds float64 arrays pairwise: below 8 elements one running sum; up to 128, eight
    interleaved partial sums (element ``i`` goes to ``i % 8``) combined as a tree, then the
    remainder; above that, the two halves (the first a multiple of 8 long) recursively. Every
    addition is a correctly rounded IEEE-754 one, so the same order gives the same bits.
    """
    return _sparse_pairwise_sum(list(enumerate(values)), 0, len(values))


def _sparse_pairwise_sum(items: list[tuple[int, float]], start: int, n: int) -> float:
    """numpy's pairwise sum of an ``n``-element array holding ``items`` ((index, value)) and +0.0 elsewhere.

    Adding +0.0 leaves a sum unchanged (the simulator's summed quantities are never -0.0), so only
    the non-zero elements need visiting, at their positions.
    """
    if n < 8:
        res = 0.0
        for _i, v in items:
            res += v
        return res
    if n <= 128:
        r = [0.0] * 8
        full = n - n % 8
        tail = []
        for i, v in items:
            off = i - start
            if off < full:
                r[off % 8] += v
            else:
                tail.append(v)
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        for v in tail:
            res += v
        return res
    half = n // 2
    half -= half % 8
    cut = start + half
    return _sparse_pairwise_sum([x for x in items if x[0] < cut], start, half) + _sparse_pairwise_sum(
        [x for x in items if x[0] >= cut], cut, n - half
    )


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
        # Every per-slot float the step reads is a row of one 2-D array (the attributes below are views
        # of its rows, updated in place): the small-cluster step gathers and scatters all of a few
        # slots' numbers in one indexing operation each (see _step_few).
        self._rows = np.zeros((len(_STEP_ROWS) + len(_INPUT_ROWS), n))
        # in _STEP_ROWS + _INPUT_ROWS order (iterating a 2-D array yields views of its rows)
        (
            self.wait_n, self.wait_p, self.wait_o, self.run_n, self.run_ctx, self.run_o,
            self.admit_ema, self.ttft_ema, self.tpot_last, self.busy, self.kv_usage,
            self.prompt_tokens, self.gen_tokens, self.ok_stop, self.ok_length, self.aborted, self.preemptions,
            self.interval_prompt, self.interval_gen,
            self.iv_ttft_sum, self.iv_ttft_count, self.iv_tpot_sum, self.iv_tpot_count,
            self.iv_e2e_sum, self.iv_e2e_count,
            self.arr_n, self.arr_p, self.arr_o,
            self.max_seqs, self.kv_cap, self.prefill_rate, self.dec_base, self.dec_tok, self.lat_factor,
            self.extra_latency,
        ) = self._rows  # fmt: skip
        # configuration refreshed whenever the cluster's pods change (max_seqs ... extra_latency are
        # rows of _rows; extra_latency holds the seconds network faults add on the pod's node)
        self.serving = np.zeros(n, dtype=bool)
        self.routable = np.zeros(n, dtype=bool)
        self.fail_fast = np.zeros(n, dtype=bool)
        self.dep_index = np.full(n, -1, dtype=np.int64)
        self.gpu_idx = np.full((n, 1), cluster.gpus.n, dtype=np.int64)
        # queue and batch (wait_*, run_*, admit_ema, ttft_ema, tpot_last, busy, kv_usage, arr_*) and
        # Prometheus counters (prompt_tokens ... preemptions; reset when the engine restarts, like a
        # real process) are rows of _rows too.
        self.hist = {
            "ttft": (TTFT_BUCKETS, np.zeros((n, len(TTFT_BUCKETS))), z(), z()),
            "tpot": (TPOT_BUCKETS, np.zeros((n, len(TPOT_BUCKETS))), z(), z()),
            "e2e": (E2E_BUCKETS, np.zeros((n, len(E2E_BUCKETS))), z(), z()),
        }
        # per-interval (sum, count) of each latency, turned into histogram buckets at scrape time
        self.iv = {
            "ttft": (self.iv_ttft_sum, self.iv_ttft_count),
            "tpot": (self.iv_tpot_sum, self.iv_tpot_count),
            "e2e": (self.iv_e2e_sum, self.iv_e2e_count),
        }
        # the slots a small-cluster step works on, cached per cluster version (see _few_slots)
        self._few_version = -1
        self._few: tuple[list[int], np.ndarray, list[bool], list[bool]] = ([], np.zeros(0, dtype=np.int64), [], [])
        self._version = -1
        self._dep_slots: list[np.ndarray] = []
        self._dep_pick: list[tuple[list[int], np.ndarray]] = []
        self._route_key: tuple[int, list[float]] | None = None
        self._route_table: list[np.ndarray | None] = []
        self._gpu_constants: GpuConstants | None = None
        self._factor_ext = np.ones(cluster.gpus.n + 1)  # slot_speed's per-GPU factors plus 1.0 for padding
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
            # a drained replica leaves the rotation but keeps serving what it holds (serving below)
            if c.in_rotation(pod):
                self.routable[slot] = True
                slots[dep_pos[pod.deployment]].append(slot)
                if pod.engine_dead:
                    self.fail_fast[slot] = True
            self.up[slot] = pod.phase in ("Loading", "Running")
            # A NotReady node is usually a partition: its pods' in-flight requests stall and time out.
            self.serving[slot] = pod.ready and not pod.engine_dead and not pod.hung and c.nodes[pod.node].ready
        self._dep_slots = [np.array(sorted(s), dtype=np.int64) for s in slots]
        # each deployment's Ready slots and the uniform probabilities the router picks one with
        self._dep_pick = [(sorted(s), np.full(len(s), 1.0 / len(s))) if s else ([], np.zeros(0)) for s in slots]

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
        """Split the step's arrivals over deployments (router weights) and their pods in rotation.

        Counts are summed per slot in Python floats (the same additions, in the same order, as
        adding each deployment's draw to the arrays) and written to ``arr_n``/``arr_p``/``arr_o`` once.
        """
        arr = self._rows[_ARR_ROW : _ARR_ROW + 3]  # arr_n, arr_p, arr_o
        arr[:] = 0.0
        counts = arrivals.n.tolist()
        total = sum(counts)  # numpy's order for a few elements: left to right
        # Clients retry most failed requests a moment later, so a crash does not shed load.
        if self.retry_pending >= 1.0 and total > 0:
            extra = [float(math.floor(self.retry_pending * x / total)) for x in counts]
            counts = [x + e for x, e in zip(counts, extra, strict=True)]
            self.retry_pending -= sum(extra)
        stats.arrivals += int(sum(counts)) + arrivals.oversize
        stats.errors += arrivals.oversize
        prompt = arrivals.prompt.tolist()
        output = arrivals.output.tolist()
        table = self._routing_table()
        acc: dict[int, list[float]] = {}
        for c, class_pvals in enumerate(table):
            n = int(counts[c])
            if n == 0:
                continue
            if class_pvals is None:
                stats.errors += n  # 503 from the gateway (or 400: prompt too long for every model)
                self.router_errors += n
                continue
            per_dep = self.rng.multinomial(n, class_pvals)
            for d, m in enumerate(per_dep.tolist()):
                if not m:
                    continue
                slot_list, uniform = self._dep_pick[d]
                k = self.rng.multinomial(m, uniform)
                pc, oc = prompt[c], output[c]
                for slot, kk in zip(slot_list, k.tolist(), strict=True):
                    if kk:
                        a = acc.get(slot)
                        if a is None:
                            acc[slot] = [0.0 + kk, 0.0 + kk * pc, 0.0 + kk * oc]
                        else:
                            a[0] += kk
                            a[1] += kk * pc
                            a[2] += kk * oc
        if acc:
            arr[:, list(acc)] = np.array(list(acc.values())).T

    def _routing_table(self) -> list[np.ndarray | None]:
        """Per context class, the deployment probabilities of the router (None: no deployment fits).

        Depends only on which deployments have Ready pods, their context lengths and the weights,
        so it is rebuilt when the pods (refresh) or the weights change.
        """
        key = (self._version, self.weights.tolist())
        if self._route_key == key:
            return self._route_table
        has_pods = np.array([len(s) > 0 for s in self._dep_slots], dtype=bool)
        table: list[np.ndarray | None] = []
        for bound in CLASS_BOUNDS:
            eligible = has_pods & (self.dep_max_len >= bound) & (self.weights > 0)
            if not eligible.any():
                # No weighted deployment can take it: fall back to any replica that fits the context.
                eligible = has_pods & (self.dep_max_len >= bound)
                w = eligible.astype(float)
            else:
                w = np.where(eligible, self.weights, 0.0)
            table.append(w / w.sum() if eligible.any() else None)
        self._route_key, self._route_table = key, table
        return table

    # ------------------------------------------------------------------------------ step

    # Serving.step takes the small-cluster path (_step_few) while the cluster has at most this many pods.
    few_max_pods = 24

    def step(self, dt: float, arrivals: ClassArrivals, speed: np.ndarray) -> StepStats:
        """Advance every replica by ``dt`` seconds.

        Two implementations of the same arithmetic: numpy over every slot (``_step_all``), and plain
        Python floats over the occupied slots (``_step_few``) while there are at most
        ``few_max_pods`` pods, where numpy's per-call overhead would dominate. Both do the same
        IEEE-754 operations in the same order per slot, and sum like numpy does, so their results
        are identical to the bit (tests/unit/test_sim_core.py runs a scenario both ways).

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
        if len(self.cluster.pods) <= self.few_max_pods:
            self._step_few(dt, speed, stats)
        else:
            self._step_all(dt, speed, stats)
        self.retry_pending = min(1e7, self.retry_pending + self.retry_share * (stats.errors - errors_before_step))
        self.retry_pending += self.retry_share * errors_before_step
        return stats

    def _step_all(self, dt: float, speed: np.ndarray, stats: StepStats) -> None:
        """The step as numpy operations over every slot (the model as written in the module docstring)."""
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
        self.wait_p[:] = np.where(tot > 0, (self.wait_n * self.wait_p + self.arr_p) / safe, self.wait_p)
        self.wait_o[:] = np.where(tot > 0, (self.wait_n * self.wait_o + self.arr_o) / safe, self.wait_o)
        carried = self.wait_n.copy()
        self.wait_n[:] = tot
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
        self.run_ctx[:] = np.where(run_tot > 0, (self.run_n * self.run_ctx + admit * new_ctx) / rsafe, self.run_ctx)
        self.run_o[:] = np.where(run_tot > 0, (self.run_n * self.run_o + admit * self.wait_o) / rsafe, self.run_o)
        self.run_n[:] = run_tot
        self.wait_n -= admit
        decode_avail = np.maximum(0.0, dt - prefill_time)
        ts = (self.dec_base + self.dec_tok * self.run_n * self.run_ctx) * spd
        tok_per_seq = np.where(srv & (self.run_n > 0), decode_avail / np.maximum(ts, 1e-9), 0.0)
        gen = self.run_n * tok_per_seq
        done = np.minimum(self.run_n, gen / np.maximum(self.run_o, 1.0))
        self.run_n -= done
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
        self.kv_usage[:] = np.where(
            self.kv_cap > 0, np.minimum(1.0, self.run_n * self.run_ctx / np.maximum(self.kv_cap, 1.0)), 0.0
        )
        # Latency estimates for this step's cohorts.
        self.admit_ema[:] = 0.8 * self.admit_ema + 0.2 * admit / dt
        # Queue wait by Little's law at the faster of the recent and the current admission rate (an
        # idle replica's near-zero average would otherwise turn one queued request into a minute).
        q_wait = np.minimum(self.timeout, carried / np.maximum(np.maximum(self.admit_ema, admit / dt), 1e-3))
        ttft = q_wait + 0.5 * prefill_time + p / np.maximum(prefill, 1e-9) + ts + self.extra_latency
        self.ttft_ema[:] = np.where(admit > 0, 0.7 * self.ttft_ema + 0.3 * ttft, self.ttft_ema)
        tpot = ts * dt / np.maximum(decode_avail, 0.05 * dt)
        self.tpot_last[:] = np.where(gen > 0, tpot, self.tpot_last)
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
        self.busy[:] = np.where(
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

    def _few_slots(self) -> tuple[list[int], np.ndarray, list[bool], list[bool]]:
        """The occupied slots (sorted, as a list and an index array) with their serving and fail-fast flags.

        Rebuilt when the cluster's version changes. A slot without a pod is idle: its queue, batch and
        admission rate were zeroed when its pod went (``_drop``), no request is routed to it, and the
        full step leaves every number of it as it is but ``busy``, which it sets to 0; so does this.
        """
        if self._few_version != self.cluster.version:
            slots = sorted(self.cluster.pods)
            idx = np.array(slots, dtype=np.int64)
            idle = np.ones(self.n, dtype=bool)
            idle[idx] = False
            self.busy[idle] = 0.0
            self._few = (slots, idx, self.serving[idx].tolist(), self.fail_fast[idx].tolist())
            self._few_version = self.cluster.version
        return self._few

    def _step_few(self, dt: float, speed: np.ndarray, stats: StepStats) -> None:
        """The step of ``_step_all`` slot by slot in Python floats, for clusters with a few pods.

        Every line mirrors one of ``_step_all`` (same operations, same order, numpy's choice in
        ``np.where``/``np.maximum``/``np.minimum``), so the results are the same bits; change both
        together. Stats are summed with numpy's pairwise order over all slots (``_sparse_pairwise_sum``).
        """
        slots, idx, srv_of, ff_of = self._few_slots()
        if not slots:
            return
        nrows = len(_STEP_ROWS)
        cols = self._rows[:, idx].T.tolist()
        speeds = speed[idx].tolist()
        timeout = self.timeout
        abort_share = min(1.0, 0.1 * dt)
        min_tpot_den = 0.05 * dt
        out: list[list[float]] = []
        ff_lost: list[float] = []
        ff_slots: list[int] = []
        s_abort: list[tuple[int, float]] = []
        s_done: list[tuple[int, float]] = []
        s_ttft: list[tuple[int, float]] = []
        s_admit: list[tuple[int, float]] = []
        s_e2e: list[tuple[int, float]] = []
        s_gen: list[tuple[int, float]] = []
        for slot, col, srv, ff, spd_in in zip(slots, cols, srv_of, ff_of, speeds, strict=True):
            (
                wait_n, wait_p, wait_o, run_n, run_ctx, run_o, admit_ema, ttft_ema, tpot_last, busy, kv_usage,
                prompt_tokens, gen_tokens, ok_stop, ok_length, aborted, preemptions, interval_prompt, interval_gen,
                ttft_s, ttft_c, tpot_s, tpot_c, e2e_s, e2e_c,
                a, arr_p, arr_o, max_seqs, kv_cap, prefill_rate, dec_base, dec_tok, lat_factor, extra_latency,
            ) = col  # fmt: skip
            # engine-dead pods answer 500 at once
            if ff and a > 0:
                ff_lost.append(a)
                ff_slots.append(slot)
                a = 0.0
            tot = wait_n + a
            if tot > 0:
                safe = tot if tot >= 1e-9 else 1e-9
                wait_p = (wait_n * wait_p + arr_p) / safe
                wait_o = (wait_n * wait_o + arr_o) / safe
            carried = wait_n
            wait_n = tot
            spd = spd_in * lat_factor
            if srv:
                prefill = prefill_rate / (spd if spd >= 1e-9 else 1e-9)
            else:
                prefill = 0.0
            p = wait_p if wait_p >= 1.0 else 1.0
            if srv:
                kv_room = kv_cap * 0.99 - run_n * run_ctx
                kv_room = 0.0 if 0.0 >= kv_room else kv_room
                seq_room = max_seqs - run_n
                seq_room = 0.0 if 0.0 >= seq_room else seq_room
                admit = wait_n if wait_n <= seq_room else seq_room
                x = kv_room / p
                admit = admit if admit <= x else x
                x = prefill * dt * 0.9 / p
                admit = admit if admit <= x else x
            else:
                admit = 0.0
            if admit > 0:
                prefill_time = admit * p / (prefill if prefill >= 1e-9 else 1e-9)
            else:
                prefill_time = 0.0
            new_ctx = p + wait_o * 0.5
            run_tot = run_n + admit
            if run_tot > 0:
                rsafe = run_tot if run_tot >= 1e-9 else 1e-9
                run_ctx = (run_n * run_ctx + admit * new_ctx) / rsafe
                run_o = (run_n * run_o + admit * wait_o) / rsafe
            run_n = run_tot
            wait_n = wait_n - admit
            decode_avail = dt - prefill_time
            decode_avail = 0.0 if 0.0 >= decode_avail else decode_avail
            ts = (dec_base + dec_tok * run_n * run_ctx) * spd
            if srv and run_n > 0:
                tok_per_seq = decode_avail / (ts if ts >= 1e-9 else 1e-9)
            else:
                tok_per_seq = 0.0
            gen = run_n * tok_per_seq
            done = gen / (run_o if run_o >= 1.0 else 1.0)
            done = run_n if run_n <= done else done
            run_n = run_n - done
            over = run_n * run_ctx - kv_cap
            if srv and over > 0:
                pre = over / (run_ctx if run_ctx >= 1.0 else 1.0)
            else:
                pre = 0.0
            usage = run_n * run_ctx / (kv_cap if kv_cap >= 1.0 else 1.0)
            if srv:
                x = (usage - 0.95) / 0.05
                x = 0.0 if x < 0.0 else (1.0 if x > 1.0 else x)
                pre = pre + run_n * 0.02 * x
            else:
                pre = pre + 0.0
            pre = pre if pre <= run_n else run_n
            run_n = run_n - pre
            wait_n = wait_n + pre
            preemptions = preemptions + pre
            if kv_cap > 0:
                x = run_n * run_ctx / (kv_cap if kv_cap >= 1.0 else 1.0)
                kv_usage = 1.0 if 1.0 <= x else x
            else:
                kv_usage = 0.0
            admit_ema = 0.8 * admit_ema + 0.2 * admit / dt
            x = admit / dt
            x = admit_ema if admit_ema >= x else x
            x = carried / (x if x >= 1e-3 else 1e-3)
            q_wait = timeout if timeout <= x else x
            ttft = q_wait + 0.5 * prefill_time + p / (prefill if prefill >= 1e-9 else 1e-9) + ts + extra_latency
            if admit > 0:
                ttft_ema = 0.7 * ttft_ema + 0.3 * ttft
            tpot = ts * dt / (decode_avail if decode_avail >= min_tpot_den else min_tpot_den)
            if gen > 0:
                tpot_last = tpot
            e2e = ttft_ema + run_o * tpot + extra_latency
            excess = wait_n - admit_ema * timeout
            excess = 0.0 if 0.0 >= excess else excess
            abort = excess * abort_share
            wait_n = wait_n - abort
            aborted = aborted + abort
            admitted_tokens = admit * p
            prompt_tokens = prompt_tokens + admitted_tokens
            gen_tokens = gen_tokens + gen
            interval_prompt = interval_prompt + admitted_tokens
            interval_gen = interval_gen + gen
            ok_stop = ok_stop + done * 0.92
            ok_length = ok_length + done * 0.08
            admit_ttft = admit * ttft
            gen_tpot = gen * tpot
            done_e2e = done * e2e
            ttft_s = ttft_s + admit_ttft
            ttft_c = ttft_c + admit
            tpot_s = tpot_s + gen_tpot
            tpot_c = tpot_c + gen
            e2e_s = e2e_s + done_e2e
            e2e_c = e2e_c + done
            if srv:
                x = 0.6 + run_n / 32
                x = decode_avail * (1.0 if 1.0 <= x else x) if run_n > 0 else 0.0
                x = (prefill_time + x) / dt
                busy = 1.0 if 1.0 <= x else x
            else:
                busy = 0.0
            out.append(
                [
                    wait_n, wait_p, wait_o, run_n, run_ctx, run_o, admit_ema, ttft_ema, tpot_last, busy, kv_usage,
                    prompt_tokens, gen_tokens, ok_stop, ok_length, aborted, preemptions, interval_prompt,
                    interval_gen, ttft_s, ttft_c, tpot_s, tpot_c, e2e_s, e2e_c,
                ]
            )  # fmt: skip
            s_abort.append((slot, abort))
            s_done.append((slot, done))
            s_ttft.append((slot, admit_ttft))
            s_admit.append((slot, admit))
            s_e2e.append((slot, done_e2e))
            s_gen.append((slot, gen))
        self._rows[:nrows, idx] = np.array(out).T
        if ff_lost:
            lost = pairwise_sum(ff_lost)
            stats.errors += lost
            self.router_errors += lost
            self.arr_n[ff_slots] = 0.0
        n = self.n
        total_abort = _sparse_pairwise_sum(s_abort, 0, n)
        n_done = _sparse_pairwise_sum(s_done, 0, n)
        stats.errors += total_abort
        stats.completions += n_done
        self.router_errors += total_abort
        self.router_ok += n_done
        stats.ttft_sum += _sparse_pairwise_sum(s_ttft, 0, n)
        stats.ttft_n += _sparse_pairwise_sum(s_admit, 0, n)
        stats.e2e_sum += _sparse_pairwise_sum(s_e2e, 0, n)
        stats.e2e_n += n_done
        stats.gen_tokens += _sparse_pairwise_sum(s_gen, 0, n)

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

    def gpu_constants(self) -> GpuConstants:
        """Spec-derived GPU arrays and buffers for :func:`update_gpus` (built on first use)."""
        if self._gpu_constants is None:
            self._gpu_constants = GpuConstants(self.cluster, self.n, self.gmu)
        return self._gpu_constants

    def slot_speed(self, gpu_factor: np.ndarray) -> np.ndarray:
        """Per-slot slow-down: the slowest GPU of each replica decides (tensor parallel lock-step)."""
        ext = self._factor_ext
        if ext.size != gpu_factor.size + 1:
            ext = self._factor_ext = np.ones(gpu_factor.size + 1)  # the last entry pads gpu_idx rows
        ext[:-1] = gpu_factor
        return ext[self.gpu_idx].max(axis=1)


class GpuConstants:
    """What :func:`update_gpus` derives from the GPU specs (fixed once the cluster is built), plus buffers.

    Each array holds exactly the values the expression in its comment gives, computed once.
    """

    def __init__(self, cluster: Cluster, n_slots: int, gpu_memory_utilization: float) -> None:
        g = cluster.gpus
        self.clock_den = np.maximum(g.max_clock, 1.0)
        self.power_span = g.tdp_w - g.idle_w
        self.power_cap = 0.97 * g.tdp_w  # power-capping throttle threshold
        self.slowdown_from = g.slowdown_c - 1.0  # thermal throttling starts a degree below slowdown
        self.engine_mib = g.memory_mib * gpu_memory_utilization
        self.busy_ext = np.zeros(n_slots + 1)
        self.batch_ext = np.zeros(n_slots + 1)
        self._cooling: dict[float, float] = {}

    def cooling(self, dt: float) -> float:
        """Share of the gap to the target temperature closed in ``dt`` (``1 - exp(-dt / 60 s)``)."""
        share = self._cooling.get(dt)
        if share is None:
            share = self._cooling[dt] = 1.0 - np.exp(-dt / 60.0)
        return share


def update_gpus(cluster: Cluster, serving: Serving, dt: float) -> np.ndarray:
    """Advance GPU power, temperature, clocks and memory from the replicas' load.

    Returns:
        Per-GPU step-time multiplier (thermal clock loss x link retries), >= 1.
    """
    g = cluster.gpus
    k = serving.gpu_constants()
    slot = g.pod_slot
    # per-slot values gathered per GPU; index -1 (no pod) reads the trailing 0.0
    busy_ext, batch_ext = k.busy_ext, k.batch_ext
    busy_ext[:-1] = serving.busy
    np.minimum(1.0, serving.run_n / np.maximum(serving.max_seqs, 1.0), out=batch_ext[:-1])
    busy = np.where(g.broken, 0.0, busy_ext[slot])
    batch = batch_ext[slot]
    clock_ratio = np.where(g.sm_clock > 0, g.sm_clock / k.clock_den, 1.0)
    g.power_w = g.idle_w + k.power_span * busy * (0.55 + 0.45 * batch) * np.maximum(clock_ratio, 0.4)
    target = 28.0 + 52.0 * g.power_w / g.tdp_w + g.heat_c
    g.temp_c = g.temp_c + (target - g.temp_c) * k.cooling(dt)
    hot = g.temp_c >= k.slowdown_from
    # np.clip(x, 0.4, 1.0) is minimum(maximum(x, 0.4), 1.0), without clip's Python-level wrappers
    ratio = np.where(hot, np.minimum(np.maximum(1.0 - 0.08 * (g.temp_c - k.slowdown_from), 0.4), 1.0), 1.0)
    g.sm_clock = np.where(busy > 0.05, g.max_clock * ratio, g.idle_clock)
    reasons = (
        np.where(busy <= 0.05, 0x1, 0) | np.where(hot, 0x20 | 0x40, 0) | np.where(g.power_w >= k.power_cap, 0x4, 0)
    )
    g.throttle_reasons = reasons.astype(np.int64, copy=False)
    g.util = (100.0 * busy).round()
    # vLLM preallocates gpu_memory_utilization of the card once the engine runs; a leak adds to it.
    # (serving.up[-1], read for GPUs without a pod, is always False.)
    alloc = np.where(serving.up[slot], k.engine_mib, 0.0)
    g.fb_used_mib = np.where(g.off_bus, 0.0, np.minimum(g.memory_mib, alloc + g.leak_mib + 1.0))
    return g.slowdown / ratio
