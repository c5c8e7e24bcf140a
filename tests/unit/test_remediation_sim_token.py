"""The remediation actuator reaches a simulator whose control API wants its token.

`medic sim serve` with CLUSTERMEDIC_SIM_TOKEN refuses every control route without it
(tests/unit/test_exposure.py); the actuator takes the same variable from the environment, never from
remediation.yaml, which is not a secret.
"""

from __future__ import annotations

import httpx
import pytest

from services.core.settings import Settings
from services.remediation.actuators.simulator import SimulatorActuator
from services.remediation.config import RemediationSettings, load_config
from services.remediation.errors import ActuatorError
from services.remediation.runtime import MemoryEventSink, build_executor


class NoDispatch:
    def execute(self, run_id: str) -> None: ...
    def chain(self, *args: object) -> None: ...
    def rollback(self, run_id: str, token: str) -> None: ...


def _control_api(token: str) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.headers.get("Authorization") != f"Bearer {token}":
            return httpx.Response(401, json={"detail": "missing or wrong bearer token"})
        return httpx.Response(200, json={"t": 42.0, "deployments": {}, "pods": {}, "nodes": {}, "gpus": {}})

    return httpx.MockTransport(answer)


def test_the_actuator_sends_the_token_and_is_refused_without_it() -> None:
    assert SimulatorActuator("http://sim", token="s3cret", transport=_control_api("s3cret")).clock() == 42.0
    with pytest.raises(ActuatorError, match="401"):
        SimulatorActuator("http://sim", transport=_control_api("s3cret")).clock()


def test_the_entrypoint_takes_the_token_from_the_environment_and_never_shows_it() -> None:
    executor = build_executor(
        Settings(sim_token="s3cret"),
        RemediationSettings(),
        NoDispatch(),
        events=MemoryEventSink(),
        config=load_config(),
    )
    assert executor.config.actuator.token is None  # the YAML's config holds no secret
    assert executor.actuator._http.headers["Authorization"] == "Bearer s3cret"  # type: ignore[attr-defined]
    assert "s3cret" not in repr(executor.config) + executor.config.model_dump_json()
