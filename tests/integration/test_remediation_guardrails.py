"""Guardrails enforced atomically at execution, with two real Celery workers racing (issue 13, item 4).

Each cluster here is a fresh database, a simulator behind its HTTP control API and two real
`medic worker` processes (embedded beat, recovery sweep every second) on a Redis database of their
own. Runs are decided with their start held back (:class:`HeldDispatcher`), so the test chooses the
moment the execute tasks reach the workers: all at once, for the races.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml
from psycopg import sql

from services.celery_app import app as celery_app
from services.celery_app import configure
from services.core.bus import ensure_topics, read_raw
from services.core.events import Diagnosis, Hypothesis, RemediationEvent
from services.core.settings import Settings
from services.remediation.config import RemediationSettings, load_config
from services.remediation.executor import Executor
from services.remediation.runtime import MemoryEventSink, build_executor
from services.remediation.store import RunRow, RunStore
from services.remediation.tasks import CeleryDispatcher
from services.store.db import migrate
from tests.conftest import _with_dbname, poll
from tests.integration.test_remediation_harness import (
    SimServer,
    Worker,
    isolated_settings,
    sim_server,
    worker_env,
    write_config,
)

pytestmark = pytest.mark.integration

ROUNDS = 20  # the race tests repeat inside the test: one pytest run proves 20 in a row
NODES = ("gpu-node-001", "gpu-node-002")  # healthy nodes of the xid79 scenario (gpu-node-000 has the fault)
ENDED = ("succeeded", "failed", "rolled_back", "blocked", "dry_run", "paged")
# Redis databases of this module's clusters: not the harness's 13, which other remediation tests use
REDIS_DBS = {"shared": 11, "breaker": 12}


class HeldDispatcher(CeleryDispatcher):
    """Sends chains and rollbacks at once, but keeps execute tasks until :meth:`release`."""

    def __init__(self) -> None:
        self.held: list[str] = []

    def execute(self, run_id: str) -> None:
        self.held.append(run_id)

    def release(self) -> None:
        """Send every held execute task, back to back, so the two workers claim at the same moment."""
        held, self.held = self.held, []
        for run_id in held:
            super().execute(run_id)


@dataclass
class Cluster:
    ex: Executor
    held: HeldDispatcher
    box: SimServer
    settings: Settings
    workers: list[Worker]

    @property
    def store(self) -> RunStore:
        return self.ex.store

    def decide(self, playbook: str, params: dict[str, Any], *, approve: bool = False) -> str:
        """Record a run whose execute task is held; approve it (level 2) when asked."""
        run_id, decision = self.ex.submit(diagnosis(playbook, params))
        want = "await_approval" if approve else "execute"
        assert decision.outcome == want, decision
        if approve:
            self.ex.approve(run_id, approver="alice", channel="test")
        return run_id

    def ended(self, run_id: str, timeout_s: float = 30.0) -> RunRow:
        """Wait until the run ended and no rollback is pending."""

        def done() -> RunRow | None:
            run = self.store.get_run(run_id)
            return run if run and run.status in ENDED and run.rollback_state != "pending" else None

        poll(done, timeout_s, what=f"run {run_id} to end\n{self.logs()}")
        run = self.store.get_run(run_id)
        assert run is not None
        return run

    def logs(self) -> str:
        return "\n".join(w.log.read_text()[-1500:] for w in self.workers if w.log.exists())

    def node(self, name: str) -> dict[str, Any]:
        return dict(self.box.sim.observe()["nodes"][name])

    def sim_action(self, kind: str, target: str) -> None:
        """Act on the simulator as a human would (kubectl), not through ClusterMedic."""
        httpx.post(f"{self.box.url}/actions/{kind}", json={"target": target, "params": {}}).raise_for_status()


def diagnosis(playbook: str, params: dict[str, Any]) -> Diagnosis:
    return Diagnosis(
        incident_id=f"inc-{uuid.uuid4().hex[:8]}",
        diagnostician="ranker",
        hypotheses=(Hypothesis(cause="test", confidence=0.9, playbook=playbook),),
        proposed_playbook=playbook,
        proposed_params=params,
        ts=time.time(),
    )


@contextlib.contextmanager
def cluster(
    database_url: str, tmp: Path, redis_db: int, overrides: list[dict[str, Any]], **policy: Any
) -> Iterator[Cluster]:
    """A fresh database, a simulator, two workers and a test-side executor whose starts are held."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    base = isolated_settings(Settings(database_url=_with_dbname(database_url, name)))
    settings = base.model_copy(update={"redis_url": f"redis://127.0.0.1:{base.redis_port}/{redis_db}"})
    migrate(settings)
    ensure_topics(settings, [settings.topic("remediations.v1"), settings.topic("incidents.v1")])
    try:
        with sim_server() as box:
            config = write_config(tmp / "remediation.yaml", box.url, **policy)
            data = yaml.safe_load(config.read_text())
            data["policy"]["overrides"] = overrides
            config.write_text(yaml.safe_dump(data))
            env = {**worker_env(settings, config), "CLUSTERMEDIC_REMEDIATION_RECOVER_INTERVAL_S": "1"}
            workers = [Worker(env, tmp / f"worker{i}.log") for i in range(2)]
            for w in workers:
                w.launch()
            held = HeldDispatcher()
            configure(settings)
            ex = build_executor(
                settings, RemediationSettings(config=config), held, events=MemoryEventSink(), config=load_config(config)
            )
            try:
                for w in workers:
                    w.wait_ready()
                box.ticking.set()
                yield Cluster(ex, held, box, settings, workers)
            finally:
                for w in workers:
                    w.stop()
                ex.store.close()
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def shared(database_url: str, redis_ready: None, kafka_ready: None, tmp_path_factory: pytest.TempPathFactory):
    """Blast radius of one node, no cooldown (rounds reuse nodes), dry runs for uncordon_node.

    Tests that make runs fail use approved level-2 runs, which the automatic circuit breaker ignores,
    so they cannot open it for the others.
    """
    with cluster(
        database_url,
        tmp_path_factory.mktemp("guardrails"),
        REDIS_DBS["shared"],
        [{"match": {"playbook": "uncordon_node"}, "set": {"dry_run": True}}],
        cooldown_s=0,
        rate_limit={"max_runs": 10_000, "window_s": 3600},
        blast_radius={"max_nodes": 1, "max_replicas": 1, "max_fraction": 0.5},
    ) as c:
        yield c


