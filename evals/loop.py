"""The closed loop as an evaluation: simulator -> detect -> correlate -> diagnose -> remediate, in process.

Every stage is the object the stack's role runs, fed without a broker (docs/evaluation.md):

* the simulator (:class:`~services.simulator.simulator.Simulator`) steps one simulated second at a time;
* its telemetry goes through :class:`evals.detect.OfflineDetect` (the detect role's objects) and
  :class:`evals.correlate.OfflineCorrelate` (the correlate role's objects) with ``infra/config/routing.yaml``;
* every ``opened``/``updated`` incident is diagnosed by the offline ranker (signals, no knowledge base),
  as the diagnostician service does, and submitted to the remediation
  :class:`~services.remediation.executor.Executor` (``policy.plan_from_diagnosis``, the default
  ``infra/config/remediation.yaml``, a real :class:`~services.remediation.store.RunStore` on a
  database of the episode's own);
* :class:`LoopDispatcher` stands in for Celery: it runs execute / act / verify / finish / rollback in
  order as simulated time reaches them (the same countdowns as ``CeleryDispatcher.chain``), and a
  verification still pending is tried again after the simulator advanced (Celery's backoff, 1 s doubling
  to 30 s, in simulated seconds);
* the actuator is :class:`~services.remediation.actuators.simulator.SimulatorActuator` over an
  ``httpx.MockTransport`` that calls the simulator directly (no sockets);
* a simulated human approves a level-2 run :data:`APPROVAL_DELAY_S` simulated seconds after it asked
  (through :meth:`Executor.approve`), unless another run of the incident already acted; level-3 runs
  page and are counted;
* a run that succeeded mitigates its incident in the engine, as the correlate role's remediation agent
  does.

Time is the simulator's everywhere: the engine's clock is simulated seconds, the executor's clock is the
simulated UNIX time (``epoch + t``), the actuator's clock is the simulator's ``t``.

The baselines (:mod:`services.simulator.policies`: noop, static, autoscaler) run on the same scenario,
seed and duration; the seed fixes the traffic and the faults whatever a policy does, so the noop run is
also the counterfactual against which an action's effect is measured.
"""

from __future__ import annotations

import heapq
import json
import statistics
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

import httpx

from evals.diagnose import FAULT_CAUSES, FAULT_SCENARIOS, alert_matches, pick_incident, xid_cause
from services.core.events import Diagnosis, IncidentEvent, KubeEvent, RemediationEvent
from services.core.paths import REPO_ROOT
from services.core.settings import Settings
from services.diagnostician.ranker import RunbookIndex
from services.diagnostician.service import diagnosable
from services.remediation.errors import ActuatorError, VerificationFailed, VerificationPending
from services.remediation.executor import Executor, StaleTask
from services.remediation.model import Step
from services.remediation.policy import ACTED
from services.remediation.store import RunRow, RunStore
from services.simulator.scenario import Scenario
from services.simulator.simulator import Simulator

APPROVAL_DELAY_S = 120.0
"""Simulated seconds the simulated human takes to approve a level-2 run."""
APPROVER = "simulated-human"
EFFECT_WINDOW_S = 600.0
"""An action's effect: the loop's mean step score over this window after it, minus the noop run's."""
EFFECT_EPSILON = 0.005
"""An effect within +-this is no effect (useless); below -this the action made the SLO worse (harmful)."""
RECOVERY_TOLERANCE = 0.02
"""Recovered: the trailing 60 s mean step score is back within this of the 120 s before the onset."""
AFTER_ONSET_S = 900.0
"""Each episode runs until this long after its last fault's onset (or the scenario's end, if sooner)."""
VERIFY_BACKOFF_MAX_S = 30.0
VERIFY_MAX_RETRIES = 500
BASELINES: tuple[str, ...] = ("noop", "static", "autoscaler")
# Faults that end without any action: not a repair by anyone.
_NOT_REPAIRED = frozenset({"", "expired", "crash", "informational", "no_target"})


# ------------------------------------------------------------------------------ the simulator over HTTP


