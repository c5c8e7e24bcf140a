"""The remediation HTTP API: a FastAPI router the API service mounts (behind services/auth).

Routes (under ``/remediation``), each with the role it needs (docs/api.md):

==========================================  ========  =========================================================
``GET /runs``, ``GET /runs/{run_id}``       viewer    runs; one run with its steps, approval and audit trail
``POST /runs/{run_id}/approve|reject``      operator  decide on a level-2 run; the approver is the caller
``GET /kill-switch``                        viewer    whether every remediation is stopped
``PUT /kill-switch``                        admin     stop (``{"enabled": true, "reason": ...}``) or allow all
``POST /slack/interactions``                (Slack)   signed Slack button clicks, by mapped users only
==========================================  ========  =========================================================

Who approves comes from authentication, never from the body: an ``approver`` in the body (older
clients send one) is ignored, and when it names someone else the audit row keeps it as
``claimed_approver``. A Slack click counts only when Slack signed it, it was not seen before, and its
user id maps (RemediationSettings.slack_users) to the name of an active operator or admin token;
otherwise Slack shows the clicking user why, and nothing is decided.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from services.auth.http import Admin, AuthContext, AuthStore, Operator, Viewer, context
from services.auth.tokens import Identity, Role
from services.core.errors import InfraError, StoreError
from services.remediation.errors import ApprovalError, SignatureError
from services.remediation.executor import Executor
from services.remediation.slack import APPROVE_ACTION, MAX_SKEW_S, parse_interaction, verify_signature

ROUTER_PREFIX = "/remediation"
# Signed by Slack (verify_signature), not by the API's bearer token, which Slack cannot send.
SLACK_INTERACTIONS_ROUTE = "/slack/interactions"


class ApprovalBody(BaseModel):
    """Body of an approve or reject request (optional).

    Attributes:
        approver: ignored: the approver is the authenticated caller. Accepted so that older clients,
            which sent their name here, keep working.
        comment: why; recorded with the decision.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    approver: str = ""
    comment: str = ""


