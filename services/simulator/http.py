"""HTTP control API over one simulator, for the remediation workers (FastAPI).

Routes: ``GET /state``, ``GET /clock`` (``t`` and ``now`` = epoch + t: the remediation executor's event
time, without a state snapshot), ``GET /faults``, ``GET /grade``, ``POST /actions/{kind}`` with
``{"target": ..., "params": {...}}``, ``GET /actions`` (every action request so far, accepted or not,
oldest first: what an audit of the cluster would show), ``POST /advance?seconds=N``,
``POST /faults/{id}/detected``;
``GET /healthz`` and ``GET /metrics`` (``clustermedic_insecure_listener{role="simulator"}``).

The control routes act on the cluster and reveal the planted faults (the grader's ground truth), so
with a token every one of them needs ``Authorization: Bearer <CLUSTERMEDIC_SIM_TOKEN>``; a server that
binds goes through :func:`control_app`, which applies the project's one listener rule
(:func:`services.core.exposure.check_listener`): no token is allowed on a loopback address only.
"""

from __future__ import annotations

import threading
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, HTTPException, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, Field

from services.core.exposure import BearerAuth, Listener, check_listener, export_listener
from services.core.settings import Settings
from services.simulator.actuators import ACTIONS
from services.simulator.simulator import Simulator


class ActionBody(BaseModel):
    """Body of an action request."""

    target: str = ""
    params: dict[str, Any] = Field(default_factory=dict)


TOKEN_VARIABLE = "CLUSTERMEDIC_SIM_TOKEN"


def create_http_app(
    sim: Simulator,
    *,
    listener: Listener | None = None,
    lock: threading.Lock | threading.RLock | None = None,
    clock_running: bool = False,
) -> FastAPI:
    """Build the control API for ``sim`` (calls are serialised with a lock).

    Args:
        sim: the simulator to control.
        listener: from :func:`control_app`: the token every control route requires (none without a
            listener: in-process use and tests) and whether it is exposed, for ``/metrics``.
        lock: the lock every use of ``sim`` takes (default: one of this app's own); a live
            simulation passes the lock its clock steps under.
        clock_running: the simulation advances on its own (``medic sim serve``): ``/advance`` is
            refused, since moving time by hand would break the wall-clock pacing.
    """
    listener = listener or Listener("simulator", "127.0.0.1", 0)
    app = FastAPI(title="ClusterMedic simulator")
    if listener.token:
        app.add_middleware(BearerAuth, token=listener.token, token_variable=TOKEN_VARIABLE)
    registry = CollectorRegistry()
    export_listener(listener, registry)
    lock = lock or threading.Lock()

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"status": "ok"}

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/state")
    def state() -> dict[str, Any]:
        with lock:
            return sim.observe()

    @app.get("/clock")
    def clock() -> dict[str, float]:
        with lock:
            return {"t": float(sim.t), "now": float(sim.epoch + sim.t)}

    @app.get("/faults")
    def faults() -> list[dict[str, Any]]:
        with lock:
            return [f.summary() for f in sim.fault_list()]

    @app.get("/grade")
    def grade() -> dict[str, Any]:
        with lock:
            return sim.grade().model_dump()

    @app.get("/actions")
    def actions() -> list[dict[str, Any]]:
        with lock:
            return [asdict(res) for res in sim.actions.log]

    @app.post("/actions/{kind}")
    def act(kind: str, body: ActionBody) -> dict[str, Any]:
        if kind not in ACTIONS:
            raise HTTPException(404, f"unknown action {kind!r}; known: {', '.join(ACTIONS)}")
        with lock:
            res = sim.actions.apply(kind, body.target, body.params)
        if not res.accepted:
            raise HTTPException(409, res.message)
        return asdict(res)

    @app.post("/advance")
    def advance(seconds: float = 15.0) -> dict[str, Any]:
        if clock_running:
            raise HTTPException(409, "the simulation runs against the wall clock (medic sim serve): time moves itself")
        with lock:
            end = sim.t + seconds
            while sim.t < end:
                sim.step()
            return {"t": sim.t, "score": sim.last_stats.get("score", 1.0)}

    @app.post("/faults/{fault_id}/detected")
    def detected(fault_id: str) -> dict[str, Any]:
        with lock:
            if not sim.mark_detected(fault_id):
                raise HTTPException(404, f"no started fault {fault_id!r}")
            return {"fault": fault_id, "t": sim.t}

    return app


def control_app(sim: Simulator, settings: Settings, *, host: str, port: int, insecure: bool = False) -> FastAPI:
    """The control API as a server binds it: the listener rule first, then the app.

    Args:
        sim: the simulator to control.
        settings: ``sim_token`` comes from here.
        host: the listen address.
        port: the listen port.
        insecure: the operator's ``--insecure``: allow a non-loopback address without a token.

    Raises:
        services.core.exposure.UnsafeListener: a non-loopback address without a token or ``insecure``.
    """
    listener = check_listener(
        "simulator", host, port, token=settings.sim_token, token_variable=TOKEN_VARIABLE, insecure=insecure
    )
    return create_http_app(sim, listener=listener)
