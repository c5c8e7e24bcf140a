"""Baseline policies: do nothing, static thresholds, and a variant-aware predictive autoscaler.

A policy is a callable taking the simulator; it reads :meth:`Simulator.observe` (dashboards, no
fault ground truth) and acts through ``sim.actions``. The simulator calls it every decision interval.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from services.simulator.simulator import Simulator

# XIDs whose catalog resolution needs a GPU reset or a node reboot.
RESET_XIDS = {48, 64, 74, 95, 119}
REBOOT_XIDS = {79}


class Policy:
    """Base class: ``name`` for grades, ``__call__`` to act."""

    name = "policy"

    def __call__(self, sim: Simulator) -> None:
        """Look and act."""


class NoOpPolicy(Policy):
    """Never acts: the floor every other policy should beat."""

    name = "noop"


class _Reflexes:
    """Fault reflexes shared by the acting baselines (what a basic on-call runbook does)."""

    def __init__(self) -> None:
        self._handled: dict[str, float] = {}
        self._stalled: dict[str, int] = {}

    def _once(self, key: str, t: float, cooldown: float) -> bool:
        if t - self._handled.get(key, -1e9) < cooldown:
            return False
        self._handled[key] = t
        return True

    def reflexes(self, sim: Simulator, obs: dict[str, Any], vram_limit: float) -> None:
        t = sim.t
        for uuid, g in obs["gpus"].items():
            if (
                g["xid"] in REBOOT_XIDS
                and obs["nodes"][g["node"]]["ready"]
                and self._once(f"reboot:{g['node']}", t, 900)
            ):
                sim.mark_detected_entity(uuid)
                sim.actions.reboot_node(g["node"])
            elif (g["xid"] in RESET_XIDS or g["ecc_dbe"] > 0 or g["nvlink_crc"] > 2000) and self._once(
                f"reset:{uuid}", t, 300
            ):
                sim.mark_detected_entity(uuid)
                sim.actions.reset_gpu(uuid)
        for name, p in obs["pods"].items():
            if p["phase"] != "Running":
                continue
            gpus = [obs["gpus"].get(u, {}) for u in p["gpus"]]
            vram = max((g.get("fb_used_frac", 0.0) for g in gpus), default=0.0)
            stalled = self._stalled.get(name, 0) + 1 if p["progress_stalled"] else 0
            self._stalled[name] = stalled
            if (vram >= vram_limit or p["errors_fast"] or stalled >= 2) and self._once(f"restart:{name}", t, 300):
                sim.mark_detected_entity(name)
                sim.actions.restart_pod(name)
        for name, d in obs["deployments"].items():
            if d["pending"] and d["ready"] >= 1 and self._once(f"pending:{name}", t, 120):
                # Pending replicas that cannot fit: bring desired back to what runs or loads.
                sim.mark_detected_entity(name)
                sim.actions.scale(name, d["ready"] + d["loading"] + d["crashed"])


class StaticThresholdPolicy(Policy, _Reflexes):
    """Fixed thresholds: scale a deployment up at 85% KV or a queue, down when idle; runbook reflexes."""

    name = "static"

    def __init__(self) -> None:
        _Reflexes.__init__(self)

    def __call__(self, sim: Simulator) -> None:
        obs = sim.observe()
        self.reflexes(sim, obs, vram_limit=0.97)
        free = sum(n["free_gpus"] for n in obs["nodes"].values() if n["ready"] and not n["cordoned"])
        for name, d in obs["deployments"].items():
            if not self._once(f"scale:{name}", sim.t, 120):
                continue
            per_replica_wait = d["waiting"] / max(1, d["ready"])
            if (d["kv_usage"] > 0.85 or per_replica_wait > 10) and free >= d["gpus_per_replica"] and not d["pending"]:
                sim.actions.scale(name, d["replicas"] + 1)
                free -= d["gpus_per_replica"]
            elif d["kv_usage"] < 0.05 and d["waiting"] < 1 and d["replicas"] > 2:
                sim.actions.scale(name, d["replicas"] - 1)


class VariantAwareAutoscaler(Policy, _Reflexes):
    """Scales on saturation (KV-cache usage and queue depth) with a short arrival-rate forecast.

    * saturation = max(KV usage, waiting per replica / 8); the forecast adds the growth the last two
      minutes' trend predicts five minutes out;
    * scale up the cheapest variant (USD per replica-hour) that has room; scale down the most
      expensive one when the fleet is idle;
    * under pressure, shift router weight toward cheaper variants that still have headroom.
    """

    name = "autoscaler"

    def __init__(self, horizon_s: float = 300.0) -> None:
        _Reflexes.__init__(self)
        self.horizon_s = horizon_s

    def forecast_growth(self, recent: list[float]) -> float:
        """Predicted rate at the horizon / current rate, from a least-squares line over recent arrivals."""
        if len(recent) < 30:
            return 1.0
        y = np.asarray(recent, dtype=float)
        x = np.arange(y.size, dtype=float)
        slope, intercept = np.polyfit(x, y, 1)
        now = intercept + slope * x[-1]
        if now <= 0:
            return 1.0
        return float(np.clip((now + slope * self.horizon_s) / now, 0.5, 2.0))

    def __call__(self, sim: Simulator) -> None:
        obs = sim.observe()
        self.reflexes(sim, obs, vram_limit=0.95)
        deps = obs["deployments"]
        free = sum(n["free_gpus"] for n in obs["nodes"].values() if n["ready"] and not n["cordoned"])
        growth = self.forecast_growth(obs["recent_arrivals"])
        sat = {n: max(d["kv_usage"], d["waiting"] / max(1, d["ready"]) / 8.0, 0.0) * growth for n, d in deps.items()}
        unit_cost = {n: d["cost_per_hour"] / max(1, d["replicas"]) for n, d in deps.items()}
        if not self._once("scale", sim.t, 60):
            return
        hot = [n for n in deps if sat[n] > 0.7 and not deps[n]["pending"]]
        if hot:
            # Add capacity where it is cheapest among variants that can take the hot traffic.
            for name in sorted(deps, key=lambda n: (unit_cost[n], n)):
                d = deps[name]
                if d["gpus_per_replica"] <= free and not d["pending"] and sat[name] > 0.3:
                    sim.actions.scale(name, d["replicas"] + 1)
                    free -= d["gpus_per_replica"]
                    break
            cheap = [n for n in deps if sat[n] < 0.5 and deps[n]["ready"] > 0]
            if cheap:
                w = {n: deps[n]["weight"] for n in deps}
                for n in hot:
                    shift = w[n] * 0.2
                    w[n] -= shift
                    for c in cheap:
                        w[c] += shift / len(cheap)
                sim.actions.set_router_weights(w)
        elif all(s < 0.3 for s in sat.values()):
            for name in sorted(deps, key=lambda n: (-unit_cost[n], n)):
                d = deps[name]
                if d["replicas"] > 1 and d["ready"] == d["replicas"] and sat[name] < 0.2:
                    sim.actions.scale(name, d["replicas"] - 1)
                    break


POLICIES: dict[str, type[Policy]] = {
    "noop": NoOpPolicy,
    "static": StaticThresholdPolicy,
    "autoscaler": VariantAwareAutoscaler,
}


def make_policy(name: str) -> Policy:
    """Instantiate a baseline policy by name."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