def simulated_executor(sim: Simulator, store: RunStore, events: Any) -> Executor:
    """The remediation executor acting on ``sim`` in process: the simulator actuator over
    :func:`simulator_transport`, a :class:`LoopDispatcher` on simulated seconds (``executor.dispatcher``;
    :meth:`LoopDispatcher.pump` runs what is due), the shipped ``remediation.yaml``, and the world's
    clock (``execution.clock: world``: the simulated UNIX time, never ``time.time``)."""
    from services.remediation.actuators.simulator import SimulatorActuator
    from services.remediation.config import load_config
    from services.remediation.registry import playbook_registry

    actuator = SimulatorActuator("http://simulator.loop", transport=simulator_transport(sim))
    dispatcher = LoopDispatcher(lambda: sim.t)
    executor = Executor(
        store=store,
        actuator=actuator,
        playbooks=playbook_registry(),
        config=load_config(),
        events=events,
        dispatcher=dispatcher,
        clock=actuator.event_time,
    )
    dispatcher.executor = executor
    return executor


def simulator_transport(sim: Simulator) -> httpx.MockTransport:
    """The simulator's control API (``GET /state``, ``POST /actions/{kind}``) as an in-process transport.

    The same answers as :func:`services.simulator.http.create_http_app`: 404 for an unknown action, 409
    with the simulator's message when it refuses one.
    """
    from services.simulator.actuators import ACTIONS

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "GET" and path == "/state":
            return httpx.Response(200, json=sim.observe())
        if request.method == "GET" and path == "/clock":
            return httpx.Response(200, json={"t": float(sim.t), "now": float(sim.epoch + sim.t)})
        if request.method == "POST" and path.startswith("/actions/"):
            kind = path.removeprefix("/actions/")
            if kind not in ACTIONS:
                return httpx.Response(404, json={"detail": f"unknown action {kind!r}"})
            body = json.loads(request.content or b"{}")
            res = sim.actions.apply(kind, str(body.get("target", "")), dict(body.get("params") or {}))
            if not res.accepted:
                return httpx.Response(409, json={"detail": res.message})
            return httpx.Response(200, json=asdict(res))
        return httpx.Response(404, json={"detail": f"no route {request.method} {path}"})

    return httpx.MockTransport(handle)


# ------------------------------------------------------------------------------------ Celery stand-in


@dataclass(order=True)
class _Job:
    due: float
    seq: int
    kind: str = field(compare=False)  # execute | act | verify | finish | rollback
    run_id: str = field(compare=False)
    token: str = field(compare=False, default="")
    position: int = field(compare=False, default=0)
    rest: list[tuple[str, int, float]] = field(compare=False, default_factory=list)
    retries: int = field(compare=False, default=0)


class LoopDispatcher:
    """The executor's :class:`~services.remediation.executor.Dispatcher`, run synchronously on simulated time.

    Work is queued with the simulated second it is due; :meth:`pump` runs what is due, in order, on the
    calling thread. A chain is the one ``CeleryDispatcher.chain`` sends (act, verify after the step's
    wait, ..., finish), each task starting when the previous one ended plus its countdown; a task that
    raises what stops a Celery chain (``Ignore``) stops it here.

    Args:
        clock: simulated seconds now.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.executor: Executor | None = None
        self._jobs: list[_Job] = []
        self._seq = 0

    def _push(self, job: _Job) -> None:
        heapq.heappush(self._jobs, job)

    def _job(self, due: float, kind: str, run_id: str, **kw: Any) -> _Job:
        self._seq += 1
        return _Job(due, self._seq, kind, run_id, **kw)

    def execute(self, run_id: str) -> None:
        """Start the run at the next pump."""
        self._push(self._job(self.clock(), "execute", run_id))

    def chain(self, run_id: str, token: str, position: int, phase: str, plan: list[Step], time_scale: float) -> None:
        """Queue the steps from ``position`` on, then finish (countdowns in simulated seconds)."""
        ops: list[tuple[str, int, float]] = []
        delay = 0.0
        for i in range(position, len(plan)):
            step = plan[i]
            if not (i == position and phase == "verify"):
                ops.append(("act", i, delay))
                delay = 0.0
            if step.verify is not None:
                ops.append(("verify", i, step.wait_s))
            else:
                delay = step.wait_s
        ops.append(("finish", -1, delay))
        self._next(run_id, token, ops, self.clock())

    def _next(self, run_id: str, token: str, ops: list[tuple[str, int, float]], now: float) -> None:
        if ops:
            kind, position, countdown = ops[0]
            self._push(self._job(now + countdown, kind, run_id, token=token, position=position, rest=ops[1:]))

    def rollback(self, run_id: str, token: str) -> None:
        """Roll back at the next pump."""
        self._push(self._job(self.clock(), "rollback", run_id, token=token))

    def pending(self) -> int:
        """Jobs still queued."""
        return len(self._jobs)

    def pump(self) -> None:
        """Run every job due by now (jobs they queue for now run too)."""
        assert self.executor is not None, "the executor owns this dispatcher"
        ex = self.executor
        now = self.clock()
        while self._jobs and self._jobs[0].due <= now:
            job = heapq.heappop(self._jobs)
            try:
                if job.kind == "execute":
                    ex.start(job.run_id)
                elif job.kind == "rollback":
                    ex.rollback(job.run_id, job.token)
                elif job.kind == "act":
                    ex.act(job.run_id, job.position, job.token)
                elif job.kind == "verify":
                    ex.verify(job.run_id, job.position, job.token, last_try=job.retries >= VERIFY_MAX_RETRIES)
                else:
                    ex.finish(job.run_id, job.token)
            except VerificationPending:
                # Celery's retry_backoff=1, capped: 1, 2, 4 ... 30 simulated seconds
                wait = min(2.0**job.retries, VERIFY_BACKOFF_MAX_S)
                retry = self._job(now + wait, job.kind, job.run_id, token=job.token, position=job.position)
                retry.rest, retry.retries = job.rest, job.retries + 1
                self._push(retry)
                continue
            except (StaleTask, ActuatorError, VerificationFailed):
                continue  # the chain stops here, as Celery's Ignore stops it
            if job.kind in ("act", "verify"):
                self._next(job.run_id, job.token, job.rest, now)


class LoopEvents:
    """The executor's event sink: keeps every event; a run that succeeded is a mitigation to apply."""

    def __init__(self) -> None:
        self.events: list[RemediationEvent | IncidentEvent] = []
        self.runs: list[tuple[str, str, str]] = []  # (incident, run, status) for the correlate role

    def publish(self, event: RemediationEvent | IncidentEvent) -> None:
        """Keep the event; a run-level one goes to correlate too (it holds the incident while the run
        acts, and a run's final ``succeeded`` mitigates it)."""
        self.events.append(event)
        if isinstance(event, RemediationEvent) and not event.step:
            self.runs.append((event.incident_id, event.run_id, event.status))


