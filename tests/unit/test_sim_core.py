"""Determinism, randomness, actuators, grader, traffic, sinks, envs and the HTTP API.

An XID 79 repaired by a reboot and the replay of recorded LLM traces read ../shared/data: they are the
data tier's (tests/data/test_sim_xid_faults.py, tests/data/test_sim_traces.py).
"""

from __future__ import annotations

import gc
import json

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from services.core.errors import ConfigError
from services.core.events import LogRecord, MetricBatch, Sample
from services.simulator import runner, trusted
from services.simulator import serving as serving_mod
from services.simulator import traffic as traffic_mod
from services.simulator.envs import ClusterAction, ClusterEnv, ClusterOpenEnv, create_openenv_app
from services.simulator.grader import StepRecord, replay
from services.simulator.http import create_http_app
from services.simulator.policies import make_policy
from services.simulator.scenario import Scenario, load_scenario
from services.simulator.serving import Serving
from services.simulator.simulator import Simulator
from services.simulator.sinks import HashSink, LokiSink, MemorySink, PrometheusSink, render_exposition
from services.simulator.specs import GPU_SPECS, parse_variant


def _hash_run(seed: int, scenario: str = "random", seconds: float = 600.0) -> tuple[str, str]:
    sink = HashSink()
    sim = Simulator(load_scenario(scenario), seed=seed, sinks=[sink])
    grade = sim.run(seconds, policy=make_policy("static"))
    return sink.hexdigest(), grade.to_json()


def test_same_seed_same_bytes_and_grade() -> None:
    assert _hash_run(11) == _hash_run(11)


def test_different_seeds_differ() -> None:
    a = Simulator(load_scenario("random"), seed=1, telemetry=False)
    b = Simulator(load_scenario("random"), seed=2, telemetry=False)
    fa = [(f.type, f.onset) for f in a.fault_list()]
    fb = [(f.type, f.onset) for f in b.fault_list()]
    assert fa != fb
    assert _hash_run(1, "baseline", 120)[0] != _hash_run(2, "baseline", 120)[0]


def test_names_look_like_kubernetes_and_nvidia() -> None:
    sim = Simulator(Scenario(), seed=0)
    uuid = sim.cluster.gpu_uuids[0]
    assert uuid.startswith("GPU-") and [len(p) for p in uuid[4:].split("-")] == [8, 4, 4, 4, 12]
    pod = next(iter(sim.cluster.pod_by_name))
    assert pod.startswith("llama-") and len(pod.split("-")[-1]) == 5
    assert sim.cluster.gpu_pci[0] == "0000:18:00.0"


def test_telemetry_names_and_labels() -> None:
    sink = MemorySink()
    Simulator(Scenario(), seed=0, sinks=[sink]).run(31)
    batches = [e for e in sink.events if isinstance(e, MetricBatch)]
    names = {s.name for b in batches for s in b.samples}
    for n in (
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:e2e_request_latency_seconds_count",
    ):
        assert n in names
    gpu = next(b for b in batches if b.entity.startswith("GPU-"))
    assert {"gpu", "UUID", "device", "modelName", "Hostname", "pod", "namespace", "container"} <= set(
        gpu.samples[0].labels
    )
    pod = next(b for b in batches if b.entity.startswith("llama-"))
    buckets = [s for s in pod.samples if s.name == "vllm:time_to_first_token_seconds_bucket"]
    assert buckets[-1].labels["le"] == "+Inf"
    values = [s.value for s in buckets]
    assert values == sorted(values)  # cumulative
    assert any(isinstance(e, LogRecord) and "Avg prompt throughput" in e.line for e in sink.events)
    assert len({b.samples[0].ts for b in batches}) == 3  # t = 0, 15, 30


