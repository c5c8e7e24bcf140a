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
===================== ============================================================ ==========

Every rule is a condition: it fires once and sends a ``resolved`` anomaly when it clears. Counters
are cumulative; a pod restart resets them, which counts as nothing rather than as an alarm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from pipelines.detectors.rules_common import (
    Condition,
    CounterTrack,
    Finding,
    Snapshot,
    findings_to_anomalies,
    snapshots,
    topology_labels,
)
from services.core.events import Anomaly, MetricBatch, Severity

DETECTOR_NAME = "serving_rules"

KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
PREEMPTIONS = "vllm:num_preemptions_total"
SUCCESS = "vllm:request_success_total"


@dataclass
class PodServing:
    """What the detector remembers about one serving pod.

    Attributes:
        counters: series key (``name`` or ``name|finished_reason``) -> its track.
        conditions: signal -> its condition.
        waiting: the latest ``num_requests_waiting`` values, oldest first.
    """

    counters: dict[str, CounterTrack] = field(default_factory=dict)
    conditions: dict[str, Condition] = field(default_factory=dict)
    waiting: list[float] = field(default_factory=list)


@dataclass
class ServingRulesState:
    """The detector's state: one :class:`PodServing` per pod."""

    pods: dict[str, PodServing] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return the state as JSON-compatible values."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServingRulesState:
        """Rebuild a state written by :meth:`to_dict`."""
        return cls(
            pods={
                pod: PodServing(
                    counters={k: CounterTrack.from_dict(v) for k, v in p.get("counters", {}).items()},
                    conditions={k: Condition.from_dict(v) for k, v in p.get("conditions", {}).items()},
                    waiting=[float(v) for v in p.get("waiting", [])],
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
        emit_resolved: send a ``resolved`` anomaly when a condition clears (default True).
    """

    name: ClassVar[str] = DETECTOR_NAME
    consumes: ClassVar[type] = MetricBatch

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
