"""Entry points the CLI wires: run a scenario, list scenarios, grade a trajectory."""

from __future__ import annotations

import time
from pathlib import Path

from services.core.settings import Settings
from services.simulator.grader import Grade, Grader, load_trajectory
from services.simulator.policies import make_policy
from services.simulator.scenario import list_scenarios as _list
from services.simulator.scenario import load_scenario
from services.simulator.simulator import Simulator
from services.simulator.sinks import make_sink


def list_scenarios() -> list[str]:
    """Names of the shipped scenarios."""
    return _list()


def run(
    scenario: str | Path | None,
    seed: int,
    speed: float,
    sink: str,
    duration_s: float | None,
    settings: Settings | None = None,
    policy: str = "noop",
    trajectory: Path | None = None,
) -> Grade:
    """Run one episode and return its grade.

    Args:
        scenario: shipped name, YAML path, or None for the default cluster.
        seed: episode seed.
        speed: simulated seconds per wall second; 0 or less runs as fast as possible.
        sink: sink spec (see :func:`services.simulator.sinks.make_sink`).
        duration_s: simulated seconds (None: the scenario's).
        settings: process settings (Kafka sink).
        policy: ``noop``, ``static`` or ``autoscaler``.
        trajectory: where to save the step records for :func:`grade`.
    """
    sc = load_scenario(scenario)
    sim = Simulator(sc, seed=seed)
    sim.sinks.append(make_sink(sink, settings, sim.node_of, [n.name for n in sim.cluster.nodes]))
    start = time.monotonic()

    def pace(s: Simulator, _events: object) -> None:
        if speed > 0:
            ahead = s.t / speed - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)  # real-time pacing for demos; tests never use speed > 0

    try:
        result = sim.run(duration_s, policy=make_policy(policy), on_step=pace)
    finally:
        sim.close()
    if trajectory is not None:
        sim.grader.save(trajectory)
    return result


def grade(trajectory: Path, scenario: str | Path | None = None, seed: int = 0, policy: str = "") -> Grade:
    """Re-grade a saved trajectory (deterministic: the same file gives the same grade)."""
    sc = load_scenario(scenario)
    g = Grader(sc.slo)
    for rec in load_trajectory(trajectory):
        g.record(rec)
    return g.grade(sc.name, seed, policy, [])
