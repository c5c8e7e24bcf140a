"""Chunking, reciprocal rank fusion, query building and the evidence tools (no database)."""

from __future__ import annotations

from typing import Any

import pytest

from services.core.events import AlertRef, IncidentEvent, Provenance
from services.diagnostician.documents import (
    CHUNKER_VERSION,
    content_hash,
    load_documents,
    split_long,
    split_sections,
)
from services.diagnostician.kb import RRF_K, excerpt, or_query, rrf_scores
from services.diagnostician.tools import TOOLS, EvidenceTool, ToolContext, gather_evidence

T0 = 1_760_000_000.0


@pytest.fixture(scope="module")
def documents() -> list[Any]:
    return load_documents()


def test_every_runbook_and_postmortem_becomes_a_document(documents: list[Any]) -> None:
    kinds = [d.kind for d in documents]
    assert kinds.count("runbook") >= 30 and kinds.count("postmortem") >= 3
    assert len({d.doc_id for d in documents}) == len(documents)


def test_chunks_follow_sections_and_carry_title_signals_and_labels(documents: list[Any]) -> None:
    xid = next(d for d in documents if d.doc_id == "gpu-xid-79-fallen-off-bus")
    headings = [c.content.split("\n")[3] for c in xid.chunks[1:]]
    assert headings[:5] == [
        "## What it means",
        "## Why it happens",
        "## How to confirm",
        "## Remediation",
        "## Prevention",
    ]
    for chunk in xid.chunks:
        assert chunk.content.startswith("GPU has fallen off the bus (XID 79)\nSignals: root cause gpu_xid_79")
        assert "XID 79" in chunk.content and "NodeNotReady" in chunk.content
        assert chunk.labels == {"kind": "runbook", "area": "gpu", "root_cause": "gpu_xid_79"}
    assert "Symptoms:" in xid.chunks[0].content
    assert [c.position for c in xid.chunks] == list(range(len(xid.chunks)))
    pm = next(d for d in documents if d.kind == "postmortem" and d.metadata["root_cause"] == "gpu_xid_79")
    assert pm.chunks[0].labels["kind"] == "postmortem" and pm.chunks[0].labels["root_cause"] == "gpu_xid_79"


def test_headings_inside_code_fences_do_not_split() -> None:
    body = "intro\n## A\ntext\n```bash\n## not a heading\n```\n## B\nmore"
    assert [h for h, _ in split_sections(body)] == ["", "A", "B"]


def test_long_sections_split_at_paragraphs() -> None:
    text = "\n\n".join("word " * 50 for _ in range(10))
    pieces = split_long(text, limit=600)
    assert len(pieces) > 1 and all(len(p) <= 600 for p in pieces)
    assert "".join(pieces).replace("\n", "") == text.replace("\n", "")


def test_content_hash_changes_with_text_embedder_and_chunker() -> None:
    assert content_hash("a") == content_hash("a")
    assert content_hash("a") != content_hash("b")
    assert content_hash("a", "minilm") != content_hash("a", "openai")
    assert CHUNKER_VERSION


def test_rrf_matches_the_formula() -> None:
    scores = rrf_scores([["a", "b", "c"], ["c", "a"]])
    assert scores["a"] == pytest.approx(1 / (RRF_K + 1) + 1 / (RRF_K + 2))
    assert scores["c"] == pytest.approx(1 / (RRF_K + 3) + 1 / (RRF_K + 1))
    assert scores["b"] == pytest.approx(1 / (RRF_K + 2))
    assert sorted(scores, key=lambda k: -scores[k]) == ["a", "c", "b"]


def test_or_query_keeps_words_and_drops_operators() -> None:
    assert or_query('GPU "fell" off -the bus OR and') == "gpu or fell or off or bus"
    assert or_query("vllm:num_requests_waiting") == "vllm or num or requests or waiting"
    assert or_query("") == ""


