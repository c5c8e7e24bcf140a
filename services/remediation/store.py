"""The remediation audit log in Postgres: runs, steps, approvals, audit entries.

Idempotency lives here. A run id is derived from its diagnosis, so a redelivered diagnosis finds its
run. A step row is inserted (``ON CONFLICT DO NOTHING``) and committed *before* its action runs: a
redelivered or resumed task that finds the row never acts again. State changes are conditional
updates (``WHERE status = ANY(...)``) so two workers cannot both move a run.

Guardrails are enforced here too. :meth:`RunStore.claim_run` (a run starts) and
:meth:`RunStore.begin_action` (a step is about to act) each run in one transaction that first takes
``pg_advisory_xact_lock(GUARDRAIL_LOCK_ID)``, reads the guardrail state, asks the caller's check, and
only then writes. Every writer that can change what a guardrail sees at start (a claim, the kill
switch) takes the same lock, so two runs starting at once are serialised: the second one sees the
first as ``running``. The lock is held for a few queries, never while an actuator acts.

Time: every timestamp a guardrail, the recovery sweep or an approval reads (a run's ``created_at``,
``started_at``, ``finished_at``, ``lease_until``; an approval's ``requested_at``, ``expires_at``,
``decided_at``) is the caller's ``now``: the executor's clock, which is event time (simulated time
under the simulator), never the database's ``now()``. So are the times a timeline is read from: a
step's ``started_at`` / ``finished_at`` and an incident's ``mitigated_at``, so that a run's steps fall
within the run and a mitigation is on the incident's own clock. Only the runs' ``updated_at``, the
audit log's ``ts`` and the kill switch's ``updated_at`` are the database's wall time: they are for humans.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ConfigDict, Field

from services.core.errors import StoreError
from services.core.settings import Settings
from services.remediation.model import Decision, Step, Targets
from services.remediation.policy import GuardrailState, KillSwitch, RunSummary
from services.store.db import connect

# Any constant works; it only has to be the same in every process (and differ from the migration lock).
GUARDRAIL_LOCK_ID = 0x436C4D6547  # "ClMeG"
# How far back the guardrails look (cooldowns, rate limits and breaker windows must fit in it).
GUARDRAIL_WINDOW_S = 86_400.0

Query = Callable[[str, Sequence[Any]], list[dict[str, Any]]]
GuardrailCheck = Callable[[GuardrailState], list[str]]

_RUN_COLS = """run_id, incident_id, playbook, level, params, status, decided_by, dry_run, detail, automatic,
    targets, scope, reasons, observed, plan, rollback_plan, rollback_state, token,
    extract(epoch FROM created_at) AS created_at, extract(epoch FROM started_at) AS started_at,
    extract(epoch FROM finished_at) AS finished_at, extract(epoch FROM lease_until) AS lease_until"""
_STEP_COLS = """step_id, run_id, position, name, kind, status, attempts, output,
    extract(epoch FROM started_at) AS started_at, extract(epoch FROM finished_at) AS finished_at"""


class RunRow(BaseModel):
    """One remediation run as stored."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    incident_id: str
    playbook: str
    level: int
    params: dict[str, Any]
    status: str
    decided_by: str
    dry_run: bool
    detail: str
    automatic: bool
    targets: Targets
    scope: dict[str, str]
    reasons: list[str]
    observed: dict[str, Any]
    plan: list[Step]
    rollback_plan: list[Step]
    rollback_state: str
    token: str
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    lease_until: float | None = None


class StepRow(BaseModel):
    """One recorded step (precheck, action, verify or rollback)."""

    model_config = ConfigDict(frozen=True)

    step_id: str
    run_id: str
    position: int
    name: str
    kind: str
    status: str
    attempts: int
    started_at: float | None = None
    finished_at: float | None = None
    output: dict[str, Any] = Field(default_factory=dict)


