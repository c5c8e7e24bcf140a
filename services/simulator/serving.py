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

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr

from services.simulator.cluster import Cluster
from services.simulator.scalar import KernelError, derive_slot_loop
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
# the order of slot_step's parameters (checked below) ...
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


# The per-slot sums slot_step returns after the new _STEP_ROWS, in this order (StepStats takes them).
_STEP_SUMS: tuple[str, ...] = ("abort", "done", "admit_ttft", "admit", "done_e2e", "gen")


def slot_step(
    wait_n: np.ndarray,
    wait_p: np.ndarray,
    wait_o: np.ndarray,
    run_n: np.ndarray,
    run_ctx: np.ndarray,
    run_o: np.ndarray,
    admit_ema: np.ndarray,
    ttft_ema: np.ndarray,
    tpot_last: np.ndarray,
    busy: np.ndarray,
    kv_usage: np.ndarray,
    prompt_tokens: np.ndarray,
    gen_tokens: np.ndarray,
    ok_stop: np.ndarray,
    ok_length: np.ndarray,
    aborted: np.ndarray,
    preemptions: np.ndarray,
    interval_prompt: np.ndarray,
    interval_gen: np.ndarray,
    iv_ttft_sum: np.ndarray,
    iv_ttft_count: np.ndarray,
    iv_tpot_sum: np.ndarray,
    iv_tpot_count: np.ndarray,
    iv_e2e_sum: np.ndarray,
    iv_e2e_count: np.ndarray,
    arr_n: np.ndarray,
    arr_p: np.ndarray,
    arr_o: np.ndarray,
    max_seqs: np.ndarray,
    kv_cap: np.ndarray,
    prefill_rate: np.ndarray,
    dec_base: np.ndarray,
    dec_tok: np.ndarray,
    lat_factor: np.ndarray,
    extra_latency: np.ndarray,
    srv: np.ndarray,
    speed: np.ndarray,
    *,
    dt: float,
    timeout: float,
    abort_share: float,
    min_tpot_den: float,
) -> tuple[np.ndarray, ...]:
    """One serving step of every slot (the model of the module docstring), as numpy over arrays.

    The one place the step's arithmetic is written: :meth:`Serving._step_occupied` calls it on the
    occupied slots' rows of ``Serving._rows``, or, on a small cluster, runs the Python-float loop derived
    from this code (:func:`services.simulator.scalar.derive_slot_loop`, which states the rules the body keeps:
    single-name assignments, ``np.where``/``maximum``/``minimum``/``clip`` only, no ``+=``).

    Args:
        wait_n ... extra_latency: the slots' rows, in ``_STEP_ROWS`` + ``_INPUT_ROWS`` order (``arr_n``
            with the fail-fast slots' arrivals already taken out).
        srv: whether each slot's replica serves (Ready, engine alive, node Ready).
        speed: per-slot multiplier of step time (>= 1 is slower).
        dt: step length (s).
        timeout: the client timeout (s).
        abort_share: share of the queue beyond the timeout that aborts in the step (``min(1, 0.1 dt)``).
        min_tpot_den: the least decode time a TPOT estimate divides by (``0.05 dt``).

    Returns:
        The new ``_STEP_ROWS`` values, then the per-slot terms of ``_STEP_SUMS``.
    """
    tot = wait_n + arr_n
    safe = np.maximum(tot, 1e-9)
    wait_p = np.where(tot > 0, (wait_n * wait_p + arr_p) / safe, wait_p)
    wait_o = np.where(tot > 0, (wait_n * wait_o + arr_o) / safe, wait_o)
    carried = wait_n
    wait_n = tot
    spd = speed * lat_factor
    prefill = np.where(srv, prefill_rate / np.maximum(spd, 1e-9), 0.0)
    p = np.maximum(wait_p, 1.0)
    kv_room = np.maximum(0.0, kv_cap * 0.99 - run_n * run_ctx)  # vLLM's 1% watermark
    seq_room = np.maximum(0.0, max_seqs - run_n)
    admit = np.where(srv, np.minimum.reduce([wait_n, seq_room, kv_room / p, prefill * dt * 0.9 / p]), 0.0)
    prefill_time = np.where(admit > 0, admit * p / np.maximum(prefill, 1e-9), 0.0)
    new_ctx = p + wait_o * 0.5
    run_tot = run_n + admit
    rsafe = np.maximum(run_tot, 1e-9)
    run_ctx = np.where(run_tot > 0, (run_n * run_ctx + admit * new_ctx) / rsafe, run_ctx)
    run_o = np.where(run_tot > 0, (run_n * run_o + admit * wait_o) / rsafe, run_o)
    run_n = run_tot
    wait_n = wait_n - admit
    decode_avail = np.maximum(0.0, dt - prefill_time)
    ts = (dec_base + dec_tok * run_n * run_ctx) * spd
    tok_per_seq = np.where(srv & (run_n > 0), decode_avail / np.maximum(ts, 1e-9), 0.0)
    gen = run_n * tok_per_seq
    done = np.minimum(run_n, gen / np.maximum(run_o, 1.0))
    run_n = run_n - done
    # Decoding grows every sequence's KV footprint; past the pool size vLLM preempts (recompute).
    over = run_n * run_ctx - kv_cap
    pre = np.where(srv & (over > 0), over / np.maximum(run_ctx, 1.0), 0.0)
    # Lengths vary around the fluid mean: within 5% of a full pool some sequence always needs a
    # block that is not there, so a small share of the batch is preempted every step.
    usage = run_n * run_ctx / np.maximum(kv_cap, 1.0)
    pre = pre + np.where(srv, run_n * 0.02 * np.clip((usage - 0.95) / 0.05, 0.0, 1.0), 0.0)
    pre = np.minimum(pre, run_n)
    run_n = run_n - pre
    wait_n = wait_n + pre
    preemptions = preemptions + pre
    kv_usage = np.where(kv_cap > 0, np.minimum(1.0, run_n * run_ctx / np.maximum(kv_cap, 1.0)), 0.0)
    # Latency estimates for this step's cohorts.
    admit_ema = 0.8 * admit_ema + 0.2 * admit / dt
    # Queue wait by Little's law at the faster of the recent and the current admission rate (an
    # idle replica's near-zero average would otherwise turn one queued request into a minute).
    q_wait = np.minimum(timeout, carried / np.maximum(np.maximum(admit_ema, admit / dt), 1e-3))
    ttft = q_wait + 0.5 * prefill_time + p / np.maximum(prefill, 1e-9) + ts + extra_latency
    ttft_ema = np.where(admit > 0, 0.7 * ttft_ema + 0.3 * ttft, ttft_ema)
    tpot = ts * dt / np.maximum(decode_avail, min_tpot_den)
    tpot_last = np.where(gen > 0, tpot, tpot_last)
    e2e = ttft_ema + run_o * tpot + extra_latency
    # Clients give up on requests that would wait past their timeout.
    excess = np.maximum(0.0, wait_n - admit_ema * timeout)
    abort = excess * abort_share
    wait_n = wait_n - abort
    aborted = aborted + abort
    # counters
    admitted_tokens = admit * p
    prompt_tokens = prompt_tokens + admitted_tokens
    gen_tokens = gen_tokens + gen
    interval_prompt = interval_prompt + admitted_tokens
    interval_gen = interval_gen + gen
    ok_stop = ok_stop + done * 0.92
    ok_length = ok_length + done * 0.08
    admit_ttft = admit * ttft
    done_e2e = done * e2e
    iv_ttft_sum = iv_ttft_sum + admit_ttft
    iv_ttft_count = iv_ttft_count + admit
    iv_tpot_sum = iv_tpot_sum + gen * tpot
    iv_tpot_count = iv_tpot_count + gen
    iv_e2e_sum = iv_e2e_sum + done_e2e
    iv_e2e_count = iv_e2e_count + done
    decoding = np.where(run_n > 0, decode_avail * np.minimum(1.0, 0.6 + run_n / 32), 0.0)
    busy = np.where(srv, np.minimum(1.0, (prefill_time + decoding) / dt), 0.0)
    return (
        wait_n, wait_p, wait_o, run_n, run_ctx, run_o, admit_ema, ttft_ema, tpot_last, busy, kv_usage,
        prompt_tokens, gen_tokens, ok_stop, ok_length, aborted, preemptions, interval_prompt, interval_gen,
        iv_ttft_sum, iv_ttft_count, iv_tpot_sum, iv_tpot_count, iv_e2e_sum, iv_e2e_count,
        abort, done, admit_ttft, admit, done_e2e, gen,
    )  # fmt: skip


