"""Serving rules over vLLM's ``/metrics``, one pod at a time.

===================== ============================================================ ==========
signal                when                                                         severity
===================== ============================================================ ==========
kv_cache_saturation   ``vllm:kv_cache_usage_perc`` (or the older                   warning
                      ``vllm:gpu_cache_usage_perc``; 1.0 = full) >= kv_threshold
                      for kv_samples
queue_saturation      ``vllm:num_requests_waiting`` >= queue_min_waiting, >=       warning
                      queue_ratio x ``num_requests_running``, and above its value
                      queue_samples scrapes ago, for queue_samples scrapes; stays
                      firing while the queue is merely high
preemption_storm      ``vllm:num_preemptions_total`` rose by >= preempt_threshold   warning
                      within preempt_window_s
error_rate            failed share of finished requests within error_window_s      warning /
                      >= error_threshold (at least error_min_requests finished):   critical
                      ``vllm:request_success_total{finished_reason in
                      bad_reasons}`` plus ``failure_counters``, over all of them
generation_stalled    ``vllm:num_requests_running`` >= stall_min_running while      critical
                      ``vllm:generation_tokens_total`` has not risen, for
                      stall_samples consecutive scrapes
latency_regression    the mean time to first token or per output token over the    warning
                      last latency_window scrapes is >= latency_ratio x, and >= the
                      metric's minimum increase above, the median of the pod's own
                      means over latency_baseline scrapes, for latency_samples scrapes, while
                      the load does not explain it (TTFT: queue below
                      queue_min_waiting; mean prompt length, arrivals and running
                      requests <= latency_load_ratio x their medians; TPOT:
                      arrivals and running requests)
===================== ============================================================ ==========

Every rule is a condition: it fires once and sends a ``resolved`` anomaly when it clears. Counters
are cumulative; a pod restart resets them, which counts as nothing rather than as an alarm.

``generation_stalled`` is a hung engine: requests are admitted but no token comes out. A
tensor-parallel replica whose collective never returns (an NCCL hang: its GPUs read 100% busy) looks
exactly like this for minutes before the NCCL watchdog aborts it, and its probes may still pass. It
is the runbooks' PromQL ``rate(vllm:generation_tokens_total[..]) == 0 and vllm:num_requests_running
> 0``, judged scrape by scrape. A counter that went down (the engine restarted) is not a stall.

``latency_regression`` compares a pod with its own recent past, not with a fixed target: a network
delay, a slow GPU link, a throttled GPU or a bad release makes requests slower at the same load, while
a traffic burst makes them slower by queueing them or by batching more, which the load gate excludes
(the queue and SLO rules speak for those). Its baseline stops learning while it fires, so a lasting
regression stays one anomaly until it is fixed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pipelines.detectors.rules_common import (
    Condition,
    CounterTrack,
    Finding,
    Snapshot,
    findings_to_anomalies,
    plain,
    snapshots,
    topology_labels,
)
from services.core.events import Anomaly, MetricBatch, Severity

DETECTOR_NAME = "serving_rules"
MAD_TO_SIGMA = 1.4826  # median absolute deviation -> standard deviation, for normal data

KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
PREEMPTIONS = "vllm:num_preemptions_total"
SUCCESS = "vllm:request_success_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATED = "vllm:generation_tokens_total"
# Latency histograms the regression rule watches: (key, metric names in order of preference).
LATENCY_HISTOGRAMS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ttft", ("vllm:time_to_first_token_seconds",)),
    ("tpot", ("vllm:time_per_output_token_seconds", "vllm:inter_token_latency_seconds")),
)


@dataclass
class PodServing:
    """What the detector remembers about one serving pod.

    Attributes:
        counters: series key (``name`` or ``name|finished_reason``) -> its track.
        conditions: signal -> its condition.
        waiting: the latest ``num_requests_waiting`` values, oldest first.
        sums: latency histogram key -> ``[_sum, _count]`` readings of the last ``latency_window + 1``
            scrapes, oldest first.
        means: latency histogram key -> the windowed mean latency at each recent scrape, oldest first
            (the regression rule's baseline; frozen while the rule fires).
        running: recent ``num_requests_running`` values, oldest first (the load the baseline saw).
        prompt_marks: ``[prompt tokens, requests]`` counter readings of the last ``latency_window + 1``
            scrapes (mean prompt length of the window).
        prompt_lengths: recent windowed mean prompt lengths, oldest first (the prompts the baseline saw).
        requests: recent windowed request counts, oldest first (the arrivals the baseline saw).
        slow_keys: the latencies (``ttft``, ``tpot``) found slow at their latest judgement.
        generated: the last ``generation_tokens_total`` reading (the stall rule's mark).
    """

    counters: dict[str, CounterTrack] = field(default_factory=dict)
    conditions: dict[str, Condition] = field(default_factory=dict)
    waiting: list[float] = field(default_factory=list)
    sums: dict[str, list[list[float]]] = field(default_factory=dict)
    means: dict[str, list[float]] = field(default_factory=dict)
    running: list[float] = field(default_factory=list)
    prompt_marks: list[list[float]] = field(default_factory=list)
    prompt_lengths: list[float] = field(default_factory=list)
    requests: list[float] = field(default_factory=list)
    slow_keys: list[str] = field(default_factory=list)
    generated: float | None = None


@dataclass
class ServingRulesState:
    """The detector's state: one :class:`PodServing` per pod."""

    pods: dict[str, PodServing] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return the state as JSON-compatible values."""
        return plain(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServingRulesState:
        """Rebuild a state written by :meth:`to_dict`."""
        return cls(
            pods={
                pod: PodServing(
                    counters={k: CounterTrack.from_dict(v) for k, v in p.get("counters", {}).items()},
                    conditions={k: Condition.from_dict(v) for k, v in p.get("conditions", {}).items()},
                    waiting=[float(v) for v in p.get("waiting", [])],
                    sums={k: [[float(x) for x in r] for r in v] for k, v in p.get("sums", {}).items()},
                    means={k: [float(x) for x in v] for k, v in p.get("means", {}).items()},
                    running=[float(v) for v in p.get("running", [])],
                    prompt_marks=[[float(x) for x in m] for m in p.get("prompt_marks", [])],
                    prompt_lengths=[float(v) for v in p.get("prompt_lengths", [])],
                    requests=[float(v) for v in p.get("requests", [])],
                    slow_keys=[str(k) for k in p.get("slow_keys", [])],
                    generated=None if p.get("generated") is None else float(p["generated"]),
                )
                for pod, p in data.get("pods", {}).items()
            }
        )


@dataclass(frozen=True)
class ServingRuleDetector:
    """vLLM saturation and failure rules: KV cache, queue, preemptions, error rate.

    Attributes:
        kv_threshold: KV-cache usage (0-1) at or above which the cache is saturated (default 0.95).
        kv_samples: consecutive saturated scrapes that fire (default 3).
        queue_min_waiting: fewest waiting requests that count as a queue (default 10).
        queue_ratio: waiting must be at least this multiple of running (default 1.0).
        queue_samples: consecutive high-and-growing scrapes that fire, and how far back "growing"
            looks (default 3).
        preempt_window_s: window of the preemption count (default 300 s).
        preempt_threshold: preemptions within the window that make a storm (default 50).
        error_window_s: window of the error rate (default 300 s).
        error_threshold: failed share of finished requests that fires (default 0.05).
        error_critical: failed share that makes it critical (default 0.25).
        error_min_requests: fewest finished requests in the window to judge a rate (default 20).
        bad_reasons: ``finished_reason`` values that count as failures (default abort, error).
        failure_counters: counters of failed requests added to both sides of the ratio
            (default ``vllm:request_failure_total``, ``vllm:corrupted_requests_total``).
        latency_ratio: how many times its baseline median a latency must reach (default 2;
            ``None`` disables ``latency_regression``).
        ttft_min_increase_s: smallest rise of the mean TTFT that counts (default 0.25 s).
        tpot_min_increase_s: smallest rise of the mean time per output token that counts (default 0.005 s).
        latency_baseline: windowed means in the baseline median (default 20); the rule judges once it
            has half of them.
        latency_window: scrape intervals pooled into one mean (default 4: a minute at 15 s).
        latency_samples: consecutive slow scrapes that fire (default 2).
        latency_min_requests: fewest observations the pooled intervals must hold for a mean (default 20).
        latency_spread_k: robust standard deviations (1.4826 x the median absolute deviation of the
            baseline means) a latency must also rise by, so a replica whose latency normally swings
            needs a larger swing (default 6).
        latency_load_ratio: arrivals (requests per window) or a mean prompt length above this multiple
            of their baseline medians explain a slowdown (default 1.5).
        latency_min_running: running requests below which a batch never counts as bigger (default 2).
        stall_min_running: running requests at or above which no new token is a stall (default 1).
        stall_samples: consecutive scrapes without a new token that fire (default 3: 45 s at 15 s).
        emit_resolved: send a ``resolved`` anomaly when a condition clears (default True).
    """

    name: ClassVar[str] = DETECTOR_NAME
    consumes: ClassVar[type] = MetricBatch
    signals: ClassVar[frozenset[str]] = frozenset(
        {
            "kv_cache_saturation",
            "queue_saturation",
            "preemption_storm",
            "error_rate",
            "latency_regression",
            "generation_stalled",
        }
    )

    kv_threshold: float = 0.95
    kv_samples: int = 3
    queue_min_waiting: float = 10.0
    queue_ratio: float = 1.0
    queue_samples: int = 3
    preempt_window_s: float = 300.0
    preempt_threshold: float = 50.0
    error_window_s: float = 300.0
    error_threshold: float = 0.05
    error_critical: float = 0.25
    error_min_requests: float = 20.0
    bad_reasons: tuple[str, ...] = ("abort", "error")
    failure_counters: tuple[str, ...] = ("vllm:request_failure_total", "vllm:corrupted_requests_total")
    latency_ratio: float | None = 2.0
    ttft_min_increase_s: float = 0.25
    tpot_min_increase_s: float = 0.005
    latency_baseline: int = 20
    latency_window: int = 4
    latency_samples: int = 2
    latency_min_requests: float = 20.0
    latency_load_ratio: float = 1.5
    latency_spread_k: float = 6.0
    latency_min_running: float = 2.0
    stall_min_running: float = 1.0
    stall_samples: int = 3
    emit_resolved: bool = True

    def initial_state(self) -> ServingRulesState:
        """Return an empty state."""
        return ServingRulesState()

    def detect(self, batch: Sequence[Any], state: ServingRulesState) -> tuple[ServingRulesState, list[Anomaly]]:
        """Evaluate every rule on each pod scrape in a micro-batch.

        Args:
            batch: :class:`~services.core.events.MetricBatch` items from vLLM (others are ignored).
            state: the state returned by the previous call (or :meth:`initial_state`).

        Returns:
            The updated state (changed in place) and the anomalies, oldest scrape first.
        """
        anomalies: list[Anomaly] = []
        for snap in snapshots(batch, entity_label="pod"):
            if not any(name.startswith("vllm:") for name in snap.samples):
                continue
            pod = state.pods.setdefault(snap.entity, PodServing())
            findings = [
                *self._kv(snap, pod),
                *self._queue(snap, pod),
                *self._preemption(snap, pod),
                *self._errors(snap, pod),
                *self._latency(snap, pod),
                *self._stall(snap, pod),
            ]
            labels = topology_labels(next(s[0].labels for n, s in snap.samples.items() if n.startswith("vllm:") and s))
            anomalies += findings_to_anomalies(
                findings,
                detector=DETECTOR_NAME,
                entity=snap.entity,
                entity_kind="pod",
                ts=snap.ts,
                labels=labels,
                emit_resolved=self.emit_resolved,
            )
        return state, anomalies

    # -- rules

    def _kv(self, snap: Snapshot, pod: PodServing) -> list[Finding]:
        usage = snap.value(*KV_USAGE)
        if usage is None:
            return []
        cond = pod.conditions.setdefault("kv_cache_saturation", Condition())
        change = cond.update(usage >= self.kv_threshold, snap.ts, self.kv_samples)
        if change is None:
            return []
        evidence = {
            "kv_cache_usage": usage,
            "samples": self.kv_samples,
            "since": cond.since,
            "waiting": snap.value(WAITING),
            "running": snap.value(RUNNING),
        }
        return [Finding("kv_cache_saturation", change, usage, self.kv_threshold, "warning", evidence)]

    def _queue(self, snap: Snapshot, pod: PodServing) -> list[Finding]:
        waiting = snap.value(WAITING)
        if waiting is None:
            return []
        running = snap.value(RUNNING) or 0.0
        history = pod.waiting
        earlier = history[0] if len(history) >= self.queue_samples else None
        history.append(waiting)
        del history[: max(0, len(history) - self.queue_samples)]
        high = waiting >= self.queue_min_waiting and waiting >= self.queue_ratio * running
        growing = earlier is not None and waiting > earlier
        cond = pod.conditions.setdefault("queue_saturation", Condition())
        change = cond.update(high and growing, snap.ts, self.queue_samples, stays=high)
        if change is None:
            return []
        ratio = waiting / max(running, 1.0)
        evidence = {
            "waiting": waiting,
            "running": running,
            "waiting_per_running": ratio,
            "waiting_before": earlier,
            "growth": waiting - earlier if earlier is not None else None,
            "since": cond.since,
        }
        return [Finding("queue_saturation", change, ratio, self.queue_ratio, "warning", evidence)]

    def _stall(self, snap: Snapshot, pod: PodServing) -> list[Finding]:
        generated, running = snap.value(GENERATED), snap.value(RUNNING)
        if generated is None or running is None:
            return []
        before, pod.generated = pod.generated, generated
        if before is None:
            return []  # the first reading: nothing to compare with
        # equal, not "not above": a counter that went down is a restarted engine, which produces again
        stalled = running >= self.stall_min_running and generated == before
        cond = pod.conditions.setdefault("generation_stalled", Condition())
        change = cond.update(stalled, snap.ts, self.stall_samples)
        if change is None:
            return []
        evidence = {
            "running": running,
            "waiting": snap.value(WAITING),
            "generation_tokens_total": generated,
            "samples": self.stall_samples,
            "since": cond.since,
        }
        return [Finding("generation_stalled", change, running, self.stall_min_running, "critical", evidence)]

    def _counter(self, pod: PodServing, key: str, value: float, ts: float, window_s: float) -> float:
        track = pod.counters.setdefault(key, CounterTrack())
        track.update(value, ts, window_s)
        return track.window_increase()

    def _preemption(self, snap: Snapshot, pod: PodServing) -> list[Finding]:
        total = snap.value(PREEMPTIONS)
        if total is None:
            return []
        increase = self._counter(pod, PREEMPTIONS, total, snap.ts, self.preempt_window_s)
        cond = pod.conditions.setdefault("preemption_storm", Condition())
        change = cond.update(increase >= self.preempt_threshold, snap.ts, 1)
        if change is None:
            return []
        evidence = {
            "preemptions_in_window": increase,
            "window_s": self.preempt_window_s,
            "per_minute": increase * 60.0 / self.preempt_window_s,
            "kv_cache_usage": snap.value(*KV_USAGE),
        }
        return [Finding("preemption_storm", change, increase, self.preempt_threshold, "warning", evidence)]

    def _errors(self, snap: Snapshot, pod: PodServing) -> list[Finding]:
        outcomes = snap.samples.get(SUCCESS, [])
        failures = [(name, snap.samples[name]) for name in self.failure_counters if name in snap.samples]
        if not outcomes and not failures:
            return []
        total = 0.0
        bad = 0.0
        by_reason: dict[str, float] = {}
        for sample in outcomes:
            reason = sample.labels.get("finished_reason", "")
            inc = self._counter(pod, f"{SUCCESS}|{reason}", sample.value, snap.ts, self.error_window_s)
            by_reason[reason] = by_reason.get(reason, 0.0) + inc
            total += inc
            if reason in self.bad_reasons:
                bad += inc
        for name, samples in failures:
            inc = self._counter(pod, name, sum(s.value for s in samples), snap.ts, self.error_window_s)
            by_reason[name] = inc
            total += inc
            bad += inc
        ratio = bad / total if total > 0 else 0.0
        cond = pod.conditions.setdefault("error_rate", Condition())
        firing = total >= self.error_min_requests and ratio >= self.error_threshold
        change = cond.update(firing, snap.ts, 1)
        if change is None:
            return []
        severity: Severity = "critical" if ratio >= self.error_critical else "warning"
        evidence = {
            "error_ratio": ratio,
            "failed": bad,
            "finished": total,
            "window_s": self.error_window_s,
            "by_reason": by_reason,
        }
        return [Finding("error_rate", change, ratio, self.error_threshold, severity, evidence)]

    def _window_mean(self, snap: Snapshot, pod: PodServing, key: str, names: tuple[str, ...]) -> float | None:
        """Mean latency of the requests finished over the last ``latency_window`` scrape intervals.

        From the histogram's exact ``_sum`` and ``_count``: a median interpolated inside vLLM's wide
        buckets (1 s to 2.5 s for TTFT) jumps when it crosses a bound, a mean does not. One interval of a
        quiet replica holds a handful of requests, so a minute of them is pooled. None: too few
        requests, or counters that started again (a restarted pod).
        """
        name = next((n for n in names if f"{n}_sum" in snap.samples and f"{n}_count" in snap.samples), None)
        if name is None:
            return None
        total, count = snap.value(f"{name}_sum"), snap.value(f"{name}_count")
        if total is None or count is None:
            return None
        kept = pod.sums.setdefault(key, [])
        if kept and (total < kept[-1][0] or count < kept[-1][1]):
            kept.clear()  # the pod restarted: its histogram started again from zero
        kept.append([total, count])
        del kept[: max(0, len(kept) - (self.latency_window + 1))]
        finished = kept[-1][1] - kept[0][1]
        if len(kept) < 2 or finished < self.latency_min_requests:
            return None
        return (kept[-1][0] - kept[0][0]) / finished

    def _mean_prompt(self, snap: Snapshot, pod: PodServing) -> float | None:
        """Mean prompt length (tokens) of the requests of the last ``latency_window`` scrape intervals."""
        prompt = snap.value(PROMPT_TOKENS)
        count = snap.value(f"{LATENCY_HISTOGRAMS[0][1][0]}_count")
        if prompt is None or count is None:
            return None
        marks = pod.prompt_marks
        if marks and (prompt < marks[-1][0] or count < marks[-1][1]):
            marks.clear()  # counters restarted with the pod
        marks.append([prompt, count])
        del marks[: max(0, len(marks) - (self.latency_window + 1))]
        requests = marks[-1][1] - marks[0][1]
        if len(marks) < 2 or requests < self.latency_min_requests:
            return None
        return (marks[-1][0] - marks[0][0]) / requests

    def _window_requests(self, pod: PodServing) -> float | None:
        """Requests that got their first token over the window :meth:`_mean_prompt` last read."""
        marks = pod.prompt_marks
        return marks[-1][1] - marks[0][1] if len(marks) >= 2 else None

    def _latency(self, snap: Snapshot, pod: PodServing) -> list[Finding]:
        if self.latency_ratio is None:
            return []
        running = snap.value(RUNNING)
        waiting = snap.value(WAITING) or 0.0
        cond = pod.conditions.setdefault("latency_regression", Condition())
        minimum = {"ttft": self.ttft_min_increase_s, "tpot": self.tpot_min_increase_s}
        load_median = _median(pod.running)
        prompt = self._mean_prompt(snap, pod)
        prompt_median = _median(pod.prompt_lengths)
        requests = self._window_requests(pod)
        requests_median = _median(pod.requests)
        # More arrivals, or a bigger batch, is load. Slower requests also stay longer, so more run at
        # once (Little's law): a batch counts as bigger only past latency_min_running, so a quiet
        # replica going from one request in flight to two does not excuse its own slowdown.
        more_arrivals = (
            requests is not None
            and requests_median is not None
            and requests > self.latency_load_ratio * max(requests_median, self.latency_min_requests)
        )
        # the window's latency reflects its busiest moment, not the scrape that closes it
        peak = max([running, *pod.running[-self.latency_window :]]) if running is not None else None
        bigger_batch = (
            peak is not None
            and load_median is not None
            and peak > self.latency_load_ratio * max(load_median, self.latency_min_running)
        )
        busier = more_arrivals or bigger_batch
        longer = prompt is not None and prompt_median is not None and prompt > self.latency_load_ratio * prompt_median
        # what load explains each slowdown: queueing and longer prompts delay the first token,
        # more arrivals (bigger batches) slow every step
        explained = {"ttft": busier or longer or waiting >= self.queue_min_waiting, "tpot": busier}
        slow: dict[str, dict[str, float]] = {}
        judged: set[str] = set()
        for key, names in LATENCY_HISTOGRAMS:
            mean = self._window_mean(snap, pod, key, names)
            if mean is None:
                continue
            history = pod.means.setdefault(key, [])
            base = _median(history) if len(history) >= self.latency_baseline // 2 else None
            if base is not None:
                judged.add(key)
                # a replica whose latency normally swings must swing further than usual
                spread = MAD_TO_SIGMA * (_median([abs(v - base) for v in history]) or 0.0)
                line = max(base * self.latency_ratio, base + minimum[key], base + self.latency_spread_k * spread)
                if mean >= line:
                    slow[key] = {"mean_s": mean, "baseline_mean_s": base, "ratio": mean / max(base, 1e-9)}
            if not cond.active:  # the baseline stops learning while a regression is reported
                history.append(mean)
                del history[: max(0, len(history) - self.latency_baseline)]
        if not cond.active:
            for series, value in ((pod.running, running), (pod.prompt_lengths, prompt), (pod.requests, requests)):
                if value is not None:
                    series.append(value)
                    del series[: max(0, len(series) - self.latency_baseline)]
        if not judged:
            return []
        # a latency without enough requests this time keeps its previous verdict
        still_slow = set(slow) | {k for k in pod.slow_keys if k not in judged}
        pod.slow_keys = sorted(still_slow)
        holds = any(not explained[key] for key in still_slow)
        change = cond.update(holds, snap.ts, self.latency_samples, stays=bool(still_slow))
        if change is None:
            return []
        score = max((v["ratio"] for v in slow.values()), default=1.0)
        evidence = {
            "slower": slow,
            "waiting": waiting,
            "running": running,
            "baseline_running": load_median,
            "requests_in_window": requests,
            "baseline_requests": requests_median,
            "mean_prompt_tokens": prompt,
            "baseline_prompt_tokens": prompt_median,
            "samples": self.latency_samples,
            "since": cond.since,
        }
        return [Finding("latency_regression", change, score, self.latency_ratio, "warning", evidence)]


def _median(values: Sequence[float]) -> float | None:
    """The middle value (upper middle for an even count), None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[len(ordered) // 2]
