"""The capacity planner: one snapshot of serving observations in, desired replicas per variant out.

Pure: no I/O, no clock, no globals. The caller owns the clock (``Snapshot.t``, event time) and the
state, so the same planner runs in a stream role, in a test and in an in-process evaluation, and a
replayed snapshot sequence gives the same decisions.

The rules, per model (every variant of a model serves the same requests, so capacity added to any
of them relieves all of them):

1. **Saturation**, as llm-d's workload-variant-autoscaler counts it: a replica is saturated when its
   KV-cache usage or its waiting queue reaches a threshold; a variant needs capacity when every ready
   replica is saturated or the mean spare capacity of the others falls below the spare triggers.
2. **SLO**: a variant whose request-weighted TTFT p95 or ITL p95 is above target also needs capacity.
3. **Scale up** one replica, on the variant with the lowest cost per 1k output tokens among those
   that meet the SLO and are below their maximum. Cost per token, not per replica: a replica twice
   the price that serves three times the tokens is the cheaper capacity.
4. **Scale down** one replica, on the most expensive variant per 1k tokens whose load would still
   leave spare capacity and latency margin after losing it.
5. **Loading**: a variant with replicas still loading (or pending) is neither measured nor changed,
   and while any variant of a model loads, the model adds nothing more: the capacity asked for is on
   its way, and asking again would cascade (models take minutes to load).
6. **Hysteresis**: a condition must hold for several consecutive plans, a model rests after each
   change (longer before a scale-down), and scale events per hour are capped.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from services.capacity.config import CapacityConfig

Action = Literal["up", "down", "hold"]
HOUR_S = 3600.0


@dataclass(frozen=True)
class ReplicaObservation:
    """What one replica's serving metrics say over the last interval.

    Attributes:
        variant: the deployment (variant) the replica belongs to.
        replica: pod name.
        request_rate: requests per second arriving.
        prompt_tokens_per_s: prompt tokens processed per second.
        output_tokens_per_s: tokens generated per second.
        ttft_p95_s: time to first token, p95 (None: no request finished).
        itl_p95_s: inter-token latency, p95 (None: no token generated).
        kv_cache_usage: ``vllm:kv_cache_usage_perc`` as a fraction, 0 to 1.
        num_requests_waiting: ``vllm:num_requests_waiting``.
        loading: the replica is not Ready yet (loading weights, or pending).
    """

    variant: str
    replica: str
    request_rate: float = 0.0
    prompt_tokens_per_s: float = 0.0
    output_tokens_per_s: float = 0.0
    ttft_p95_s: float | None = None
    itl_p95_s: float | None = None
    kv_cache_usage: float = 0.0
    num_requests_waiting: float = 0.0
    loading: bool = False


@dataclass(frozen=True)
class Snapshot:
    """One planning input: the time, each variant's current replica count, and the replicas' metrics.

    ``free_gpus`` (by GPU type, None: unknown) keeps the planner from asking for a replica that
    could only sit Pending.
    """

    t: float
    replicas: Mapping[str, int]
    observations: tuple[ReplicaObservation, ...] = ()
    free_gpus: Mapping[str, int] | None = None


@dataclass(frozen=True)
class VariantView:
    """What the planner concluded about one variant (reported with every plan, for the audit)."""

    variant: str
    model: str
    current: int
    ready: int
    loading: int
    saturated: int
    kv_mean: float
    spare_kv: float
    spare_queue: float
    ttft_p95_s: float | None
    itl_p95_s: float | None
    tokens_per_s_per_replica: float
    cost_per_1k_tokens: float
    needs_capacity: bool
    slo_breach: bool
    queueing: bool
    meets_slo: bool

    @property
    def in_transition(self) -> bool:
        """Replicas are loading, or asked for and not yet observed: measurements are not settled."""
        return self.loading > 0 or self.ready + self.loading < self.current


@dataclass(frozen=True)
class Decision:
    """The desired replica count of one variant and why."""

    variant: str
    current: int
    desired: int
    action: Action
    reason: str


@dataclass(frozen=True)
class PlannerState:
    """What the planner remembers between plans, per model (the caller stores and passes it back)."""

    up_streak: Mapping[str, int] = field(default_factory=dict)
    down_streak: Mapping[str, int] = field(default_factory=dict)
    last_event_t: Mapping[str, float] = field(default_factory=dict)
    last_up_t: Mapping[str, float] = field(default_factory=dict)
    safe_streak: Mapping[str, int] = field(default_factory=dict)
    slo_met_t: Mapping[str, float] = field(default_factory=dict)
    events: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Plan:
    """The planner's answer for one snapshot."""

    t: float
    decisions: Mapping[str, Decision]
    views: Mapping[str, VariantView]
    notes: tuple[str, ...] = ()

    def desired(self) -> dict[str, int]:
        """Desired replicas per variant."""
        return {name: d.desired for name, d in self.decisions.items()}

    def changes(self) -> list[Decision]:
        """The decisions that change a replica count."""
        return [d for d in self.decisions.values() if d.action != "hold"]