def test_excerpt_drops_the_header() -> None:
    assert excerpt("Title\nSignals: x\n\n## What it means\nbody") == "## What it means\nbody"
    assert excerpt("x" * 1000, limit=50).endswith("…")


def incident(*alerts: AlertRef) -> IncidentEvent:
    return IncidentEvent(
        incident_id="inc-1", kind="opened", severity="warning", title="t", alerts=alerts, opened_at=T0, ts=T0
    )


def ref(signal: str, detector: str = "rules", entity: str = "pod-a", **evidence: Any) -> AlertRef:
    return AlertRef(
        fingerprint=f"{signal}:{entity}",
        entity=entity,
        signal=signal,
        detector=detector,
        severity="warning",
        starts_at=T0,
        labels={"node": "n1", "pod": entity, "model": "llama"},
        evidence=evidence,
    )


def test_every_registered_tool_loads_and_returns_a_result() -> None:
    inc = incident(ref("kv_cache_saturation", kv_cache_usage=0.98))
    for name in TOOLS.names():
        tool = TOOLS.load(name)
        assert issubclass(tool, EvidenceTool) and tool.name == name
        result = tool().run(ToolContext(incident=inc))
        assert result.tool == name and result.status in ("ok", "no_data")


def test_tools_report_logs_events_changes_metrics_and_topology() -> None:
    inc = incident(
        ref(
            "log_new_template",
            "log_templates",
            template="CUDA out of memory <*>",
            example="CUDA out of memory x",
            count=3,
        ),
        ref("kube_event", "kube_events", reason="ScalingReplicaSet", message="Scaled up replica set llama-7f to 2"),
        ref(
            "gpu_thermal_throttle", entity="gpu-1", DCGM_FI_DEV_GPU_TEMP=92.0, metrics={"DCGM_FI_DEV_SM_CLOCK": [1, 2]}
        ),
        ref("latency_regression", entity="llama"),
    )
    ev = gather_evidence(inc)
    logs = ev.results["log_events"].data
    assert logs["templates"][0] == {"template": "CUDA out of memory <*>", "count": 3, "example": "CUDA out of memory x"}
    assert logs["events"][0]["reason"] == "ScalingReplicaSet"
    changes = ev.results["recent_changes"].data
    assert {c["signal"] for c in changes} == {"kube_event", "latency_regression"}
    assert ev.results["metric_windows"].data["gpu-1"]["DCGM_FI_DEV_SM_CLOCK"] == [1, 2]
    assert ev.results["topology"].data["node"] == ["n1"]
    assert ev.metrics == {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK"}
    assert ev.event_reasons == {"ScalingReplicaSet"}
    assert "DCGM_FI_DEV_GPU_TEMP=92 on gpu-1" in ev.facts


def test_a_failing_tool_returns_an_error_result_instead_of_raising() -> None:
    class Broken(EvidenceTool):
        name = "broken"

        def collect(self, ctx: ToolContext) -> Any:
            raise RuntimeError("boom")

    result = Broken().run(ToolContext(incident=incident(ref("x"))))
    assert result.status == "error" and "boom" in result.error


def test_xid_codes_are_read_from_kernel_lines_too() -> None:
    line = "NVRM: Xid (PCI:0000:9b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
    kernel = Provenance(source="kernel_log", trusted=("gpu_fault", "topology"))
    alert = ref("gpu_xid", "log_templates", example=line).model_copy(update={"provenance": kernel})
    ev = gather_evidence(incident(alert))
    assert ev.xids == {79}


def test_xid_codes_in_an_alert_of_unknown_provenance_are_not_believed() -> None:
    line = "NVRM: Xid (PCI:0000:9b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
    ev = gather_evidence(incident(ref("gpu_xid", "log_templates", example=line)))
    assert ev.xids == set() and "gpu_xid" not in ev.signals
    assert "XID text in a signal of unknown provenance; not a trusted source" in ev.untrusted
