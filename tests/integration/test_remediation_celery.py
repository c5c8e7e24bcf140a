"""Remediation end to end: real Celery worker, Redis, Postgres, Kafka and the simulator's HTTP API."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from services.celery_app import configure
from services.core.bus import ensure_topics, read_raw
from services.core.events import Diagnosis, Hypothesis, RemediationEvent
from services.core.settings import Settings
from services.remediation.config import RemediationSettings, load_config
from services.remediation.executor import Executor
from services.remediation.runtime import KafkaEventSink, build_executor
from services.remediation.store import RunStore
from services.remediation.tasks import CeleryDispatcher
from services.store.db import migrate
from tests.conftest import poll
from tests.integration.test_remediation_harness import (
    SimServer,
    Worker,
    isolated_settings,
    sim_server,
    worker_env,
    write_config,
)

pytestmark = pytest.mark.integration

XID79_GPU_NODE = "gpu-node-000"


def diagnosis(playbook: str, params: dict[str, Any], incident: str | None = None) -> Diagnosis:
    return Diagnosis(
        incident_id=incident or f"inc-{uuid.uuid4().hex[:8]}",
        diagnostician="ranker",
        hypotheses=(Hypothesis(cause="gpu_xid_79_fallen_off_bus", confidence=0.9, playbook=playbook),),
        proposed_playbook=playbook,
        proposed_params=params,
        ts=time.time(),
    )


def xid79_gpu(box: SimServer) -> str:
    return next(uuid for uuid, g in box.sim.observe()["gpus"].items() if g["xid"] == 79)


@pytest.fixture(scope="module")
def env(
    database_url: str, redis_ready: None, kafka_ready: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Executor, SimServer, Settings, Worker]]:
    """One simulator, one fresh database, one worker for the module."""
    import psycopg
    from psycopg import sql

    from tests.conftest import _with_dbname

    name = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    settings = isolated_settings(Settings(database_url=_with_dbname(database_url, name)))
    migrate(settings)
    ensure_topics(settings, [settings.topic("remediations.v1"), settings.topic("incidents.v1")])
    tmp = tmp_path_factory.mktemp("remediation")
    with sim_server() as box:
        config_path = write_config(tmp / "remediation.yaml", box.url)
        worker = Worker(worker_env(settings, config_path), tmp / "worker.log")
        worker.start()
        configure(settings)
        ex = build_executor(
            settings,
            RemediationSettings(config=config_path),
            CeleryDispatcher(),
            events=KafkaEventSink(settings),
            config=load_config(config_path),
        )
        box.ticking.set()
        try:
            yield ex, box, settings, worker
        finally:
            worker.stop()
            ex.store.close()
            with psycopg.connect(database_url, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def status_of(store: RunStore, run_id: str, *wanted: str) -> str | None:
    """The run's status when it is one of ``wanted`` and no rollback is still pending."""
    run = store.get_run(run_id)
    return run.status if run and run.status in wanted and run.rollback_state != "pending" else None


