"""Receivers authenticated by default (issue 13, item 2): the one listener rule and the bearer check.

Each attack closed here: an HTTP service listening on a reachable address with no credential, and a
request without (or with a wrong) token reaching a route that writes or acts.
"""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from services.core.events import Anomaly, LogRecord, MetricBatch
from services.core.exposure import Listener, UnsafeListener, bearer_matches, check_listener, is_loopback
from services.core.settings import Settings
from services.ingest.http import ALERTMANAGER_PATH, LOKI_PUSH_PATH, REMOTE_WRITE_PATH, create_app
from services.ingest.memory import MemoryPublisher
from services.simulator.http import control_app, create_http_app
from services.simulator.scenario import load_scenario
from services.simulator.simulator import Simulator

EXPOSED = ["0.0.0.0", "::", "10.0.0.5", "2001:db8::1", "[2001:db8::1]", "gpu-node-1.example.com", "ingest", ""]
LOOPBACK = ["127.0.0.1", "127.0.0.53", "::1", "[::1]", "localhost", "LOCALHOST", "::ffff:127.0.0.1"]


@pytest.mark.parametrize("host", LOOPBACK)
def test_loopback_addresses_may_listen_without_a_token(host: str) -> None:
    assert is_loopback(host)
    listener = check_listener("ingest", host, 8081, token=None, token_variable="CLUSTERMEDIC_INGEST_TOKEN")
    assert listener == Listener("ingest", host, 8081, None, insecure=False)


@pytest.mark.parametrize("host", EXPOSED)
def test_reachable_addresses_are_refused_without_a_token(host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(UnsafeListener) as refused:
        check_listener("ingest", host, 9091, token=None, token_variable="CLUSTERMEDIC_INGEST_TOKEN")
    message = str(refused.value)
    assert "\n" not in message
    assert message.endswith("without CLUSTERMEDIC_INGEST_TOKEN; set a token or pass --insecure")


def test_the_refusal_names_the_address_and_the_fix() -> None:
    with pytest.raises(UnsafeListener, match=r"^refusing to listen on 0\.0\.0\.0:9091 without CLUSTERMEDIC_INGEST"):
        check_listener("ingest", "0.0.0.0", 9091, token="", token_variable="CLUSTERMEDIC_INGEST_TOKEN")
    with pytest.raises(UnsafeListener, match=r"^refusing to listen on \[::\]:8080 without CLUSTERMEDIC_API_TOKEN;"):
        check_listener("api", "::", 8080, token=None, token_variable="CLUSTERMEDIC_API_TOKEN")


def test_a_token_allows_any_address() -> None:
    listener = check_listener("api", "0.0.0.0", 8080, token="t0k", token_variable="CLUSTERMEDIC_API_TOKEN")
    assert (listener.token, listener.insecure) == ("t0k", False)


def test_insecure_allows_an_exposed_address_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="services.core.exposure"):
        listener = check_listener(
            "ingest", "0.0.0.0", 8081, token=None, token_variable="CLUSTERMEDIC_INGEST_TOKEN", insecure=True
        )
    assert listener.insecure and listener.token is None
    assert "ingest listens on 0.0.0.0:8081 WITHOUT a token (--insecure)" in caplog.text
    # on loopback --insecure changes nothing: nothing is exposed, so nothing is reported
    quiet = check_listener("ingest", "::1", 8081, token=None, token_variable="X", insecure=True)
    assert not quiet.insecure


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("Bearer s3cret", True),
        ("bearer s3cret", True),
        ("Bearer  s3cret ", True),
        ("", False),
        ("Bearer", False),
        ("Bearer s3cre", False),
        ("Bearer s3cret2", False),
        ("Basic s3cret", False),
        ("s3cret", False),
    ],
)
def test_bearer_header_must_carry_exactly_the_token(header: str, ok: bool) -> None:
    assert bearer_matches(header, "s3cret") is ok


# --- ingest ---------------------------------------------------------------------------------------


def _gauge(text: str, role: str) -> float:
    prefix = f'clustermedic_insecure_listener{{role="{role}"}} '
    (line,) = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(line.removeprefix(prefix))


def test_ingest_metrics_show_an_insecure_listener() -> None:
    settings = Settings()
    insecure = Listener("ingest", "0.0.0.0", 8081, None, insecure=True)
    with TestClient(create_app(settings, MemoryPublisher(), listener=insecure)) as client:
        assert _gauge(client.get("/metrics").text, "ingest") == 1
    with TestClient(create_app(settings, MemoryPublisher())) as client:
        assert _gauge(client.get("/metrics").text, "ingest") == 0


