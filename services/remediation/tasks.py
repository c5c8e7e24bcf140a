"""Celery tasks of the remediation service (the only remediation module that imports celery).

Task options say what each task is (see STYLE.md):

================================  ===========  ==========  =====================================
task                              queue        acks        retries
================================  ===========  ==========  =====================================
clustermedic.remediation.execute  remediation  early       never (claims the run, precheck)
clustermedic.remediation.act      remediation  early       never (changes the world)
clustermedic.remediation.verify   verify       late        autoretry on VerificationPending, backoff
clustermedic.remediation.finish   default      late        none needed (idempotent)
clustermedic.remediation.rollback remediation  early       never (changes the world)
clustermedic.remediation.recover  default      late        none: sent at worker start, then by beat
================================  ===========  ==========  =====================================

A run executes as one Celery chain: act(0) -> verify(0) -> act(1) -> ... -> finish. A task whose run
token is stale, or whose next action a guardrail now forbids, raises ``Ignore``, which stops its chain
without a retry. ``recover`` resumes runs whose lease lapsed: a worker sends it when it starts, and
Celery beat sends it every ``CLUSTERMEDIC_REMEDIATION_RECOVER_INTERVAL_S`` (``medic worker`` embeds
beat; see services/celery_app.py), so a run whose worker died is picked up by any surviving worker.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task, chain
from celery.exceptions import Ignore
from celery.signals import worker_ready

from services.celery_app import RECOVER_TASK, app
from services.core.settings import Settings
from services.remediation.config import RemediationSettings
from services.remediation.errors import ActuatorError, VerificationFailed, VerificationPending
from services.remediation.executor import Executor, StaleTask
from services.remediation.model import Step
from services.remediation.runtime import build_executor

log = logging.getLogger(__name__)

VERIFY_MAX_RETRIES = 500
VERIFY_BACKOFF_MAX_S = 30
_executor: Executor | None = None


class CeleryDispatcher:
    """Schedules remediation work as Celery tasks and chains."""

    def execute(self, run_id: str) -> None:
        """Send the execute task."""
        execute.apply_async(args=[run_id], queue="remediation")

    def chain(self, run_id: str, token: str, position: int, phase: str, plan: list[Step], time_scale: float) -> None:
        """Send the chain of the steps from ``position`` on, then finish."""
        sigs: list[Any] = []
        delay = 0.0
        for i in range(position, len(plan)):
            step = plan[i]
            if not (i == position and phase == "verify"):
                sigs.append(act.si(run_id, i, token).set(queue="remediation", countdown=delay))
                delay = 0.0
            if step.verify is not None:
                sigs.append(verify.si(run_id, i, token).set(queue="verify", countdown=step.wait_s * time_scale))
            else:
                delay = step.wait_s * time_scale
        sigs.append(finish.si(run_id, token).set(queue="default", countdown=delay))
        chain(*sigs).apply_async()

    def rollback(self, run_id: str, token: str) -> None:
        """Send the rollback task."""
        rollback.apply_async(args=[run_id, token], queue="remediation")


def executor() -> Executor:
    """This worker process's executor, built on first use from the environment's settings."""
    global _executor
    if _executor is None:
        _executor = build_executor(Settings(), RemediationSettings(), CeleryDispatcher())
    return _executor


@app.task(name="clustermedic.remediation.execute", acks_late=False, max_retries=0)
def execute(run_id: str) -> None:
    """Claim a proposed/approved run, precheck it and send its chain."""
    executor().start(run_id)


@app.task(name="clustermedic.remediation.act", acks_late=False, max_retries=0)
def act(run_id: str, position: int, token: str) -> None:
    """Perform one step's action, at most once ever."""
    try:
        executor().act(run_id, position, token)
    except (StaleTask, ActuatorError) as exc:
        log.warning("run %s step %s stops here: %s", run_id, position, exc)
        raise Ignore() from exc


@app.task(
    bind=True,
    name="clustermedic.remediation.verify",
    acks_late=True,
    autoretry_for=(VerificationPending,),
    retry_backoff=1,
    retry_backoff_max=VERIFY_BACKOFF_MAX_S,
    retry_jitter=False,
    max_retries=VERIFY_MAX_RETRIES,
)
def verify(self: Task, run_id: str, position: int, token: str) -> None:
    """Check one step's verification (read-only); retried with backoff until it holds or times out."""
    try:
        executor().verify(run_id, position, token, last_try=self.request.retries >= VERIFY_MAX_RETRIES)
    except (StaleTask, VerificationFailed) as exc:
        log.warning("run %s verify %s stops here: %s", run_id, position, exc)
        raise Ignore() from exc


@app.task(name="clustermedic.remediation.finish", acks_late=True)
def finish(run_id: str, token: str) -> None:
    """Mark the run succeeded and its incident mitigated."""
    try:
        executor().finish(run_id, token)
    except StaleTask as exc:
        raise Ignore() from exc


@app.task(name="clustermedic.remediation.rollback", acks_late=False, max_retries=0)
def rollback(run_id: str, token: str) -> None:
    """Undo a failed run's changes, each rollback step at most once."""
    executor().rollback(run_id, token)


@app.task(name=RECOVER_TASK, acks_late=True)
def recover() -> list[str]:
    """Resume runs whose worker died (safe to run on every worker at once: each run is claimed once)."""
    return executor().recover()


@worker_ready.connect
def _recover_on_start(**_: Any) -> None:
    """A worker that starts looks for runs a dead worker left behind."""
    recover.apply_async(queue="default")