# ------------------------------------------------------------------------------------- results


@dataclass
class FaultOutcome:
    """One fault of one episode and what the loop did about it."""

    scenario: str
    seed: int
    fault_id: str
    fault_type: str
    entity: str
    onset: float
    expected: tuple[str, ...]
    right_playbooks: tuple[str, ...]
    level: int
    related: list[str] = field(default_factory=list)
    incident_id: str = ""
    merged: bool = False
    detected_after_s: float | None = None
    cause: str = ""
    cause_right: bool = False
    right_action: str = ""
    mitigated_after_s: float | None = None
    recovered_after_s: float | None = None
    repaired_by: str = ""
    paged: int = 0

    @property
    def detected(self) -> bool:
        """An incident of its own (opened after the onset) held an alert on the fault's entity."""
        return bool(self.incident_id) and not self.merged


@dataclass
class RunOutcome:
    """One remediation run of the loop and how it is judged."""

    run_id: str
    incident_id: str
    playbook: str
    level: int
    status: str
    targets: list[str]
    acted_at: float | None
    fault_id: str = ""
    effect: float | None = None
    verdict: str = ""  # right | harmful | useless | other | not_acted


@dataclass
class Episode:
    """One (scenario, seed): the loop's grade, its faults and runs, and each baseline's grade."""

    scenario: str
    seed: int
    duration_s: float
    score: float
    budget_spent: float
    faults: list[FaultOutcome]
    runs: list[RunOutcome]
    baselines: dict[str, dict[str, float]]
    incidents: int = 0
    diagnoses: int = 0


# ------------------------------------------------------------------------------------- database


@contextmanager
def loop_database(settings: Settings) -> Iterator[Settings]:
    """A new database on the configured server (the embedded one by default), migrated; dropped afterwards."""
    import psycopg
    from psycopg import sql

    from services.store.db import migrate
    from services.store.embedded import database_url

    base = database_url(settings)
    name = f"eval_loop_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    from urllib.parse import urlsplit, urlunsplit

    url = urlunsplit(urlsplit(base)._replace(path=f"/{name}"))
    try:
        scoped = settings.model_copy(update={"database_url": url})
        migrate(scoped)
        yield scoped
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


# ------------------------------------------------------------------------------------ definitions


