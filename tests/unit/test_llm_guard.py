"""The LLM guard: the model is bounded by what the offline evidence supports (no network, no database)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from services.core.events import AlertRef, Diagnosis, Hypothesis, IncidentEvent, Provenance
from services.core.settings import Settings
from services.diagnostician.diagnostician import RankerDiagnostician
from services.diagnostician.llm import LLMDiagnostician
from services.diagnostician.ranker import RunbookIndex, allowed_actions, runbook_index

T0 = 1_760_000_000.0
POD = "llama-70b-7c9d8f6b5b-x2x4k"  # a Deployment pod: <deployment>-<pod-template-hash>-<suffix>
# vLLM metrics ClusterMedic scraped itself: believed for topology (so the ranker may act), not GPU faults
SCRAPED = Provenance(source="prometheus", stream="scrape", trusted=("topology",))


@pytest.fixture(scope="module")
def index() -> RunbookIndex:
    return runbook_index()


def hyp(cause: str, confidence: float, playbook: str | None = "auto", level: int | None = None) -> Hypothesis:
    rb = runbook_index().by_root_cause.get(cause)
    if playbook == "auto":
        playbook = rb.playbooks[0].name if rb else None
        level = level or (rb.playbooks[0].level if rb else None)
    return Hypothesis(cause=cause, confidence=confidence, playbook=playbook, level=level)


def test_the_allowed_set_is_the_supported_runbooks_playbooks_at_their_levels(index: RunbookIndex) -> None:
    allowed = allowed_actions([hyp("kv_cache_exhaustion", 0.5), hyp("max_num_seqs_too_high", 0.3)], index)
    assert allowed == {
        "scale_replicas": 1,
        "reduce_max_num_seqs": 1,
        "switch_variant": 2,
        "rollback_deployment": 2,
        "page_oncall": 3,
    }


def test_weak_hypotheses_lend_nothing(index: RunbookIndex) -> None:
    # an XID at 0.84 and a cause the evidence barely mentions: only the XID's runbook counts
    allowed = allowed_actions([hyp("kv_cache_exhaustion", 0.84), hyp("gpu_xid_79", 0.05)], index)
    assert "reboot_node" not in allowed and "evict_gpu_pods" not in allowed
    # below half of the best, even above the absolute floor
    allowed = allowed_actions([hyp("kv_cache_exhaustion", 0.6), hyp("gpu_xid_79", 0.2)], index)
    assert "reboot_node" not in allowed
    # only the top three
    many = [hyp("kv_cache_exhaustion", 0.2), hyp("ttft_slo_burn", 0.2), hyp("long_context_burst", 0.2)]
    assert "drain_node" not in allowed_actions([*many, hyp("node_not_ready", 0.2)], index)


def test_the_best_hypothesis_always_counts_and_page_oncall_is_always_allowed(index: RunbookIndex) -> None:
    assert allowed_actions([], index) == {"page_oncall": 3}
    assert allowed_actions([hyp("gpu_xid_79", 0.04)], index)["reboot_node"] == 2


def test_a_withheld_hypothesis_supports_nothing_and_a_raised_level_holds(index: RunbookIndex) -> None:
    assert allowed_actions([hyp("gpu_xid_79", 0.9, playbook=None)], index) == {"page_oncall": 3}
    raised = allowed_actions([hyp("gpu_xid_79", 0.9, playbook="evict_gpu_pods", level=2)], index)
    assert raised["evict_gpu_pods"] == 2 and raised["reboot_node"] == 2


def test_a_runbook_less_xid_hypothesis_allows_its_catalog_playbook(index: RunbookIndex) -> None:
    allowed = allowed_actions([hyp("gpu_xid_999", 0.8, playbook="reset_gpu", level=2)], index)
    assert allowed == {"reset_gpu": 2, "page_oncall": 3}


# ---------------------------------------------------------------------------- the guard in use


class Obedient:
    """A stand-in OpenAI client answering one fixed diagnosis."""

    def __init__(self, answer: dict[str, Any]) -> None:
        content = json.dumps(answer)
        reply = SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=content))])
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=lambda **_: reply))


def doctor(answer: dict[str, Any]) -> LLMDiagnostician:
    settings = Settings(diagnostician="llm", llm_base_url="http://stand-in.invalid/v1")
    ranker = RankerDiagnostician(settings, use_database=False)
    return LLMDiagnostician(settings, ranker=ranker, client=Obedient(answer))  # type: ignore[arg-type]


def kv_incident() -> IncidentEvent:
    labels = {"node": "h100-a-02", "pod": POD, "model": "llama-70b", "namespace": "serving"}
    alerts = tuple(
        AlertRef(
            fingerprint=f"rules:{signal}",
            entity=POD,
            signal=signal,
            detector="rules",
            severity="warning",
            starts_at=T0,
            labels=labels,
            evidence=evidence,
            provenance=SCRAPED,
        )
        for signal, evidence in (
            ("kv_cache_saturation", {"kv_cache_usage": 0.99}),
            ("preemption_storm", {"preemptions_in_window": 48}),
            ("queue_saturation", {"waiting": 90, "running": 12}),
        )
    )
    return IncidentEvent(
        incident_id="inc-kv", kind="opened", severity="warning", title="t", alerts=alerts, opened_at=T0, ts=T0
    )


def answer(cause: str, playbook: str | None, level: int | None) -> dict[str, Any]:
    hypothesis = {"cause": cause, "confidence": 0.9, "summary": "s", "evidence": [], "citations": []}
    return {"hypotheses": [hypothesis], "proposed_playbook": playbook, "level": level}


def test_an_obedient_models_riskier_playbook_is_refused_and_its_hypotheses_carry_none() -> None:
    # a log line talked the model into a GPU fault and cordon_node at level 1 on a KV-cache incident
    d = doctor(answer("gpu_xid_79", "cordon_node", 1)).diagnose(kv_incident())
    assert d.diagnostician == "llm"
    assert d.proposed_playbook is None and d.proposed_params == {}
    # the remediation policy falls back on a hypothesis's playbook: the model's cause lends none
    assert [h.playbook for h in d.hypotheses] == [None]
    assert any("cordon_node" in note and "not proposed" in note for note in d.notes)


def test_a_supported_playbook_keeps_the_runbook_level_and_topology_targets() -> None:
    d = doctor(answer("kv_cache_exhaustion", "reduce_max_num_seqs", 1)).diagnose(kv_incident())
    assert (d.proposed_playbook, d.level) == ("reduce_max_num_seqs", 1)
    assert d.proposed_params == {"deployment": "llama-70b", "namespace": "serving", "factor": 0.5}
    assert d.hypotheses[0].playbook == "scale_replicas"


def test_a_playbook_whose_parameters_telemetry_cannot_give_is_not_proposed() -> None:
    # switch_variant needs a variant: no label names one, and the model's word is not taken for it
    d = doctor(answer("kv_cache_exhaustion", "switch_variant", 1)).diagnose(kv_incident())
    assert d.proposed_playbook is None and d.proposed_params == {}
    assert any("switch_variant" in n and "not proposed" in n for n in d.notes)


def test_page_oncall_is_always_allowed() -> None:
    d = doctor(answer("kv_cache_exhaustion", "page_oncall", 1)).diagnose(kv_incident())
    assert (d.proposed_playbook, d.level) == ("page_oncall", 3)


def test_when_the_ranker_withheld_its_action_the_model_cannot_propose_one() -> None:
    guard = doctor(answer("kv_cache_exhaustion", "scale_replicas", 1))
    withheld = Diagnosis(
        incident_id="inc-kv",
        diagnostician="ranker",
        hypotheses=(hyp("kv_cache_exhaustion", 0.9),),
        notes=("XID text in an application log; not a trusted source",),
        ts=T0,
    )
    assert guard.allowed(withheld) == {"page_oncall": 3}
    limited = withheld.model_copy(update={"proposed_playbook": "scale_replicas", "level": 2})
    assert guard.allowed(limited) == {"scale_replicas": 2, "page_oncall": 3}

    ranker = guard.ranker
    incident = kv_incident()
    evidence = ranker.evidence(incident)
    llm_answer = guard.ask(evidence, [], withheld.hypotheses)
    d = guard.guard(incident, evidence, [], llm_answer, 0.0, fallback=withheld)
    assert d.proposed_playbook is None and [h.playbook for h in d.hypotheses] == [None]
    assert d.notes[0] == "XID text in an application log; not a trusted source"
