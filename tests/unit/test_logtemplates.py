"""Behaviour of the log-template detector and the log-parsing accuracy metrics."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from pipelines.detectors.logtemplates import (
    MINER_SETTINGS,
    LogTemplateDetector,
    LogTemplateState,
    grouping_accuracy,
    match_signature,
    mine_templates,
    parsing_accuracy,
)
from pipelines.detectors.masking import generic_template
from services.core.events import Anomaly, LogRecord

POD = {"pod": "vllm-llama-0", "namespace": "serving", "node": "gpu-node-3"}
KERNEL = {"job": "node-journal", "unit": "kernel", "node": "gpu-node-3"}

NORMAL_TEMPLATES = (
    "INFO {i} Avg prompt throughput: {a}.{b} tokens/s, Avg generation throughput: {b}.{a} tokens/s",
    "INFO {i} Running: {a} reqs, Swapped: 0 reqs, Pending: {b} reqs, GPU KV cache usage: {b}.{a}%",
    'INFO {i} 10.0.{a}.{b}:5{a}0{b} - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    "INFO {i} Finished request cmpl-{a}{b}f3a{i} in {a}.{b} s",
)


def normal_lines(start: int, n: int) -> Iterator[str]:
    """Steady vLLM-like serving logs: a few templates with changing numbers and addresses."""
    for i in range(start, start + n):
        template = NORMAL_TEMPLATES[i % len(NORMAL_TEMPLATES)]
        yield template.format(i=i, a=i % 7 + 1, b=i % 11 + 2)


def records(lines: Iterator[str] | list[str], t0: float, step: float = 1.0) -> list[LogRecord]:
    return [LogRecord(stream=POD, line=line, ts=t0 + k * step) for k, line in enumerate(lines)]


def warmed(detector: LogTemplateDetector, lines: int = 400) -> LogTemplateState:
    """A state that has learned steady logs at one line a second."""
    state, anomalies = detector.detect(records(normal_lines(0, lines), t0=0.0), detector.initial_state())
    assert anomalies == []
    return state


def signals(anomalies: list[Anomaly]) -> list[str]:
    return [a.signal for a in anomalies]


@pytest.fixture
def detector() -> LogTemplateDetector:
    return LogTemplateDetector(warmup_lines=200, window_s=60.0, burst_min_windows=3, burst_min_count=20)


def test_xid_79_line_is_a_critical_gpu_xid_with_code_and_pci(detector: LogTemplateDetector) -> None:
    line = "kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
    batch = [LogRecord(stream={"node": "gpu-node-3", "job": "node-journal", "unit": "kernel"}, line=line, ts=1000.0)]

    _, anomalies = detector.detect(batch, detector.initial_state())

    assert signals(anomalies) == ["gpu_xid"]
    xid = anomalies[0]
    assert xid.severity == "critical"
    assert xid.detector == "log_templates"
    assert xid.entity == "gpu-node-3"
    assert xid.evidence["xid"] == 79
    assert xid.evidence["pci"] == "0000:3b:00"
    assert xid.evidence["example"] == line
    assert {"template", "template_id", "count", "score", "threshold"} <= set(xid.evidence)
    assert xid.provenance.source == "kernel_log"
    assert xid.provenance.trusts("gpu_fault")


def test_application_xid_is_only_a_warning() -> None:
    match = match_signature("NVRM: Xid (PCI:0000:3b:00): 13, pid=77, Graphics Exception: ESR 0x404600", kernel=True)
    assert match is not None
    assert (match.signal, match.severity, match.details["xid"]) == ("gpu_xid", "warning", 13)


def test_cuda_oom_traceback_yields_one_cuda_oom(detector: LogTemplateDetector) -> None:
    traceback = [
        "ERROR 05-12 10:01:02 engine.py:165 Traceback (most recent call last):",
        '  File "/usr/lib/python3.11/site-packages/vllm/worker/model_runner.py", line 1500, in execute_model',
        "    hidden_states = model_executable(**inputs)",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
        "capacity of 79.10 GiB of which 1.02 GiB is free.",
    ]
    state = warmed(detector)

    _, anomalies = detector.detect(records(traceback, t0=500.0), state)

    oom = [a for a in anomalies if a.signal == "cuda_oom"]
    assert len(oom) == 1
    assert oom[0].severity == "critical"
    assert oom[0].entity == "vllm-llama-0"
    assert "CUDA out of memory" in oom[0].evidence["example"]


@pytest.mark.parametrize(
    ("line", "signal"),
    [
        (
            "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4211, OpType=ALLREDUCE, "
            "NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for 600041 milliseconds before timing out.",
            "nccl_timeout",
        ),
        ("vllm.engine.async_llm_engine.AsyncEngineDeadError: Background loop has errored already.", "engine_dead"),
        ("ERROR: Engine loop is not running. Inspect the stacktrace to find the original error", "engine_dead"),
        ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.", "engine_dead"),
    ],
)
def test_known_error_signatures(detector: LogTemplateDetector, line: str, signal: str) -> None:
    _, anomalies = detector.detect([LogRecord(stream=POD, line=line, ts=10.0)], detector.initial_state())
    assert signals(anomalies) == [signal]
    assert anomalies[0].severity == "critical"


def test_signature_fires_once_per_batch_with_line_count(detector: LogTemplateDetector) -> None:
    line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
    batch = [LogRecord(stream=KERNEL, line=line, ts=float(k)) for k in range(3)]
    _, anomalies = detector.detect(batch, detector.initial_state())
    assert signals(anomalies) == ["gpu_xid"]
    assert anomalies[0].evidence["lines_in_batch"] == 3


def test_steady_normal_logs_raise_nothing(detector: LogTemplateDetector) -> None:
    state = warmed(detector)
    _, anomalies = detector.detect(records(normal_lines(400, 600), t0=400.0), state)
    assert anomalies == []


def test_unseen_template_after_warmup_is_new(detector: LogTemplateDetector) -> None:
    state = warmed(detector)
    line = "WARNING 05-12 10:03:00 scheduler.py:1200 Sequence group 42 is preempted by PreemptionMode.RECOMPUTE"

    _, anomalies = detector.detect(records([line], t0=400.0), state)

    assert signals(anomalies) == ["log_new_template"]
    new = anomalies[0]
    assert new.evidence["example"] == line
    assert "<NUM>" in new.evidence["template"]
    assert new.entity == "vllm-llama-0"


def test_unseen_template_during_warmup_is_learned_quietly(detector: LogTemplateDetector) -> None:
    lines = [*normal_lines(0, 50), "some brand new start-up message", *normal_lines(50, 50)]
    _, anomalies = detector.detect(records(lines, t0=0.0), detector.initial_state())
    assert anomalies == []


def test_a_template_seen_twice_in_a_long_history_is_rare(detector: LogTemplateDetector) -> None:
    odd = "Restarting block manager on executor {} after heartbeat loss"
    lines = [*normal_lines(0, 100), odd.format(1), *normal_lines(100, 2000)]
    state, _ = detector.detect(records(lines, t0=0.0, step=0.5), detector.initial_state())

    _, anomalies = detector.detect(records([odd.format(2)], t0=2000.0), state)

    assert signals(anomalies) == ["log_rare_template"]
    assert anomalies[0].evidence["count"] == 2


def test_burst_of_one_template_is_reported_once(detector: LogTemplateDetector) -> None:
    state = warmed(detector, lines=600)  # ten minutes at one line a second: each template ~15/minute
    noisy = [f"INFO {i} Finished request cmpl-{i}f3a in 0.{i % 9} s" for i in range(400)]

    _, anomalies = detector.detect(records(noisy, t0=600.0, step=0.1), state)

    bursts = [a for a in anomalies if a.signal == "log_template_burst"]
    assert len(bursts) == 1, signals(anomalies)
    burst = bursts[0]
    assert burst.score >= burst.threshold == detector.burst_factor
    assert burst.evidence["rate"] > burst.evidence["baseline_rate"]
    assert "Finished request" in burst.evidence["template"]


def test_state_round_trips_through_json(detector: LogTemplateDetector) -> None:
    state = warmed(detector)
    restored = LogTemplateState.from_json(json.loads(json.dumps(state.to_json())))
    assert restored.to_dict() == state.to_dict()

    follow_up = [
        *normal_lines(400, 40),
        "NVRM: Xid (PCI:0000:86:00): 48, pid=99, An uncorrectable double bit error (DBE) has been detected",
        "brand new line about a completely different thing 17",
    ]
    _, expected = detector.detect(records(follow_up, t0=400.0), state)
    _, got = detector.detect(records(follow_up, t0=400.0), restored)

    assert [a.model_dump() for a in got] == [a.model_dump() for a in expected]
    # the XID line is in a pod's stream: an untrusted observation, never a gpu_xid
    assert signals(got) == ["untrusted_xid_text", "log_new_template"]


def test_masks_pci_uuid_ip_and_block_ids() -> None:
    lines = [
        "GPU GPU-5d1f3c9e-8f4b-4e0a-9a41-0c2b6f7d8e11 at 0000:3b:00.0 reports 3 errors from 10.0.0.1:8000",
        "GPU GPU-a1b2c3d4-1111-2222-3333-444455556666 at 0000:86:00.0 reports 12 errors from 10.0.0.7:8000",
    ]
    templates = mine_templates(lines, MINER_SETTINGS)
    assert templates == ["GPU <*> at <*> reports <*> errors from <*>"] * 2
    assert generic_template("Received block <BLK> of size <NUM> from <IP>") == "Received block <*> of size <*> from <*>"


def test_grouping_accuracy_on_a_hand_made_example() -> None:
    truth = ["E1", "E1", "E2", "E2", "E3", "E4"]
    # E1 is split (both wrong), E2 is exact (both right), E3 and E4 are merged (both wrong).
    predicted = ["a", "b", "c", "c", "d", "d"]
    assert grouping_accuracy(truth, predicted) == pytest.approx(2 / 6)
    assert grouping_accuracy(truth, truth) == 1.0
    assert grouping_accuracy(["E1", "E2"], ["x", "x"]) == 0.0


def test_parsing_accuracy_normalises_whitespace() -> None:
    truth = ["Served block <*> to <*>", "a  b <*>", "c <*>"]
    predicted = ["Served block <*>  to <*>", "a b <*>", "c d"]
    assert parsing_accuracy(truth, predicted) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        parsing_accuracy(["x"], [])
