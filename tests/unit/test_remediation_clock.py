"""The executor's clock: wall time by default, the simulator's simulated UNIX time with ``execution.clock: world``."""

from __future__ import annotations

import time

import httpx
from fastapi.testclient import TestClient

from services.core.exposure import Listener
from services.core.settings import Settings
from services.remediation.actuators.simulator import SimulatorActuator
from services.remediation.config import ExecutionConfig, RemediationSettings, load_config
from services.remediation.executor import Executor
from services.remediation.runtime import MemoryEventSink, build_executor
from services.simulator.http import create_http_app
from services.simulator.scenario import load_scenario
from services.simulator.simulator import Simulator


class NoDispatch:
    def execute(self, run_id: str) -> None: ...
    def chain(self, *args: object) -> None: ...
    def rollback(self, run_id: str, token: str) -> None: ...


def _forward(client: TestClient) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        got = client.request(request.method, request.url.path, headers=dict(request.headers))
        return httpx.Response(got.status_code, content=got.content, headers=got.headers)

    return httpx.MockTransport(answer)


def test_the_simulators_clock_route_gives_the_simulated_unix_time_and_needs_the_token() -> None:
    sim = Simulator(load_scenario("engine_dead"), seed=0, telemetry=False)
    sim.run(60.0)
    client = TestClient(create_http_app(sim, listener=Listener("simulator", "127.0.0.1", 0, token="s3cret")))
    assert client.get("/clock").status_code == 401
    actuator = SimulatorActuator("http://sim", token="s3cret", transport=_forward(client))
    assert actuator.event_time() == sim.epoch + sim.t
    assert actuator.clock() == sim.t


def test_the_executor_clock_is_wall_time_unless_the_config_says_world() -> None:
    def build(clock: str) -> Executor:
        config = load_config()
        config = config.model_copy(update={"execution": ExecutionConfig(clock=clock)})  # type: ignore[arg-type]
        return build_executor(Settings(), RemediationSettings(), NoDispatch(), events=MemoryEventSink(), config=config)

    assert build("wall").clock is time.time
    world = build("world")
    assert world.clock == world.actuator.event_time
