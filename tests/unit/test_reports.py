"""Post-incident reports from facts built in memory: what a reader sees for approvals, failures, missing data and
hostile text, and the telemetry arithmetic behind the plots. (The report of a real stored closed-loop incident is
tests/integration/test_reports.py.)"""

from __future__ import annotations

from datetime import UTC, datetime

from services.core.events import Citation, Hypothesis, MetricBatch, Sample
from services.remediation.model import Targets
from services.remediation.store import ApprovalRow, RunRow, StepRow
from services.reports.build import build_report, duration
from services.reports.facts import DiagnosisFact, IncidentFacts, RunFacts
from services.reports.plots import draw_plots
from services.reports.render import to_html, to_markdown
from services.reports.telemetry import (
    MemoryMetricSource,
    Telemetry,
    TelemetryScope,
    counter_ratio,
    histogram_quantile,
)
from services.store.incidents import AlertRow, IncidentRow

T = 1_800_000_000.0


def at(offset: float) -> datetime:
    return datetime.fromtimestamp(T + offset, UTC)


def alert(signal: str, entity: str, *, start: float, end: float | None, **labels: str) -> AlertRow:
    return AlertRow(
        fingerprint=f"fp-{signal}",
        incident_id="inc-1",
        entity=entity,
        signal=signal,
        detector="kube_events",
        severity="warning",
        status="resolved" if end is not None else "firing",
        labels={"node": "gpu-node-004", **labels},
        evidence={},
        starts_at=at(start),
        last_seen_at=at(end or start),
        ends_at=at(end) if end is not None else None,
    )


def incident(*alerts: AlertRow, resolved: float | None = 900.0) -> IncidentRow:
    return IncidentRow(
        incident_id="inc-1",
        group_key="g",
        title="pod_crashloop on llama-8b-fp16-abcde12345-xyz12",
        status="resolved" if resolved is not None else "updated",
        severity="warning",
        labels={},
        opened_at=at(0),
        updated_at=at(resolved or 600),
        mitigated_at=None,
        resolved_at=at(resolved) if resolved is not None else None,
        alerts=alerts,
    )


def run_facts(status: str, *, approver: str = "ana", approval: str = "approved") -> RunFacts:
    run = RunRow(
        run_id="run-1",
        incident_id="inc-1",
        playbook="drain_node",
        level=2,
        params={},
        status=status,
        decided_by="policy:ranker",
        dry_run=False,
        detail="step drain: verification did not hold in 300 s" if status == "rolled_back" else "",
        automatic=False,
        targets=Targets(nodes=("gpu-node-004",)),
        scope={},
        reasons=["level 2 needs approval"],
        observed={},
        plan=[],
        rollback_plan=[],
        rollback_state="done" if status == "rolled_back" else "",
        token="t",
        created_at=T + 40,
        started_at=T + 200,
        finished_at=T + 560,
    )
    steps = (
        StepRow(
            step_id="run-1:action:0",
            run_id="run-1",
            position=0,
            name="drain",
            kind="action",
            status="succeeded",
            attempts=1,
            started_at=T + 200,
            finished_at=T + 201,
            output={"message": "drained"},
        ),
        StepRow(
            step_id="run-1:verify:0",
            run_id="run-1",
            position=0,
            name="drain",
            kind="verify",
            status="failed" if status == "rolled_back" else "succeeded",
            attempts=12,
            started_at=T + 230,
            finished_at=T + 530,
            output={"detail": "2 pods still running"},
        ),
        StepRow(
            step_id="run-1:rollback:0",
            run_id="run-1",
            position=0,
            name="uncordon",
            kind="rollback",
            status="succeeded",
            attempts=1,
            started_at=T + 540,
            finished_at=T + 541,
            output={},
        ),
    )
    ap = ApprovalRow(
        run_id="run-1",
        status=approval,
        requested_at=T + 40,
        expires_at=T + 940,
        decided_at=T + 190,
        approver=approver,
        channel="slack",
        comment="go",
    )
    return RunFacts(run=run, steps=steps if status != "awaiting_approval" else (), approval=ap, audit=())