class KillSwitchBody(BaseModel):
    """Body of ``PUT /kill-switch``."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    enabled: bool
    reason: str = Field(default="", max_length=1000)


def create_router(
    executor: Callable[[], Executor],
    *,
    slack_signing_secret: str = "",
    clock: Callable[[], float] = time.time,
    slack_users: Mapping[str, str] | None = None,
    auth_store: AuthStore | None = None,
) -> APIRouter:
    """Build the router.

    Args:
        executor: returns the process's executor (built at the API entrypoint).
        slack_signing_secret: the Slack app's signing secret; empty refuses every Slack request.
        clock: UNIX time, for the Slack timestamp check.
        slack_users: Slack user id -> token name (RemediationSettings.slack_users).
        auth_store: where Slack users' identities and seen Slack signatures are looked up; None
            refuses every Slack request.
    """
    router = APIRouter(prefix=ROUTER_PREFIX, tags=["remediation"])
    users = dict(slack_users or {})

    @router.get("/runs")
    def runs(auth: Viewer, status: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        return [r.model_dump(mode="json") for r in executor().store.list_runs(status, limit)]

    @router.get("/runs/{run_id}")
    def run(run_id: str, auth: Viewer) -> dict[str, Any]:
        store = executor().store
        row = store.get_run(run_id)
        if row is None:
            raise HTTPException(404, f"no run {run_id}")
        approval = store.get_approval(run_id)
        return {
            "run": row.model_dump(mode="json"),
            "steps": [s.model_dump(mode="json") for s in store.steps(run_id)],
            "approval": approval.model_dump(mode="json") if approval else None,
            "audit": store.audit_log(run_id),
        }

    def decide(run_id: str, approve: bool, approver: str, channel: str, comment: str) -> dict[str, Any]:
        ex = executor()
        try:
            if approve:
                row = ex.approve(run_id, approver=approver, channel=channel, comment=comment)
            else:
                row = ex.reject(run_id, approver=approver, channel=channel, comment=comment)
        except ApprovalError as exc:
            raise HTTPException(409, str(exc)) from exc
        return {"run_id": run_id, "status": row.status, "approver": approver}

    def from_api(run_id: str, approve: bool, body: ApprovalBody | None, auth: AuthContext) -> dict[str, Any]:
        body = body or ApprovalBody()
        auth.note("run.approve" if approve else "run.reject", run_id, comment=body.comment)
        if body.approver and body.approver != auth.name:
            auth.note(claimed_approver=body.approver)  # kept for the record, never believed
        return decide(run_id, approve, auth.name, "api", body.comment)

    @router.post("/runs/{run_id}/approve")
    def approve(run_id: str, auth: Operator, body: ApprovalBody | None = None) -> dict[str, Any]:
        return from_api(run_id, True, body, auth)

    @router.post("/runs/{run_id}/reject")
    def reject(run_id: str, auth: Operator, body: ApprovalBody | None = None) -> dict[str, Any]:
        return from_api(run_id, False, body, auth)

    @router.get("/kill-switch")
    def kill_switch(auth: Viewer) -> dict[str, Any]:
        ks = executor().store.kill_switch()
        return {"kill_switch": "on" if ks else "off", **(ks.model_dump() if ks else {})}

    @router.put("/kill-switch")
    def set_kill_switch(body: KillSwitchBody, auth: Admin) -> dict[str, Any]:
        auth.note("kill_switch.on" if body.enabled else "kill_switch.off", "kill_switch", reason=body.reason)
        store = executor().store
        store.set_kill_switch(body.enabled, set_by=auth.name, reason=body.reason)
        ks = store.kill_switch()
        return {"kill_switch": "on" if ks else "off", **(ks.model_dump() if ks else {})}

    @router.post(SLACK_INTERACTIONS_ROUTE)
    async def slack(request: Request) -> dict[str, Any]:
        body = await request.body()
        stamp = request.headers.get("x-slack-request-timestamp")
        signature = request.headers.get("x-slack-signature")
        try:
            verify_signature(slack_signing_secret, stamp, body, signature, clock())
            click = parse_interaction(body)
        except SignatureError as exc:
            raise HTTPException(401, str(exc)) from exc
        assert stamp is not None and signature is not None  # verify_signature refuses a request without them
        if auth_store is None:
            raise HTTPException(401, "Slack approvals are not configured")
        approve = click.action_id == APPROVE_ACTION
        ctx = context(request)
        ctx.note("run.approve" if approve else "run.reject", click.run_id, slack_user=click.user_id)
        try:
            first = await run_in_threadpool(
                auth_store.first_sighting, "slack", signature, float(stamp), 2.0 * MAX_SKEW_S
            )
            name = users.get(click.user_id)
            identity = await run_in_threadpool(auth_store.identity_named, name) if name else None
        except (InfraError, StoreError) as exc:
            raise HTTPException(503, "authentication unavailable") from exc
        if not first:
            raise HTTPException(401, "replayed Slack request: this signature was seen before")
        refusal = _slack_refusal(click.user_id, name, identity)
        if refusal:
            ctx.actor, ctx.outcome = f"slack:{click.user_id}", "denied"
            return {"response_type": "ephemeral", "replace_original": False, "text": refusal}
        assert identity is not None
        ctx.identity = identity
        result = await run_in_threadpool(decide, click.run_id, approve, identity.name, "slack", "")
        verb = "approved" if result["status"] == "approved" else "rejected"
        return {
            "response_type": "in_channel",
            "replace_original": True,
            "text": f"Run {click.run_id} {verb} by {identity.name} (<@{click.user_id}>)",
        }

    return router


def _slack_refusal(user_id: str, name: str | None, identity: Identity | None) -> str:
    """Why a Slack user's click is refused ("" when it is not), as Slack shows it to them."""
    if name is None:
        return (
            f"<@{user_id}> is not a ClusterMedic operator: nothing was decided. An admin maps Slack users to "
            "operators in CLUSTERMEDIC_REMEDIATION_SLACK_USERS."
        )
    if identity is None:
        return f"<@{user_id}> maps to {name!r}, which has no active ClusterMedic token: nothing was decided."
    if not identity.role.allows(Role.OPERATOR):
        return (
            f"<@{user_id}> maps to {name!r}, a {identity.role.value}: approving needs an operator. Nothing was decided."
        )
    return ""
