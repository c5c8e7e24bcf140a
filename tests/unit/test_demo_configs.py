"""The configuration `medic demo` writes for one run: every file loads with the loader its role uses.

A demo run points the routing tree's receivers at the local Slack/PagerDuty stand-in, the remediation
actuator at the simulator (with its clock's pace), and a real Prometheus at the simulator's /metrics
(for PromQL only: ClusterMedic scrapes the simulator itself). A key its loader refuses would fail the
demo minutes in.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from services.alerting.config import load_routing
from services.demo.loop import Ports, write_configs
from services.remediation.config import load_config


def test_the_demo_configs_load_and_point_at_the_run(tmp_path: Path) -> None:
    ports = Ports(sim=18080, ingest=18081, api=18082, prometheus=18090, faust_detect=18066, faust_correlate=18067)
    files = write_configs(tmp_path, ports, "http://127.0.0.1:9999", speed=30.0)
    routing = load_routing(files["routing"])
    slack_files = [c["api_url_file"] for r in routing.receivers for c in r.slack_configs]
    assert slack_files and all(Path(f).read_text().startswith("http://127.0.0.1:9999/") for f in slack_files)
    remediation = load_config(files["remediation"])
    assert remediation.actuator.url == "http://127.0.0.1:18080"
    assert abs(remediation.actuator.time_scale - 1 / 30) < 1e-9  # waits between checks follow simulated time
    prometheus = yaml.safe_load(files["prometheus"].read_text())
    job = prometheus["scrape_configs"][0]
    assert job["static_configs"][0]["targets"] == ["127.0.0.1:18080"]
    assert job["scrape_interval"] == "500ms"  # 15 simulated seconds at 30x
    # simulated time at 30x is up to an hour behind the wall clock: Prometheus would refuse it as too old,
    # and its remote_write would never send it, so Prometheus keeps its own time and feeds nothing
    assert job["honor_timestamps"] is False and "remote_write" not in prometheus


def test_free_ports_are_distinct() -> None:
    ports = Ports.pick()
    values = list(vars(ports).values())
    assert len(set(values)) == len(values)
