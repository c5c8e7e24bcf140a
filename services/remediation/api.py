"""The remediation HTTP API: a FastAPI router the API service mounts.

Routes (under ``/remediation``): ``GET /runs``, ``GET /runs/{run_id}`` (run, steps, approval, audit),
``POST /runs/{run_id}/approve``, ``POST /runs/{run_id}/reject`` and ``POST /slack/interactions``
(signed Slack button clicks).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from services.remediation.errors import ApprovalError, SignatureError
from services.remediation.executor import Executor
from services.remediation.slack import APPROVE_ACTION, parse_interaction, verify_signature

ROUTER_PREFIX = "/remediation"
# Signed by Slack (verify_signature), not by the API's bearer token, which Slack cannot send.
SLACK_INTERACTIONS_ROUTE = "/slack/interactions"


class ApprovalBody(BaseModel):
    """Body of an approve or reject request."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    approver: str = Field(min_length=1)
    comment: str = ""


def create_router(
    executor: Callable[[], Executor], *, slack_signing_secret: str = "", clock: Callable[[], float] = time.time
) -> APIRouter:
    """Build the router.

    Args:
        executor: returns the process's executor (built at the API entrypoint).
        slack_signing_secret: the Slack app's signing secret; empty refuses every Slack request.
        clock: UNIX time, for the Slack timestamp check.
    """
    router = APIRouter(prefix=ROUTER_PREFIX, tags=["remediation"])

    @router.get("/runs")
    def runs(status: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        return [r.model_dump(mode="json") for r in executor().store.list_runs(status, limit)]

    @router.get("/runs/{run_id}")
    def run(run_id: str) -> dict[str, Any]:
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

    @router.post("/runs/{run_id}/approve")
    def approve(run_id: str, body: ApprovalBody) -> dict[str, Any]:
        return decide(run_id, True, body.approver, "api", body.comment)

    @router.post("/runs/{run_id}/reject")
    def reject(run_id: str, body: ApprovalBody) -> dict[str, Any]:
        return decide(run_id, False, body.approver, "api", body.comment)

    @router.post(SLACK_INTERACTIONS_ROUTE)
    async def slack(request: Request) -> dict[str, Any]:
        body = await request.body()
        try:
            verify_signature(
                slack_signing_secret,
                request.headers.get("x-slack-request-timestamp"),
                body,
                request.headers.get("x-slack-signature"),
                clock(),
            )
            action, run_id, user = parse_interaction(body)
        except SignatureError as exc:
            raise HTTPException(401, str(exc)) from exc
        result = decide(run_id, action == APPROVE_ACTION, user, "slack", "")
        verb = "approved" if result["status"] == "approved" else "rejected"
        return {"response_type": "in_channel", "replace_original": True, "text": f"Run {run_id} {verb} by {user}"}

    return router