@pytest.fixture(autouse=True)
def _world_as_found(request: pytest.FixtureRequest) -> Iterator[None]:
    """Point Celery at the shared cluster's Redis; afterwards heal the simulator and put the nodes back."""
    if "shared" not in request.fixturenames:
        yield
        return
    c: Cluster = request.getfixturevalue("shared")
    configure(c.settings)  # the breaker test's cluster has a Redis database of its own
    yield
    c.box.slow.clear()
    c.box.broken.clear()
    c.box.arrived.clear()
    c.store.set_kill_switch(False, set_by="test")
    for node in NODES:
        if not c.node(node)["ready"]:
            continue
        c.sim_action("uncordon_node", node)


def acted(c: Cluster, run_id: str) -> list[str]:
    """The action steps the run recorded (an action step is written before the actuator is called)."""
    return [s.name for s in c.store.steps(run_id) if s.kind == "action" and s.status != "skipped"]


# --------------------------------------------------------------------------------------------- races


def test_two_runs_started_at_once_never_both_pass_a_blast_radius_of_one_node(shared: Cluster):
    c = shared
    for i in range(ROUNDS):
        a = c.decide("cordon_node", {"node": NODES[0]})
        b = c.decide("cordon_node", {"node": NODES[1]})
        before = len(c.box.actions("cordon_node"))
        c.held.release()
        runs = {r: c.ended(r) for r in (a, b)}
        statuses = sorted(r.status for r in runs.values())
        assert statuses == ["blocked", "succeeded"], f"round {i}: {[(r.status, r.detail) for r in runs.values()]}"
        loser = next(r for r in runs.values() if r.status == "blocked")
        assert "blast radius: 2 nodes" in loser.detail, loser.detail
        assert acted(c, loser.run_id) == [], "the blocked run acted"
        assert len(c.box.actions("cordon_node")) == before + 1, f"round {i}: both runs cordoned a node"
        for node in NODES:
            c.sim_action("uncordon_node", node)


def test_the_kill_switch_flipped_between_decision_and_start_stops_every_run(shared: Cluster):
    c = shared
    before = len(c.box.actions())
    for i in range(ROUNDS):
        automatic = c.decide("cordon_node", {"node": NODES[i % 2]})
        approved = c.decide("drain_node", {"node": NODES[(i + 1) % 2]}, approve=True)
        c.store.set_kill_switch(True, set_by="alice", reason="change freeze")  # after the decisions
        c.held.release()
        for run_id in (automatic, approved):
            run = c.ended(run_id)
            assert run.status == "blocked", f"round {i}: {run.status} {run.detail}"
            assert run.detail == "kill switch is on (set by alice: change freeze)"
            assert acted(c, run_id) == []
        c.store.set_kill_switch(False, set_by="alice")
    assert len(c.box.actions()) == before, "a run acted while the kill switch was on"