def test_fast_constructors_match_pydantic_construction() -> None:
    labels = {"pod": "llama-0", "le": "+Inf"}
    s = trusted.sample("vllm:x_bucket", labels, 3.0, 1.5)
    ref = Sample(name="vllm:x_bucket", labels=labels, value=3.0, ts=1.5)
    assert s == ref and s.model_fields_set == ref.model_fields_set
    b = trusted.metric_batch("llama-0", "simulator", (s,))
    ref_b = MetricBatch(entity="llama-0", source="simulator", samples=(ref,))
    assert b == ref_b and b.to_bytes() == ref_b.to_bytes() and b.model_fields_set == ref_b.model_fields_set
    r = trusted.log_record({"pod": "llama-0"}, "INFO up", 2.0, "llama-0")
    ref_r = LogRecord(stream={"pod": "llama-0"}, line="INFO up", ts=2.0, entity="llama-0")
    assert r == ref_r and r.to_bytes() == ref_r.to_bytes() and r.model_fields_set == ref_r.model_fields_set
    with pytest.raises(ValidationError):  # frozen like a validated model
        b.entity = "other"


def test_simulated_telemetry_survives_revalidation_byte_for_byte() -> None:
    # A fault run covers GPU, pod, router batches, logs and Kubernetes events (an off-bus GPU's batch,
    # which needs an XID 79 from NVIDIA's catalog: tests/data/test_sim_xid_faults.py).
    sink = MemorySink()
    Simulator(load_scenario("node_flapping"), seed=0, sinks=[sink]).run(330)  # the node flaps from 300 s
    kinds = {type(e).__name__ for e in sink.events}
    assert kinds == {"MetricBatch", "LogRecord", "KubeEvent"}
    for e in sink.events:
        twin = type(e).from_bytes(e.to_bytes())
        assert twin == e and twin.to_bytes() == e.to_bytes()
        if isinstance(e, MetricBatch):
            # pydantic turns ints and numpy scalars into float; so must the fast path
            assert all(type(x.value) is float and type(x.ts) is float for x in e.samples), e.entity


def test_gc_paused_restores_the_collector_state() -> None:
    assert gc.isenabled()
    with pytest.raises(RuntimeError), trusted.gc_paused():
        assert not gc.isenabled()
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with trusted.gc_paused():
            pass
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()


def test_run_pauses_the_collector_per_step_and_restores_it() -> None:
    seen: list[bool] = []
    sim = Simulator(Scenario(), seed=0, sinks=[HashSink()])
    sim.run(3, on_step=lambda _sim, _events: seen.append(gc.isenabled()))
    assert seen == [False, False, False] and gc.isenabled()

    def fail(_sim: Simulator, _events: object) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        sim.run(10, on_step=fail)
    assert gc.isenabled()
    gc.disable()
    try:
        sim.run(12)
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()


def test_entity_and_series_samples_match_single_samples() -> None:
    labels = [{"pod": "p", "le": "1.0"}, {"pod": "p", "le": "+Inf"}]
    assert trusted.series_samples("x_bucket", labels, [1.0, 2.0], 5.0) == [
        Sample(name="x_bucket", labels=labels[0], value=1.0, ts=5.0),
        Sample(name="x_bucket", labels=labels[1], value=2.0, ts=5.0),
    ]
    assert trusted.entity_samples(["a", "b"], labels[0], [3.0, 4.0], 5.0) == [
        Sample(name="a", labels=labels[0], value=3.0, ts=5.0),
        Sample(name="b", labels=labels[0], value=4.0, ts=5.0),
    ]
    with pytest.raises(ValueError):  # a missing value is an error, not a shorter batch
        trusted.entity_samples(["a", "b"], labels[0], [3.0], 5.0)


def test_pairwise_sum_is_numpys_sum_bit_for_bit() -> None:
    rng = np.random.default_rng(7)
    for n in [*range(1, 40), 94, 127, 128, 129, 200, 300, 1064]:
        for _ in range(20):
            # wide magnitudes make the order of additions visible in the last bits; many zeros, as in
            # the slot arrays, exercise the sparse form
            x = rng.lognormal(0.0, 8.0, n) * (rng.random(n) < 0.4)
            ref = float(np.sum(x))
            assert serving_mod.pairwise_sum(x.tolist()) == ref, n
            items = [(i, v) for i, v in enumerate(x.tolist()) if v != 0.0]
            assert serving_mod._sparse_pairwise_sum(items, 0, n) == ref, n
    x = rng.lognormal(0.0, 8.0, 64)
    assert serving_mod.pairwise_sum(x.tolist()) != sum(x.tolist())  # the check above can fail


