"""Diagnosis evaluation on seeded simulator scenarios, through the real detection and correlation code.

For each seed and fault type, the fault type's scenario runs in the simulator; its telemetry goes
through :class:`evals.detect.OfflineDetect` (the detect role's own objects, no broker) and
:class:`evals.correlate.OfflineCorrelate` (the correlate role's) with ``infra/config/routing.yaml``. The case
is the first incident *opened* after the fault's onset that holds an alert on the fault's entity
(directly or through topology labels) which started after the onset; the diagnostician sees its last
version within ``window_s`` of that event, as the live service would have diagnosed it, and its
ranking is compared with the fault's label.

The Deployment controller's events of the episode feed a :class:`~services.diagnostician.tools.ChangeLog`
given to the ranker, as a live deployment reading the cluster's Kubernetes events would: a rollout of
an incident's deployment shortly before its alerts is evidence (the tool never reads changes after
the incident's last alert).

An incident opened before the onset was opened by something else (the seeded background load can
overload a deployment on its own), so it does not carry the fault's label even when the fault's alerts
later join it. Such a fault has no incident of its own: it counts as not detected and is reported as
``merged`` (its ranking over the earlier incident is kept, and summarised separately, so nothing is
hidden).

The seed also varies the scenario: the fault's severity, and for XID faults the code (drawn from the
simulator's XID mix), so the cases are not the hand-written scenarios alone. Labels map each fault
type to the root causes counted as right (:data:`FAULT_CAUSES`); an XID fault's label is the runbook
whose ``signals.xid`` lists its code.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.core.events import AlertRef, IncidentEvent, KubeEvent
from services.core.settings import Settings
from services.diagnostician.diagnostician import Diagnostician, RankerDiagnostician
from services.diagnostician.ranker import RunbookIndex
from services.diagnostician.tools import ChangeLog

# Fault type -> scenario file, and the root causes that count as the right diagnosis.
FAULT_SCENARIOS: dict[str, str] = {
    "vram_leak": "vram_leak",
    "kv_cache_exhaustion": "kv_cache_exhaustion",
    "xid": "xid79",
    "ecc": "ecc",
    "thermal_throttle": "thermal_throttle",
    "nvlink_error": "nvlink_error",
    "nccl_timeout": "nccl_timeout",
    "network_latency": "network_latency",
    "node_flapping": "node_flapping",
    "engine_dead": "engine_dead",
    "bad_rollout": "bad_rollout",
    "pending_pods": "pending_pods",
}
FAULT_CAUSES: dict[str, tuple[str, ...]] = {
    "vram_leak": ("vram_leak",),
    # the simulator exhausts the cache with a long-context burst (Faults._start_kv_cache_exhaustion adds
    # one to the traffic): naming the burst names this fault's cause, and both runbooks scale first
    "kv_cache_exhaustion": ("kv_cache_exhaustion", "long_context_burst"),
    # a severe ECC fault escalates to double-bit errors (XID 48): both name the failing memory
    "ecc": ("ecc_sbe_accumulation", "gpu_xid_48", "gpu_xid_92", "gpu_xid_63_row_remap_pending"),
    "thermal_throttle": ("thermal_throttle",),
    "nvlink_error": ("nvlink_crc_errors", "gpu_xid_74"),
    "nccl_timeout": ("nccl_timeout",),
    "network_latency": ("network_latency",),
    "node_flapping": ("node_flapping",),
    "engine_dead": ("engine_dead",),
    "bad_rollout": ("bad_rollout",),
    "pending_pods": ("insufficient_gpu_capacity",),
}
XID_CODES: tuple[int, ...] = (13, 31, 43, 48, 63, 64, 74, 79, 94, 95, 119)


@dataclass
class CaseResult:
    """One fault and what the diagnostician made of its incident."""

    scenario: str
    seed: int
    fault_type: str
    expected: tuple[str, ...]
    incident_id: str = ""
    ranked: list[str] = field(default_factory=list)
    latency_ms: float = 0.0
    merged: bool = False

    @property
    def detected(self) -> bool:
        """An incident opened after the onset held an alert on the fault's entity."""
        return bool(self.incident_id) and not self.merged

    def hit(self, k: int) -> bool:
        """The right cause ranks within the top ``k``."""
        return any(cause in self.expected for cause in self.ranked[:k])


