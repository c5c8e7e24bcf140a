"""Kill the Celery worker in the middle of a playbook, restart it: no step runs twice, nothing is lost."""

from __future__ import annotations

import time
import uuid

import pytest

from services.celery_app import configure
from services.core.events import Diagnosis, Hypothesis
from services.remediation.config import RemediationSettings, load_config
from services.remediation.runtime import MemoryEventSink, build_executor
from services.remediation.tasks import CeleryDispatcher
from services.store.db import migrate
from tests.conftest import poll
from tests.integration.test_remediation_harness import Worker, isolated_settings, sim_server, worker_env, write_config

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("kill_at", ["mid_action", "between_steps"])
def test_worker_killed_mid_playbook_resumes_without_repeating_a_step(fresh_database, redis_ready, tmp_path, kill_at):
    settings = isolated_settings(fresh_database)
    migrate(settings)
    with sim_server() as box:
        config = write_config(tmp_path / "remediation.yaml", box.url)
        worker = Worker(worker_env(settings, config), tmp_path / "worker.log")
        worker.start()
        configure(settings)
        ex = build_executor(
            settings,
            RemediationSettings(config=config),
            CeleryDispatcher(),
            events=MemoryEventSink(),
            config=load_config(config),
        )
        box.ticking.set()
        if kill_at == "mid_action":
            box.slow["drain_node"] = 3.0  # the drain request hangs in the simulator while we kill
        try:
            gpu = next(u for u, g in box.sim.observe()["gpus"].items() if g["xid"] == 79)
            diag = Diagnosis(
                incident_id=f"inc-{uuid.uuid4().hex[:8]}",
                diagnostician="ranker",
                hypotheses=(Hypothesis(cause="gpu_xid_79", confidence=0.9),),
                proposed_playbook="reboot_node",
                proposed_params={"gpu": gpu},
                ts=time.time(),
            )
            run_id, _ = ex.submit(diag)
            ex.approve(run_id, approver="bob", channel="test")
            if kill_at == "mid_action":
                poll(lambda: "drain_node" in box.arrived, 30, what="the drain request to reach the simulator")
            else:
                poll(
                    lambda: (s := ex.store.get_step(f"{run_id}:action:2")) is not None and s.status == "succeeded",
                    60,
                    what="the reboot action to be done",
                )
            worker.kill()
            worker.start()
            poll(
                lambda: (
                    (r := ex.store.get_run(run_id)) is not None
                    and r.status in ("succeeded", "failed", "rolled_back")
                    and r.rollback_state != "pending"
                ),
                60,
                what="the run to end after the restart",
            )
        finally:
            worker.stop()
            ex.store.close()
        run = ex.store.get_run(run_id)
        kinds = [a.kind for a in box.actions()]
        for kind in set(kinds):
            assert kinds.count(kind) == 1, f"{kind} ran {kinds.count(kind)} times: {kinds}"
        steps = ex.store.steps(run_id)
        assert all(s.attempts == 1 for s in steps if s.kind in ("action", "rollback"))
        audit = [a["action"] for a in ex.store.audit_log(run_id)]
        assert "recovered" in audit, audit
        if kill_at == "mid_action":
            assert run.status == "rolled_back", run.detail
            assert "reboot_node" not in kinds, "a step after the interrupted one ran"
            assert kinds[-1] == "uncordon_node", "the rollback did not restore the node"
            drain = ex.store.get_step(f"{run_id}:action:1")
            assert drain.status == "interrupted"
        else:
            assert run.status == "succeeded", run.detail
            assert kinds == ["cordon_node", "drain_node", "reboot_node", "uncordon_node"]