def right_playbooks(index: RunbookIndex, causes: Iterable[str]) -> tuple[tuple[str, ...], int]:
    """Playbooks the runbooks of these root causes list (page_oncall aside), and the first one's level."""
    names: list[str] = []
    level = 3
    first = True
    for rb in index.runbooks:
        if rb.root_cause not in causes:
            continue
        for ref in rb.playbooks:
            if first:
                level, first = ref.level, False
            if ref.name != "page_oncall" and ref.name not in names:
                names.append(ref.name)
    return tuple(names), level


def related_entities(sim: Simulator, fault: Any) -> set[str]:
    """The fault's entity and what it directly involves, at its onset: GPU -> node, pod, deployment; pod
    -> node, deployment; node -> its pods and their deployments; deployment -> its pods."""
    c = sim.cluster
    out = {fault.entity}
    kind = fault.entity_kind
    if kind == "gpu":
        gpu = c.gpu_by_uuid.get(fault.entity)
        if gpu is not None:
            out.add(c.nodes[int(c.gpus.node[gpu])].name)
            slot = int(c.gpus.pod_slot[gpu])
            if slot >= 0 and slot in c.pods:
                out |= {c.pods[slot].name, c.pods[slot].deployment}
    elif kind == "pod":
        pod = c.pod_by_name.get(fault.entity)
        if pod is not None:
            out.add(pod.deployment)
            if pod.node >= 0:
                out.add(c.nodes[pod.node].name)
    elif kind == "node":
        node = c.node_by_name.get(fault.entity)
        for pod in c.pods.values():
            if node is not None and pod.node == c.nodes.index(node):
                out |= {pod.name, pod.deployment}
    elif kind == "deployment":
        out |= {p.name for p in c.pods_of(fault.entity)}
    return out


def _target_names(run: RunRow) -> list[str]:
    t = run.targets
    return sorted({*t.nodes, *t.pods, *t.gpus, *([t.deployment] if t.deployment else [])})


def _relates(names: Sequence[str], related: set[str]) -> bool:
    return any(n in related or any(n.startswith(r + "-") for r in related) for n in names)


def _mean(xs: Sequence[float]) -> float:
    return float(statistics.fmean(xs)) if xs else 0.0


def budget_spent(grade: Any, availability: float) -> float:
    """Share of the availability SLO's error budget the episode spent (1.0 = all of it)."""
    budget = (1.0 - availability) * float(grade.requests)
    return round(float(grade.errors) / budget, 4) if budget > 0 else 0.0


# ----------------------------------------------------------------------------------------- episode


def episode_duration(spec: Scenario, after_onset_s: float = AFTER_ONSET_S) -> float:
    """Simulated seconds an episode of this scenario runs."""
    last = max((f.onset for f in spec.faults), default=0.0)
    return float(min(spec.duration_s, last + after_onset_s))


def run_baseline(spec: Scenario, seed: int, policy: str, duration: float) -> tuple[dict[str, float], list[float]]:
    """One baseline policy on the scenario and seed (no telemetry): its grade and per-step scores."""
    from services.simulator.policies import make_policy

    sim = Simulator(spec, seed=seed, telemetry=False)
    try:
        grade = sim.run(duration, make_policy(policy))
    finally:
        sim.close()
    return (
        {"score": round(grade.score, 4), "budget_spent": budget_spent(grade, spec.slo.availability)},
        sim.grader.step_scores(),
    )