def test_the_breaker_at_start_lets_no_more_runs_fail_than_it_allows(
    database_url: str, redis_ready: None, kafka_ready: None, tmp_path: Path
):
    """Five runs queued before any failure, all started at once: only three may act (and fail)."""
    pods_of = "llama-8b-fp16"
    with cluster(
        database_url,
        tmp_path,
        REDIS_DBS["breaker"],
        [],
        cooldown_s=0,
        circuit_breaker={"max_failures": 3, "window_s": 3600},
        rate_limit={"max_runs": 10_000, "window_s": 3600},
    ) as c:
        pods = [p for p, v in c.box.sim.observe()["pods"].items() if v["deployment"].startswith(pods_of)]
        c.box.broken.add("restart_pod")  # every restart fails with an unparseable answer
        for i in range(ROUNDS):
            runs = [c.decide("restart_pod", {"pod": pods[j % len(pods)]}) for j in range(5)]
            c.held.release()
            ended = [c.ended(r) for r in runs]
            failed = [r for r in ended if r.status in ("failed", "rolled_back")]
            blocked = [r for r in ended if r.status == "blocked"]
            assert len(failed) == 3 and len(blocked) == 2, f"round {i}: {[(r.status, r.detail) for r in ended]}"
            assert all("circuit breaker" in r.detail for r in blocked), [r.detail for r in blocked]
            assert all(acted(c, r.run_id) == [] for r in blocked)
            # the next round starts from a closed breaker: a fresh history in this cluster's own database
            with psycopg.connect(str(c.settings.database_url), autocommit=True) as conn:
                conn.execute("DELETE FROM remediation_runs")


# ------------------------------------------------------------------------------ failures and rollback


def test_an_actuator_raising_anything_fails_the_step_and_rolls_back_at_once(shared: Cluster):
    c = shared
    node = NODES[0]
    c.box.broken.add("drain_node")  # the answer cannot be parsed: ValueError, not an ActuatorError
    run_id = c.decide("drain_node", {"node": node}, approve=True)
    c.held.release()
    run = c.ended(run_id)
    assert run.status == "rolled_back", run.detail
    drain = c.store.get_step(f"{run_id}:action:1")
    assert drain is not None and drain.status == "failed"
    assert "JSONDecodeError" in drain.output["error"], drain.output
    audit = [a["action"] for a in c.store.audit_log(run_id)]
    assert "recovered" not in audit, "the run was left running until the recovery sweep found it"
    assert c.node(node)["cordoned"] is False, "the rollback did not uncordon the node"


def test_a_failing_rollback_is_recorded_and_asks_for_a_human(shared: Cluster):
    c = shared
    node = NODES[1]
    c.box.broken.update({"drain_node", "uncordon_node"})
    run_id = c.decide("drain_node", {"node": node}, approve=True)
    c.held.release()
    run = c.ended(run_id)
    assert run.status == "failed"
    assert "rollback incomplete" in run.detail and "a human must look" in run.detail, run.detail
    rollback = c.store.get_step(f"{run_id}:rollback:0")
    assert rollback is not None and rollback.status == "failed" and "JSONDecodeError" in rollback.output["error"]
    assert "rollback_incomplete" in [a["action"] for a in c.store.audit_log(run_id)]
    assert c.node(node)["cordoned"] is True, "the node is as the failed rollback left it"


def test_a_rollback_leaves_cordoned_a_node_a_human_had_cordoned(shared: Cluster):
    c = shared
    node = NODES[0]
    c.sim_action("cordon_node", node)  # a human cordoned it before the run
    c.box.broken.add("drain_node")
    run_id = c.decide("drain_node", {"node": node}, approve=True)
    c.held.release()
    run = c.ended(run_id)
    assert run.status == "failed" and "step drain" in run.detail, run.detail
    assert run.observed["schedulable"] is False and run.rollback_plan == [], "nothing of its own to undo"
    assert [s.kind for s in c.store.steps(run_id) if s.kind == "rollback"] == []
    assert c.node(node)["cordoned"] is True, "the rollback uncordoned a node a human had cordoned"


def test_the_kill_switch_stops_a_running_run_before_its_next_action_and_rolls_it_back(shared: Cluster):
    c = shared
    node = NODES[1]
    c.box.slow["cordon_node"] = 1.0  # the first action is in flight while the switch is flipped
    run_id = c.decide("drain_node", {"node": node}, approve=True)
    c.held.release()
    poll(lambda: "cordon_node" in c.box.arrived and c.box.arrived["cordon_node"].is_set(), 30, what="the cordon")
    c.store.set_kill_switch(True, set_by="bob", reason="stop")
    run = c.ended(run_id)
    assert run.status == "blocked", run.detail
    assert "stopped before step drain: kill switch is on (set by bob: stop)" in run.detail
    assert run.detail.endswith("rolled back")
    assert acted(c, run_id) == ["cordon"], "an action began after the kill switch was on"
    assert c.node(node)["cordoned"] is False, "the rollback (which the kill switch lets through) did not run"