@pytest.mark.parametrize(("scenario", "seed", "policy"), [("random", 11, "autoscaler"), ("engine_dead", 2, None)])
def test_small_cluster_step_equals_the_vectorised_step(
    monkeypatch: pytest.MonkeyPatch, scenario: str, seed: int, policy: str | None
) -> None:
    """The per-slot Python step and the numpy step give the same telemetry bytes and grade."""

    def run(few_max_pods: int) -> tuple[str, str, int]:
        monkeypatch.setattr(Serving, "few_max_pods", few_max_pods)
        sink = HashSink()
        sim = Simulator(load_scenario(scenario), seed=seed, sinks=[sink])
        grade = sim.run(900, policy=make_policy(policy) if policy else None)
        return sink.hexdigest(), grade.to_json(), len(sim.cluster.pods)

    few = run(10_000)
    full = run(0)
    assert few[2] > 0 and few == full


def test_serving_arrays_are_rows_of_one_block() -> None:
    s = Simulator(Scenario(), seed=0).serving
    names = serving_mod._STEP_ROWS + serving_mod._INPUT_ROWS
    assert len(names) == len(set(names)) == s._rows.shape[0]
    for i, name in enumerate(names):
        row = getattr(s, name)
        assert row.base is s._rows and np.shares_memory(row, s._rows[i]), name
        assert not any(np.shares_memory(row, s._rows[j]) for j in range(len(names)) if j != i), name
    assert names[serving_mod._ARR_ROW : serving_mod._ARR_ROW + 3] == ("arr_n", "arr_p", "arr_o")  # route's block


def test_few_request_aggregation_equals_bincount(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    t = traffic_mod.SyntheticTraffic(np.random.default_rng(0))
    for n in (1, 2, 5, 17, 64):
        prompt = np.round(rng.lognormal(8.0, 1.5, n)) + 1.0  # some beyond every class (oversize)
        output = np.round(rng.lognormal(5.0, 1.0, n)) + 1.0
        few = t._aggregate_few(prompt.tolist(), output.tolist())
        monkeypatch.setattr(t, "requests", lambda _t, _dt, p=prompt, o=output: (p, o))
        monkeypatch.setattr(traffic_mod, "_FEW_REQUESTS", 0)
        full = t.arrivals(0.0, 1.0)
        monkeypatch.setattr(traffic_mod, "_FEW_REQUESTS", 64)
        assert few.oversize == full.oversize
        for a, b in ((few.n, full.n), (few.prompt, full.prompt), (few.output, full.output)):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), n


def test_variant_specs() -> None:
    h100 = GPU_SPECS["h100-80gb"]
    assert parse_variant("70b-fp16-32k-tp4").fits(h100)
    assert not parse_variant("70b-fp16-32k-tp1").fits(h100)
    assert parse_variant("70b-fp16-8k-tp4").load_time_s() > 120  # minutes to load a 70B replica
    assert parse_variant("8b-int4-8k").weight_gib < parse_variant("8b-fp16-8k").weight_gib


def test_scale_and_router_weights() -> None:
    sim = Simulator(Scenario(), seed=0, telemetry=False)
    assert sim.actions.scale("llama-8b-fp16", 5).accepted
    assert sim.actions.set_router_weights({"llama-8b-fp16": 1.0}).accepted
    assert not sim.actions.set_router_weights({"nope": 1.0}).accepted
    sim.run(120)
    d = sim.observe()["deployments"]["llama-8b-fp16"]
    assert d["replicas"] == 5 and d["ready"] == 5  # an 8B replica loads in about a minute
    assert d["weight"] == 1.0


def test_grader_penalises_vram_severity() -> None:
    from services.simulator.scenario import SloSpec

    def rec(v: float) -> StepRecord:
        return StepRecord(0, 10, 0, 0.5, 5, 1000, 0.001, v, 0, 0)

    s85, s99 = (replay([rec(v)], SloSpec())[0]["score"] for v in (0.86, 0.99))
    assert s99 < s85 <= 1.0


