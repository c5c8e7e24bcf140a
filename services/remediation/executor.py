"""The execution engine the Celery tasks call; no Celery here, so it is testable and reusable.

One run moves through::

    proposed / approved --start--> running --act(0)--> --verify(0)--> ... --finish--> succeeded
                                      \\ precheck fails: failed (nothing changed)
    any action fails / any verification times out: failed, rollback_state=pending --rollback--> rolled_back

Rules that make redelivery and worker death harmless:
    * a step row is committed before its action runs; finding the row means "never act again": an
      action row still ``running`` was interrupted, so the run fails and rolls back;
    * every task carries the run's execution ``token``; a task whose token is not the run's current
      one (a stale or duplicated message) does nothing and stops its chain;
    * each task pushes the run's lease forward; :meth:`Executor.recover` resumes runs whose lease
      lapsed (a killed worker) from the state recorded in Postgres, with a new token.
"""

from __future__ import annotations

import logging
import time
import uuid
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
from services.remediation.policy import check_guardrails, plan_from_diagnosis, policy_for
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
        clock: wall clock (UNIX seconds) for leases, approvals and guardrails.
    """

    store: RunStore
    actuator: Actuator
    playbooks: Registry[type[Playbook]]
    config: RemediationConfig
    events: EventSink
    dispatcher: Dispatcher
    clock: Any = field(default=time.time)

    # ----------------------------------------------------------------------------- intake

    def submit(self, diagnosis: Diagnosis) -> tuple[str, Decision]:
        """Decide on a diagnosis, record the run, and start it when the decision is ``execute``.

        Idempotent: the run id is derived from the diagnosis, so submitting it again does nothing new.
        """
        now = float(self.clock())
        decision = plan_from_diagnosis(
            diagnosis, self.config.policy, self.playbooks, state=self.store.guardrail_state(now), now=now
        )
        run_id = run_id_for(diagnosis, decision)
        status: RemediationStatus = {
            "execute": "proposed",
            "await_approval": "awaiting_approval",
            "page": "paged",
            "blocked": "blocked",
            "dropped": "blocked",
        }[decision.outcome]  # type: ignore[assignment]
        detail = ("dropped: " if decision.outcome == "dropped" else "") + "; ".join(decision.reasons)
        if not self.store.create_run(run_id, decision, status, automatic=decision.outcome == "execute", detail=detail):
            return run_id, decision
        self.store.audit(run_id, decision.decided_by, f"decided:{decision.outcome}", decision.model_dump(mode="json"))
        if decision.outcome == "await_approval":
            self.store.request_approval(run_id, now + self.config.approvals.ttl_s)
        self._event(run_id, status, detail=detail)
        if decision.outcome == "execute":
            self.dispatcher.execute(run_id)
        return run_id, decision

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
        expired = self.store.expire_approvals(float(self.clock()) if now is None else now)
        for run_id in expired:
            if self.store.transition(
                run_id, ["awaiting_approval"], "expired", detail="approval expired", finished=True
            ):
                self.store.audit(run_id, "system", "expired")
                self._event(run_id, "expired", detail="approval expired")
        return expired

    # -------------------------------------------------------------------------- execution

    def start(self, run_id: str) -> None:
        """Claim a proposed or approved run, run its precheck, freeze its plan and dispatch its chain."""
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
        if spec.kill_switch:
            self._end(run_id, [run.status], "blocked", "kill switch is on")
            return
        blocks = check_guardrails(run.targets, spec, self.store.guardrail_state(now), now, exclude_run=run_id)
        if blocks:
            self._end(run_id, [run.status], "blocked", "; ".join(blocks))
            return
        token = uuid.uuid4().hex
        lease = now + self.config.execution.lease_s
        if not self.store.transition(
            run_id, [run.status], "running", token=token, started=True, lease_until=lease, detail=""
        ):
            return
        self._event(run_id, "running")
        playbook = self.playbooks.load(run.playbook)()
        params = playbook.parse(run.params)
        _, row = self.store.begin_step(run_id, "precheck", 0, "precheck")
        pre: PrecheckResult | None
        try:
            pre = playbook.precheck(params, self.actuator)
            reason = pre.reason
        except ActuatorError as exc:
            pre, reason = None, str(exc)
        self.store.finish_step(
            row.step_id,
            "succeeded" if pre and pre.ok else "failed",
            {"reason": reason, "observed": pre.observed if pre else {}},
        )
        if pre is None or not pre.ok:
            self._end(run_id, ["running"], "failed", f"precheck: {reason}")  # nothing changed: no rollback
            return
        plan = playbook.steps(params, pre.observed)
        rollback = playbook.rollback(params, pre.observed)
        self.store.set_plan(run_id, pre.observed, plan, rollback)
        if run.dry_run:
            for i, step in enumerate(plan):
                self.store.record_skipped(run_id, "action", i, step.name, {"dry_run": True, **_describe(step)})
            self._end(run_id, ["running"], "succeeded", "dry run: nothing changed")
            return
        self.dispatcher.chain(run_id, token, 0, "act", plan, self.actuator.time_scale)

    def _running(self, run_id: str, token: str) -> RunRow:
        run = self.store.get_run(run_id)
        if run is None or run.status != "running" or run.token != token:
            raise StaleTask(f"run {run_id}: not running under token {token}")
        return run

    def act(self, run_id: str, position: int, token: str) -> None:
        """Perform the action of step ``position`` at most once.

        Raises:
            StaleTask: the message is stale (the chain must stop).
            ActuatorError: the action failed; the run was failed and its rollback dispatched.
        """
        run = self._running(run_id, token)
        step = run.plan[position]
        self.store.extend_lease(run_id, token, float(self.clock()) + self.config.execution.lease_s)
        if step.action is None:
            self.store.record_skipped(run_id, "action", position, step.name, {"reason": "verify-only step"})
            return
        created, row = self.store.begin_step(run_id, "action", position, step.name)
        if not created:
            if row.status == "succeeded":
                return  # done before a redelivery: do not act again
            if row.status == "running":
                self.store.finish_step(row.step_id, "interrupted", {"error": "interrupted mid-action"})
            self.fail(run_id, token, f"step {step.name}: action interrupted or failed before; not repeated")
            raise StaleTask(f"run {run_id} step {position} already attempted")
        world_t = self.actuator.clock()
        try:
            outcome = self.actuator.act(step.action)
        except ActuatorError as exc:
            self.store.finish_step(row.step_id, "failed", {"error": str(exc), "world_t": world_t})
            self._event(run_id, "failed", step=step.name, detail=str(exc))
            self.fail(run_id, token, f"step {step.name}: {exc}")
            raise
        self.store.finish_step(row.step_id, "succeeded", {"world_t": world_t, **outcome.model_dump()})
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
        self.store.extend_lease(
            run_id,
            token,
            float(self.clock()) + self.config.execution.lease_s + self.config.execution.verify_backoff_max_s,
        )
        created, row = self.store.begin_step(run_id, "verify", position, step.name)
        if row.status == "succeeded":
            return
        if not created:
            self.store.bump_attempts(row.step_id)
        action = self.store.get_step(f"{run_id}:action:{position}")
        since = float(action.output.get("world_t", 0.0)) if action else 0.0
        now_world = self.actuator.clock()
        result: CheckResult | None
        try:
            result = self.actuator.check(step.verify)
            detail = result.detail
        except ActuatorError as exc:
            result, detail = None, str(exc)
        if result is not None and result.ok:
            self.store.finish_step(row.step_id, "succeeded", {"detail": detail, "observed": result.observed})
            self._event(run_id, "running", step=step.name, detail=f"verified: {detail}")
            return
        if now_world - since <= step.timeout_s and not last_try:
            raise VerificationPending(f"{step.name}: {detail}")
        self.store.finish_step(row.step_id, "failed", {"detail": detail, "waited_s": now_world - since})
        self._event(run_id, "failed", step=step.name, detail=f"verification failed: {detail}")
        self.fail(run_id, token, f"step {step.name}: verification did not hold in {step.timeout_s:.0f} s: {detail}")
        raise VerificationFailed(f"{step.name}: {detail}")

    def finish(self, run_id: str, token: str) -> None:
        """Mark the run succeeded and its incident mitigated."""
        self._running(run_id, token)
        if not self.store.transition(run_id, ["running"], "succeeded", require_token=token, finished=True):
            return
        self.store.audit(run_id, "system", "succeeded")
        run = self.store.get_run(run_id)
        assert run is not None
        self._event(run_id, "succeeded", detail="verification passed")
        incident = self.store.mark_incident_mitigated(run.incident_id)
        if incident is not None:
            now = float(self.clock())
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

    def fail(self, run_id: str, token: str, reason: str) -> None:
        """Fail a running run and dispatch its rollback (once)."""
        run = self.store.get_run(run_id)
        if run is None:
            return
        pending = "pending" if run.rollback_plan else "done"
        if self.store.transition(
            run_id,
            ["running"],
            "failed",
            detail=reason,
            finished=True,
            rollback_state=pending,
            require_token=token,
            lease_until=float(self.clock()) + self.config.execution.lease_s,
        ):
            self.store.audit(run_id, "system", "failed", {"reason": reason})
            self._event(run_id, "failed", detail=reason)
            if pending == "pending":
                self.dispatcher.rollback(run_id, token)

    def rollback(self, run_id: str, token: str) -> None:
        """Perform the rollback steps once each; end as ``rolled_back`` (or ``failed`` if one fails)."""
        run = self.store.get_run(run_id)
        if run is None or run.rollback_state != "pending" or run.token != token:
            return
        ok = True
        notes: list[str] = []
        for i, step in enumerate(run.rollback_plan):
            if step.action is None:
                continue
            created, row = self.store.begin_step(run_id, "rollback", i, step.name)
            if not created:
                if row.status == "running":
                    self.store.finish_step(row.step_id, "interrupted", {"error": "interrupted mid-rollback"})
                    ok = False
                    notes.append(f"{step.name} interrupted (not repeated)")
                elif row.status != "succeeded":
                    ok = False
                continue
            try:
                outcome = self.actuator.act(step.action)
            except ActuatorError as exc:
                self.store.finish_step(row.step_id, "failed", {"error": str(exc)})
                ok = False
                notes.append(f"{step.name}: {exc}")
                continue
            self.store.finish_step(row.step_id, "succeeded", outcome.model_dump())
            self._event(run_id, "running", step=step.name, detail=f"rollback {step.action.op} {step.action.target}")
        self.store.set_rollback_state(run_id, "done")
        if ok:
            self.store.transition(run_id, ["failed"], "rolled_back", detail=f"{run.detail}; rolled back")
            self.store.audit(run_id, "system", "rolled_back")
            self._event(run_id, "rolled_back", detail=run.detail)
        else:
            detail = f"{run.detail}; rollback incomplete: {'; '.join(notes)}; a human must look"
            self.store.transition(run_id, ["failed"], "failed", detail=detail)
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
            self.store.set_token(run.run_id, token, now + self.config.execution.lease_s)
            self.store.audit(run.run_id, "system", "recovered", {"status": run.status})
            touched.append(run.run_id)
            if run.status != "running":  # failed with a rollback never completed
                self.dispatcher.rollback(run.run_id, token)
                continue
            if not run.plan:
                self._end(run.run_id, ["running"], "failed", "interrupted before any action; nothing changed")
                continue
            position, phase = self._resume_point(run)
            if phase == "interrupted":
                sid = f"{run.run_id}:action:{position}"
                self.store.finish_step(sid, "interrupted", {"error": "worker died mid-action"})
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
        if self.store.transition(run_id, from_status, status, detail=detail, finished=True):
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
                ts=float(self.clock()),
            )
        )


def run_id_for(diagnosis: Diagnosis, decision: Decision) -> str:
    """A run id derived from the diagnosis: the same diagnosis delivered twice is the same run."""
    key = f"{diagnosis.incident_id}|{decision.playbook}|{sorted(decision.params.items())}|{diagnosis.ts!r}"
    return f"run-{uuid.uuid5(_RUN_NS, key).hex[:20]}"


def _describe(step: Step) -> dict[str, Any]:
    return {"action": step.action.model_dump() if step.action else None}
