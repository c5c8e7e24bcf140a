"""Plugins from outside the repository, as docs/extending.md describes them.

tests/unit/plugins/ is a plugin package laid out as it is once installed: ``medic_example_plugins`` (a
rule detector with a signal of its own, a playbook with typed parameters, a notifier for a new vendor,
an ingest source polling a BMC over Redfish),
its ``*.dist-info/entry_points.txt`` (one line per plugin: what ``[project.entry-points."clustermedic.*"]``
in its ``pyproject.toml`` becomes), and the runbook it ships for its signal. A fresh process with the
package on its path (plugins/plugin_checks.py) finds each plugin in its registry and in every catalog
derived from it, without a file of ClusterMedic edited.
"""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.detectors.registry import signal_catalog
from services.core.errors import ConfigError, PluginError
from services.core.paths import REPO_ROOT
from services.core.registry import Registry, installed_entries
from services.diagnostician.runbooks import check_anomaly_signals, load_runbook
from services.remediation.playbook import Playbook, PlaybookParams

PLUGINS = Path(__file__).parent / "plugins"
PACKAGE = PLUGINS / "medic_example_plugins"
ENTRY_POINTS = PLUGINS / "clustermedic_example_plugins-0.1.dist-info" / "entry_points.txt"
RUNBOOK = PLUGINS / "knowledge" / "runbooks" / "gpu" / "gpu-pcie-replay-errors.md"


def test_each_plugin_is_one_module_and_one_entry_point_line() -> None:
    points = configparser.ConfigParser()
    points.read(ENTRY_POINTS)
    lines = {group: dict(points[group]) for group in points.sections()}
    assert lines == {
        "clustermedic.detectors": {"pcie_replay": "medic_example_plugins.pcie:PcieReplayDetector"},
        "clustermedic.ingest_sources": {"redfish": "medic_example_plugins.redfish:RedfishSource"},
        "clustermedic.notifiers": {"msteams": "medic_example_plugins.msteams:TeamsNotifier"},
        "clustermedic.playbooks": {"pcie_quarantine": "medic_example_plugins.quarantine:PcieQuarantinePlaybook"},
    }
    modules = {p.name for p in PACKAGE.glob("*.py")} - {"__init__.py"}
    assert modules == {"pcie.py", "msteams.py", "quarantine.py", "redfish.py"}
    doc = (REPO_ROOT / "docs" / "extending.md").read_text()
    assert "tests/unit/plugins" in doc and "clustermedic.detectors" in doc


@pytest.mark.slow  # a fresh Python process that imports the whole project: about 7 s
def test_an_installed_plugin_package_is_picked_up_by_every_registry_and_catalog(tmp_path: Path) -> None:
    shutil.copytree(REPO_ROOT / "knowledge" / "runbooks", tmp_path / "runbooks")
    shutil.copy(RUNBOOK, tmp_path / "runbooks" / "gpu")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(PLUGINS), str(REPO_ROOT)]),
        "CLUSTERMEDIC_KB_DIR": str(tmp_path),
    }
    checks = [sys.executable, "-m", "pytest", str(PLUGINS / "plugin_checks.py"), "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(checks, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "7 passed" in done.stdout


def test_without_the_package_its_runbook_names_a_signal_and_a_playbook_nothing_provides() -> None:
    with pytest.raises(ConfigError, match="unknown playbook 'pcie_quarantine'"):
        load_runbook(RUNBOOK)
    text = RUNBOOK.read_text().replace("  - name: pcie_quarantine\n    level: 2\n", "")
    alone = PLUGINS.parent / "_runbook_without_playbook"
    try:
        (alone / "gpu").mkdir(parents=True)
        path = alone / "gpu" / RUNBOOK.name
        path.write_text(text)
        with pytest.raises(ConfigError, match=r"names 'pcie_replay_errors', which no detector emits"):
            check_anomaly_signals([load_runbook(path)], signal_catalog())
    finally:
        shutil.rmtree(alone, ignore_errors=True)


def dist(root: Path, name: str, group: str, line: str) -> None:
    info = root / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{line}\n")


@pytest.fixture
def fresh_entry_points(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(tmp_path))
    installed_entries.cache_clear()
    yield tmp_path
    installed_entries.cache_clear()


def test_an_entry_point_never_replaces_a_built_in_or_another_package_s_plugin(fresh_entry_points: Path) -> None:
    dist(fresh_entry_points, "acme-medic", "clustermedic.things", "config = acme:Config")
    registry: Registry[type] = Registry("thing", {"config": "services.core.errors:ConfigError"})
    with pytest.raises(PluginError, match=r"'config' of the package 'acme-medic'.*already registered by built-in"):
        registry.names()
    dist(fresh_entry_points, "other-medic", "clustermedic.widgets", "w = other:W")
    dist(fresh_entry_points, "third-medic", "clustermedic.widgets", "w = third:W")
    installed_entries.cache_clear()
    with pytest.raises(
        PluginError, match=r"'w' of the package '(other|third)-medic'.*already registered by the package"
    ):
        Registry("widget", {}).names()


def test_an_entry_point_loads_lazily_like_a_built_in_line(fresh_entry_points: Path) -> None:
    dist(fresh_entry_points, "acme-medic", "clustermedic.things", "plugin = services.core.errors:PluginError")
    registry: Registry[type] = Registry("thing", {"config": "services.core.errors:ConfigError"})
    assert registry.names() == ["config", "plugin"]
    assert registry.load("plugin") is PluginError
    assert (registry.origin("plugin"), registry.origin("config")) == ("the package 'acme-medic'", "built-in")


class _Params(PlaybookParams):
    node: str = ""


def test_a_playbook_names_its_params_type_once_in_its_header() -> None:
    class Typed(Playbook[_Params]):
        name = "typed"

    assert Typed.Params is _Params and isinstance(Typed().parse({"node": "n1"}), _Params)
    with pytest.raises(TypeError, match="Params = PlaybookParams but the header says _Params"):

        class Contradicting(Playbook[_Params]):
            Params = PlaybookParams