def diagnosis(cause: str = "node_not_ready") -> DiagnosisFact:
    return DiagnosisFact(
        id=7,
        incident_id="inc-1",
        diagnostician="ranker",
        hypotheses=(
            Hypothesis(
                cause=cause,
                confidence=0.8,
                summary="Node not ready",
                evidence=("Kubernetes event NodeNotReady",),
                citations=(Citation(doc_id="k8s-node-not-ready", title="Node NotReady"),),
                playbook="drain_node",
                level=2,
            ),
            Hypothesis(cause="node_flapping", confidence=0.3, evidence=("Kubernetes event NodeReady",)),
        ),
        proposed_playbook="drain_node",
        proposed_params={},
        level=2,
        notes=(),
        at=T + 35,
        event_time=True,
    )


def test_an_approval_shows_who_approved_and_a_rolled_back_run_becomes_a_follow_up() -> None:
    facts = IncidentFacts(
        incident=incident(
            alert(
                "pod_crashloop",
                "llama-8b-fp16-abcde12345-xyz12",
                start=0,
                end=700,
                pod="llama-8b-fp16-abcde12345-xyz12",
            )
        ),
        diagnoses=(diagnosis(),),
        runs=(run_facts("rolled_back"),),
    )
    report = build_report(facts, telemetry=None)
    texts = [e.text for e in report.timeline]
    assert "drain_node approved by ana via slack: go" in texts
    assert any(e.actor == "ana" and e.source.table == "approvals" for e in report.timeline)
    assert "Verified drain: failed after 12 checks — 2 pods still running" in texts
    assert "Rollback uncordon: succeeded" in texts
    assert report.document is not None
    md = to_markdown(report.document)
    follow = md.split("## Follow-ups", 1)[1]
    assert "Remediation drain_node `run-1` ended rolled_back: step drain: verification did not hold in 300 s." in follow
    assert "Step verify drain of drain_node failed: 2 pods still running." in follow
    assert "Rollback: 1 step(s), done." in md
    assert "`node_flapping` at 0.30, 0.50 below the chosen cause" in md
    # no telemetry was asked for: impact says so instead of guessing
    assert "> **Missing:** Failed and slowed requests are not known: telemetry unavailable" in md


def test_a_section_without_data_says_so() -> None:
    facts = IncidentFacts(incident=incident(resolved=None))
    report = build_report(facts, telemetry=None)
    assert report.document is not None
    md = to_markdown(report.document)
    assert "No alert is linked to this incident, so nothing says how it was detected." in md
    assert "No diagnosis is stored for this incident" in md
    assert "No remediation run is stored for this incident" in md
    assert "**Time to resolve**: not resolved" in md
    assert "The incident is still updated: follow it up before closing this report." in md


def test_hostile_text_in_stored_facts_is_escaped_in_the_html() -> None:
    evil = "<script>alert(1)</script>"
    facts = IncidentFacts(incident=incident(alert("pod_crashloop", f"pod-{evil}", start=0, end=60)))
    report = build_report(facts, telemetry=None, plots=draw_plots(facts, None))
    assert report.document is not None
    page = to_html(report.document)
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def _ttft(pod: str, ts: float, buckets: dict[str, float]) -> MetricBatch:
    samples = tuple(
        Sample(name="vllm:time_to_first_token_seconds_bucket", labels={"pod": pod, "le": le}, value=v, ts=ts)
        for le, v in buckets.items()
    )
    return MetricBatch(entity=pod, samples=samples)


def test_ttft_p95_comes_from_the_bucket_increases_of_every_pod() -> None:
    pods = ("m-abcde12345-aaaaa", "m-abcde12345-bbbbb")
    batches = [
        _ttft(pods[0], T, {"0.5": 0, "1.0": 0, "+Inf": 0}),
        _ttft(pods[1], T, {"0.5": 0, "1.0": 0, "+Inf": 0}),
        # 90 fast requests on one pod, 10 between 0.5 s and 1 s on the other
        _ttft(pods[0], T + 15, {"0.5": 90, "1.0": 90, "+Inf": 90}),
        _ttft(pods[1], T + 15, {"0.5": 0, "1.0": 10, "+Inf": 10}),
    ]
    series = histogram_quantile(batches, set(pods), "vllm:time_to_first_token_seconds", 0.95, "m")
    assert series.ts == (T + 15,)
    assert abs(series.values[0] - 0.75) < 1e-9  # rank 95 of 100: halfway into the (0.5, 1.0] bucket