def run_episode(
    settings: Settings,
    spec: Scenario,
    seed: int,
    *,
    index: RunbookIndex,
    approval_delay_s: float = APPROVAL_DELAY_S,
    duration_s: float | None = None,
) -> Episode:
    """Run the closed loop on one scenario and seed, the baselines beside it, and judge every fault and run.

    Args:
        settings: a database of this episode's own (see :func:`loop_database`) and detector settings.
            Every episode replays the same simulated epoch (:data:`~services.simulator.simulator.EPOCH`,
            which the judging reads too), so another episode's runs would sit at the same simulated
            times, count as recent for the cooldowns, rate limit and breaker, and (same incident, remedy
            and diagnosis time) share run ids.
        spec: the scenario.
        seed: the episode seed.
        index: the runbook index the ranker and the definitions use.
        approval_delay_s: simulated seconds before the simulated human approves a level-2 run.
        duration_s: simulated seconds to run (default :func:`episode_duration`).
    """
    from evals.correlate import OfflineCorrelate
    from evals.detect import OfflineDetect
    from pipelines.detect import build_detectors
    from services.alerting.config import load_routing
    from services.diagnostician.diagnostician import RankerDiagnostician
    from services.diagnostician.tools import ChangeLog

    duration = duration_s if duration_s is not None else episode_duration(spec)
    baselines: dict[str, dict[str, float]] = {}
    noop_scores: list[float] = []
    for name in BASELINES:
        baselines[name], scores = run_baseline(spec, seed, name, duration)
        if name == "noop":
            noop_scores = scores

    sim = Simulator(spec, seed=seed)
    offline = OfflineDetect(build_detectors(settings))
    correlate = OfflineCorrelate(load_routing(REPO_ROOT / "infra" / "config" / "routing.yaml"), sim.epoch)
    doctor = RankerDiagnostician(settings, index=index, use_database=False)
    doctor.change_log = ChangeLog({n: f"{n}-{d.template_hash}" for n, d in sim.cluster.deployments.items()})
    sink = LoopEvents()
    store = RunStore(settings)
    executor = simulated_executor(sim, store, sink)
    dispatcher = executor.dispatcher
    assert isinstance(dispatcher, LoopDispatcher)
    incidents: list[IncidentEvent] = []
    submitted: list[tuple[float, str, Diagnosis]] = []  # (t, run id, diagnosis)
    awaiting: dict[str, float] = {}  # run id -> simulated second it asked for approval
    related: dict[str, set[str]] = {}
    diagnoses = 0
    try:
        while sim.t < duration:
            now = sim.t
            batch = sim.step()
            for fault in sim.fault_list():
                if fault.started_at is not None and fault.id not in related:
                    related[fault.id] = related_entities(sim, fault)
            for item in batch:
                if isinstance(item, KubeEvent):
                    doctor.change_log.observe(item)
            for event in correlate.feed(batch, offline.feed(batch), now):
                incidents.append(event)
                if not diagnosable(event):
                    continue  # the diagnostician service's rule
                diagnosis = doctor.diagnose(event).model_copy(update={"ts": sim.epoch + now})
                diagnoses += 1
                run_id, decision = executor.submit(diagnosis)
                submitted.append((now, run_id, diagnosis))
                if decision.outcome == "await_approval":
                    awaiting.setdefault(run_id, now)
            for run_id, asked in list(awaiting.items()):
                if now - asked >= approval_delay_s:
                    del awaiting[run_id]
                    _simulated_human(executor, store, run_id)
            dispatcher.pump()
            while sink.runs:
                incidents.extend(correlate.run(*sink.runs.pop(0)))
        grade = sim.grade("clustermedic")
        scores = sim.grader.step_scores()
        faults = [f for f in sim.fault_list() if f.started_at is not None]
        runs = {run_id: store.get_run(run_id) for _, run_id, _ in submitted}
        steps = {rid: store.steps(rid) for rid, row in runs.items() if row is not None and row.status in ACTED}
        succeeded_at = {
            e.run_id: e.ts - sim.epoch
            for e in sink.events
            if isinstance(e, RemediationEvent) and e.status == "succeeded" and not e.step
        }
    finally:
        store.close()
        executor.actuator.close()
        sim.close()
        doctor.close()
    return _judge(
        spec,
        seed,
        duration,
        grade,
        scores,
        noop_scores,
        faults,
        related,
        incidents,
        submitted,
        runs,
        steps,
        succeeded_at,
        baselines,
        index,
        diagnoses,
    )


def _simulated_human(executor: Executor, store: RunStore, run_id: str) -> None:
    """Approve a level-2 run, unless another run of its incident already acted (then it is not needed)."""
    from services.remediation.errors import ApprovalError

    run = store.get_run(run_id)
    if run is None or run.status != "awaiting_approval":
        return
    others = [r for r in store.list_runs(limit=1000) if r.incident_id == run.incident_id and r.run_id != run_id]
    try:
        if any(r.status in ACTED or r.status == "approved" for r in others):
            executor.reject(run_id, approver=APPROVER, channel="eval", comment="another run already acted")
        else:
            executor.approve(run_id, approver=APPROVER, channel="eval", comment="the loop's simulated human")
    except ApprovalError:
        pass  # expired meanwhile: it never acts


