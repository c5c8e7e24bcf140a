"""One line must neither stall nor kill the log detector.

The SERIAL mask used to take 14 s on a 40 KB line (tests/unit/test_masking_linear.py feeds every mask
256 KB lines); the NCCL detail pattern was quadratic too, and its ``int()`` of a 5,000-digit SeqNum
raised ValueError, which ended the detect-logs agent and lost the rest of its micro-batch. Here the
whole detector gets 256 KB hostile lines in bounded time, and a record that makes a detector raise is
set aside (dead-lettered by the agent) while its neighbours are processed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import pytest

from pipelines.detect import detect_each_guarded
from pipelines.detectors.logtemplates import MINED_LINE_MAX, LogTemplateDetector, match_signature
from services.core.events import Anomaly, LogRecord
from tests.unit.test_masking_linear import HOSTILE

N = 256 * 1024
NCCL = "[Rank 0] Watchdog caught collective operation timeout: "
LINES = {
    **HOSTILE,
    "many WorkNCCL without a timeout": NCCL + "WorkNCCL(SeqNum=1, OpType=A " * (N // 28),
    "a 256 KB SeqNum": NCCL + "WorkNCCL(SeqNum=" + "7" * N + ", OpType=ALLREDUCE, Timeout(ms)=600000)",
    "a 256 KB xid": "NVRM: Xid (PCI:0000:3b:00): " + "7" * N + ", pid=1",
    "many xid openings": "Xid (" * (N // 5),
    "many error words": "error " * (N // 6),
    "one token per character": "a " * (N // 2),
}


@pytest.mark.timeout(30)  # a backtracking pattern takes minutes on one of these lines; nothing is timed
@pytest.mark.parametrize("shape", sorted(LINES))
@pytest.mark.parametrize("stream", [{"unit": "kernel", "node": "n"}, {"pod": "vllm-0"}], ids=["kernel", "app"])
def test_the_detector_takes_a_256_kb_hostile_line_in_bounded_time(shape: str, stream: dict[str, str]) -> None:
    detector = LogTemplateDetector()
    state = detector.initial_state()
    record = LogRecord(stream=stream, line=LINES[shape], ts=1_780_000_000.0)
    state, found = detector.detect([record], state)  # the test's timeout fails a backtracking pattern
    for anomaly in found:
        Anomaly.from_bytes(anomaly.to_bytes())


def test_a_5000_digit_nccl_number_is_a_timeout_without_details_not_a_crash() -> None:
    for line in (
        NCCL + "WorkNCCL(SeqNum=" + "7" * 5000 + ", OpType=ALLREDUCE, NumelIn=1, Timeout(ms)=600000) ran",
        NCCL + "WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=" + "7" * 5000 + ") ran",
    ):
        match = match_signature(line)
        assert match is not None and match.signal == "nccl_timeout" and match.details == {}
    usual = NCCL + "WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012"
    match = match_signature(usual)
    assert match is not None and match.details == {"seq": 12, "op": "ALLREDUCE", "timeout_ms": 600000}


def test_a_5000_digit_xid_is_not_a_gpu_fault_and_not_a_crash() -> None:
    detector = LogTemplateDetector()
    line = "NVRM: Xid (PCI:0000:3b:00): " + "7" * 5000 + ", pid=1, name=python3"
    _, found = detector.detect([LogRecord(stream={"unit": "kernel"}, line=line, ts=1.0)], detector.initial_state())
    assert [a.signal for a in found] == ["untrusted_xid_text"]


def test_the_miner_keeps_only_a_bounded_prefix_of_a_line() -> None:
    detector = LogTemplateDetector()
    state = detector.initial_state()
    state, _ = detector.detect([LogRecord(stream={"pod": "p"}, line="tok " * N, ts=1.0)], state)
    [stats] = state.templates.values()
    assert len(stats.template) <= MINED_LINE_MAX


class _Fragile:
    """A log detector with a bug one line triggers."""

    name: ClassVar[str] = "fragile"
    consumes: ClassVar[type] = LogRecord

    def initial_state(self) -> list[str]:
        return []

    def detect(self, batch: Sequence[LogRecord], state: list[str]) -> tuple[list[str], list[Anomaly]]:
        found = []
        for record in batch:
            if "poison" in record.line:
                raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")
            state.append(record.line)
            found.append(Anomaly(entity="p", signal="seen", detector=self.name, score=1.0, threshold=1.0, ts=record.ts))
        return state, found


def test_a_record_that_makes_a_detector_raise_is_set_aside_and_its_neighbours_processed() -> None:
    batch = [LogRecord(stream={"pod": "p"}, line=line, ts=1.0) for line in ("a", "poison", "b", "c")]
    detector: Any = _Fragile()
    state, found, failed = detect_each_guarded(detector, batch, [])
    assert [index for index, _ in failed] == [1]
    assert isinstance(failed[0][1], ValueError)
    assert state[-3:] == ["a", "b", "c"] and len(found) == 3
    # a clean batch is one call, as before
    state, found, failed = detect_each_guarded(detector, batch[2:], [])
    assert state == ["b", "c"] and len(found) == 2 and failed == []