@pytest.mark.parametrize("path", [REMOTE_WRITE_PATH, LOKI_PUSH_PATH, ALERTMANAGER_PATH])
@pytest.mark.parametrize("authorization", [None, "Bearer wrong", "Basic s3cret", "Bearer s3cret2"])
def test_every_ingest_push_route_refuses_a_missing_or_wrong_token(path: str, authorization: str | None) -> None:
    publisher = MemoryPublisher()
    headers = {} if authorization is None else {"Authorization": authorization}
    with TestClient(create_app(Settings(ingest_token="s3cret"), publisher)) as client:
        response = client.post(path, content=b"{}", headers=headers)
        assert client.get("/healthz").status_code == 200
        assert client.get("/metrics").status_code == 200
    assert response.status_code == 401
    assert "CLUSTERMEDIC_INGEST_TOKEN" in response.text
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert not publisher.events(MetricBatch) and not publisher.events(LogRecord) and not publisher.events(Anomaly)


# --- simulator control API ------------------------------------------------------------------------


def _sim() -> Simulator:
    return Simulator(load_scenario("engine_dead"), seed=0, telemetry=False)


def test_simulator_control_api_refuses_actions_without_the_token() -> None:
    sim = _sim()
    app = control_app(sim, Settings(sim_token="sim-t0k"), host="0.0.0.0", port=18080)
    good = {"Authorization": "Bearer sim-t0k"}
    with TestClient(app) as client:
        for method, path in [
            ("POST", "/actions/restart_pod"),
            ("POST", "/advance"),
            ("POST", "/faults/f-1/detected"),
            ("GET", "/state"),
            ("GET", "/faults"),
            ("GET", "/grade"),
        ]:
            for headers in ({}, {"Authorization": "Bearer nope"}):
                response = client.request(method, path, json={"target": "x"}, headers=headers)
                assert response.status_code == 401, (method, path, headers)
                assert "CLUSTERMEDIC_SIM_TOKEN" in response.json()["detail"]
        assert client.get("/healthz").status_code == 200
        assert _gauge(client.get("/metrics").text, "simulator") == 0
        assert client.post("/advance", params={"seconds": 15}, headers=good).json()["t"] == 15
        assert client.get("/state", headers=good).status_code == 200
    assert not sim.actions.log, "an unauthenticated request acted on the simulator"


def test_simulator_control_api_applies_the_listener_rule() -> None:
    with pytest.raises(UnsafeListener, match="without CLUSTERMEDIC_SIM_TOKEN; set a token or pass --insecure"):
        control_app(_sim(), Settings(), host="0.0.0.0", port=18080)
    with TestClient(control_app(_sim(), Settings(), host="0.0.0.0", port=18080, insecure=True)) as client:
        assert _gauge(client.get("/metrics").text, "simulator") == 1
        assert client.get("/state").status_code == 200
    with TestClient(create_http_app(_sim())) as client:  # in-process, loopback: open, not reported
        assert _gauge(client.get("/metrics").text, "simulator") == 0


# --- the commands refuse before they connect to anything ------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "gpu-node-1.example.com"])
@pytest.mark.parametrize(
    ("command", "variable", "credentials"),
    [
        (["ingest", "serve"], "CLUSTERMEDIC_INGEST_TOKEN", "CLUSTERMEDIC_INGEST_TOKEN"),
        (["api", "serve"], "CLUSTERMEDIC_API_TOKEN", "CLUSTERMEDIC_API_TOKEN or a stored token (medic token create)"),
    ],
)
def test_serve_commands_refuse_an_exposed_address_without_a_token(
    host: str, command: list[str], variable: str, credentials: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.cli import app

    monkeypatch.delenv(variable, raising=False)
    # a broker that does not exist: the refusal must come before any connection to it is tried
    monkeypatch.setenv("CLUSTERMEDIC_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    # the API counts its stored tokens as credentials: a database that does not answer holds none
    monkeypatch.setenv("CLUSTERMEDIC_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none?connect_timeout=2")
    result = CliRunner().invoke(app, [*command, "--host", host, "--port", "9091"])
    assert result.exit_code == 2, result.output
    shown = host if ":" not in host else f"[{host}]"
    refusal = f"refusing to listen on {shown}:9091 without {credentials}; set a token or pass --insecure"
    assert refusal in " ".join(result.output.split())