def test_prometheus_and_loki_sinks() -> None:
    sim = Simulator(Scenario(), seed=0)
    c = sim.cluster
    node_of = {u: c.nodes[int(c.gpus.node[i])].name for i, u in enumerate(c.gpu_uuids)}
    prom = PrometheusSink(lambda e: node_of.get(e, ""), [n.name for n in c.nodes])
    pushed: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        pushed.append(json.loads(request.content))
        return httpx.Response(204)

    loki = LokiSink("http://loki:3100", httpx.Client(transport=httpx.MockTransport(handler)))
    sim.sinks += [prom, loki]
    try:
        sim.run(20)
        text = httpx.get(f"http://127.0.0.1:{prom.ports[c.nodes[0].name]}/metrics").text
    finally:
        sim.close()
    assert "# TYPE DCGM_FI_DEV_GPU_TEMP gauge" in text and 'Hostname="gpu-node-000"' in text
    assert pushed and "streams" in pushed[0]
    value = pushed[0]["streams"][0]["values"][0]  # type: ignore[index]
    assert value[0].isdigit() and isinstance(value[1], str)
    assert render_exposition([]) == "\n"


def test_runner_and_regrade(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "traj.jsonl"
    g = runner.run("engine_dead", 1, 0.0, "null", 400.0, policy="static", trajectory=path)
    again = runner.grade(path, "engine_dead", 1)
    assert abs(again.score - g.score) < 1e-9
    assert "xid79" in runner.list_scenarios()
    with pytest.raises(ConfigError):
        load_scenario("no-such-scenario")


def test_gymnasium_env() -> None:
    env = ClusterEnv("random", decision_interval=15.0, duration_s=120.0)
    obs, _info = env.reset(seed=4)
    assert env.observation_space.contains(obs)
    total, done, steps = 0.0, False, 0
    while not done:
        obs, r, done, _, _ = env.step(int(env.action_space.sample()))
        total += r
        steps += 1
    assert steps == 8 and 0 < total <= 8
    o1, _ = env.reset(seed=4)
    assert np.allclose(o1, env.reset(seed=4)[0])


def test_openenv_environment_and_app() -> None:
    env = ClusterOpenEnv("baseline", duration_s=60.0)
    obs = env.reset(seed=1)
    assert obs.view["deployments"] and not obs.done
    obs = env.step(ClusterAction(kind="scale", target="llama-8b-fp16", params={"replicas": 4}))
    assert obs.last_action["accepted"] and obs.reward is not None
    assert env.state.step_count == 1
    app = create_openenv_app("baseline")
    assert any(getattr(r, "path", "") == "/reset" for r in app.routes)


def test_http_api() -> None:
    sim = Simulator(load_scenario("engine_dead"), seed=0, telemetry=False)
    client = TestClient(create_http_app(sim))
    assert client.post("/advance", params={"seconds": 320}).json()["t"] == 320
    faults = client.get("/faults").json()
    assert faults[0]["status"] == "active"
    assert client.post(f"/faults/{faults[0]['id']}/detected").status_code == 200
    r = client.post("/actions/restart_pod", json={"target": faults[0]["entity"]})
    assert r.status_code == 200 and r.json()["accepted"]
    assert client.post("/actions/nope", json={}).status_code == 404
    (logged,) = client.get("/actions").json()  # the unknown kind never reached the cluster
    assert (logged["kind"], logged["target"], logged["accepted"]) == ("restart_pod", faults[0]["entity"], True)
    client.post("/advance", params={"seconds": 15})
    assert client.get("/faults").json()[0]["resolved_by"] == "restart"
    assert 0 <= client.get("/grade").json()["score"] <= 1


@pytest.mark.slow  # six 1800 s episodes: about 5 s
def test_autoscaler_beats_baselines() -> None:
    scores: dict[str, float] = {}
    for name in ("noop", "static", "autoscaler"):
        scores[name] = float(
            np.mean(
                [
                    Simulator(load_scenario("busy"), seed=s, telemetry=False).run(1800, policy=make_policy(name)).score
                    for s in (0, 1)
                ]
            )
        )
    assert scores["autoscaler"] > scores["noop"] and scores["autoscaler"] > scores["static"], scores
