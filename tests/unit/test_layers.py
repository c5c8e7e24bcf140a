"""The package layers (docs/ARCHITECTURE: import rules), read from the source with ``ast``, nothing imported.

``services/*`` never imports ``pipelines/*`` or ``evals/*``: the stream pipeline and the evaluation
harnesses sit above the services they use. Only the entrypoints below wire them in, each for a stated
reason. ``services/alerting`` (the Alertmanager model) sits right above ``services/core``: store, notify,
the API and the pipeline all use it, so it may use nothing else of the project.

Imports inside functions count as much as those at the top of a module: a lazy import is still a
dependency.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICES = REPO_ROOT / "services"

# Packages of this repository that services must not import.
ABOVE_SERVICES = ("pipelines", "evals")

# Modules under services/ allowed to import pipelines.* or evals.*, each with why.
ENTRYPOINTS: dict[str, str] = {
    "services/cli.py": "the CLI starts the pipeline roles and the eval loop, and injects the notify stage",
    "services/demo/smoke.py": "`medic demo --smoke` runs the smoke Faust agent in its own process",
    "services/diagnostician/cli.py": "`medic eval diagnose` and `medic eval nezha` run the harnesses in evals/",
}


def modules(root: Path) -> Iterator[Path]:
    yield from sorted(root.rglob("*.py"))


def imported(path: Path) -> Iterator[tuple[int, str]]:
    """Every module ``path`` imports (absolute names; a relative import is resolved against its package),
    anywhere in the module, including ``importlib.import_module("...")`` with a literal name."""
    package = path.relative_to(REPO_ROOT).with_suffix("").parts[:-1]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                yield node.lineno, ".".join([*base, node.module] if node.module else base)
            elif node.module:
                yield node.lineno, node.module
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def top(name: str) -> str:
    return name.split(".", 1)[0]


def test_services_never_import_the_pipeline_or_the_evaluation_harnesses_except_the_listed_entrypoints() -> None:
    upward: list[str] = []
    used_by_entrypoint: set[str] = set()
    for path in modules(SERVICES):
        rel = path.relative_to(REPO_ROOT).as_posix()
        for line, name in imported(path):
            if top(name) not in ABOVE_SERVICES:
                continue
            if rel in ENTRYPOINTS:
                used_by_entrypoint.add(rel)
            else:
                upward.append(f"{rel}:{line} imports {name}")
    assert upward == [], "services import upward:\n" + "\n".join(upward)
    # an exception nobody needs any more must go, or it will hide the next upward import
    assert sorted(used_by_entrypoint) == sorted(ENTRYPOINTS)


def test_the_alertmanager_model_imports_only_core_and_third_party_packages() -> None:
    local = {p.name for p in REPO_ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert {"services", "pipelines"} <= local
    found: list[str] = []
    for path in modules(SERVICES / "alerting"):
        rel = path.relative_to(REPO_ROOT).as_posix()
        for line, name in imported(path):
            if top(name) in local and not name.startswith(("services.core", "services.alerting")):
                found.append(f"{rel}:{line} imports {name}")
    assert found == [], "services/alerting must import only services.core:\n" + "\n".join(found)
