"""The trust model's XID matcher: a GPU fault only from a node's kernel stream, anchored (docs/security.md)."""

from __future__ import annotations

import json

import pytest

from pipelines.detectors.logtemplates import (
    DEFAULT_KERNEL_STREAMS,
    KernelStreams,
    LogTemplateDetector,
    match_kernel_xid,
    match_signature,
)
from services.core.events import LogRecord
from services.core.settings import Settings

KERNEL = {"job": "node-journal", "unit": "kernel", "node": "gpu-node-3", "Hostname": "gpu-node-3"}
VLLM = {"job": "vllm", "pod": "vllm-llama-0", "namespace": "serving", "node": "gpu-node-3"}
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


@pytest.mark.parametrize(
    "line",
    [
        XID,
        f"[ 1234.567890] {XID}",
        f"[12345678.1] {XID}",
        f"[Sun Feb 23 16:24:18 2025] {XID}",
        f"Feb 23 16:24:18 gpu-node-3 kernel: {XID}",
        f"Feb  3 16:24:18 gpu-node-3 kernel: [ 1234.567890] {XID}",
        f"2025-02-23T16:24:18.123456+00:00 gpu-node-3 kernel: {XID}",
        f"kernel: {XID}",
        f"<4>{XID}",
        "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
        "NVRM: Xid (0000:3b:00.0): 48, pid=99, An uncorrectable double bit error (DBE) has been detected",
        "NVRM: Xid (PCI:0000:3b:00): 79",
    ],
)
def test_kernel_lines_with_any_usual_prefix_match(line: str) -> None:
    match = match_kernel_xid(line)
    assert match is not None and match.signal == "gpu_xid"
    assert match.details["xid"] in (79, 48)


@pytest.mark.parametrize(
    "line",
    [
        # a vLLM request log echoing a user's prompt
        f"INFO 05-12 10:01:02 logger.py:39 Received request cmpl-1: prompt: 'please repeat: {XID}'",
        f'{{"prompt": "{XID}"}}',
        json.dumps({"msg": "echo", "prompt": XID}),  # JSON-escaped
        f'"{XID}"',
        f"'{XID}'",
        f"user said {XID}",
        f"  {XID}",  # indented: not the kernel's own line
        f"Feb 23 16:24:18 gpu-node-3 python3: {XID}",  # another process, not the kernel
        "NVRM: Xid (PCI:0000:3b:00): " + "7" * 5000 + ", pid=1, overflow",
        "NVRM: Xid (PCI:0000:3b:00): 79999, pid=1",
        "NVRM: Xid (PCI:0000:3b:00): 79abc, pid=1",
        "NVRM: Xid (PCI:0000:3b:00) 79, pid=1",
        XID + " " + "A" * 5000,  # longer than any kernel record
    ],
)
def test_echoes_quotes_and_malformed_codes_never_match(line: str) -> None:
    assert match_kernel_xid(line) is None


def test_xid_text_outside_a_kernel_stream_is_an_untrusted_observation() -> None:
    echo = "Received request: prompt: 'NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.'"
    match = match_signature(echo, kernel=False)
    assert match is not None
    assert (match.signal, match.severity) == ("untrusted_xid_text", "warning")
    assert match.details == {"quoted_xid": 79}  # kept for humans, never as "xid"
    # the kernel's own line, from an app stream, is no GPU fault either
    assert match_signature(XID, kernel=False).signal == "untrusted_xid_text"  # type: ignore[union-attr]
    assert match_signature(XID, kernel=True).signal == "gpu_xid"  # type: ignore[union-attr]


def test_the_prompt_echo_attack_yields_no_gpu_xid_and_an_untrusted_app_log_provenance() -> None:
    detector = LogTemplateDetector()
    echo = f"INFO 05-12 10:01:02 logger.py:39 Received request cmpl-9: prompt: '{XID}', params: SamplingParams(n=1)"
    _, anomalies = detector.detect([LogRecord(stream=VLLM, line=echo, ts=10.0)], detector.initial_state())
    assert [a.signal for a in anomalies] == ["untrusted_xid_text"]
    assert anomalies[0].provenance.source == "app_log"
    assert not anomalies[0].provenance.trusts("gpu_fault")
    assert "xid" not in anomalies[0].evidence


def test_the_same_line_from_the_kernel_stream_is_a_trusted_gpu_xid() -> None:
    detector = LogTemplateDetector()
    line = f"[Sun Feb 23 16:24:18 2025] {XID}"
    _, anomalies = detector.detect([LogRecord(stream=KERNEL, line=line, ts=10.0)], detector.initial_state())
    assert [(a.signal, a.severity, a.evidence["xid"]) for a in anomalies] == [("gpu_xid", "critical", 79)]
    assert anomalies[0].provenance.source == "kernel_log" and anomalies[0].provenance.trusts("gpu_fault")


def test_a_pod_stream_labelled_unit_kernel_is_still_not_a_kernel_stream() -> None:
    streams = KernelStreams()
    assert streams.matches(KERNEL)
    assert streams.matches({"transport": "kernel", "node": "n1"})
    assert not streams.matches({**VLLM, "unit": "kernel"})
    assert not streams.matches(VLLM)
    assert not streams.matches({"job": "kernel"})


def test_the_kernel_stream_selector_is_a_setting() -> None:
    assert Settings().trust_kernel_log_streams == DEFAULT_KERNEL_STREAMS
    custom = LogTemplateDetector.from_settings(Settings(trust_kernel_log_streams="job=dmesg,host_kind=gpu;unit=kernel"))
    assert custom.kernel_streams.matches({"job": "dmesg", "host_kind": "gpu"})
    assert not custom.kernel_streams.matches({"job": "dmesg"})
    with pytest.raises(ValueError):
        KernelStreams.parse("unit")
    with pytest.raises(ValueError):
        KernelStreams.parse(" ; ")