# ---------------------------------------------------------------------------------- recovery, dry runs


def test_a_run_whose_worker_died_is_recovered_by_the_scheduled_sweep_without_a_restart(shared: Cluster):
    c = shared
    node = NODES[0]
    c.box.slow["drain_node"] = 3.0  # the drain hangs in the simulator while its worker is killed
    run_id = c.decide("drain_node", {"node": node}, approve=True)
    c.held.release()
    poll(lambda: "drain_node" in c.box.arrived and c.box.arrived["drain_node"].is_set(), 30, what="the drain")
    configure(c.settings)
    holder = poll(lambda: _worker_running(c, run_id), 10, what="the worker that holds the drain")
    survivor = next(w for w in c.workers if w is not holder)
    survivor_pid = survivor.proc.pid if survivor.proc else None
    holder.kill()
    try:
        run = c.ended(run_id, timeout_s=40)
        assert run.status == "rolled_back", run.detail
        assert "worker died mid-action" in run.detail
        assert "recovered" in [a["action"] for a in c.store.audit_log(run_id)]
        drain = c.store.get_step(f"{run_id}:action:1")
        assert drain is not None and drain.status == "interrupted" and drain.attempts == 1
        uncordon = c.store.get_step(f"{run_id}:rollback:0")
        assert uncordon is not None and uncordon.status == "succeeded"
        assert survivor.proc is not None and survivor.proc.pid == survivor_pid and survivor.proc.poll() is None
    finally:
        holder.start()


def _worker_running(c: Cluster, run_id: str) -> Worker | None:
    active = celery_app.control.inspect(timeout=1.0, destination=[w.name for w in c.workers]).active() or {}
    for name, tasks in active.items():
        if any(t["name"] == "clustermedic.remediation.act" and t["args"][:2] == [run_id, 1] for t in tasks):
            return next(w for w in c.workers if w.name == name)
    return None


def test_a_dry_run_is_reported_as_one_and_counts_toward_no_guardrail(shared: Cluster):
    c = shared
    node = NODES[1]
    c.sim_action("cordon_node", node)  # so that the dry uncordon has something it would do
    before = len(c.box.actions())
    run_id = c.decide("uncordon_node", {"node": node})
    c.held.release()
    run = c.ended(run_id)
    assert run.status == "dry_run" and run.dry_run, run.detail
    assert run.detail == f"dry run: nothing changed; would run uncordon_node {node}"
    assert len(c.box.actions()) == before and c.node(node)["cordoned"] is True
    # what every guardrail (cooldown, rate limit, blast radius, breaker) reads leaves dry runs out
    assert run_id not in {r.run_id for r in c.store.guardrail_state(time.time()).runs}
    real = c.decide("cordon_node", {"node": NODES[0]})
    c.held.release()
    assert c.ended(real).status == "succeeded"
    events = [
        RemediationEvent.from_bytes(v)
        for _, _, v in read_raw(c.settings, ["remediations.v1"], max_messages=5000, timeout_s=5)
    ]
    mine = [e for e in events if e.run_id == run_id]
    assert mine and all(e.dry_run for e in mine), "every event of a dry run says it is one"
    assert mine[-1].status == "dry_run"
    assert not any(e.dry_run for e in events if e.run_id == real)


def test_an_execute_task_delivered_twice_to_both_workers_starts_the_run_once(shared: Cluster):
    c = shared
    for i in range(ROUNDS):
        run_id = c.decide("cordon_node", {"node": NODES[i % 2]})
        c.held.held.append(run_id)  # a duplicate delivery: both workers race to claim the same run
        c.held.release()
        assert c.ended(run_id).status == "succeeded"
        poll(lambda: not _busy(c), 10, what="both execute tasks to be done")
        assert acted(c, run_id) == ["cordon"]
        assert [s.kind for s in c.store.steps(run_id)].count("precheck") == 1
        assert [a["action"] for a in c.store.audit_log(run_id)].count("succeeded") == 1
        c.sim_action("uncordon_node", NODES[i % 2])


def _busy(c: Cluster) -> bool:
    active = celery_app.control.inspect(timeout=1.0, destination=[w.name for w in c.workers]).active() or {}
    return any(t["name"] != "clustermedic.remediation.recover" for tasks in active.values() for t in tasks)
