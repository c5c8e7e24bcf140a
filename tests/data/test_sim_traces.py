"""The simulator replaying recorded LLM request traces from ../shared/data/llm_traces."""

from __future__ import annotations

import numpy as np
import pytest

from services.core.errors import ConfigError
from services.simulator import runner
from services.simulator.traffic import TraceTraffic, trace_path


def test_trace_replay() -> None:
    try:
        trace_path("conv")
    except ConfigError as exc:
        pytest.fail(str(exc))
    t = TraceTraffic(np.random.default_rng(0), "conv", time_scale=2.0)
    total = sum(t.arrivals(float(s), 1.0).total for s in range(60))
    assert total > 100  # ~5 req/s in the trace, doubled
    g = runner.run("trace_replay", 0, 0.0, "null", 120.0)
    assert g.requests > 100