def _judge(
    spec: Scenario,
    seed: int,
    duration: float,
    grade: Any,
    scores: list[float],
    noop_scores: list[float],
    faults: list[Any],
    related: dict[str, set[str]],
    incidents: list[IncidentEvent],
    submitted: list[tuple[float, str, Diagnosis]],
    runs: dict[str, RunRow | None],
    steps: dict[str, list[Any]],
    succeeded_at: dict[str, float],
    baselines: dict[str, dict[str, float]],
    index: RunbookIndex,
    diagnoses: int,
) -> Episode:
    from services.simulator.simulator import EPOCH

    by_incident: dict[str, list[tuple[float, str, Diagnosis]]] = {}
    for item in submitted:
        by_incident.setdefault(item[2].incident_id, []).append(item)
    judged: list[RunOutcome] = []
    for rid, row in runs.items():
        if row is None or any(j.run_id == rid for j in judged):
            continue
        acted = [
            float(s.output["world_t"])
            for s in steps.get(rid, [])
            if s.kind == "action" and s.status in ("succeeded", "failed") and s.output.get("world_t") is not None
        ]
        judged.append(
            RunOutcome(
                rid, row.incident_id, row.playbook, row.level, row.status, _target_names(row), min(acted, default=None)
            )
        )
    outcomes: list[FaultOutcome] = []
    for fault in faults:
        expected = (
            (xid_cause(index, int(fault.params.get("code", 79))),)
            if fault.type == "xid"
            else FAULT_CAUSES.get(fault.type, ())
        )
        playbooks, level = right_playbooks(index, expected)
        onset = float(fault.started_at)
        out = FaultOutcome(
            spec.name,
            seed,
            fault.id,
            fault.type,
            fault.entity,
            onset,
            expected,
            playbooks,
            level,
            sorted(related.get(fault.id, {fault.entity})),
        )
        incident, out.merged = pick_incident(fault, incidents, EPOCH, 180.0)
        if incident is not None:
            out.incident_id = incident.incident_id
            first = next(
                e
                for e in incidents
                if e.incident_id == incident.incident_id
                and e.kind in ("opened", "updated")
                and any(alert_matches(fault, a) and a.starts_at - EPOCH >= onset - 1 for a in e.alerts)
            )
            out.detected_after_s = round(first.ts - onset, 1)
            items = by_incident.get(incident.incident_id, [])
            inc_runs = [j for j in judged if j.incident_id == incident.incident_id]
            acted_ids = {j.run_id for j in inc_runs if j.acted_at is not None}
            deciding = next((d for _, rid, d in items if rid in acted_ids), items[-1][2] if items else None)
            if deciding is not None and deciding.hypotheses:
                out.cause = deciding.hypotheses[0].cause
                out.cause_right = out.cause in expected
            out.paged = sum(1 for j in inc_runs if j.status == "paged")
        rel = related.get(fault.id, {fault.entity})
        right = [
            j
            for j in judged
            if j.status == "succeeded"
            and j.playbook in playbooks
            and j.acted_at is not None
            and _relates(j.targets, rel)
        ]
        if right:
            first_right = min(right, key=lambda j: j.acted_at or 0.0)
            out.right_action = first_right.playbook
            # the run's own event time (RemediationEvent.ts is the executor's clock: simulated UNIX time)
            done_t = succeeded_at.get(first_right.run_id, first_right.acted_at or onset)
            out.mitigated_after_s = round(done_t - onset, 1)
            out.recovered_after_s = _recovered_after(scores, onset, done_t)
        if fault.resolved_by not in _NOT_REPAIRED and fault.resolved_at is not None:
            out.repaired_by = fault.resolved_by
            repaired_after = round(float(fault.resolved_at) - onset, 1)
            if out.recovered_after_s is None or repaired_after < out.recovered_after_s:
                out.recovered_after_s = repaired_after
        outcomes.append(out)
    for j in judged:
        if j.acted_at is None:
            j.verdict = "not_acted"
            continue
        start = int(j.acted_at)
        mine = scores[start : start + int(EFFECT_WINDOW_S)]
        base = noop_scores[start : start + int(EFFECT_WINDOW_S)]
        j.effect = round(_mean(mine) - _mean(base), 4) if mine and base else None
        hit = next((f for f in outcomes if _relates(j.targets, set(f.related))), None)
        j.fault_id = hit.fault_id if hit else ""
        if hit is None or (j.effect is not None and j.effect < -EFFECT_EPSILON):
            j.verdict = "harmful"
        elif j.playbook in hit.right_playbooks and j.status == "succeeded":
            j.verdict = "right" if j.effect is None or j.effect > EFFECT_EPSILON or hit.repaired_by else "useless"
        elif j.effect is not None and abs(j.effect) <= EFFECT_EPSILON:
            j.verdict = "useless"
        else:
            j.verdict = "other"
    return Episode(
        spec.name,
        seed,
        duration,
        round(grade.score, 4),
        budget_spent(grade, spec.slo.availability),
        outcomes,
        judged,
        baselines,
        incidents=len({e.incident_id for e in incidents}),
        diagnoses=diagnoses,
    )


