"""The real ``amtool`` (Debian's prometheus-alertmanager, 0.25) against ClusterMedic's Alertmanager API
v2 (issue 18, item 2): served by ``medic api serve`` on a free port over a fresh PostgreSQL database.

What a user of amtool would notice: a silence added with amtool is listed, mutes the alert it matches
and is expired with amtool; its author is the token's name, whatever ``--author`` says; alerts show
their receivers and which are silenced or inhibited; a viewer cannot silence, an operator cannot mute
everything, and without a token every call is refused with 401.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.auth.tokens import Role
from services.core.events import AlertRef, IncidentEvent
from services.core.settings import Settings
from services.store.db import connect, migrate
from services.store.incidents import upsert_incident_events
from services.store.silences import list_silences
from tests.api_auth import token_for
from tests.conftest import REPO, free_port, poll

pytestmark = pytest.mark.integration

AMTOOL = "/usr/bin/amtool"


@dataclass
class Served:
    """A running API, where it listens, and a token file for amtool per role."""

    base: str
    settings: Settings
    configs: dict[str, Path]
    log: Path

    def amtool(self, *args: str, role: str | None = "operator") -> subprocess.CompletedProcess[str]:
        """Run amtool against the API as ``role`` (None: with no token at all)."""
        auth = [f"--http.config.file={self.configs[role]}"] if role else []
        return subprocess.run(
            [AMTOOL, f"--alertmanager.url={self.base}", *auth, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def json(self, *args: str, role: str | None = "operator") -> Any:
        """amtool's ``-o json`` output, parsed; fail with its stderr when it fails."""
        done = self.amtool("-o", "json", *args, role=role)
        assert done.returncode == 0, (args, done.stdout, done.stderr, self.log.read_text()[-2000:])
        return json.loads(done.stdout)


def alert(fingerprint: str, signal_: str, entity: str, node: str, severity: str, **labels: str) -> AlertRef:
    """A firing alert as the correlate agent links it to an incident."""
    return AlertRef(
        fingerprint=fingerprint,
        entity=entity,
        signal=signal_,
        detector="rules",
        severity=severity,  # type: ignore[arg-type]
        starts_at=time.time() - 120,
        labels={"node": node, "entity_kind": "gpu" if entity.startswith("GPU") else "node", **labels},
    )


def seed_alerts(settings: Settings) -> None:
    """Four firing alerts (one inhibited by a node that is down) and one resolved, through the store's upsert."""
    now = time.time()
    firing = (
        alert("fp-xid", "gpu_xid", "GPU-1", "node-1", "critical", xid="13"),
        alert("fp-hot2", "gpu_thermal", "GPU-2", "node-2", "warning"),
        alert("fp-down3", "node_down", "node-3", "node-3", "critical"),
        alert("fp-hot3", "gpu_thermal", "GPU-3", "node-3", "warning"),
    )
    gone = alert("fp-ecc4", "gpu_ecc", "GPU-4", "node-4", "warning").model_copy(update={"status": "resolved"})
    events = [
        IncidentEvent(
            incident_id="inc-a", kind="opened", severity="critical", title="GPUs", alerts=firing, opened_at=now, ts=now
        ),
        IncidentEvent(
            incident_id="inc-b", kind="resolved", severity="warning", title="ECC", alerts=(gone,), opened_at=now, ts=now
        ),
    ]
    with connect(settings) as conn:
        upsert_incident_events(conn, events)