def test_xid79_reboot_waits_for_approval_then_runs_end_to_end_and_the_grade_recovers(env):
    ex, box, settings, worker = env
    gpu = xid79_gpu(box)
    dep_before = box.sim.observe()["deployments"]["llama-70b-fp16"]
    assert dep_before["ready"] < dep_before["replicas"], "the XID 79 fault should have taken a replica down"
    faulty = box.sim.grader.mean(last_n=20)

    diag = diagnosis("reboot_node", {"gpu": gpu})
    run_id, decision = ex.submit(diag)
    assert decision.outcome == "await_approval" and decision.level == 2
    assert ex.submit(diag)[0] == run_id, "a redelivered diagnosis is the same run"
    assert len(ex.store.list_runs()) == 1
    # level 2: nothing acts while it waits
    t_wait = box.sim.t
    poll(lambda: box.sim.t > t_wait + 100, 30, what="simulated time to pass")
    assert ex.store.get_run(run_id).status == "awaiting_approval"
    assert box.actions() == [], "a level-2 playbook acted before approval"

    ex.approve(run_id, approver="alice", channel="test", comment="go")
    poll(lambda: status_of(ex.store, run_id, "succeeded", "failed", "rolled_back"), 90, what="run to finish")
    run = ex.store.get_run(run_id)
    assert run.status == "succeeded", (run.detail, worker.log.read_text()[-3000:])
    kinds = [a.kind for a in box.actions()]
    assert kinds == ["cordon_node", "drain_node", "reboot_node", "uncordon_node"], kinds
    steps = ex.store.steps(run_id)
    assert [(s.kind, s.name) for s in steps if s.kind == "action"] == [
        ("action", "cordon"),
        ("action", "drain"),
        ("action", "reboot"),
        ("action", "uncordon"),
    ]
    assert all(s.status == "succeeded" and s.attempts == 1 for s in steps if s.kind == "action")
    approval = ex.store.get_approval(run_id)
    assert approval.status == "approved" and approval.approver == "alice"

    # the grade recovers: full readiness, the fault repaired by the reboot, per-step score back up
    t_done = box.sim.t
    poll(lambda: box.sim.t > t_done + 600, 30, what="simulated time after the fix")
    state = box.sim.observe()
    assert state["deployments"]["llama-70b-fp16"]["ready"] == state["deployments"]["llama-70b-fp16"]["replicas"]
    fault = next(f for f in box.sim.fault_list() if f.type == "xid")
    assert fault.status == "resolved" and fault.resolved_by == "reboot_node"
    assert box.sim.grader.mean(last_n=120) >= max(0.99, faulty - 1e-6)

    events = [
        RemediationEvent.from_bytes(v)
        for _, _, v in read_raw(settings, ["remediations.v1"], max_messages=200, timeout_s=5)
    ]
    mine = [e for e in events if e.run_id == run_id]
    statuses = [e.status for e in mine if not e.step]
    assert statuses[0] == "awaiting_approval" and "approved" in statuses and statuses[-1] == "succeeded"
    assert any(e.approver == "alice" for e in mine)


def test_failing_verification_rolls_back(env):
    ex, box, _, _ = env
    before = box.sim.observe()["deployments"]["llama-8b-fp16"]["replicas"]
    run_id, decision = ex.submit(
        diagnosis("scale_replicas", {"deployment": "llama-8b-fp16", "replicas": 40, "timeout_s": 120})
    )
    assert decision.outcome == "execute"
    poll(lambda: status_of(ex.store, run_id, "succeeded", "failed", "rolled_back"), 60, what="run to end")
    run = ex.store.get_run(run_id)
    assert run.status == "rolled_back", run.detail
    assert "verification did not hold" in run.detail
    kinds = [(a.kind, a.params.get("replicas")) for a in box.actions("scale")]
    assert kinds == [("scale", 40), ("scale", before)]
    assert box.sim.observe()["deployments"]["llama-8b-fp16"]["replicas"] == before
    verify = next(s for s in ex.store.steps(run_id) if s.kind == "verify")
    assert verify.status == "failed" and verify.attempts >= 1


def test_level_three_and_unknown_playbooks_never_act(env):
    ex, box, _, _ = env
    n = len(box.actions())
    run_id, decision = ex.submit(diagnosis("page_oncall", {"summary": "GPU needs RMA"}))
    assert decision.outcome == "page" and ex.store.get_run(run_id).status == "paged"
    run_id, decision = ex.submit(diagnosis("restart_pod", {"pod": "llama-8b-fp16-x"}).model_copy(update={"level": 3}))
    assert decision.outcome == "page"
    run_id, decision = ex.submit(diagnosis("format_disk", {"node": XID79_GPU_NODE}))
    assert decision.outcome == "dropped" and ex.store.get_run(run_id).status == "blocked"
    # even a forged 'proposed' level-3 run is refused by the worker
    ex.store.transition(run_id, ["blocked"], "proposed")
    ex.dispatcher.execute(run_id)
    poll(lambda: status_of(ex.store, run_id, "blocked", "failed"), 30, what="forged run to be refused")
    assert len(box.actions()) == n
