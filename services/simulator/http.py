"""HTTP control API over one simulator, for the remediation workers (FastAPI).

Routes: ``GET /state``, ``GET /faults``, ``GET /grade``, ``POST /actions/{kind}`` with
``{"target": ..., "params": {...}}``, ``POST /advance?seconds=N``, ``POST /faults/{id}/detected``.
"""

from __future__ import annotations

import threading
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from services.simulator.actuators import ACTIONS
from services.simulator.simulator import Simulator


class ActionBody(BaseModel):
    """Body of an action request."""

    target: str = ""
    params: dict[str, Any] = Field(default_factory=dict)


def create_http_app(sim: Simulator) -> FastAPI:
    """Build the control API for ``sim`` (calls are serialised with a lock)."""
    app = FastAPI(title="ClusterMedic simulator")
    lock = threading.Lock()

    @app.get("/state")
    def state() -> dict[str, Any]:
        with lock:
            return sim.observe()

    @app.get("/faults")
    def faults() -> list[dict[str, Any]]:
        with lock:
            return [f.summary() for f in sim.fault_list()]

    @app.get("/grade")
    def grade() -> dict[str, Any]:
        with lock:
            return sim.grade().model_dump()

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