def xid_cause(index: RunbookIndex, code: int) -> str:
    """The root cause of the runbook listing this XID code ('gpu_xid_<code>' when none does)."""
    for rb in index.runbooks:
        if code in rb.signals.xid:
            return rb.root_cause
    return f"gpu_xid_{code}"


def alert_matches(fault: Any, alert: AlertRef) -> bool:
    """Whether an alert points at the fault's entity, directly or through its topology labels."""
    target = fault.entity
    if not target:
        return False
    if alert.entity == target or target in alert.labels.values():
        return True
    if fault.entity_kind == "deployment":
        prefix = target + "-"
        return alert.entity.startswith(prefix) or alert.labels.get("pod", "").startswith(prefix)
    return False


def pick_incident(
    fault: Any, events: Sequence[IncidentEvent], epoch: float, window_s: float
) -> tuple[IncidentEvent | None, bool]:
    """The incident version to diagnose for a fault, and whether it is an earlier incident the fault joined.

    Incident times (``ts``, ``opened_at``) are simulated seconds, alert ``starts_at`` is UNIX time:
    ``epoch`` is the UNIX time of simulated second 0.

    Returns:
        (the last version within ``window_s`` of the first event holding a fault alert, merged): merged
        is True when no incident opened after the onset holds one and an earlier incident does; the
        incident is None when no incident holds an alert on the fault's entity after the onset.
    """
    onset = float(fault.started_at or 0.0)

    def holds_fault_alert(e: IncidentEvent) -> bool:
        return (
            e.kind in ("opened", "updated")
            and e.ts >= onset
            and any(alert_matches(fault, a) and a.starts_at - epoch >= onset - 1 for a in e.alerts)
        )

    candidates = [e for e in events if holds_fault_alert(e)]
    own = [e for e in candidates if e.opened_at >= onset - 1]
    if not candidates:
        return None, False
    merged = not own
    first = (own or candidates)[0]
    versions = [
        e
        for e in events
        if e.incident_id == first.incident_id and first.ts <= e.ts <= first.ts + window_s and e.kind != "resolved"
    ]
    return (versions[-1] if versions else first), merged


def run_case(
    fault_type: str,
    seed: int,
    detectors: Any,
    routing: Any,
    doctor: Diagnostician,
    index: RunbookIndex,
    *,
    window_s: float = 180.0,
    after_onset_s: float = 600.0,
) -> list[CaseResult]:
    """Run the fault type's scenario with this seed and diagnose the incident of each fault."""
    from evals.correlate import OfflineCorrelate
    from evals.detect import OfflineDetect
    from services.simulator.scenario import load_scenario
    from services.simulator.simulator import EPOCH, Simulator

    rng = np.random.default_rng(seed)
    spec = load_scenario(FAULT_SCENARIOS[fault_type])
    faults = []
    for f in spec.faults:
        params = dict(f.params)
        if f.type == "xid":
            params["code"] = int(rng.choice(XID_CODES))
        faults.append(f.model_copy(update={"severity": float(rng.uniform(0.4, 0.95)), "params": params}))
    spec = spec.model_copy(update={"faults": faults})
    duration = min(spec.duration_s, max((f.onset for f in spec.faults), default=0.0) + after_onset_s)
    sim = Simulator(spec, seed=seed)
    offline = OfflineDetect(detectors)
    correlate = OfflineCorrelate(routing, EPOCH)
    events: list[IncidentEvent] = []
    # the Deployment changes the cluster records, starting from each deployment's ReplicaSet
    changes = ChangeLog({name: f"{name}-{dep.template_hash}" for name, dep in sim.cluster.deployments.items()})
    try:
        while sim.t < duration:
            now = sim.t
            batch = sim.step()
            for item in batch:
                if isinstance(item, KubeEvent):
                    changes.observe(item)
            events.extend(correlate.feed(batch, offline.feed(batch), now))
        fault_list = [f for f in sim.fault_list() if f.started_at is not None]
    finally:
        sim.close()
    ranker = doctor if isinstance(doctor, RankerDiagnostician) else getattr(doctor, "ranker", None)
    if isinstance(ranker, RankerDiagnostician):
        # the tool reads only changes before the incident's alerts (``RecentChangesTool``)
        ranker.change_log = changes
    results: list[CaseResult] = []
    for fault in fault_list:
        expected = (
            (xid_cause(index, int(fault.params.get("code", 79))),)
            if fault.type == "xid"
            else FAULT_CAUSES.get(fault.type, ())
        )
        case = CaseResult(spec.name, seed, fault.type, expected)
        incident, case.merged = pick_incident(fault, events, EPOCH, window_s)
        if incident is not None:
            started = time.perf_counter()
            diagnosis = doctor.diagnose(incident)
            case.latency_ms = (time.perf_counter() - started) * 1000
            case.incident_id = incident.incident_id
            case.ranked = [h.cause for h in diagnosis.hypotheses]
        results.append(case)
    return results


