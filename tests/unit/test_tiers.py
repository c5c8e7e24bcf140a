"""The test tiers say what they need (docs/testing.md), checked from the source.

* tests/unit needs no network, no infrastructure and no ``../shared/data``: no unit module reads the shared
  folder, loads NVIDIA's XID catalog by default (``XidCatalog.load()``, ``XidDetector()``), runs a simulator
  scenario whose faults raise XIDs or whose traffic replays recorded traces, or asks for the Kafka,
  Postgres or Redis fixtures. (tests/unit/conftest.py also runs the tier with the shared folder absent, so
  what this static reading misses fails at run time.) The tier collects with the shared data absent.
* Every test module of tests/integration and tests/acceptance carries the ``integration`` marker.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.core.paths import REPO_ROOT
from services.simulator.scenario import list_scenarios, load_scenario

TESTS = REPO_ROOT / "tests"
UNIT = TESTS / "unit"

INFRA_FIXTURES = frozenset({"kafka_ready", "database_url", "fresh_database", "redis_ready", "celery_worker"})
"""The fixtures of tests/conftest.py that connect to the real infrastructure."""

SHARED_DATA_READERS = frozenset({"shared_data_dir", "xid_catalog", "catalog_available", "nvidia_required_actions"})
"""Functions that read ``../shared/data``: the folder itself, the simulator's XID catalog, remediation's."""

XID_FAULT_TYPES = frozenset({"xid", "ecc", "nvlink_error"})
"""Simulator faults that raise an XID (ecc's double-bit error is XID 48, nvlink_error's XID 74), whose
message and effect come from NVIDIA's catalog."""

CATALOG_ARGS = frozenset({"catalog", "catalog_path"})
"""Arguments by which a test gives the XID detector its catalog instead of the default."""

SCENARIO_RUNNERS = frozenset({"load_scenario", "run_scenario", "run", "score", "_run"})
"""Calls whose first argument names a simulator scenario (tests/sim_telemetry.py's helpers included)."""

ALLOWED = {
    ("tests/unit/test_core.py", "test_shared_data_dir_explains_when_absent"): "its own absent folder, for the error",
}
"""(module, function) -> why it may name what the rules forbid."""


def data_scenarios() -> set[str]:
    """The shipped scenarios that need ``../shared/data``: XID faults, or recorded traffic."""
    out = set()
    for name in list_scenarios():
        spec = load_scenario(name)
        if spec.traffic.kind == "trace" or {f.type for f in spec.faults} & XID_FAULT_TYPES:
            out.add(name)
    return out


def unit_modules() -> list[Path]:
    return sorted(p for p in UNIT.rglob("*.py") if "__pycache__" not in p.parts)


def called_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def qualified(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return f"{func.value.id}.{func.attr}"
    return called_name(call)


def enclosing_functions(tree: ast.Module) -> dict[ast.AST, str]:
    """Each node -> the name of the top-level function (or method) it is in, '' at module level."""
    owner: dict[ast.AST, str] = {}
    for top in tree.body:
        scopes = [top] if not isinstance(top, ast.ClassDef) else top.body
        for scope in scopes:
            name = scope.name if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef) else ""
            for node in ast.walk(scope):
                owner[node] = name
    return owner


def violations(source: str, rel: str, scenarios: set[str]) -> list[str]:
    """What the module ``rel`` (its ``source``) does that a unit module may not, one 'rel:line: what' each."""
    tree = ast.parse(source, filename=rel)
    owner = enclosing_functions(tree)
    found: list[tuple[ast.AST, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name in SHARED_DATA_READERS:
                    found.append((node, f"imports {alias.name} (it reads ../shared/data)"))
        elif isinstance(node, ast.Call):
            name, dotted = called_name(node), qualified(node)
            has_args = bool(node.args or node.keywords)
            if name in SHARED_DATA_READERS:
                found.append((node, f"calls {name}() (it reads ../shared/data)"))
            elif dotted in ("XidCatalog.load", "XidCatalog.default_dir") and not has_args:
                found.append((node, f"{dotted}() reads NVIDIA's catalog from ../shared/data: pass a made-up one"))
            elif name == "XidDetector" and not node.args and not {k.arg for k in node.keywords} & CATALOG_ARGS:
                found.append((node, "XidDetector() loads NVIDIA's catalog: give it tests/made_up_xids.py's"))
            elif name in SCENARIO_RUNNERS and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and first.value in scenarios:
                    found.append((node, f"runs the scenario {first.value!r}, which needs ../shared/data"))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            infra = sorted({a.arg for a in node.args.args} & INFRA_FIXTURES)
            if infra:
                found.append((node, f"asks for {infra}: the infrastructure is the integration tier's"))
    return [
        f"{rel}:{getattr(node, 'lineno', 0)}: {what}"
        for node, what in found
        if (rel, owner.get(node, "")) not in ALLOWED
    ]


def test_no_unit_module_reads_the_shared_data_or_needs_the_infrastructure() -> None:
    scenarios = data_scenarios()
    assert {"xid79", "ecc", "nvlink_error", "trace_replay"} <= scenarios  # the rule sees what it must
    found = [
        line
        for path in unit_modules()
        for line in violations(path.read_text(encoding="utf-8"), str(path.relative_to(REPO_ROOT)), scenarios)
    ]
    assert not found, "unit tests that belong to tests/data or tests/integration:\n" + "\n".join(found)


def test_the_static_check_catches_each_kind_of_dependency() -> None:
    probe = (
        "from services.core.paths import shared_data_dir\n"
        "def test_a(database_url):\n"
        "    XidCatalog.load()\n"
        "    XidDetector()\n"
        "    XidDetector(catalog=made_up_xid_catalog())\n"
        "    Simulator(load_scenario('xid79'))\n"
        "    Simulator(load_scenario('thermal_throttle'))\n"
    )
    found = violations(probe, "tests/unit/probe.py", data_scenarios())
    assert [line.split(":")[1] for line in found] == ["1", "2", "3", "4", "6"], found


def integration_marked(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            marks = node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [node.value]
            return any(ast.unparse(mark) == "pytest.mark.integration" for mark in marks)
    return False


def defines_tests(tree: ast.Module) -> bool:
    return any(
        (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"))
        or (isinstance(node, ast.ClassDef) and node.name.startswith("Test"))
        for node in tree.body
    )


def test_every_integration_and_acceptance_module_is_marked_integration() -> None:
    unmarked = []
    for folder in ("integration", "acceptance"):
        for path in sorted((TESTS / folder).rglob("test_*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            if defines_tests(tree) and not integration_marked(tree):
                unmarked.append(str(path.relative_to(REPO_ROOT)))
    assert not unmarked, f"add `pytestmark = pytest.mark.integration` to {unmarked}"


@pytest.mark.slow  # a fresh process importing every unit module: about 10 s on 2 cores
def test_the_unit_tier_collects_without_the_shared_data(tmp_path: Path) -> None:
    env = {**os.environ, "CLUSTERMEDIC_SHARED_DATA": str(tmp_path / "absent")}
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", str(UNIT)]
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " collected" in done.stdout and "error" not in done.stdout.splitlines()[-1], done.stdout[-2000:]
