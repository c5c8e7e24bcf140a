"""Reinforcement-learning wrappers: a Gymnasium env and an OpenEnv environment over one core.

Both build a fresh :class:`Simulator` on every reset (the seed decides traffic, faults and noise),
let the agent act, then advance ``decision_interval`` simulated seconds; the reward is the mean SLO
grade of those seconds.
"""

from __future__ import annotations

import uuid
from typing import Any

import gymnasium as gym
import numpy as np
from openenv.core.env_server import Action, Environment, Observation, State

from services.simulator.policies import REBOOT_XIDS, RESET_XIDS
from services.simulator.scenario import Scenario, load_scenario
from services.simulator.simulator import Simulator

_DEP_FEATURES = 5
_CLUSTER_FEATURES = 6


class SimCore:
    """Shared episode logic: build, observe as a vector, macro actions, advance.

    Args:
        scenario: a scenario (name/path/model); default: random faults on the default cluster.
        decision_interval: simulated seconds per agent step.
        duration_s: episode length (default: the scenario's).
    """

    def __init__(
        self, scenario: str | Scenario | None = None, decision_interval: float = 15.0, duration_s: float | None = None
    ) -> None:
        if isinstance(scenario, Scenario):
            self.scenario = scenario
        else:
            self.scenario = load_scenario(scenario or "random")
        self.interval = decision_interval
        self.duration = duration_s or self.scenario.duration_s
        self.sim = Simulator(self.scenario, seed=0, telemetry=False)
        self.deps = list(self.sim.cluster.deployments)

    def reset(self, seed: int) -> None:
        """Start a new episode."""
        self.sim = Simulator(self.scenario, seed=seed, telemetry=False)

    @property
    def n_actions(self) -> int:
        """noop, then (scale up, scale down, favour) per deployment, then three repair macros."""
        return 1 + 3 * len(self.deps) + 3

    def vector(self) -> np.ndarray:
        """Observation vector in [0, ~1]."""
        obs = self.sim.observe()
        out: list[float] = []
        slo = self.scenario.slo
        for name in self.deps:
            d = obs["deployments"][name]
            out += [
                d["ready"] / max(1, d["replicas"]),
                d["kv_usage"],
                min(1.0, d["waiting"] / (10.0 * max(1, d["ready"]))),
                min(2.0, d["ttft_s"] / slo.ttft_s),
                d["weight"],
            ]
        nodes = obs["nodes"].values()
        gpus = obs["gpus"].values()
        n_gpus = self.sim.cluster.gpus.n
        out += [
            min(1.0, obs["error_rate"]),
            sum(n["free_gpus"] for n in nodes) / n_gpus,
            sum(1 for g in gpus if g["xid"]) / n_gpus,
            max((g["fb_used_frac"] for g in gpus), default=0.0),
            sum(1 for n in nodes if not n["ready"]) / len(self.sim.cluster.nodes),
            float(obs["score"]),
        ]
        return np.asarray(out, dtype=np.float32)

    def act(self, a: int) -> None:
        """Apply macro action ``a``."""
        sim = self.sim
        if a <= 0:
            return
        obs = sim.observe()
        k = a - 1
        if k < 3 * len(self.deps):
            name = self.deps[k // 3]
            d = obs["deployments"][name]
            op = k % 3
            if op == 0:
                sim.actions.scale(name, d["replicas"] + 1)
            elif op == 1 and d["replicas"] > 1:
                sim.actions.scale(name, d["replicas"] - 1)
            elif op == 2:
                w = {n: obs["deployments"][n]["weight"] * 0.8 for n in self.deps}
                w[name] += 0.2
                sim.actions.set_router_weights(w)
            return
        macro = k - 3 * len(self.deps)
        if macro == 0:
            bad = [
                n
                for n, p in obs["pods"].items()
                if p["phase"] == "Running" and (p["errors_fast"] or p["progress_stalled"])
            ]
            bad = bad or [n for n, p in obs["pods"].items() if p["phase"] == "Crashed"]
            if bad:
                sim.actions.restart_pod(bad[0])
        elif macro == 1:
            bad = [u for u, g in obs["gpus"].items() if g["xid"] in RESET_XIDS or g["ecc_dbe"] > 0]
            if bad:
                sim.actions.reset_gpu(bad[0])
        else:
            bad = [g["node"] for g in obs["gpus"].values() if g["xid"] in REBOOT_XIDS]
            bad = bad or [n for n, v in obs["nodes"].items() if not v["ready"] and not v["rebooting"]]
            if bad:
                sim.actions.reboot_node(bad[0])

    def advance(self) -> tuple[float, bool]:
        """Run one decision interval; return (mean step score, episode over)."""
        scores = []
        end = min(self.duration, self.sim.t + self.interval)
        while self.sim.t < end:
            self.sim.step()
            scores.append(self.sim.last_stats["score"])
        return float(np.mean(scores)) if scores else 0.0, self.sim.t >= self.duration


class ClusterEnv(gym.Env[np.ndarray, int]):
    """Gymnasium environment: Box observation, Discrete macro actions, reward = SLO grade.

    Args:
        scenario: scenario name, path or model (default ``random``).
        decision_interval: simulated seconds per step.
        duration_s: episode length.
    """

    metadata = {"render_modes": []}

    def __init__(
        self, scenario: str | Scenario | None = None, decision_interval: float = 15.0, duration_s: float | None = None
    ) -> None:
        self.core = SimCore(scenario, decision_interval, duration_s)
        n = _DEP_FEATURES * len(self.core.deps) + _CLUSTER_FEATURES
        self.observation_space = gym.spaces.Box(0.0, 2.0, shape=(n,), dtype=np.float32)
        self.action_space: gym.spaces.Discrete = gym.spaces.Discrete(self.core.n_actions)  # type: ignore[assignment]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """New episode; the seed fixes traffic and faults (drawn from gymnasium's seeding when None)."""
        super().reset(seed=seed)
        episode_seed = int(seed) if seed is not None else int(self.np_random.integers(0, 2**31 - 1))
        self.core.reset(episode_seed)
        return np.clip(self.core.vector(), 0.0, 2.0), {"seed": episode_seed}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Act, advance one decision interval, return (obs, reward, terminated, truncated, info)."""
        self.core.act(int(action))
        reward, done = self.core.advance()
        return np.clip(self.core.vector(), 0.0, 2.0), reward, done, False, {"t": self.core.sim.t}


class ClusterAction(Action):
    """An OpenEnv action: any actuator by name (``noop`` to just advance)."""

    kind: str = "noop"
    target: str = ""
    params: dict[str, Any] = {}


class ClusterObservation(Observation):
    """An OpenEnv observation: the dashboards' view plus the last action's outcome."""

    t: float = 0.0
    view: dict[str, Any] = {}
    last_action: dict[str, Any] = {}


class ClusterState(State):
    """OpenEnv state: episode id, steps, seed and simulated time."""

    seed: int = 0
    t: float = 0.0
    scenario: str = ""


class ClusterOpenEnv(Environment[ClusterAction, ClusterObservation, ClusterState]):
    """OpenEnv environment over the same core (serve it with ``create_app``)."""

    def __init__(
        self, scenario: str | Scenario | None = None, decision_interval: float = 15.0, duration_s: float | None = None
    ) -> None:
        super().__init__()
        self.core = SimCore(scenario, decision_interval, duration_s)
        self._state = ClusterState(episode_id=str(uuid.uuid4()), step_count=0, scenario=self.core.scenario.name)

    def _obs(self, reward: float | None, done: bool, last: dict[str, Any]) -> ClusterObservation:
        view = self.core.sim.observe()
        view.pop("recent_arrivals", None)
        return ClusterObservation(done=done, reward=reward, t=self.core.sim.t, view=view, last_action=last)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> ClusterObservation:
        """New episode for ``seed`` (0 when None)."""
        s = int(seed or 0)
        self.core.reset(s)
        self._state = ClusterState(
            episode_id=episode_id or str(uuid.uuid4()), step_count=0, seed=s, scenario=self.core.scenario.name
        )
        return self._obs(None, False, {})

    def step(self, action: ClusterAction, timeout_s: float | None = None, **kwargs: Any) -> ClusterObservation:
        """Apply the action, advance one decision interval."""
        last: dict[str, Any] = {}
        if action.kind != "noop":
            res = self.core.sim.actions.apply(action.kind, action.target, action.params)
            last = {
                "id": res.id,
                "kind": res.kind,
                "accepted": res.accepted,
                "message": res.message,
                "eta_s": res.eta_s,
            }
        reward, done = self.core.advance()
        self._state.step_count += 1
        self._state.t = self.core.sim.t
        return self._obs(reward, done, last)

    @property
    def state(self) -> ClusterState:
        """Current episode state."""
        return self._state


def create_openenv_app(scenario: str | None = None) -> Any:
    """FastAPI app serving :class:`ClusterOpenEnv` through openenv's ``create_app``."""
    from openenv.core.env_server import create_app

    return create_app(lambda: ClusterOpenEnv(scenario), ClusterAction, ClusterObservation, env_name="clustermedic-sim")
