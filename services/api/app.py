"""The ClusterMedic HTTP API: incidents, silences, remediation runs and approvals, tokens and the audit log.

Every route but ``/healthz``, ``/metrics`` and the Slack button (which Slack signs) needs
``Authorization: Bearer <token>``: a token from ``medic token create`` (or the bootstrap token,
CLUSTERMEDIC_API_TOKEN), whose role must be at least the route's (services/auth; docs/api.md). Who
acts is the token's name, never a field of the body; every write lands in the audit log.

=====================================  ========  ==================================================
``GET /healthz``                       open      ``{"status": "ok"}``; 503 ``{"status": "down"}`` without PostgreSQL
``GET /metrics``                       open      ``clustermedic_insecure_listener{role="api"}``
``GET /api/v1/incidents``              viewer    incidents, most recently changed first (``status``, ``limit``)
``GET /api/v1/incidents/{id}``         viewer    one incident with its linked alerts, each with its evidence
``GET .../incidents/{id}/report``      viewer    its post-incident report (``format``: md, html, pdf; services/reports)
``POST /api/v1/silences``              operator  create a silence (matchers, start/end or duration, comment);
                                                 one that mutes every alert (``"all": true``) needs admin
``GET /api/v1/silences``               viewer    silences (``state``: pending, active, expired)
``GET /api/v1/silences/{id}``          viewer    one silence
``DELETE /api/v1/silences/{id}``       operator  expire a silence now
``GET /api/v1/remediation/runs``       viewer    remediation runs (``status``, ``limit``); ``/runs/{id}`` one
``POST .../runs/{id}/approve|reject``  operator  decide on a level-2 run (services/remediation/api.py)
``GET .../remediation/kill-switch``    viewer    the live kill switch; ``PUT`` (admin) stops or allows every run
``POST .../remediation/slack/...``     Slack     the Slack approval button (signed requests, mapped users)
``GET /api/v1/whoami``                 viewer    the caller's name and role
``GET|POST /api/v1/tokens``            admin     list or create tokens; ``DELETE /api/v1/tokens/{name_or_id}``
``GET /api/v1/audit``                  operator  the audit log (``actor``, ``action``, ``target``, ``outcome``,
                                                 ``since``, ``until``; pages with ``before`` and ``limit``)
``GET /api/v2/silences``               viewer    Alertmanager's API v2, for amtool and Grafana (alertmanager_v2.py)
``POST /api/v2/silences``              operator  create (or replace) a silence; one that mutes every alert needs admin
``GET /api/v2/silence/{id}``           viewer    one silence; ``DELETE`` (operator) expires it
``GET /api/v2/alerts``                 viewer    firing alerts (``active``, ``silenced``, ``inhibited``, ``filter``,
                                                 ``receiver``); ``/alerts/groups`` grouped as routing.yaml groups
``GET /api/v2/status``                 viewer    version, uptime, routing.yaml with receiver secrets masked
=====================================  ========  ==================================================

The correlate agent polls the silences table, so a silence created here mutes matching alerts within
a few seconds. Invalid input answers 422 (schema) or 400 (a matcher that does not parse, a silence
that would mute every alert without ``"all": true``, an end before the start), with a message that
says which.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager, asynccontextmanager
from datetime import datetime
from typing import Any, Literal

import psycopg
from fastapi import FastAPI, HTTPException, Query, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.alerting.durations import parse_duration
from services.alerting.errors import SilenceError
from services.api.alertmanager_v2 import PREFIX as ALERTMANAGER_V2_PREFIX
from services.api.alertmanager_v2 import create_router as alertmanager_v2_router
from services.api.database import request_connection
from services.auth.http import AuthStore, Operator, Viewer, auth_router, install
from services.auth.tokens import Role
from services.core.errors import InfraError
from services.core.exposure import OPEN_PATHS, Listener, export_listener
from services.core.settings import Settings
from services.remediation.api import ROUTER_PREFIX, SLACK_INTERACTIONS_ROUTE
from services.remediation.config import RemediationSettings
from services.remediation.executor import Executor
from services.reports.api import create_router as reports_router
from services.reports.telemetry import MetricSource
from services.store.db import connect
from services.store.incidents import get_incident, list_incidents
from services.store.silences import (
    SilenceNotFound,
    StoredSilence,
    create_silence,
    expire_silence,
    get_silence,
    list_silences,
)

API_PREFIX = "/api/v1"
SLACK_INTERACTIONS_PATH = API_PREFIX + ROUTER_PREFIX + SLACK_INTERACTIONS_ROUTE
# The only paths served without a token: a scraper's, a liveness probe's, and Slack's (signed instead).
API_OPEN_PATHS: frozenset[str] = OPEN_PATHS | {SLACK_INTERACTIONS_PATH}

log = logging.getLogger(__name__)


class SilenceBody(BaseModel):
    """Body of ``POST /api/v1/silences``.

    Give either ``ends_at`` or ``duration`` (a Prometheus duration such as ``2h``). Alertmanager's
    spellings ``startsAt``, ``endsAt`` and ``createdBy`` are accepted too. The author is the caller's
    token name: ``created_by`` is ignored (older clients send it). A silence that would mute every
    alert needs ``"all": true`` from an admin; its comment records who confirmed it.
    """

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    matchers: list[str] = Field(min_length=1, description='matcher strings such as alertname="gpu_xid"')
    starts_at: datetime | None = Field(default=None, alias="startsAt", description="default: now")
    ends_at: datetime | None = Field(default=None, alias="endsAt")
    duration: str | None = Field(default=None, description="instead of ends_at: 30m, 2h, 1d...")
    created_by: str = Field(default="", alias="createdBy", description="ignored: the author is the caller")
    comment: str = ""
    mute_all: bool = Field(default=False, alias="all", description="confirm a silence that mutes every alert (admin)")

    @model_validator(mode="after")
    def _one_end(self) -> SilenceBody:
        if (self.ends_at is None) == (self.duration is None):
            raise ValueError("give exactly one of ends_at and duration")
        if self.duration is not None:
            parse_duration(self.duration)
        for when in (self.starts_at, self.ends_at):
            if when is not None and when.tzinfo is None:
                raise ValueError("timestamps need a time zone, e.g. 2025-01-01T10:00:00Z")
        return self

    def window(self, now: float) -> tuple[float, float]:
        """``(starts_at, ends_at)`` in UNIX seconds."""
        start = self.starts_at.timestamp() if self.starts_at else now
        end = self.ends_at.timestamp() if self.ends_at else start + parse_duration(self.duration or "")
        return start, end


def create_app(
    settings: Settings,
    *,
    clock: Callable[[], float] = time.time,
    executor: Callable[[], Executor] | None = None,
    remediation: RemediationSettings | None = None,
    listener: Listener | None = None,
    report_telemetry: MetricSource | None = None,
) -> FastAPI:
    """Build the API app: every route under ``/api/v1`` behind services/auth.

    Args:
        settings: where PostgreSQL is; ``api_token`` is the bootstrap token unless ``listener`` says.
        clock: UNIX time (silence start defaults, state filters, the Slack timestamp check); injected
            by tests.
        executor: returns the remediation executor; default: built on first use from the settings
            (Celery dispatcher, remediation.yaml).
        remediation: the Slack signing secret and user mapping; default: RemediationSettings().
        listener: what :func:`services.auth.http.check_api_listener` decided (``medic api serve``);
            default: ``api_host``/``api_port`` with ``api_token``. Its token is the bootstrap token.
        report_telemetry: where reports read the plotted series; default: ``telemetry.metrics.v1``.
    """
    listener = listener or Listener("api", settings.api_host, settings.api_port, settings.api_token)
    auth_store = AuthStore(settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        auth_store.close()

    api = FastAPI(title="ClusterMedic", version="1", lifespan=lifespan)
    install(api, auth_store, bootstrap_token=listener.token, open_paths=API_OPEN_PATHS)
    registry = CollectorRegistry()
    export_listener(listener, registry)
    from services.remediation.api import create_router

    rsettings = remediation or RemediationSettings()
    built: list[Executor] = []

    def default_executor() -> Executor:
        # built on first use: the API serves incidents and silences even where Celery is not configured
        if not built:
            from services.celery_app import configure
            from services.remediation.runtime import build_executor
            from services.remediation.tasks import CeleryDispatcher

            configure(settings)
            built.append(build_executor(settings, rsettings, CeleryDispatcher()))
        return built[0]

    api.include_router(
        create_router(
            executor or default_executor,
            slack_signing_secret=rsettings.slack_signing_secret,
            clock=clock,
            slack_users=rsettings.slack_users,
            auth_store=auth_store,
        ),
        prefix=API_PREFIX,
    )
    api.include_router(auth_router(auth_store), prefix=API_PREFIX)
    api.include_router(reports_router(settings, telemetry=report_telemetry), prefix=API_PREFIX)
    api.include_router(alertmanager_v2_router(settings, clock=clock), prefix=ALERTMANAGER_V2_PREFIX)

    def db() -> AbstractContextManager[psycopg.Connection]:
        return request_connection(settings)

    @api.get("/healthz", response_model=None)
    def healthz() -> dict[str, Any] | JSONResponse:
        # open to anyone: it says up or down, never why (a connection error names hosts and users)
        try:
            with connect(settings) as conn:
                conn.execute("SELECT 1")
        except (InfraError, psycopg.Error) as exc:
            log.warning("healthz: the database does not answer: %s", exc)
            return JSONResponse({"status": "down"}, status_code=503)
        return {"status": "ok"}

    @api.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @api.get("/api/v1/incidents")
    def incidents(
        auth: Viewer,
        status: Literal["opened", "updated", "mitigated", "resolved"] | None = None,
        limit: int = Query(default=100, ge=1, le=1000),
    ) -> list[dict[str, Any]]:
        with db() as conn:
            rows = list_incidents(conn, status=status, limit=limit)
        return [row.model_dump(mode="json", exclude={"alerts"}) for row in rows]

    @api.get("/api/v1/incidents/{incident_id}")
    def incident(incident_id: str, auth: Viewer) -> dict[str, Any]:
        with db() as conn:
            row = get_incident(conn, incident_id)
        if row is None:
            raise HTTPException(404, f"no incident {incident_id!r}")
        return row.model_dump(mode="json")

    @api.post("/api/v1/silences", status_code=201)
    def add_silence(body: SilenceBody, auth: Operator) -> dict[str, Any]:
        auth.note("silence.create", matchers=body.matchers, all=body.mute_all)
        if body.created_by and body.created_by != auth.name:
            auth.note(claimed_created_by=body.created_by)  # kept for the record, never believed
        identity = auth.identity
        assert identity is not None
        if body.mute_all and not identity.role.allows(Role.ADMIN):
            raise HTTPException(
                403,
                f'a silence that mutes every alert ("all": true) needs the admin role; {auth.name!r} has '
                f"{identity.role.value}",
            )
        start, end = body.window(clock())
        try:
            with db() as conn:
                stored = create_silence(
                    conn,
                    matchers=body.matchers,
                    starts_at=start,
                    ends_at=end,
                    created_by=auth.name,
                    comment=body.comment,
                    allow_all=body.mute_all,
                    via="api",
                )
        except SilenceError as exc:
            raise HTTPException(400, str(exc)) from exc
        auth.note(target=stored.silence_id)
        return _silence(stored, clock())

    @api.get("/api/v1/silences")
    def silences(
        auth: Viewer,
        state: Literal["pending", "active", "expired"] | None = None,
        limit: int = Query(default=1000, ge=1, le=10000),
    ) -> list[dict[str, Any]]:
        now = clock()
        with db() as conn:
            return [_silence(s, now) for s in list_silences(conn, now=now, state=state, limit=limit)]

    @api.get("/api/v1/silences/{silence_id}")
    def silence(silence_id: str, auth: Viewer) -> dict[str, Any]:
        try:
            with db() as conn:
                return _silence(get_silence(conn, silence_id), clock())
        except SilenceNotFound as exc:
            raise HTTPException(404, str(exc)) from exc

    @api.delete("/api/v1/silences/{silence_id}")
    def expire(silence_id: str, auth: Operator) -> dict[str, Any]:
        auth.note("silence.expire", silence_id)
        now = clock()
        try:
            with db() as conn:
                stored = expire_silence(conn, silence_id, now=now)
        except SilenceNotFound as exc:
            raise HTTPException(404, str(exc)) from exc
        # the database keeps microseconds (rounded): judge the state at the stored end, not a hair before
        return _silence(stored, max(now, stored.ends_at.timestamp()))

    return api


def _silence(stored: StoredSilence, now: float) -> dict[str, Any]:
    out: dict[str, Any] = stored.model_dump(mode="json")
    out["state"] = stored.state(now)
    return out