if [*inspect.signature(slot_step).parameters][: len(_STEP_ROWS) + len(_INPUT_ROWS)] != [*_STEP_ROWS, *_INPUT_ROWS]:
    raise KernelError("slot_step's parameters must be _STEP_ROWS + _INPUT_ROWS, in that order")
# The two forms of the step, called with Serving._rows spread: the kernel over arrays, and the
# small-cluster loop over Python floats derived from it (scalar.loop_source shows its code).
_SLOT_STEP_ARRAYS: Callable[..., tuple[np.ndarray, ...]] = slot_step
_SLOT_STEP_FLOATS = derive_slot_loop(slot_step, n_columns=len(_STEP_ROWS) + len(_INPUT_ROWS))


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
        # slots' numbers in one indexing operation each (see _step_occupied).
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
        # the slots a step works on, cached per cluster version (see _occupied)
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

    # Serving.step runs the derived Python-float loop while the cluster has at most this many pods.
    few_max_pods = 24

    def step(self, dt: float, arrivals: ClassArrivals, speed: np.ndarray) -> StepStats:
        """Advance every replica by ``dt`` seconds.

        The arithmetic is written once, in :func:`slot_step` (numpy over arrays), and the step is one
        path (:meth:`_step_occupied`) over the occupied slots, run in one of two forms: the kernel
        itself, or, while there are at most ``few_max_pods`` pods, where numpy's per-call overhead
        would dominate, the Python-float loop derived from it. The derived loop does the same IEEE-754
        operations in the same order per slot, and both sum like numpy over every slot, so the
        results are identical to the bit (tests/unit/test_sim_core.py runs scenarios both ways).

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
        self._step_occupied(dt, speed, stats, floats=len(self.cluster.pods) <= self.few_max_pods)
        self.retry_pending = min(1e7, self.retry_pending + self.retry_share * (stats.errors - errors_before_step))
        self.retry_pending += self.retry_share * errors_before_step
        return stats

    def _occupied(self) -> tuple[list[int], np.ndarray, list[bool], list[bool]]:
        """The occupied slots (sorted, as a list and an index array) with their serving and fail-fast flags.

        Rebuilt when the cluster's version changes. A slot without a pod is idle: its queue, batch and
        admission rate were zeroed when its pod went (``_drop``), no request is routed to it, and
        :func:`slot_step` would leave every number of it as it is but ``busy``, which it would set to
        0; so the step skips idle slots, and this sets their ``busy`` to 0.
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

    def _step_occupied(self, dt: float, speed: np.ndarray, stats: StepStats, *, floats: bool) -> None:
        """The step of the occupied slots: gather their rows, run :func:`slot_step`, scatter, add the sums.

        ``floats``: run the loop derived from the kernel (:data:`_SLOT_STEP_FLOATS`) over Python floats,
        and add the sums in numpy's pairwise order over all slots (``_sparse_pairwise_sum``); else the
        kernel over the gathered arrays, its sums taken with numpy over all slots (idle ones hold 0).
        The same numbers either way.
        """
        slots, idx, srv_of, ff_of = self._occupied()
        if not slots:
            return
        nrows, n = len(_STEP_ROWS), self.n
        shared = self._shared(dt)
        lost: float | None = None
        if floats:
            cols = self._rows[:, idx].T.tolist()
            ff_lost: list[float] = []
            ff_slots: list[int] = []
            for slot, col, ff in zip(slots, cols, ff_of, strict=True):
                if ff and col[_ARR_ROW] > 0:  # engine-dead pods answer 500 at once
                    ff_lost.append(col[_ARR_ROW])
                    ff_slots.append(slot)
                    col[_ARR_ROW] = 0.0
            if ff_slots:
                lost = pairwise_sum(ff_lost)
                self.arr_n[ff_slots] = 0.0
            out = _SLOT_STEP_FLOATS(cols, srv_of, speed[idx].tolist(), **shared)
            self._rows[:nrows, idx] = np.array([o[:nrows] for o in out]).T
            sums = [
                _sparse_pairwise_sum([(slot, o[k]) for slot, o in zip(slots, out, strict=True)], 0, n)
                for k in range(nrows, nrows + len(_STEP_SUMS))
            ]
        else:
            rows = self._rows[:, idx]
            arrivals = rows[_ARR_ROW]
            ff = self.fail_fast[idx] & (arrivals > 0)  # engine-dead pods answer 500 at once
            if ff.any():
                lost = float(arrivals[ff].sum())
                arrivals[ff] = 0.0
                self.arr_n[idx[ff]] = 0.0
            terms = _SLOT_STEP_ARRAYS(*rows, self.serving[idx], speed[idx], **shared)
            self._rows[:nrows, idx] = terms[:nrows]
            full = np.zeros(n)
            sums = []
            for term in terms[nrows:]:
                full[idx] = term
                sums.append(float(full.sum()))  # numpy's pairwise order over all slots, as the loop's
        self._account(stats, lost, sums)

    def _shared(self, dt: float) -> dict[str, float]:
        """The keyword arguments of :func:`slot_step` for a step of ``dt`` seconds."""
        return {"dt": dt, "timeout": self.timeout, "abort_share": min(1.0, 0.1 * dt), "min_tpot_den": 0.05 * dt}

    def _account(self, stats: StepStats, lost: float | None, sums: list[float]) -> None:
        """Add a step's cluster-wide sums (:data:`_STEP_SUMS` order) and fail-fast losses to the stats."""
        if lost is not None:
            stats.errors += lost
            self.router_errors += lost
        total_abort, n_done, ttft_sum, ttft_n, e2e_sum, gen_tokens = sums
        stats.errors += total_abort
        stats.completions += n_done
        self.router_errors += total_abort
        self.router_ok += n_done
        stats.ttft_sum += ttft_sum
        stats.ttft_n += ttft_n
        stats.e2e_sum += e2e_sum
        stats.e2e_n += n_done
        stats.gen_tokens += gen_tokens

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
