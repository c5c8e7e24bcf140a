"""The simulator actuator: the simulator's HTTP control API (services/simulator/http.py).

``GET /state`` gives the operator's view the checks read; ``POST /actions/{kind}`` acts (409 when the
simulator refuses). World time is the simulator's simulated time, so step timeouts are simulated
seconds. ``drain_replica`` / ``restore_replica`` take a replica out of the simulator's router and put
it back (the pod stays Ready; the views' ``in_rotation`` says whether the router sends it requests).

Workarounds for what the simulator API does not offer (listed in docs/remediation.md):
    * no rollout restart: ``rollout_restart`` sets ``max_num_seqs`` to its current value, which rolls
      every replica like ``kubectl rollout restart``;
    * ``/state`` omits idle healthy GPUs: a GPU seen before and absent now is reported healthy on the
      node it was seen on.
"""

from __future__ import annotations

from typing import Any

import httpx

from services.remediation.actuators.base import Actuator, ObjectKind
from services.remediation.config import ActuatorConfig
from services.remediation.errors import ActuatorError, ActuatorUnsupported
from services.remediation.model import ActionOutcome, ActionSpec

_SIM_ACTION: dict[str, str] = {
    "restart_pod": "restart_pod",
    "delete_pod": "delete_pod",
    "drain_replica": "drain_replica",
    "restore_replica": "restore_replica",
    "scale": "scale",
    "set_max_num_seqs": "set_max_num_seqs",
    "switch_variant": "switch_variant",
    "rollback_deployment": "rollback",
    "cordon_node": "cordon_node",
    "uncordon_node": "uncordon_node",
    "drain_node": "drain_node",
    "reset_gpu": "reset_gpu",
    "reboot_node": "reboot_node",
}


class SimulatorActuator(Actuator):
    """Acts on a running simulator through its HTTP control API.

    Args:
        url: base URL of the simulator's control API.
        timeout_s: per-request timeout.
        time_scale: wall seconds per simulated second for the waits between verifications.
        transport: an httpx transport (tests).
        token: the control API's bearer token (``CLUSTERMEDIC_SIM_TOKEN``), when it has one.
    """

    name = "simulator"
    operations = frozenset({*_SIM_ACTION, "rollout_restart"})

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 10.0,
        time_scale: float = 1.0,
        transport: httpx.BaseTransport | None = None,
        token: str | None = None,
    ) -> None:
        self.time_scale = time_scale
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=url, timeout=timeout_s, transport=transport, headers=headers)
        self._gpu_node: dict[str, str] = {}

    @classmethod
    def from_config(cls, config: ActuatorConfig) -> SimulatorActuator:
        return cls(config.url, timeout_s=config.timeout_s, time_scale=config.time_scale, token=config.token)

    def close(self) -> None:
        self._http.close()

    def _state(self) -> dict[str, Any]:
        try:
            resp = self._http.get("/state")
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            raise ActuatorError(f"simulator state unavailable: {exc}") from exc
        state: dict[str, Any] = resp.json()
        for uuid, gpu in state.get("gpus", {}).items():
            self._gpu_node[uuid] = gpu["node"]
        return state

    def clock(self) -> float:
        return float(self._state()["t"])

    def event_time(self) -> float:
        """The simulated UNIX time (epoch + t), from the cheap ``GET /clock`` (no state snapshot)."""
        try:
            resp = self._http.get("/clock")
            resp.raise_for_status()
            return float(resp.json()["now"])
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            raise ActuatorError(f"simulator clock unavailable: {exc}") from exc

    def act(self, action: ActionSpec) -> ActionOutcome:
        if action.op == "rollout_restart":
            dep = self.describe("deployment", action.target)
            if dep is None:
                raise ActuatorError(f"deployment {action.target} not found")
            return self._post("set_max_num_seqs", action.target, {"max_num_seqs": dep["max_num_seqs"]})
        kind = _SIM_ACTION.get(action.op)
        if kind is None:
            raise ActuatorUnsupported(f"the simulator cannot {action.op}")
        return self._post(kind, action.target, dict(action.params))

    def _post(self, kind: str, target: str, params: dict[str, Any]) -> ActionOutcome:
        try:
            resp = self._http.post(f"/actions/{kind}", json={"target": target, "params": params})
        except httpx.HTTPError as exc:
            raise ActuatorError(f"simulator {kind} {target}: {exc}") from exc
        if resp.status_code >= 400:
            detail = (
                resp.json().get("detail", resp.text)
                if resp.headers.get("content-type", "").startswith("application/json")
                else resp.text
            )
            raise ActuatorError(f"simulator refused {kind} {target}: {resp.status_code} {detail}")
        body = resp.json()
        return ActionOutcome(
            accepted=bool(body.get("accepted", True)),
            message=str(body.get("message", "")),
            eta_s=float(body.get("eta_s", 0.0)),
            data={"id": body.get("id", "")},
        )

    def describe(self, kind: ObjectKind, name: str, namespace: str = "") -> dict[str, Any] | None:
        state = self._state()
        if kind == "deployment":
            d = state["deployments"].get(name)
            if d is None:
                return None
            return {
                "replicas": int(d["replicas"]),
                "ready": int(d["ready"]),
                "max_num_seqs": d.get("max_num_seqs"),
                "variant": d.get("variant"),
                "revision": d.get("revision"),
                "in_rotation": int(d["in_rotation"]),
            }
        if kind == "pod":
            p = state["pods"].get(name)
            if p is None:
                return None
            return {
                "phase": p["phase"],
                "node": p["node"],
                "deployment": p["deployment"],
                "ready": p["phase"] == "Running",
                "in_rotation": bool(p["in_rotation"]),
            }
        if kind == "node":
            n = state["nodes"].get(name)
            if n is None:
                return None
            unhealthy = {uuid for uuid, g in state["gpus"].items() if g["node"] == name and g["xid"]}
            on_node = {pod: p for pod, p in state["pods"].items() if p["node"] == name}
            return {
                "ready": bool(n["ready"]),
                "schedulable": not n["cordoned"],
                "rebooting": bool(n["rebooting"]),
                "pods": len(on_node),
                "unhealthy_gpus": len(unhealthy),
                # the simulator has no namespaces: its pods answer to the one asked about
                "failed_gpu_pods": [
                    {
                        "pod": pod,
                        "namespace": namespace,
                        "deployment": p["deployment"],
                        "ready": p["phase"] == "Running",
                    }
                    for pod, p in on_node.items()
                    if unhealthy.intersection(p.get("gpus", ()))
                ],
            }
        g = state["gpus"].get(name)
        if g is None:
            node = self._gpu_node.get(name)
            return None if node is None else {"node": node, "healthy": True, "xid": 0}
        return {"node": g["node"], "healthy": not g["xid"], "xid": int(g["xid"])}
