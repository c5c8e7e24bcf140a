"""Running a seeded simulator scenario and picking its telemetry apart (tests/unit and tests/data)."""

from __future__ import annotations

from services.core.events import Event, KubeEvent, LogRecord, MetricBatch
from services.simulator.scenario import load_scenario
from services.simulator.simulator import Simulator
from services.simulator.sinks import MemorySink


def run(name: str, seconds: float = 720.0) -> tuple[Simulator, list[Event]]:
    """Run scenario ``name`` (seed 3) for ``seconds`` of simulated time; return it and what it emitted."""
    sink = MemorySink()
    sim = Simulator(load_scenario(name), seed=3, sinks=[sink])
    sim.run(seconds)
    return sim, sink.events


def values(events: list[Event], metric: str, entity: str | None = None) -> list[float]:
    """Every value of ``metric`` (of ``entity``'s batches, when given)."""
    return [
        s.value
        for e in events
        if isinstance(e, MetricBatch) and (entity is None or e.entity == entity)
        for s in e.samples
        if s.name == metric
    ]


def logs(events: list[Event], needle: str) -> list[LogRecord]:
    """The log records whose line holds ``needle``."""
    return [e for e in events if isinstance(e, LogRecord) and needle in e.line]


def kube(events: list[Event], reason: str) -> list[KubeEvent]:
    """The Kubernetes events of ``reason``."""
    return [e for e in events if isinstance(e, KubeEvent) and e.reason == reason]


def score(name: str, seconds: float = 900.0) -> float:
    """The grade of scenario ``name`` (seed 3, no telemetry) left to itself for ``seconds``."""
    return Simulator(load_scenario(name), seed=3, telemetry=False).run(seconds).score