def test_the_failed_share_counts_only_failure_codes_and_survives_a_counter_reset() -> None:
    def router(ts: float, ok: float, failed: float) -> MetricBatch:
        return MetricBatch(
            entity="inference-router",
            samples=(
                Sample(name="router_requests_total", labels={"code": "200"}, value=ok, ts=ts),
                Sample(name="router_requests_total", labels={"code": "503"}, value=failed, ts=ts),
            ),
        )

    batches = [router(T, 100, 0), router(T + 15, 190, 10), router(T + 30, 40, 2)]  # the router restarted
    series, failed, total = counter_ratio(batches, "router_requests_total", "code", {"503"}, "router")
    assert (failed, total) == (12.0, 142.0)
    assert series.values == (0.1, 2 / 42)


def test_the_memory_source_keeps_only_the_incidents_entities_and_the_service_metrics() -> None:
    wanted = MetricBatch(entity="llama-70b-fp16-abcde12345-xyz12", samples=(Sample(name="x", value=1, ts=T),))
    router = MetricBatch(entity="inference-router", samples=(Sample(name="router_requests_total", value=1, ts=T),))
    other = MetricBatch(entity="llama-8b-fp16-abcde12345-xyz12", samples=(Sample(name="x", value=1, ts=T),))
    late = MetricBatch(entity="llama-70b-fp16-abcde12345-xyz12", samples=(Sample(name="x", value=1, ts=T + 9999),))
    scope = TelemetryScope(prefixes=("llama-70b-fp16-",))
    got: Telemetry = MemoryMetricSource([wanted, router, other, late]).fetch(scope, T - 10, T + 10)
    assert got.batches == [wanted, router]
    assert scope.wants_value(router.to_bytes()) and not scope.wants_value(other.to_bytes())


def test_durations_read_as_a_person_would_say_them() -> None:
    assert [duration(x) for x in (0, 59.6, 217, 3600 + 125, None)] == [
        "0 s",
        "1 min 00 s",
        "3 min 37 s",
        "1 h 02 min",
        "—",
    ]


def test_another_incidents_action_on_the_same_model_is_shown_apart_and_an_unrelated_one_not_at_all() -> None:
    pod = "llama-8b-fp16-abcde12345-xyz12"
    sibling = run_facts("succeeded")
    sibling_run = sibling.run.model_copy(
        update={
            "run_id": "run-2",
            "incident_id": "inc-2",
            "playbook": "drain_replica",
            "targets": Targets(pods=("llama-8b-fp16-abcde12345-new01",)),
        }
    )
    unrelated_run = sibling.run.model_copy(
        update={"run_id": "run-3", "incident_id": "inc-3", "targets": Targets(nodes=("gpu-node-009",))}
    )
    steps = tuple(s.model_copy(update={"step_id": s.step_id.replace("run-1", "run-2")}) for s in sibling.steps)
    facts = IncidentFacts(
        incident=incident(alert("pod_crashloop", pod, start=0, end=700, pod=pod, model="llama-8b-fp16")),
        nearby=(
            RunFacts(run=sibling_run, steps=steps, approval=None, audit=()),
            RunFacts(run=unrelated_run, steps=sibling.steps, approval=None, audit=()),
        ),
    )
    report = build_report(facts, telemetry=None)
    others = [e for e in report.timeline if e.kind == "other incident"]
    assert [e.text for e in others] == [
        "Another incident's remediation (inc-2, drain_replica): action drain: succeeded",
        "Another incident's remediation (inc-2, drain_replica): rollback uncordon: succeeded",
    ]
    assert all(e.source.key.startswith("run-2:") for e in others)
    assert [m.label for m in report.marks if m.kind == "other"] == [
        "drain (other incident)",
        "uncordon (other incident)",
    ]
    assert not any(m.kind == "action" for m in report.marks), "another incident's actions are not this one's"


def test_where_names_each_pod_and_model_of_the_incidents_comma_joined_labels_once() -> None:
    from services.reports.build import affected

    inc = incident(alert("queue_saturation", "llama-70b-int4-nwmh87vd7m-rjxrd", start=0, end=60))
    inc = inc.model_copy(
        update={"labels": {"pod": "llama-70b-int4-nwmh87vd7m-rjxrd,llama-70b-int4-nwmh87vd7m-pvnkc", "model": "m1,m2"}}
    )
    names = affected(IncidentFacts(incident=inc))
    assert names["pods"] == ["llama-70b-int4-nwmh87vd7m-rjxrd", "llama-70b-int4-nwmh87vd7m-pvnkc"]
    assert names["models"] == ["m1", "m2"]