def _recovered_after(scores: list[float], onset: float, mitigated: float) -> float | None:
    """Seconds from onset to the first second, at or after the mitigation, whose trailing 60 s mean step score
    is back within :data:`RECOVERY_TOLERANCE` of the mean of the 120 s before the onset (None: never)."""
    start = int(onset)
    before = scores[max(0, start - 120) : start]
    if not before:
        return None
    target = _mean(before) - RECOVERY_TOLERANCE
    for t in range(max(int(mitigated), start + 60), len(scores)):
        if _mean(scores[t - 60 : t]) >= target:
            return float(t - start)
    return None


# ------------------------------------------------------------------------------------- evaluation


def scenarios_for(scenario: str | None) -> list[str]:
    """The scenario asked for, or one per fault type (the diagnosis evaluation's set)."""
    return [scenario] if scenario else sorted(set(FAULT_SCENARIOS.values()))


def evaluate(
    settings: Settings,
    seeds: Iterable[int],
    *,
    scenario: str | None = None,
    progress: TextIO | None = sys.stderr,
    approval_delay_s: float = APPROVAL_DELAY_S,
    duration_s: float | None = None,
) -> list[Episode]:
    """Run the loop on every (seed, scenario), each in a database of its own, dropped afterwards.

    Args:
        settings: where the database server is (the embedded one by default).
        seeds: episode seeds.
        scenario: one scenario (default: one per fault type).
        progress: one line per episode goes here (None: quiet).
        approval_delay_s: the simulated human's delay.
        duration_s: simulated seconds per episode (default :func:`episode_duration`).

    Raises:
        InfraError: the database server is unreachable.
        ConfigError: an unknown scenario.
    """
    from services.diagnostician.ranker import runbook_index
    from services.simulator.scenario import load_scenario

    names = scenarios_for(scenario)
    specs = {name: load_scenario(name) for name in names}  # an unknown name fails before any work
    index = runbook_index(settings.kb_dir)
    episodes: list[Episode] = []
    for seed in seeds:
        for name in names:
            with loop_database(settings) as scoped:  # ~0.2 s: an episode's runs never meet another's
                ep = run_episode(
                    scoped, specs[name], seed, index=index, approval_delay_s=approval_delay_s, duration_s=duration_s
                )
            episodes.append(ep)
            if progress is not None:
                base = " ".join(f"{k} {v['score']:.4f}" for k, v in ep.baselines.items())
                acted = sum(1 for r in ep.runs if r.acted_at is not None)
                progress.write(
                    f"seed {seed} {name}: score {ep.score:.4f} ({base}); "
                    f"detected {sum(f.detected for f in ep.faults)}/{len(ep.faults)}, runs acted {acted}\n"
                )
                progress.flush()
    return episodes


def _pct(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * len(s)))], 1)


def _named(runs: Sequence[RunOutcome]) -> list[str]:
    return sorted({f"{r.playbook} {','.join(r.targets)}" for r in runs})