def _weighted(values: Iterable[tuple[float | None, float]]) -> float | None:
    """Request-weighted mean of replicas' p95s (equal weights when no replica had requests).

    The mean of per-replica p95s is not the fleet's p95, but it moves with it, and a planner that
    needs raw histograms could not run on the gauges most dashboards export.
    """
    pairs = [(v, w) for v, w in values if v is not None]
    if not pairs:
        return None
    total = sum(w for _, w in pairs)
    if total <= 0:
        return sum(v for v, _ in pairs) / len(pairs)
    return sum(v * w for v, w in pairs) / total


class CapacityPlanner:
    """Plans replicas per variant from serving observations (see the module docstring for the rules).

    Args:
        config: thresholds, SLO, hysteresis, prices and variants (``infra/config/capacity.yaml``).
    """

    def __init__(self, config: CapacityConfig) -> None:
        self.config = config

    # ------------------------------------------------------------------------------ analysis

    def analyse(self, snapshot: Snapshot) -> tuple[dict[str, VariantView], list[str]]:
        """Per-variant views of a snapshot, and notes about input that was ignored."""
        cfg = self.config
        notes: list[str] = []
        by_variant: dict[str, list[ReplicaObservation]] = {}
        for obs in snapshot.observations:
            if obs.variant not in cfg.variants:
                notes.append(f"ignored observations of {obs.replica!r}: variant {obs.variant!r} is not configured")
                continue
            by_variant.setdefault(obs.variant, []).append(obs)
        for name in snapshot.replicas:
            if name not in cfg.variants:
                notes.append(f"variant {name!r} has replicas but no configuration: left as it is")
        views = {}
        for name, current in snapshot.replicas.items():
            if name in cfg.variants:
                views[name] = self._view(name, int(current), by_variant.get(name, []))
        return views, sorted(set(notes))

    def _view(self, name: str, current: int, obs: list[ReplicaObservation]) -> VariantView:
        cfg, sat = self.config, self.config.saturation
        vc = cfg.variants[name]
        ready = [o for o in obs if not o.loading]
        saturated = [o for o in ready if o.kv_cache_usage >= sat.kv_cache or o.num_requests_waiting >= sat.queue_depth]
        calm = [o for o in ready if o not in saturated]
        spare_kv = statistics.fmean(sat.kv_cache - o.kv_cache_usage for o in calm) if calm else 0.0
        spare_queue = statistics.fmean(sat.queue_depth - o.num_requests_waiting for o in calm) if calm else 0.0
        needs = bool(ready) and (not calm or spare_kv < sat.spare_kv or spare_queue < sat.spare_queue)
        ttft = _weighted((o.ttft_p95_s, o.request_rate) for o in ready)
        itl = _weighted((o.itl_p95_s, o.output_tokens_per_s) for o in ready)
        ttft_bad = ttft is not None and ttft > cfg.slo.ttft_p95_s
        itl_bad = itl is not None and itl > cfg.slo.itl_p95_s
        # A TTFT breach with a queue is queueing, which capacity cures; an ITL breach, or a TTFT
        # breach with no queue, is the variant's own speed, which more replicas do not change.
        queueing = bool(saturated) or (
            bool(ready) and statistics.fmean(o.num_requests_waiting for o in ready) >= self.config.queueing_depth
        )
        meets = itl is not None and not itl_bad and (not ttft_bad or queueing)
        tps = self._tokens_per_replica(name, ready)
        cost = cfg.replica_usd_per_hour(name) / HOUR_S / tps * 1000.0
        return VariantView(
            variant=name,
            model=vc.model,
            current=current,
            ready=len(ready),
            loading=len(obs) - len(ready),
            saturated=len(saturated),
            kv_mean=statistics.fmean(o.kv_cache_usage for o in ready) if ready else 0.0,
            spare_kv=spare_kv,
            spare_queue=spare_queue,
            ttft_p95_s=ttft,
            itl_p95_s=itl,
            tokens_per_s_per_replica=tps,
            cost_per_1k_tokens=cost,
            needs_capacity=needs,
            slo_breach=ttft_bad or itl_bad,
            queueing=queueing,
            meets_slo=meets,
        )

    def _tokens_per_replica(self, name: str, ready: list[ReplicaObservation]) -> float:
        """Output tokens per second one replica serves when it reaches the KV saturation threshold.

        KV-cache use grows with the number of sequences in flight, and so does throughput until the
        batch is full, so tokens/s divided by the fraction of the threshold in use extrapolates to
        the replica's capacity. Replicas nearly idle say too little and are left out; with none left,
        the configured prior stands. The median keeps one odd replica from moving the price.
        """
        kv_thr = self.config.saturation.kv_cache
        floor = self.config.min_kv_for_estimate
        estimates = [
            o.output_tokens_per_s / min(1.0, o.kv_cache_usage / kv_thr)
            for o in ready
            if o.kv_cache_usage >= floor and o.output_tokens_per_s > 0
        ]
        if not estimates:
            return self.config.variants[name].prior_tokens_per_s
        return statistics.median(estimates)

    # ------------------------------------------------------------------------------ decisions

    def plan(self, snapshot: Snapshot, state: PlannerState | None = None) -> tuple[Plan, PlannerState]:
        """Desired replicas for every configured variant in ``snapshot``, and the state to pass next time.

        Never raises on odd input: unknown variants are noted and left alone, and a variant with no
        usable measurement keeps its replicas (never scaled to zero by accident: ``min_replicas`` is
        at least 1).
        """
        state = state or PlannerState()
        views, notes = self.analyse(snapshot)
        met = dict(state.slo_met_t)
        for n, v in views.items():
            if not v.in_transition and v.ttft_p95_s is not None and v.itl_p95_s is not None and not v.slo_breach:
                met[n] = snapshot.t
        state = replace(state, slo_met_t=met)
        decisions: dict[str, Decision] = {}
        models = sorted({v.model for v in views.values()})
        for model in models:
            group = {n: v for n, v in views.items() if v.model == model}
            out, state = self._plan_model(model, group, snapshot.t, state, snapshot.free_gpus)
            decisions.update(out)
        horizon = snapshot.t - HOUR_S
        state = replace(state, events=tuple(e for e in state.events if e[1] > horizon))
        return Plan(snapshot.t, decisions, views, tuple(notes)), state

    def _plan_model(
        self,
        model: str,
        group: dict[str, VariantView],
        t: float,
        state: PlannerState,
        free_gpus: Mapping[str, int] | None,
    ) -> tuple[dict[str, Decision], PlannerState]:
        cfg, hy = self.config, self.config.hysteresis
        hold = {n: Decision(n, v.current, v.current, "hold", "within band") for n, v in group.items()}

        # Bounds first: they need no evidence, and an out-of-bounds count is a config fact.
        clamped = False
        for n, v in group.items():
            vc = cfg.variants[n]
            if v.current < vc.min_replicas:
                hold[n] = Decision(n, v.current, vc.min_replicas, "up", f"below min_replicas {vc.min_replicas}")
                clamped = True
            elif v.current > vc.max_replicas:
                hold[n] = Decision(n, v.current, vc.max_replicas, "down", f"above max_replicas {vc.max_replicas}")
                clamped = True
        if clamped:
            return hold, state

        settled = {n: v for n, v in group.items() if not v.in_transition}
        moving = sorted(n for n in group if n not in settled)
        for n in moving:
            v = group[n]
            hold[n] = Decision(
                n, v.current, v.current, "hold", f"skipped: {v.current - v.ready} replica(s) not ready yet"
            )
        # Any breach presses for capacity, even where the breaching variant is no target: prefill-bound
        # replicas slow down with load long before their KV cache or queue shows it, and the capacity
        # added elsewhere takes their load (the gateway balances a model's variants). A variant slow
        # even when idle keeps asking too, bounded by max_replicas and the hourly cap: its cure is
        # routing away or switch_variant, which this planner does not decide.
        pressure = [n for n, v in settled.items() if v.needs_capacity or v.slo_breach]
        # Any breach, curable or not, forbids shedding: a slow variant would take the load it sheds.
        idle = bool(settled) and all(
            v.saturated == 0 and not v.needs_capacity and not v.slo_breach for v in settled.values()
        )
        up = dict(state.up_streak)
        down = dict(state.down_streak)
        up[model] = up.get(model, 0) + 1 if pressure else 0
        down[model] = down.get(model, 0) + 1 if idle and not pressure else 0
        # A replica may go only after every plan of the confirmation window found it spare: one quiet
        # sample in a noisy series is not headroom.
        safe = dict(state.safe_streak)
        for n, v in group.items():
            safe[n] = safe.get(n, 0) + 1 if idle and n in settled and self._can_lose_one(v) else 0
        state = replace(state, up_streak=up, down_streak=down, safe_streak=safe)
        since = t - state.last_event_t.get(model, -1e18)
        recent = sum(1 for m, et in state.events if m == model and et > t - HOUR_S)
        why_pressure = ", ".join(self._pressure_reason(group[n]) for n in sorted(pressure))

        if pressure:
            if moving:
                reason = f"needs capacity ({why_pressure}) but waiting for {', '.join(moving)} to load"
                return self._hold_all(hold, settled, reason), state
            if up[model] < hy.up_confirmations:
                reason = f"needs capacity ({why_pressure}), seen {up[model]}/{hy.up_confirmations} plans"
                return self._hold_all(hold, settled, reason), state
            if since < hy.up_cooldown_s:
                reason = f"needs capacity ({why_pressure}), cooling down {hy.up_cooldown_s - since:.0f}s more"
                return self._hold_all(hold, settled, reason), state
            if recent >= hy.max_events_per_hour:
                reason = f"needs capacity ({why_pressure}), but {recent} scale events in the last hour is the cap"
                return self._hold_all(hold, settled, reason), state
            candidates = [
                v
                for n, v in settled.items()
                if self._eligible(v, t, state) and v.current < cfg.variants[n].max_replicas and self._fits(n, free_gpus)
            ]
            if not candidates:
                reason = (
                    f"needs capacity ({why_pressure}), but no variant meets the SLO below its max_replicas "
                    "with free GPUs for a replica"
                )
                return self._hold_all(hold, settled, reason), state
            pick = min(candidates, key=lambda v: (v.cost_per_1k_tokens, v.variant))
            step = self._step(pick, settled, free_gpus)
            hold[pick.variant] = Decision(
                pick.variant,
                pick.current,
                pick.current + step,
                "up",
                f"{why_pressure}: +{step} on the cheapest variant meeting the SLO "
                f"(${pick.cost_per_1k_tokens:.4f} per 1k tokens)",
            )
            return hold, self._record(state, model, group, t, up=True)

        if idle:
            if moving:
                return self._hold_all(hold, settled, f"idle, but waiting for {', '.join(moving)} to load"), state
            if down[model] < hy.down_confirmations:
                reason = f"headroom seen {down[model]}/{hy.down_confirmations} plans"
                return self._hold_all(hold, settled, reason), state
            last_up = t - state.last_up_t.get(model, -1e18)
            if min(since, last_up) < hy.down_cooldown_s:
                wait = hy.down_cooldown_s - min(since, last_up)
                return self._hold_all(hold, settled, f"headroom, cooling down {wait:.0f}s more"), state
            if recent >= hy.max_events_per_hour:
                reason = f"headroom, but {recent} scale events in the last hour is the cap"
                return self._hold_all(hold, settled, reason), state
            spare = [v for n, v in settled.items() if safe[n] >= hy.down_confirmations]
            if not spare:
                return self._hold_all(hold, settled, "headroom, but no variant could lose a replica safely"), state
            pick = max(spare, key=lambda v: (v.cost_per_1k_tokens, v.variant))
            hold[pick.variant] = Decision(
                pick.variant,
                pick.current,
                pick.current - 1,
                "down",
                f"headroom: -1 on the most expensive variant (${pick.cost_per_1k_tokens:.4f} per 1k tokens)",
            )
            return hold, self._record(state, model, group, t, up=False)
        return hold, state

    def _eligible(self, v: VariantView, t: float, state: PlannerState) -> bool:
        """May ``v`` receive capacity: does it meet the SLO now, or did it recently?

        Under overload every variant's latency breaks, ITL included (prefill steals decode time), so
        the latency of the moment cannot tell a variant too slow by nature from one that is only
        overloaded. A variant seen meeting both targets within ``slo_evidence_s`` is the latter.
        """
        seen = state.slo_met_t.get(v.variant)
        return v.meets_slo or (seen is not None and t - seen <= self.config.slo_evidence_s)

    def _step(self, pick: VariantView, settled: Mapping[str, VariantView], free_gpus: Mapping[str, int] | None) -> int:
        """Replicas to add to ``pick``: enough to bring the model's KV use back to the spare line.

        The model's token capacity short of keeping every variant at ``kv_cache - spare_kv`` is
        the sum over variants of ready x tokens/s x (KV use / that line - 1); it is divided by one
        ``pick`` replica's tokens/s. Models take minutes to load and nothing more is added while
        they do, so one replica at a time would chase a surge; ``max_step`` bounds the overshoot.
        At least 1 (the pressure may be latency alone), and never past max_replicas or free GPUs.
        """
        cfg, sat = self.config, self.config.saturation
        line = sat.kv_cache - sat.spare_kv
        short = sum(v.ready * v.tokens_per_s_per_replica * max(0.0, v.kv_mean / line - 1.0) for v in settled.values())
        step = max(1, min(cfg.max_step, math.ceil(short / pick.tokens_per_s_per_replica - 1e-9)))
        vc = cfg.variants[pick.variant]
        step = min(step, vc.max_replicas - pick.current)
        if free_gpus is not None:
            step = min(step, free_gpus.get(vc.gpu_type, 0) // vc.gpus_per_replica)
        return max(1, step)

    def _fits(self, variant: str, free_gpus: Mapping[str, int] | None) -> bool:
        vc = self.config.variants[variant]
        return free_gpus is None or free_gpus.get(vc.gpu_type, 0) >= vc.gpus_per_replica

    def _pressure_reason(self, v: VariantView) -> str:
        slo = self.config.slo
        if v.ttft_p95_s is not None and v.ttft_p95_s > slo.ttft_p95_s:
            return f"{v.variant} TTFT p95 {v.ttft_p95_s:.2f}s > {slo.ttft_p95_s:g}s"
        if v.itl_p95_s is not None and v.itl_p95_s > slo.itl_p95_s:
            return f"{v.variant} ITL p95 {v.itl_p95_s * 1000:.0f}ms > {slo.itl_p95_s * 1000:.0f}ms"
        if v.saturated:
            return f"{v.variant} {v.saturated}/{v.ready} replicas saturated"
        sat = self.config.saturation
        if v.spare_kv < sat.spare_kv:
            return f"{v.variant} spare KV {v.spare_kv:.2f} < {sat.spare_kv:g}"
        return f"{v.variant} spare queue {v.spare_queue:.1f} < {sat.spare_queue:g}"

    def _can_lose_one(self, v: VariantView) -> bool:
        """Would ``v`` keep spare capacity and latency margin with one replica fewer?

        Its load, spread over one replica fewer, scales each replica's KV use and queue by
        n/(n-1); TTFT must sit below the target by the configured margin, because queueing delay
        grows faster than linearly as a queue fills.
        """
        cfg, sat = self.config, self.config.saturation
        if v.current <= cfg.variants[v.variant].min_replicas or v.ready < 2:
            return False
        grow = v.ready / (v.ready - 1)
        kv_after = (sat.kv_cache - v.spare_kv) * grow
        queue_after = (sat.queue_depth - v.spare_queue) * grow
        ttft_ok = v.ttft_p95_s is None or v.ttft_p95_s <= cfg.hysteresis.down_slo_margin * cfg.slo.ttft_p95_s
        return sat.kv_cache - kv_after >= sat.spare_kv and sat.queue_depth - queue_after >= sat.spare_queue and ttft_ok

    @staticmethod
    def _hold_all(hold: dict[str, Decision], settled: Mapping[str, VariantView], reason: str) -> dict[str, Decision]:
        for n, v in settled.items():
            hold[n] = Decision(n, v.current, v.current, "hold", reason)
        return hold

    @staticmethod
    def _record(state: PlannerState, model: str, variants: Iterable[str], t: float, *, up: bool) -> PlannerState:
        """A scale event: restart every streak of the model, so the next change needs fresh evidence."""
        last = dict(state.last_event_t)
        last[model] = t
        last_up = dict(state.last_up_t)
        if up:
            last_up[model] = t
        streaks = {**state.up_streak, model: 0}, {**state.down_streak, model: 0}
        return replace(
            state,
            safe_streak={**state.safe_streak, **dict.fromkeys(variants, 0)},
            last_event_t=last,
            last_up_t=last_up,
            up_streak=streaks[0],
            down_streak=streaks[1],
            events=(*state.events, (model, t)),
        )
