"""The XID rules' state goes to JSON as the other rules' do (tests/unit/test_rules_state.py), built from a
simulated XID 79, whose kernel message and effect come from NVIDIA's catalog."""

from __future__ import annotations

import json
from dataclasses import asdict

from pipelines.detectors.rules_xid import XidDetector
from services.core.events import MetricBatch
from services.simulator.scenario import load_scenario
from services.simulator.simulator import Simulator
from services.simulator.sinks import MemorySink


def test_the_xid_rules_plain_state_equals_asdict_and_round_trips() -> None:
    sink = MemorySink()
    Simulator(load_scenario("xid79"), seed=3, sinks=[sink]).run(420.0)  # the XID at 300 s, held for 300 s
    detector = XidDetector()
    state = detector.initial_state()
    for event in sink.events:
        if isinstance(event, MetricBatch):
            state, _ = detector.detect([event], state)
    out = state.to_dict()
    assert out == asdict(state)
    fired = [gpu["fired"] for gpu in out["gpus"].values() if gpu["last_code"] == 79]
    assert len(fired) == 1 and "79" in fired[0], fired  # the XID fired and its hold record is kept
    restored = type(state).from_dict(json.loads(json.dumps(out)))
    assert restored == state
