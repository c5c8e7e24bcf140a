"""Rule detectors' states go to JSON through ``rules_common.plain``: the same data ``asdict`` gives, no shared lists.

The states are built by running the rules over a seeded simulator scenario, so every kind of track
(counters, conditions, readings, hold records) is populated. The XID rules' state is built from the
simulator's XID faults, which need NVIDIA's catalog: tests/data/test_rules_state_xid.py.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pytest

from pipelines.detectors.rules_common import plain
from pipelines.detectors.rules_gpu import GpuRuleDetector
from pipelines.detectors.rules_kube import KubeEventDetector
from pipelines.detectors.rules_serving import ServingRuleDetector
from pipelines.detectors.rules_slo import SloBurnDetector
from services.core.events import KubeEvent, MetricBatch
from services.simulator.scenario import load_scenario
from services.simulator.simulator import Simulator
from services.simulator.sinks import MemorySink


@pytest.fixture(scope="module")
def telemetry() -> list[Any]:
    sink = MemorySink()
    Simulator(load_scenario("node_flapping"), seed=3, sinks=[sink]).run(900.0)
    return sink.events


@pytest.mark.parametrize(
    "make",
    [GpuRuleDetector, ServingRuleDetector, SloBurnDetector, KubeEventDetector],
    ids=lambda d: d.__name__,
)
def test_plain_state_equals_asdict_and_round_trips(make: Any, telemetry: list[Any]) -> None:
    detector = make()
    wanted = KubeEvent if isinstance(detector, KubeEventDetector) else MetricBatch
    state = detector.initial_state()
    for event in telemetry:
        if isinstance(event, wanted):
            state, _ = detector.detect([event], state)
    out = state.to_dict()
    assert out == asdict(state)
    assert len(json.dumps(out)) > 100  # the scenario populated the state
    restored = type(state).from_dict(json.loads(json.dumps(out)))
    assert restored == state


def test_plain_copies_containers_instead_of_sharing_them() -> None:
    points = [[1.0, 2.0]]
    source = {"track": {"points": points}, "pair": (1, [2])}
    copied = plain(source)
    assert copied == source
    points.append([3.0, 4.0])
    assert copied["track"]["points"] == [[1.0, 2.0]]
    assert copied["pair"][1] is not source["pair"][1]