class ApprovalRow(BaseModel):
    """The approval of a level-2 run."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    status: str
    requested_at: float
    expires_at: float
    decided_at: float | None = None
    approver: str = ""
    channel: str = ""
    comment: str = ""


class Claim(BaseModel):
    """What :meth:`RunStore.claim_run` did.

    Attributes:
        outcome: ``claimed`` (now ``running`` under the new token), ``blocked`` (a guardrail said no;
            the run is ``blocked`` with the reasons as its detail) or ``stale`` (the run was not in a
            claimable status: another worker took it, or it was handled before).
        reasons: the guardrails' reasons when blocked.
    """

    model_config = ConfigDict(frozen=True)

    outcome: str
    reasons: tuple[str, ...] = ()


class ActionStart(BaseModel):
    """What :meth:`RunStore.begin_action` did.

    Attributes:
        created: the step row was inserted now (False: it existed, see ``step``).
        step: the step row (None when stale or blocked).
        reasons: the guardrails' reasons when they forbid the action (then no row was written).
        stale: the run is not running under the caller's token.
    """

    model_config = ConfigDict(frozen=True)

    created: bool = False
    step: StepRow | None = None
    reasons: tuple[str, ...] = ()
    stale: bool = False


# Statuses of a run that still answers its incident (see RunStore.handling_run).
HANDLING = ("proposed", "awaiting_approval", "approved", "running", "succeeded", "dry_run", "paged")


def step_id(run_id: str, kind: str, position: int) -> str:
    """The deterministic id of a step: the same step of the same run always has the same id."""
    return f"{run_id}:{kind}:{position}"


class RunStore:
    """Runs, steps, approvals and audit entries (one autocommit connection, used under a lock).

    Args:
        settings: where the database is.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._conn: psycopg.Connection[dict[str, Any]] | None = None
        self._lock = threading.Lock()

    def _c(self) -> psycopg.Connection[dict[str, Any]]:
        if self._conn is None or self._conn.closed:
            conn = connect(self._settings, autocommit=True)
            conn.row_factory = dict_row  # type: ignore[assignment]
            self._conn = conn  # type: ignore[assignment]
        assert self._conn is not None
        return self._conn

    def _q(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        with self._lock:
            try:
                cur = self._c().execute(sql.encode(), params)
                return list(cur.fetchall()) if cur.description else []
            except psycopg.OperationalError as exc:
                self.close()
                raise StoreError(f"remediation store: {exc}") from exc
            except psycopg.Error as exc:
                raise StoreError(f"remediation store: {exc}") from exc

    @contextlib.contextmanager
    def _guarded(self) -> Iterator[Query]:
        """One transaction holding the guardrail advisory lock; yields a query function bound to it."""
        with self._lock:
            conn = self._c()

            def q(sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
                cur = conn.execute(sql.encode(), params)
                return list(cur.fetchall()) if cur.description else []

            try:
                with conn.transaction():
                    q("SELECT pg_advisory_xact_lock(%s)", (GUARDRAIL_LOCK_ID,))
                    yield q
            except psycopg.OperationalError as exc:
                self.close()
                raise StoreError(f"remediation store: {exc}") from exc
            except psycopg.Error as exc:
                raise StoreError(f"remediation store: {exc}") from exc

    def close(self) -> None:
        """Close the connection (reopened on next use)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # ------------------------------------------------------------------------------- runs

    def create_run(
        self, run_id: str, decision: Decision, status: str, *, now: float, automatic: bool, detail: str = ""
    ) -> bool:
        """Record a run created at ``now`` (UNIX seconds); False when the run id exists (a redelivered diagnosis)."""
        rows = self._q(
            """INSERT INTO remediation_runs (run_id, incident_id, playbook, level, params, status, decided_by,
                   dry_run, detail, automatic, targets, scope, reasons, created_at)
               VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, to_timestamp(%s))
               ON CONFLICT (run_id) DO NOTHING RETURNING run_id""",
            (
                run_id,
                decision.incident_id,
                decision.playbook or "",
                decision.level,
                Jsonb(decision.params),
                status,
                decision.decided_by,
                decision.dry_run,
                detail,
                automatic,
                Jsonb(decision.targets.model_dump()),
                Jsonb(decision.scope),
                Jsonb(list(decision.reasons)),
                now,
            ),
        )
        return bool(rows)

    def handling_run(self, incident_id: str, playbook: str, params: dict[str, Any]) -> str | None:
        """The run of this playbook with these params for this incident that is still in hand.

        In hand: proposed, awaiting approval, approved, running, succeeded (or its dry run), or paged.
        A run that failed, was rolled back, rejected, expired or blocked does not count: a later
        diagnosis may try again.
        """
        rows = self._q(
            """SELECT run_id FROM remediation_runs
               WHERE incident_id = %s AND playbook = %s AND params = %s
                 AND status = ANY(%s) ORDER BY created_at DESC LIMIT 1""",
            (incident_id, playbook, Jsonb(params), list(HANDLING)),
        )
        return str(rows[0]["run_id"]) if rows else None

    def stale_approvals(self, incident_id: str, playbook: str, params: dict[str, Any]) -> list[tuple[str, str]]:
        """``(run id, playbook)`` of the incident's runs awaiting approval for another playbook or other
        params than these, oldest first."""
        rows = self._q(
            """SELECT run_id, playbook FROM remediation_runs
               WHERE incident_id = %s AND status = 'awaiting_approval' AND NOT (playbook = %s AND params = %s)
               ORDER BY created_at""",
            (incident_id, playbook, Jsonb(params)),
        )
        return [(str(r["run_id"]), str(r["playbook"])) for r in rows]

    def withdraw_approval(self, run_id: str, now: float) -> bool:
        """Expire a pending approval now, whatever its deadline; False when it was not pending."""
        rows = self._q(
            """UPDATE approvals SET status = 'expired', decided_at = to_timestamp(%s)
               WHERE run_id = %s AND status = 'pending' RETURNING run_id""",
            (now, run_id),
        )
        return bool(rows)

    def get_run(self, run_id: str) -> RunRow | None:
        """The run, or None."""
        rows = self._q(f"SELECT {_RUN_COLS} FROM remediation_runs WHERE run_id = %s", (run_id,))
        return _run(rows[0]) if rows else None

    def list_runs(self, status: str | None = None, limit: int = 100) -> list[RunRow]:
        """Newest runs first, optionally of one status."""
        if status:
            rows = self._q(
                f"SELECT {_RUN_COLS} FROM remediation_runs WHERE status = %s ORDER BY created_at DESC LIMIT %s",
                (status, limit),
            )
        else:
            rows = self._q(f"SELECT {_RUN_COLS} FROM remediation_runs ORDER BY created_at DESC LIMIT %s", (limit,))
        return [_run(r) for r in rows]

    def transition(
        self,
        run_id: str,
        from_status: Iterable[str],
        to_status: str,
        *,
        detail: str | None = None,
        token: str | None = None,
        require_token: str | None = None,
        now: float | None = None,
        started: bool = False,
        finished: bool = False,
        lease_until: float | None = None,
        rollback_state: str | None = None,
    ) -> bool:
        """Move a run from one of ``from_status`` to ``to_status``; False when it was not in one of them.

        ``started``/``finished`` stamp ``started_at``/``finished_at`` with ``now`` (the executor's clock,
        required with either).
        """
        if (started or finished) and now is None:
            raise ValueError("transition: started/finished need the executor's now")
        sets = ["status = %s", "updated_at = now()"]  # updated_at: wall time, for humans only
        args: list[Any] = [to_status]
        if detail is not None:
            sets.append("detail = %s")
            args.append(detail)
        if token is not None:
            sets.append("token = %s")
            args.append(token)
        if started:
            sets.append("started_at = coalesce(started_at, to_timestamp(%s))")
            args.append(now)
        if finished:
            sets.append("finished_at = to_timestamp(%s)")
            args.append(now)
        if lease_until is not None:
            sets.append("lease_until = to_timestamp(%s)")
            args.append(lease_until)
        if rollback_state is not None:
            sets.append("rollback_state = %s")
            args.append(rollback_state)
        where = "run_id = %s AND status = ANY(%s)"
        args += [run_id, list(from_status)]
        if require_token is not None:
            where += " AND token = %s"
            args.append(require_token)
        rows = self._q(f"UPDATE remediation_runs SET {', '.join(sets)} WHERE {where} RETURNING run_id", args)
        return bool(rows)

    def claim_run(
        self,
        run_id: str,
        from_status: Iterable[str],
        check: GuardrailCheck,
        *,
        now: float,
        token: str,
        lease_until: float,
    ) -> Claim:
        """Move a run to ``running`` if, in the same transaction, ``check`` finds no reason against it.

        Under the guardrail lock: the run row is read (``stale`` unless it is in ``from_status``), the
        guardrail state is read, and ``check(state)`` decides. No reasons: the run becomes ``running``
        with ``token`` and its lease. Reasons: it becomes ``blocked`` (finished) with them as detail.

        Args:
            run_id: the run to start.
            from_status: the statuses it may start from (``proposed``, ``approved``).
            check: pure; returns the reasons the run may not start (see policy.start_blocks).
            now: UNIX seconds (the guardrail window ends here).
            token: the run's new execution token.
            lease_until: UNIX seconds until which the recovery sweep leaves the run alone.
        """
        with self._guarded() as q:
            rows = q(
                "SELECT status FROM remediation_runs WHERE run_id = %s AND status = ANY(%s) FOR UPDATE",
                (run_id, list(from_status)),
            )
            if not rows:
                return Claim(outcome="stale")
            reasons = check(self._guardrail_state(q, now))
            if reasons:
                q(
                    "UPDATE remediation_runs SET status = 'blocked', detail = %s, finished_at = to_timestamp(%s),"
                    " updated_at = now() WHERE run_id = %s",
                    ("; ".join(reasons), now, run_id),
                )
                return Claim(outcome="blocked", reasons=tuple(reasons))
            q(
                """UPDATE remediation_runs SET status = 'running', token = %s, detail = '',
                       started_at = coalesce(started_at, to_timestamp(%s)), lease_until = to_timestamp(%s),
                       updated_at = now()
                   WHERE run_id = %s""",
                (token, now, lease_until, run_id),
            )
            return Claim(outcome="claimed")

    def begin_action(
        self, run_id: str, token: str, position: int, name: str, check: GuardrailCheck, *, now: float
    ) -> ActionStart:
        """Record an action step as running, only if the run still runs and ``check`` finds no reason against it.

        The check and the step row share one transaction under the guardrail lock, so once the kill
        switch is committed no action begins that had not begun before. ``now`` (UNIX seconds, the
        executor's clock) ends the guardrail window and is the step's ``started_at``.
        """
        with self._guarded() as q:
            rows = q(
                "SELECT 1 FROM remediation_runs WHERE run_id = %s AND status = 'running' AND token = %s",
                (run_id, token),
            )
            if not rows:
                return ActionStart(stale=True)
            reasons = check(self._guardrail_state(q, now))
            if reasons:
                return ActionStart(reasons=tuple(reasons))
            sid = step_id(run_id, "action", position)
            created = q(
                """INSERT INTO remediation_steps (step_id, run_id, position, name, kind, status, attempts, started_at)
                   VALUES (%s, %s, %s, %s, 'action', 'running', 1, to_timestamp(%s))
                   ON CONFLICT DO NOTHING RETURNING step_id""",
                (sid, run_id, position, name, now),
            )
            step = q(f"SELECT {_STEP_COLS} FROM remediation_steps WHERE step_id = %s", (sid,))
            return ActionStart(created=bool(created), step=_step(step[0]))

    def set_plan(self, run_id: str, observed: dict[str, Any], plan: list[Step], rollback: list[Step]) -> None:
        """Freeze what the precheck saw and the steps it implies."""
        self._q(
            "UPDATE remediation_runs SET observed = %s, plan = %s, rollback_plan = %s, updated_at = now()"
            " WHERE run_id = %s",
            (
                Jsonb(observed),
                Jsonb([s.model_dump() for s in plan]),
                Jsonb([s.model_dump() for s in rollback]),
                run_id,
            ),
        )

    def extend_lease(self, run_id: str, token: str, until: float) -> None:
        """Push the run's lease forward (the recovery sweep leaves it alone until then)."""
        self._q(
            "UPDATE remediation_runs SET lease_until = to_timestamp(%s), updated_at = now()"
            " WHERE run_id = %s AND token = %s",
            (until, run_id, token),
        )

    def claim_stale(self, run_id: str, token: str, now: float, lease_until: float) -> bool:
        """Give a stale run a new execution token, only if its lease still lapsed (False: someone else did).

        Every worker runs the recovery sweep on a schedule; this conditional update lets exactly one
        sweep take each abandoned run, and makes every older Celery message of the run a no-op.
        """
        rows = self._q(
            """UPDATE remediation_runs SET token = %s, lease_until = to_timestamp(%s), updated_at = now()
               WHERE run_id = %s AND (status = 'running' OR rollback_state = 'pending')
                 AND (lease_until IS NULL OR lease_until < to_timestamp(%s)) RETURNING run_id""",
            (token, lease_until, run_id, now),
        )
        return bool(rows)

    def set_rollback_state(self, run_id: str, state: str) -> None:
        """'' (none needed), 'pending' (to do) or 'done'."""
        self._q("UPDATE remediation_runs SET rollback_state = %s WHERE run_id = %s", (state, run_id))

    def stale_runs(self, now: float) -> list[RunRow]:
        """Running runs whose lease lapsed, and failed runs whose rollback never completed."""
        rows = self._q(
            f"""SELECT {_RUN_COLS} FROM remediation_runs
                WHERE (status = 'running' OR rollback_state = 'pending')
                  AND (lease_until IS NULL OR lease_until < to_timestamp(%s))""",
            (now,),
        )
        return [_run(r) for r in rows]

    # ------------------------------------------------------------------------------ steps

    def begin_step(self, run_id: str, kind: str, position: int, name: str, *, now: float) -> tuple[bool, StepRow]:
        """Record a step as running since ``now`` before it acts; ``(False, existing)`` when it was recorded before."""
        sid = step_id(run_id, kind, position)
        rows = self._q(
            """INSERT INTO remediation_steps (step_id, run_id, position, name, kind, status, attempts, started_at)
               VALUES (%s, %s, %s, %s, %s, 'running', 1, to_timestamp(%s))
               ON CONFLICT DO NOTHING RETURNING step_id""",
            (sid, run_id, position, name, kind, now),
        )
        step = self.get_step(sid)
        assert step is not None
        return bool(rows), step

    def get_step(self, sid: str) -> StepRow | None:
        """One step, or None."""
        rows = self._q(f"SELECT {_STEP_COLS} FROM remediation_steps WHERE step_id = %s", (sid,))
        return _step(rows[0]) if rows else None

    def steps(self, run_id: str) -> list[StepRow]:
        """Every step of a run in the order recorded."""
        rows = self._q(
            f"SELECT {_STEP_COLS} FROM remediation_steps WHERE run_id = %s ORDER BY started_at, position", (run_id,)
        )
        return [_step(r) for r in rows]

    def bump_attempts(self, sid: str) -> None:
        """Count one more verification attempt."""
        self._q("UPDATE remediation_steps SET attempts = attempts + 1 WHERE step_id = %s", (sid,))

    def finish_step(self, sid: str, status: str, output: dict[str, Any], *, now: float) -> None:
        """Record a step's outcome at ``now`` (merged into its output)."""
        self._q(
            "UPDATE remediation_steps SET status = %s, finished_at = to_timestamp(%s), output = output || %s"
            " WHERE step_id = %s",
            (status, now, Jsonb(output), sid),
        )

    def record_skipped(
        self, run_id: str, kind: str, position: int, name: str, output: dict[str, Any], *, now: float
    ) -> None:
        """Record a step that was deliberately not performed (dry run, no action), at ``now``."""
        self._q(
            """INSERT INTO remediation_steps (step_id, run_id, position, name, kind, status, attempts,
                   started_at, finished_at, output)
               VALUES (%s, %s, %s, %s, %s, 'skipped', 0, to_timestamp(%s), to_timestamp(%s), %s)
               ON CONFLICT DO NOTHING""",
            (step_id(run_id, kind, position), run_id, position, name, kind, now, now, Jsonb(output)),
        )

    # -------------------------------------------------------------------------- approvals

    def request_approval(self, run_id: str, *, now: float, expires_at: float) -> None:
        """Open a pending approval requested at ``now`` (idempotent)."""
        self._q(
            "INSERT INTO approvals (run_id, status, requested_at, expires_at)"
            " VALUES (%s, 'pending', to_timestamp(%s), to_timestamp(%s)) ON CONFLICT (run_id) DO NOTHING",
            (run_id, now, expires_at),
        )

    def get_approval(self, run_id: str) -> ApprovalRow | None:
        """The approval of a run, or None."""
        rows = self._q(
            """SELECT run_id, status, approver, channel, comment,
                      extract(epoch FROM requested_at) AS requested_at, extract(epoch FROM expires_at) AS expires_at,
                      extract(epoch FROM decided_at) AS decided_at
               FROM approvals WHERE run_id = %s""",
            (run_id,),
        )
        return ApprovalRow.model_validate(_floats(rows[0])) if rows else None

    def decide_approval(
        self, run_id: str, status: str, *, approver: str, channel: str, comment: str, now: float
    ) -> bool:
        """Approve or reject a pending, unexpired approval; False when it was not pending or has expired."""
        rows = self._q(
            """UPDATE approvals SET status = %s, approver = %s, channel = %s, comment = %s,
                   decided_at = to_timestamp(%s)
               WHERE run_id = %s AND status = 'pending' AND expires_at > to_timestamp(%s) RETURNING run_id""",
            (status, approver, channel, comment, now, run_id, now),
        )
        return bool(rows)

    def expire_approvals(self, now: float) -> list[str]:
        """Expire pending approvals past their deadline; return their run ids."""
        rows = self._q(
            """UPDATE approvals SET status = 'expired', decided_at = to_timestamp(%s)
               WHERE status = 'pending' AND expires_at <= to_timestamp(%s) RETURNING run_id""",
            (now, now),
        )
        return [r["run_id"] for r in rows]

    # ------------------------------------------------------------------------------ audit

    def audit(self, run_id: str, actor: str, action: str, detail: dict[str, Any] | None = None) -> None:
        """Append an audit entry."""
        self._q(
            "INSERT INTO remediation_audit (run_id, actor, action, detail) VALUES (%s, %s, %s, %s)",
            (run_id, actor, action, Jsonb(detail or {})),
        )

    def audit_log(self, run_id: str) -> list[dict[str, Any]]:
        """A run's audit entries, oldest first."""
        rows = self._q(
            "SELECT extract(epoch FROM ts) AS ts, actor, action, detail FROM remediation_audit"
            " WHERE run_id = %s ORDER BY id",
            (run_id,),
        )
        return [_floats(r) for r in rows]

    # ------------------------------------------------------------------------- guardrails

    def guardrail_state(self, now: float) -> GuardrailState:
        """A snapshot for decisions (not atomic with anything: the executor checks again at start)."""
        return self._guardrail_state(self._q, now)

    @staticmethod
    def _guardrail_state(q: Query, now: float) -> GuardrailState:
        """Recent non-dry runs (cooldown, rate limit, blast radius, circuit breaker) and the live kill switch."""
        since = now - GUARDRAIL_WINDOW_S
        rows = q(
            """SELECT run_id, playbook, status, incident_id, automatic, targets,
                      rollback_state = 'pending' AS rollback_pending,
                      extract(epoch FROM started_at) AS started_at, extract(epoch FROM finished_at) AS finished_at,
                      EXISTS (SELECT 1 FROM remediation_steps s WHERE s.run_id = remediation_runs.run_id
                              AND s.kind = 'precheck' AND s.status = 'failed') AS refused
               FROM remediation_runs
               WHERE NOT dry_run AND (status = 'running' OR rollback_state = 'pending'
                     OR started_at >= to_timestamp(%s) OR finished_at >= to_timestamp(%s))""",
            (since, since),
        )
        ks = q(
            "SELECT set_by, reason, extract(epoch FROM updated_at) AS since FROM remediation_controls"
            " WHERE name = 'kill_switch' AND enabled",
            (),
        )
        return GuardrailState(
            runs=tuple(RunSummary.model_validate(_floats(r)) for r in rows),
            kill_switch=KillSwitch.model_validate(_floats(ks[0])) if ks else None,
        )

    def set_kill_switch(self, enabled: bool, *, set_by: str, reason: str = "") -> None:
        """Turn the live kill switch on or off (under the guardrail lock: once this returns, no run
        starts and no action begins until it is turned off; rollbacks still run)."""
        with self._guarded() as q:
            q(
                """INSERT INTO remediation_controls (name, enabled, set_by, reason) VALUES ('kill_switch', %s, %s, %s)
                   ON CONFLICT (name) DO UPDATE SET enabled = EXCLUDED.enabled, set_by = EXCLUDED.set_by,
                       reason = EXCLUDED.reason, updated_at = now()""",
                (enabled, set_by, reason),
            )

    def kill_switch(self) -> KillSwitch | None:
        """The live kill switch when it is on, else None."""
        rows = self._q(
            "SELECT set_by, reason, extract(epoch FROM updated_at) AS since FROM remediation_controls"
            " WHERE name = 'kill_switch' AND enabled"
        )
        return KillSwitch.model_validate(_floats(rows[0])) if rows else None

    def mark_incident_mitigated(self, incident_id: str, *, now: float) -> dict[str, Any] | None:
        """Mark the incident mitigated at ``now`` (if it is stored and still open); return its row.

        An incident's ``updated_at`` is event time, not wall time: the correlate stage's upsert only
        overwrites a row with a version at least as recent (services/store/incidents.py), so a wall-clock
        ``updated_at`` an hour ahead of simulated time would make it refuse every later version. It only
        moves forward here.
        """
        rows = self._q(
            """UPDATE incidents SET status = 'mitigated', mitigated_at = coalesce(mitigated_at, to_timestamp(%s)),
                      updated_at = greatest(updated_at, to_timestamp(%s))
               WHERE incident_id = %s AND status IN ('opened', 'updated', 'mitigated')
               RETURNING incident_id, title, severity, group_key, labels,
                         extract(epoch FROM opened_at) AS opened_at""",
            (now, now, incident_id),
        )
        return _floats(rows[0]) if rows else None


def _floats(row: dict[str, Any]) -> dict[str, Any]:
    # extract(epoch ...) comes back as Decimal
    return {k: (float(v) if v is not None and type(v).__name__ == "Decimal" else v) for k, v in row.items()}


def _run(row: dict[str, Any]) -> RunRow:
    return RunRow.model_validate(_floats(row))


def _step(row: dict[str, Any]) -> StepRow:
    return StepRow.model_validate(_floats(row))


def dumps(obj: Any) -> str:
    """JSON for CLI output."""
    return json.dumps(obj, default=str, sort_keys=True)