def evaluate(
    settings: Settings,
    doctor: Diagnostician,
    index: RunbookIndex,
    seeds: Iterable[int],
    *,
    fault_types: Sequence[str] | None = None,
    max_cases: int | None = None,
) -> list[CaseResult]:
    """Run every (seed, fault type) case until ``max_cases`` faults were evaluated."""
    from pipelines.detect import build_detectors
    from services.alerting.config import load_routing
    from services.core.paths import REPO_ROOT

    routing = load_routing(REPO_ROOT / "infra" / "config" / "routing.yaml")
    types = list(fault_types or FAULT_SCENARIOS)
    results: list[CaseResult] = []
    for seed in seeds:
        for fault_type in types:
            detectors = build_detectors(settings)  # fresh detector state per episode
            results.extend(run_case(fault_type, seed, detectors, routing, doctor, index))
            if max_cases is not None and len(results) >= max_cases:
                return results
    return results


def summarise(results: Sequence[CaseResult]) -> dict[str, Any]:
    """Top-1 / top-3 accuracy over detected faults, detection rate, latency, and per fault type."""
    detected = [r for r in results if r.detected]
    latencies = sorted(r.latency_ms for r in detected)

    def pct(q: float) -> float | None:
        if not latencies:
            return None
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 2)

    by_type: dict[str, dict[str, Any]] = {}
    for fault_type in sorted({r.fault_type for r in results}):
        rs = [r for r in detected if r.fault_type == fault_type]
        total = sum(1 for r in results if r.fault_type == fault_type)
        by_type[fault_type] = {
            "faults": total,
            "diagnosed": len(rs),
            "merged": sum(1 for r in results if r.fault_type == fault_type and r.merged),
            "top1": sum(r.hit(1) for r in rs),
            "top3": sum(r.hit(3) for r in rs),
            "misses": sorted({f"{r.expected[0]} -> {r.ranked[0] if r.ranked else 'none'}" for r in rs if not r.hit(1)}),
        }
    n = len(detected)
    merged = [r for r in results if r.merged]
    return {
        "faults": len(results),
        "incidents_diagnosed": n,
        "detection_rate": round(n / len(results), 4) if results else None,
        "top1_accuracy": round(sum(r.hit(1) for r in detected) / n, 4) if n else None,
        "top3_accuracy": round(sum(r.hit(3) for r in detected) / n, 4) if n else None,
        # faults whose alerts only joined an incident opened before their onset, ranked over that incident
        "merged_into_earlier_incident": {
            "faults": len(merged),
            "top1": sum(r.hit(1) for r in merged),
            "top3": sum(r.hit(3) for r in merged),
        },
        "latency_ms": {"p50": pct(0.5), "p99": pct(0.99), "mean": round(statistics.fmean(latencies), 2) if n else None},
        "by_fault_type": by_type,
    }