def scorecard(episodes: Sequence[Episode]) -> dict[str, Any]:
    """Per fault type: detection, MTTD, root cause, right action, MTTR, harmful/useless runs, SLO and budget.

    An episode's SLO score and budget count for every fault type it holds; a run counts for the fault
    type of the fault it relates to (harmful runs relating to none count for every fault type of their
    episode).
    """
    types = sorted({f.fault_type for ep in episodes for f in ep.faults})
    by_type: dict[str, Any] = {}
    for ft in types:
        eps = [ep for ep in episodes if any(f.fault_type == ft for f in ep.faults)]
        fs = [f for ep in eps for f in ep.faults if f.fault_type == ft]
        ids = {(ep.seed, ep.scenario, f.fault_id) for ep in eps for f in ep.faults if f.fault_type == ft}
        rs = [
            r
            for ep in eps
            for r in ep.runs
            if (ep.seed, ep.scenario, r.fault_id) in ids or (r.verdict == "harmful" and not r.fault_id)
        ]
        detected = [f for f in fs if f.detected]
        mttd = [f.detected_after_s for f in detected if f.detected_after_s is not None]
        mttr = [f.recovered_after_s for f in fs if f.right_action and f.recovered_after_s is not None]
        slo = {"clustermedic": round(_mean([ep.score for ep in eps]), 4)}
        budget = {"clustermedic": round(_mean([ep.budget_spent for ep in eps]), 4)}
        for name in BASELINES:
            slo[name] = round(_mean([ep.baselines[name]["score"] for ep in eps]), 4)
            budget[name] = round(_mean([ep.baselines[name]["budget_spent"] for ep in eps]), 4)
        harmful = [r for r in rs if r.verdict == "harmful"]
        useless = [r for r in rs if r.verdict == "useless"]
        by_type[ft] = {
            "faults": len(fs),
            "level": min(f.level for f in fs),
            "right_playbooks": sorted({p for f in fs for p in f.right_playbooks}),
            "detection_rate": round(len(detected) / len(fs), 4) if fs else None,
            "mttd_s": {"p50": _pct(mttd, 0.5), "mean": round(_mean(mttd), 1) if mttd else None},
            "root_cause_top1": round(sum(f.cause_right for f in detected) / len(detected), 4) if detected else None,
            "right_action_rate": round(sum(bool(f.right_action) for f in fs) / len(fs), 4) if fs else None,
            "actions": sorted({f.right_action for f in fs if f.right_action}),
            "mttr_s": {"p50": _pct(mttr, 0.5), "n": len(mttr)},
            "repaired": sum(bool(f.repaired_by) for f in fs),
            "paged": sum(f.paged for f in fs),
            "runs_acted": sum(1 for r in rs if r.acted_at is not None),
            "harmful": {"count": len(harmful), "runs": _named(harmful)},
            "useless": {"count": len(useless), "runs": _named(useless)},
            "slo_score": slo,
            "error_budget_spent": budget,
            "beats_every_baseline": all(slo["clustermedic"] > slo[b] for b in BASELINES),
        }
    level1 = [
        f.recovered_after_s
        for ep in episodes
        for f in ep.faults
        if f.level == 1 and f.right_action and f.recovered_after_s is not None
    ]
    level1_faults = sum(1 for ep in episodes for f in ep.faults if f.level == 1)
    harmful_total = sum(1 for ep in episodes for r in ep.runs if r.verdict == "harmful")
    return {
        "episodes": len(episodes),
        "seeds": sorted({ep.seed for ep in episodes}),
        "scenarios": sorted({ep.scenario for ep in episodes}),
        "approval_delay_s": APPROVAL_DELAY_S,
        "by_fault_type": by_type,
        "targets": {
            "beats_every_baseline_on_every_fault_type": all(v["beats_every_baseline"] for v in by_type.values()),
            "level1_mttr_p50_s": _pct(level1, 0.5),
            "level1_faults_recovered": f"{len(level1)}/{level1_faults}",
            "level1_mttr_p50_under_300_s": bool(level1) and (_pct(level1, 0.5) or 0.0) < 300.0,
            "harmful_actions": harmful_total,
            "no_harmful_action": harmful_total == 0,
        },
    }


def render_table(card: dict[str, Any]) -> Any:
    """The scorecard as a rich table (one row per fault type)."""
    from rich.table import Table

    table = Table(title=f"closed loop, seeds {card['seeds'][0]}-{card['seeds'][-1]}" if card["seeds"] else "loop")
    for col in (
        "fault type",
        "lvl",
        "n",
        "detect",
        "MTTD p50",
        "cause ok",
        "right act",
        "MTTR p50",
        "harm",
        "useless",
        "paged",
        "SLO medic",
        "noop",
        "static",
        "autosc.",
        "budget",
    ):
        table.add_column(col, justify="left" if col == "fault type" else "right")

    def fmt(v: Any) -> str:
        return "-" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))

    for ft, row in card["by_fault_type"].items():
        slo = row["slo_score"]
        table.add_row(
            ft,
            str(row["level"]),
            str(row["faults"]),
            fmt(row["detection_rate"]),
            fmt(row["mttd_s"]["p50"]),
            fmt(row["root_cause_top1"]),
            fmt(row["right_action_rate"]),
            fmt(row["mttr_s"]["p50"]),
            str(row["harmful"]["count"]),
            str(row["useless"]["count"]),
            str(row["paged"]),
            f"{slo['clustermedic']:.4f}",
            f"{slo['noop']:.4f}",
            f"{slo['static']:.4f}",
            f"{slo['autoscaler']:.4f}",
            fmt(row["error_budget_spent"]["clustermedic"]),
        )
    return table
