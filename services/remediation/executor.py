"""The execution engine the Celery tasks call; no Celery here, so it is testable and reusable.

One run moves through::

    proposed / approved --start--> running --act(0)--> --verify(0)--> ... --finish--> succeeded
                           \\ a guardrail forbids it: blocked (nothing changed)
                                      \\ precheck fails: failed (nothing changed)
                                      \\ dry run: dry_run (plan recorded, nothing changed)
    any action fails / any verification times out: failed, rollback_state=pending --rollback--> rolled_back
    a guardrail forbids the next action: blocked, rollback_state=pending --rollback--> blocked (rolled back)
    a rollback step fails: failed, "a human must look"

Guardrails hold under concurrency: the move to ``running`` happens in the Postgres transaction that
checks kill switch, circuit breaker, cooldown, rate limit and blast radius under one advisory lock
(:meth:`RunStore.claim_run`), and every action begins in a transaction that checks the kill switch and
the breaker again (:meth:`RunStore.begin_action`).

Rules that make redelivery and worker death harmless:
    * a step row is committed before its action runs; finding the row means "never act again": an
      action row still ``running`` was interrupted, so the run fails and rolls back;
    * every task carries the run's execution ``token``; a task whose token is not the run's current
      one (a stale or duplicated message) does nothing and stops its chain;
    * each task pushes the run's lease forward; :meth:`Executor.recover` (run on a schedule by every
      worker) resumes runs whose lease lapsed (a killed worker) from the state recorded in Postgres,
      with a new token; a conditional update lets only one sweep take each run.
    * any exception an actuator raises fails the step (never leaves it ``running``) and rolls back.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from services.core.events import Diagnosis, IncidentEvent, RemediationEvent, RemediationStatus
from services.core.registry import Registry
from services.remediation.actuators.base import Actuator
from services.remediation.config import RemediationConfig
from services.remediation.errors import (
    ActuatorError,
    ApprovalError,
    RemediationError,
    VerificationFailed,
    VerificationPending,
)
from services.remediation.model import CheckResult, Decision, PrecheckResult, Step
from services.remediation.playbook import Playbook
from services.remediation.policy import GuardrailState, act_blocks, plan_from_diagnosis, policy_for, start_blocks
from services.remediation.store import RunRow, RunStore

log = logging.getLogger(__name__)

_RUN_NS = uuid.UUID("5d6c1f3e-8a7b-4c2d-9e10-6f5a4b3c2d1e")


class EventSink(Protocol):
    """Where remediation (and incident) events go: Kafka in production, a list in tests."""

    def publish(self, event: RemediationEvent | IncidentEvent) -> None:
        """Publish one event (must not raise for a delivery problem; log it)."""


class Dispatcher(Protocol):
    """Schedules the Celery work the executor decides on (implemented in services.remediation.tasks)."""

    def execute(self, run_id: str) -> None:
        """Start a run (claim, precheck, then its chain)."""

    def chain(self, run_id: str, token: str, position: int, phase: str, plan: list[Step], time_scale: float) -> None:
        """Run the steps from ``position`` (``phase`` 'act' or 'verify'), then finish."""

    def rollback(self, run_id: str, token: str) -> None:
        """Roll the run back."""


class StaleTask(RemediationError):
    """The task's token is not the run's current one, or the run is no longer running: do nothing."""


class GuardrailStop(StaleTask):
    """A guardrail forbids the next action of a running run: it was stopped and its rollback dispatched."""


@dataclass
class Executor:
    """Everything a task needs: store, actuator, playbooks, configuration, events and a dispatcher.

    Args:
        store: the Postgres audit log.
        actuator: acts on the world.
        playbooks: the playbook registry.
        config: remediation.yaml.
        events: where RemediationEvents go.
        dispatcher: how follow-up work is scheduled.
        clock: event time (UNIX seconds) for every timestamp the store writes or compares (leases,
            approvals, guardrails) and for the events' ``ts``: wall time in production, the world's clock
            under the simulator (``execution.clock: world``, see runtime.build_executor).
    """

    store: RunStore
    actuator: Actuator
    playbooks: Registry[type[Playbook]]
    config: RemediationConfig
    events: EventSink
    dispatcher: Dispatcher
    clock: Callable[[], float] = field(default=time.time)

    # ----------------------------------------------------------------------------- intake

    def submit(self, diagnosis: Diagnosis) -> tuple[str, Decision]:
        """Decide on a diagnosis, record the run, and start it when the decision is ``execute``.

        Idempotent: the run id is derived from the diagnosis, so submitting it again does nothing new;
        and while a run of the same playbook on the same target for the same incident is waiting,
        running, succeeded or paged, a new diagnosis of that incident returns that run instead.
        """
        now = float(self.clock())
        decision = plan_from_diagnosis(
            diagnosis, self.config.policy, self.playbooks, state=self.store.guardrail_state(now), now=now
        )
        if diagnosis.proposed_playbook and decision.playbook:
            self._supersede(decision, diagnosis, now)
        if decision.outcome != "dropped" and decision.playbook:
            # an incident is re-diagnosed on every update: the same remedy for the same incident and
            # target is one run, not one per update (and one approval request, one page); also when a
            # guardrail would block a new one, as the cooldown the run in hand itself started does
            earlier = self.store.handling_run(decision.incident_id, decision.playbook, decision.params)
            if earlier is not None:
                return earlier, decision
        run_id = run_id_for(diagnosis, decision)
        status: RemediationStatus = {
            "execute": "proposed",
            "await_approval": "awaiting_approval",
            "page": "paged",
            "blocked": "blocked",
            "dropped": "blocked",
        }[decision.outcome]  # type: ignore[assignment]
        detail = ("dropped: " if decision.outcome == "dropped" else "") + "; ".join(decision.reasons)
        if not self.store.create_run(
            run_id, decision, status, now=now, automatic=decision.outcome == "execute", detail=detail
        ):
            return run_id, decision
        self.store.audit(run_id, decision.decided_by, f"decided:{decision.outcome}", decision.model_dump(mode="json"))
        if decision.outcome == "await_approval":
            self.store.request_approval(run_id, now=now, expires_at=now + self.config.approvals.ttl_s)
        self._event(run_id, status, detail=detail)
        if decision.outcome == "execute":
            self.dispatcher.execute(run_id)
        return run_id, decision

    def _supersede(self, decision: Decision, diagnosis: Diagnosis, now: float) -> None:
        """Withdraw the incident's approval requests for another remedy than the one now proposed.

        An incident is re-diagnosed as its alerts arrive; a request an engineer approves must still be
        what ClusterMedic believes. A request stays while the new diagnosis still rates a cause its
        playbook fixes at ``approvals.keep_ratio`` of its top cause or more (a near tie is noise, not a
        change of mind). The withdrawn run ends ``expired``, with the new proposal as the reason.
        """
        assert decision.playbook is not None
        top = diagnosis.hypotheses[0].confidence if diagnosis.hypotheses else 0.0
        for run_id, playbook in self.store.stale_approvals(decision.incident_id, decision.playbook, decision.params):
            rated = max((h.confidence for h in diagnosis.hypotheses if h.playbook == playbook), default=0.0)
            if rated > 0 and rated >= self.config.approvals.keep_ratio * top:
                continue
            detail = f"superseded: the diagnosis of {decision.incident_id} now proposes {decision.playbook}"
            if self.store.withdraw_approval(run_id, now) and self.store.transition(
                run_id, ["awaiting_approval"], "expired", detail=detail, now=now, finished=True
            ):
                self.store.audit(run_id, "system", "superseded", {"playbook": decision.playbook, **decision.params})
                self._event(run_id, "expired", detail=detail)

    def approve(self, run_id: str, *, approver: str, channel: str, comment: str = "") -> RunRow:
        """Approve a level-2 run and start it.

        Raises:
            ApprovalError: unknown run, not awaiting approval, or the approval expired.
        """
        return self._decide(run_id, True, approver=approver, channel=channel, comment=comment)

    def reject(self, run_id: str, *, approver: str, channel: str, comment: str = "") -> RunRow:
        """Reject a level-2 run; it never acts.

        Raises:
            ApprovalError: unknown run, not awaiting approval, or the approval expired.
        """
        return self._decide(run_id, False, approver=approver, channel=channel, comment=comment)

    def _decide(self, run_id: str, approve: bool, *, approver: str, channel: str, comment: str) -> RunRow:
        if not approver:
            raise ApprovalError("an approval needs the approver's name")
        run = self.store.get_run(run_id)
        if run is None:
            raise ApprovalError(f"no run {run_id}")
        now = float(self.clock())
        self.expire(now)
        status = "approved" if approve else "rejected"
        if not self.store.decide_approval(run_id, status, approver=approver, channel=channel, comment=comment, now=now):
            current = self.store.get_approval(run_id)
            raise ApprovalError(
                f"run {run_id} is not awaiting approval (approval {current.status if current else 'absent'})"
            )
        self.store.transition(run_id, ["awaiting_approval"], status, detail=f"{status} by {approver} via {channel}")
        self.store.audit(run_id, f"{channel}:{approver}", status, {"comment": comment})
        self._event(run_id, status, approver=approver, detail=comment)  # type: ignore[arg-type]
        if approve:
            self.dispatcher.execute(run_id)
        run = self.store.get_run(run_id)
        assert run is not None
        return run

    def expire(self, now: float | None = None) -> list[str]:
        """Expire approvals past their deadline (their runs never act)."""
        now = float(self.clock()) if now is None else now
        expired = self.store.expire_approvals(now)
        for run_id in expired:
            if self.store.transition(
                run_id, ["awaiting_approval"], "expired", detail="approval expired", now=now, finished=True
            ):
                self.store.audit(run_id, "system", "expired")
                self._event(run_id, "expired", detail="approval expired")
        return expired

    # -------------------------------------------------------------------------- execution

    def start(self, run_id: str) -> None:
        """Claim a proposed or approved run, run its precheck, freeze its plan and dispatch its chain.

        The guardrails are asked inside the transaction that moves the run to ``running``
        (:meth:`RunStore.claim_run`): a run they forbid ends ``blocked`` and nothing acts.
        """
        run = self.store.get_run(run_id)
        if run is None or run.status not in ("proposed", "approved"):
            return  # redelivered, or already handled
        if run.level >= 3:
            self._end(run_id, [run.status], "blocked", "level 3 never acts")
            return
        if run.level >= 2:
            approval = self.store.get_approval(run_id)
            if approval is None or approval.status != "approved":
                self._end(run_id, [run.status], "blocked", "level 2 without an approval")
                return
        now = float(self.clock())
        spec = policy_for(self.config.policy, run.playbook, run.targets)

        def check(state: GuardrailState) -> list[str]:
            return start_blocks(
                run_id, run.targets, spec, state, now, automatic=run.automatic, incident_id=run.incident_id
            )

        token = uuid.uuid4().hex
        claim = self.store.claim_run(
            run_id, [run.status], check, now=now, token=token, lease_until=now + self.config.execution.lease_s
        )
        if claim.outcome == "stale":
            return  # another worker claimed it first
        if claim.outcome == "blocked":
            detail = "; ".join(claim.reasons)
            self.store.audit(run_id, "system", "blocked", {"detail": detail})
            self._event(run_id, "blocked", detail=detail)
            return
        self._event(run_id, "running")
        playbook = self.playbooks.load(run.playbook)()
        params = playbook.parse(run.params)
        _, row = self.store.begin_step(run_id, "precheck", 0, "precheck", now=now)
        pre: PrecheckResult | None
        try:
            pre = playbook.precheck(params, self.actuator)
            reason = pre.reason
        except Exception as exc:  # any actuator failure fails the precheck, never the worker
            pre, reason = None, _error(exc)
        self.store.finish_step(
            row.step_id,
            "succeeded" if pre and pre.ok else "failed",
            {"reason": reason, "observed": pre.observed if pre else {}},
            now=now,
        )
        if pre is None or not pre.ok:
            self._end(run_id, ["running"], "failed", f"precheck: {reason}")  # nothing changed: no rollback
            return
        plan = playbook.steps(params, pre.observed)
        rollback = playbook.rollback(params, pre.observed)
        self.store.set_plan(run_id, pre.observed, plan, rollback)
        if run.dry_run:
            for i, step in enumerate(plan):
                self.store.record_skipped(run_id, "action", i, step.name, {"dry_run": True, **_describe(step)}, now=now)
            would = ", ".join(f"{s.action.op} {s.action.target}" for s in plan if s.action) or "nothing"
            self._end(run_id, ["running"], "dry_run", f"dry run: nothing changed; would run {would}")
            return
        self.dispatcher.chain(run_id, token, 0, "act", plan, self.actuator.time_scale)

    def _running(self, run_id: str, token: str) -> RunRow:
        run = self.store.get_run(run_id)
        if run is None or run.status != "running" or run.token != token:
            raise StaleTask(f"run {run_id}: not running under token {token}")
        return run

    def act(self, run_id: str, position: int, token: str) -> None:
        """Perform the action of step ``position`` at most once, if the guardrails still allow it.

        Raises:
            StaleTask: the message is stale (the chain must stop).
            GuardrailStop: the kill switch or the circuit breaker now forbids acting; the run was
                stopped (``blocked``) and its rollback dispatched.
            ActuatorError: the action failed (whatever the actuator raised); the run was failed and its
                rollback dispatched.
        """
        run = self._running(run_id, token)
        step = run.plan[position]
        now = float(self.clock())
        self.store.extend_lease(run_id, token, now + self.config.execution.lease_s)
        if step.action is None:
            # the step's timeout runs from now, as an action's runs from its action: record the world's time
            # (without it the verification measured from 0 and timed out at once on a wall clock). An
            # unreadable clock raises before anything is recorded: nothing acted, the recovery sweep resumes here.
            output = {"reason": "verify-only step", "world_t": self.actuator.clock()}
            self.store.record_skipped(run_id, "action", position, step.name, output, now=now)
            return
        spec = policy_for(self.config.policy, run.playbook, run.targets)

        def check(state: GuardrailState) -> list[str]:
            return act_blocks(spec, state, now, automatic=run.automatic)

        begun = self.store.begin_action(run_id, token, position, step.name, check, now=now)
        if begun.stale:
            raise StaleTask(f"run {run_id}: not running under token {token}")
        if begun.reasons:
            reason = f"stopped before step {step.name}: {'; '.join(begun.reasons)}"
            self.fail(run_id, token, reason, status="blocked")
            raise GuardrailStop(reason)
        row = begun.step
        assert row is not None
        if not begun.created:
            if row.status == "succeeded":
                return  # done before a redelivery: do not act again
            if row.status == "running":
                self.store.finish_step(row.step_id, "interrupted", {"error": "interrupted mid-action"}, now=now)
            self.fail(run_id, token, f"step {step.name}: action interrupted or failed before; not repeated")
            raise StaleTask(f"run {run_id} step {position} already attempted")
        world_t: float | None = None
        try:
            world_t = self.actuator.clock()
            outcome = self.actuator.act(step.action)
        except Exception as exc:  # whatever an actuator raises, the step fails and rolls back
            error = _error(exc)
            self.store.finish_step(row.step_id, "failed", {"error": error, "world_t": world_t}, now=now)
            self._event(run_id, "failed", step=step.name, detail=error)
            self.fail(run_id, token, f"step {step.name}: {error}")
            if isinstance(exc, ActuatorError):
                raise
            raise ActuatorError(error) from exc
        # the time the task began, not a second read of the executor's clock (under the simulator each
        # read is an HTTP GET); world_t in the output is the actuator's own clock at the action
        self.store.finish_step(row.step_id, "succeeded", {"world_t": world_t, **outcome.model_dump()}, now=now)
        self._event(
            run_id, "running", step=step.name, detail=f"{step.action.op} {step.action.target}: {outcome.message}"
        )

    def verify(self, run_id: str, position: int, token: str, *, last_try: bool = False) -> None:
        """Check step ``position``'s verification once (read-only).

        Raises:
            StaleTask: the message is stale.
            VerificationPending: it does not hold yet and the timeout has not passed (retry later).
            VerificationFailed: it did not hold in time; the run was failed and rolled back.
        """
        run = self._running(run_id, token)
        step = run.plan[position]
        if step.verify is None:
            return
        # the executor's clock for what is stored (as every step); now_world below (the actuator's clock,
        # world seconds) only measures the step's timeout against its action's world_t
        now = float(self.clock())
        self.store.extend_lease(
            run_id, token, now + self.config.execution.lease_s + self.config.execution.verify_backoff_max_s
        )
        created, row = self.store.begin_step(run_id, "verify", position, step.name, now=now)
        if row.status == "succeeded":
            return
        if not created:
            self.store.bump_attempts(row.step_id)
        action = self.store.get_step(f"{run_id}:action:{position}")
        since = float(action.output.get("world_t") or 0.0) if action else 0.0
        now_world: float | None = None
        result: CheckResult | None
        try:
            now_world = self.actuator.clock()
            result = self.actuator.check(step.verify)
            detail = result.detail
        except Exception as exc:  # a check that cannot be read does not hold (yet)
            result, detail = None, _error(exc)
        if result is not None and result.ok:
            self.store.finish_step(row.step_id, "succeeded", {"detail": detail, "observed": result.observed}, now=now)
            self._event(run_id, "running", step=step.name, detail=f"verified: {detail}")
            return
        # without the world's clock the timeout cannot be measured: retry until the task's last try
        if (now_world is None or now_world - since <= step.timeout_s) and not last_try:
            raise VerificationPending(f"{step.name}: {detail}")
        now_world = since if now_world is None else now_world
        self.store.finish_step(row.step_id, "failed", {"detail": detail, "waited_s": now_world - since}, now=now)
        self._event(run_id, "failed", step=step.name, detail=f"verification failed: {detail}")
        self.fail(run_id, token, f"step {step.name}: verification did not hold in {step.timeout_s:.0f} s: {detail}")
        raise VerificationFailed(f"{step.name}: {detail}")

    def finish(self, run_id: str, token: str) -> None:
        """Mark the run succeeded and its incident mitigated."""
        self._running(run_id, token)
        now = float(self.clock())
        if not self.store.transition(run_id, ["running"], "succeeded", require_token=token, now=now, finished=True):
            return
        self.store.audit(run_id, "system", "succeeded")
        run = self.store.get_run(run_id)
        assert run is not None
        self._event(run_id, "succeeded", detail="verification passed")
        incident = self.store.mark_incident_mitigated(run.incident_id, now=now)
        if incident is not None:
            self.events.publish(
                IncidentEvent(
                    incident_id=run.incident_id,
                    kind="mitigated",
                    severity=incident["severity"],
                    title=incident["title"],
                    group_key=incident.get("group_key") or "",
                    labels=incident.get("labels") or {},
                    opened_at=float(incident["opened_at"]),
                    ts=now,
                )
            )

    def fail(self, run_id: str, token: str, reason: str, *, status: RemediationStatus = "failed") -> None:
        """End a running run as ``status`` (``failed``, or ``blocked`` by a guardrail); dispatch its rollback once."""
        run = self.store.get_run(run_id)
        if run is None:
            return
        pending = "pending" if run.rollback_plan else "done"
        now = float(self.clock())
        if self.store.transition(
            run_id,
            ["running"],
            status,
            detail=reason,
            now=now,
            finished=True,
            rollback_state=pending,
            require_token=token,
            lease_until=now + self.config.execution.lease_s,
        ):
            self.store.audit(run_id, "system", status, {"reason": reason})
            self._event(run_id, status, detail=reason)
            if pending == "pending":
                self.dispatcher.rollback(run_id, token)

    def rollback(self, run_id: str, token: str) -> None:
        """Perform the rollback steps once each; end as ``rolled_back`` (or ``failed`` if one fails)."""
        run = self.store.get_run(run_id)
        if run is None or run.rollback_state != "pending" or run.token != token:
            return
        now = float(self.clock())  # once per task: every rollback step of this task is stamped with it
        ok = True
        notes: list[str] = []
        for i, step in enumerate(run.rollback_plan):
            if step.action is None:
                continue
            created, row = self.store.begin_step(run_id, "rollback", i, step.name, now=now)
            if not created:
                if row.status == "running":
                    self.store.finish_step(row.step_id, "interrupted", {"error": "interrupted mid-rollback"}, now=now)
                    ok = False
                    notes.append(f"{step.name} interrupted (not repeated)")
                elif row.status != "succeeded":
                    ok = False
                continue
            try:
                outcome = self.actuator.act(step.action)
            except Exception as exc:  # a failing rollback step is recorded; the others still run
                self.store.finish_step(row.step_id, "failed", {"error": _error(exc)}, now=now)
                ok = False
                notes.append(f"{step.name}: {_error(exc)}")
                continue
            self.store.finish_step(row.step_id, "succeeded", outcome.model_dump(), now=now)
            self._event(run_id, "running", step=step.name, detail=f"rollback {step.action.op} {step.action.target}")
        self.store.set_rollback_state(run_id, "done")
        if ok:
            # a run a guardrail stopped stays "blocked" (it is no remediation failure: the breaker ignores it)
            final: RemediationStatus = "blocked" if run.status == "blocked" else "rolled_back"
            self.store.transition(run_id, [run.status], final, detail=f"{run.detail}; rolled back")
            self.store.audit(run_id, "system", "rolled_back")
            self._event(run_id, final, detail=f"{run.detail}; rolled back")
        else:
            detail = f"{run.detail}; rollback incomplete: {'; '.join(notes)}; a human must look"
            self.store.transition(run_id, [run.status], "failed", detail=detail)
            self.store.audit(run_id, "system", "rollback_incomplete", {"notes": notes})
            self._event(run_id, "paged", detail=detail)

    # --------------------------------------------------------------------------- recovery

    def recover(self) -> list[str]:
        """Resume or fail every run whose lease lapsed (its worker died); expire approvals.

        Returns the run ids acted on. A resumed run gets a new token, so any message of the dead
        worker that is redelivered later does nothing.
        """
        now = float(self.clock())
        self.expire(now)
        touched: list[str] = []
        for run in self.store.stale_runs(now):
            token = uuid.uuid4().hex
            if not self.store.claim_stale(run.run_id, token, now, now + self.config.execution.lease_s):
                continue  # another worker's sweep took it
            self.store.audit(run.run_id, "system", "recovered", {"status": run.status})
            touched.append(run.run_id)
            if run.status != "running":  # failed or blocked with a rollback never completed
                self.dispatcher.rollback(run.run_id, token)
                continue
            if not run.plan:
                self._end(run.run_id, ["running"], "failed", "interrupted before any action; nothing changed")
                continue
            position, phase = self._resume_point(run)
            if phase == "interrupted":
                sid = f"{run.run_id}:action:{position}"
                self.store.finish_step(sid, "interrupted", {"error": "worker died mid-action"}, now=now)
                self.fail(run.run_id, token, f"step {run.plan[position].name}: worker died mid-action; not repeated")
                continue
            if phase == "failed":
                self.fail(run.run_id, token, f"step {run.plan[position].name} failed")
                continue
            self.dispatcher.chain(run.run_id, token, position, phase, run.plan, self.actuator.time_scale)
        return touched

    def _resume_point(self, run: RunRow) -> tuple[int, str]:
        rows = {(s.kind, s.position): s for s in self.store.steps(run.run_id)}
        for i, step in enumerate(run.plan):
            action = rows.get(("action", i))
            if action is None:
                return i, "act"
            if action.status == "running":
                return i, "interrupted"
            if action.status not in ("succeeded", "skipped"):
                return i, "failed"
            verify = rows.get(("verify", i))
            if step.verify is not None and (verify is None or verify.status == "running"):
                return i, "verify"
            if verify is not None and verify.status == "failed":
                return i, "failed"
        return len(run.plan), "act"  # every step done: the chain is just finish

    # ---------------------------------------------------------------------------- helpers

    def _end(self, run_id: str, from_status: list[str], status: str, detail: str) -> None:
        if self.store.transition(run_id, from_status, status, detail=detail, now=float(self.clock()), finished=True):
            self.store.audit(run_id, "system", status, {"detail": detail})
            self._event(run_id, status, detail=detail)  # type: ignore[arg-type]

    def _event(
        self, run_id: str, status: RemediationStatus, *, step: str = "", approver: str = "", detail: str = ""
    ) -> None:
        run = self.store.get_run(run_id)
        if run is None:
            return
        self.events.publish(
            RemediationEvent(
                incident_id=run.incident_id,
                run_id=run_id,
                playbook=run.playbook,
                step=step,
                status=status,
                level=run.level,
                approver=approver,
                detail=detail[:2000],
                dry_run=run.dry_run,
                ts=float(self.clock()),
            )
        )


def run_id_for(diagnosis: Diagnosis, decision: Decision) -> str:
    """A run id derived from the diagnosis: the same diagnosis delivered twice is the same run."""
    key = f"{diagnosis.incident_id}|{decision.playbook}|{sorted(decision.params.items())}|{diagnosis.ts!r}"
    return f"run-{uuid.uuid5(_RUN_NS, key).hex[:20]}"


def _error(exc: BaseException) -> str:
    """An exception as audit text; the type is kept when it is not one of ours (it is a bug to look at)."""
    return str(exc) if isinstance(exc, ActuatorError) else f"{type(exc).__name__}: {exc}"


def _describe(step: Step) -> dict[str, Any]:
    return {"action": step.action.model_dump() if step.action else None}