@pytest.fixture
def served(fresh_database: Settings, tmp_path: Path) -> Iterator[Served]:
    """``medic api serve`` on a free port, with stored alerts and a viewer, operator and admin token."""
    assert shutil.which(AMTOOL), "amtool is missing: apt-get install prometheus-alertmanager"
    migrate(fresh_database)
    seed_alerts(fresh_database)
    configs = {}
    for role, name in (("viewer", "vic"), ("operator", "olga"), ("admin", "ada")):
        token = token_for(fresh_database, name, Role(role))
        path = tmp_path / f"{role}.yml"
        path.write_text(f"authorization:\n  type: Bearer\n  credentials: {token}\n")
        configs[role] = path
    port = free_port()
    log = tmp_path / "api.log"
    env = {**os.environ, "CLUSTERMEDIC_DATABASE_URL": fresh_database.database_url or ""}
    env.pop("CLUSTERMEDIC_API_TOKEN", None)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "api", "serve", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            try:
                return httpx.get(base + "/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return proc.poll() is not None  # died: stop polling, the assertion below says so

        poll(up, 60, 0.2, "medic api serve")
        assert proc.poll() is None, log.read_text()
        yield Served(base, fresh_database, configs, log)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def by_fingerprint(alerts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {a["fingerprint"]: a for a in alerts}


@pytest.mark.timeout(240)
def test_amtool_adds_queries_and_expires_a_silence_and_queries_the_alerts(served: Served) -> None:
    # the firing alerts, not the resolved one; the node that is down inhibits its GPU's thermal alert
    everything = by_fingerprint(served.json("alert", "query", "--active", "--silenced", "--inhibited"))
    assert set(everything) == {"fp-xid", "fp-hot2", "fp-down3", "fp-hot3"}
    assert [r["name"] for r in everything["fp-xid"]["receivers"]] == ["pagerduty-gpu", "slack-sre"]
    assert [r["name"] for r in everything["fp-hot2"]["receivers"]] == ["slack-sre"]
    assert everything["fp-hot3"]["status"] == {"state": "suppressed", "silencedBy": [], "inhibitedBy": ["fp-down3"]}
    assert everything["fp-xid"]["labels"]["alertname"] == "gpu_xid"
    table = served.amtool("-o", "extended", "alert", "query")
    assert table.returncode == 0 and "gpu_xid on GPU-1" in table.stdout, table  # the summary annotation
    # amtool's default: active alerts only
    assert set(by_fingerprint(served.json("alert", "query"))) == {"fp-xid", "fp-hot2", "fp-down3"}
    assert set(by_fingerprint(served.json("alert", "query", "alertname=gpu_thermal", "--active", "--inhibited"))) == {
        "fp-hot2",
        "fp-hot3",
    }
    assert set(by_fingerprint(served.json("alert", "query", "--receiver", "pagerduty.*"))) == {"fp-xid", "fp-down3"}

    added = served.amtool(
        "silence", "add", "alertname=gpu_thermal", "node=node-2", "-c", "fan swap", "-a", "mallory", "-d", "1h"
    )
    assert added.returncode == 0, (added.stderr, served.log.read_text()[-2000:])
    silence_id = added.stdout.strip()
    assert silence_id.startswith("sil-"), added.stdout

    listed = {s["id"]: s for s in served.json("silence", "query", role="viewer")}
    assert set(listed) == {silence_id}
    mine = listed[silence_id]
    assert mine["createdBy"] == "olga"  # the token's name, not --author
    assert mine["status"] == {"state": "active"}
    assert mine["comment"] == "fan swap"
    assert {(m["name"], m["value"], m["isRegex"], m["isEqual"]) for m in mine["matchers"]} == {
        ("alertname", "gpu_thermal", False, True),
        ("node", "node-2", False, True),
    }
    table = served.amtool("-o", "extended", "silence", "query")
    assert table.returncode == 0 and silence_id in table.stdout and "olga" in table.stdout, table
    quiet = served.amtool("silence", "query", "-q", "node=node-2")
    assert quiet.returncode == 0 and quiet.stdout.split() == [silence_id], quiet
    assert served.amtool("silence", "query", "-q", "node=node-9").stdout.split() == []

    # the silence mutes the thermal alert on node-2: hidden by default, suppressed with --silenced
    assert set(by_fingerprint(served.json("alert", "query"))) == {"fp-xid", "fp-down3"}
    muted = by_fingerprint(served.json("alert", "query", "--silenced"))
    assert set(muted) == {"fp-hot2"}
    assert muted["fp-hot2"]["status"] == {"state": "suppressed", "silencedBy": [silence_id], "inhibitedBy": []}

    expired = served.amtool("silence", "expire", silence_id)
    assert expired.returncode == 0, expired.stderr
    assert served.amtool("silence", "query", "-q").stdout.split() == []
    gone = {s["id"]: s for s in served.json("silence", "query", "--expired")}
    assert gone[silence_id]["status"] == {"state": "expired"}
    assert set(by_fingerprint(served.json("alert", "query"))) == {"fp-xid", "fp-hot2", "fp-down3"}


@pytest.mark.timeout(240)
def test_amtool_without_a_token_is_refused_and_roles_hold(served: Served) -> None:
    for args in (("silence", "query"), ("alert", "query"), ("silence", "add", "node=node-1", "-c", "x")):
        done = served.amtool(*args, role=None)
        assert done.returncode != 0, (args, done.stdout)
        assert "(status 401)" in done.stderr, (args, done.stderr)
    assert httpx.get(served.base + "/api/v2/status").status_code == 401

    # a viewer reads but cannot silence
    refused = served.amtool("silence", "add", "node=node-1", "-c", "viewer tries", role="viewer")
    assert refused.returncode != 0 and "(status 403)" in refused.stderr, refused.stderr
    # an operator cannot mute every alert; an admin can, and the comment says who confirmed it
    everything = ("silence", "add", "alertname=~.+", "-c", "maintenance")
    refused = served.amtool(*everything, role="operator")
    assert refused.returncode != 0 and "(status 403)" in refused.stderr, refused.stderr
    with connect(served.settings) as conn:
        assert list_silences(conn, now=time.time()) == []
    allowed = served.amtool(*everything, role="admin")
    assert allowed.returncode == 0, allowed.stderr
    (stored,) = served.json("silence", "query", role="viewer")
    assert stored["createdBy"] == "ada" and "mutes every alert" in stored["comment"]
    # every alert is now silenced; amtool's default query shows none
    assert served.json("alert", "query") == []

    # amtool config show reads /api/v2/status: the routing config, with receiver settings masked
    shown = served.amtool("config", "show", role="viewer")
    assert shown.returncode == 0, shown.stderr
    assert "pagerduty-gpu" in shown.stdout and "<secret>" in shown.stdout
    assert "/etc/clustermedic/secrets" not in shown.stdout
