"""The runbook knowledge base: every file loads, is consistent, and cites things that exist.

That every XID a runbook cites is in NVIDIA's catalog is checked by the data tier
(tests/data/test_xid_catalog.py), which reads the catalog from ../shared/data.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from pipelines.detectors.registry import signal_catalog
from services.core.errors import ConfigError
from services.core.paths import REPO_ROOT
from services.diagnostician.runbooks import (
    PLAYBOOK_DEFAULT_LEVELS,
    REQUIRED_SECTIONS,
    Runbook,
    check_anomaly_signals,
    load_runbook,
    load_runbooks,
    split_front_matter,
)

RUNBOOK_ROOT = REPO_ROOT / "knowledge" / "runbooks"
POSTMORTEM_ROOT = REPO_ROOT / "knowledge" / "postmortems"

# Playbook names and default levels; tests/unit/test_remediation_playbooks.py checks them against the registry.
REGISTRY_LEVELS = PLAYBOOK_DEFAULT_LEVELS

METRIC = re.compile(
    r"^(DCGM_FI_[A-Z0-9_]+|vllm:[a-z0-9_]+|tgi_[a-z0-9_]+|nv_[a-z0-9_]+|kube_[a-z0-9_]+"
    r"|kubelet_[a-z0-9_]+|prober_[a-z0-9_]+|container_[a-z0-9_]+|node_[A-Za-z0-9_]+|probe_[a-z0-9_]+)$"
)

VALID_RUNBOOK = """\
---
id: {slug}
title: Example failure
area: gpu
root_cause: example_failure
severity: warning
symptoms: [something is slow]
signals:
  metrics: [DCGM_FI_DEV_GPU_TEMP]
  logs: ["example <*>"]
  events: [NodeNotReady]
playbooks:
  - name: {playbook}
    level: {level}
---
## What it means
x
## Why it happens
x
## How to confirm
x
## Remediation
x
## Prevention
x
"""


@pytest.fixture(scope="module")
def runbooks() -> list[Runbook]:
    return load_runbooks(RUNBOOK_ROOT)


def _write(tmp_path: Path, slug: str = "example-failure", playbook: str = "cordon_node", level: int = 1) -> Path:
    path = tmp_path / "gpu" / f"{slug}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(VALID_RUNBOOK.format(slug=slug, playbook=playbook, level=level), encoding="utf-8")
    return path


def test_knowledge_base_has_at_least_30_runbooks_across_areas(runbooks: list[Runbook]) -> None:
    assert len(runbooks) >= 30
    assert {rb.area for rb in runbooks} >= {"gpu", "serving", "kubernetes", "network", "capacity"}


def test_ids_are_unique_and_equal_the_file_slug(runbooks: list[Runbook]) -> None:
    ids = [rb.id for rb in runbooks]
    assert len(ids) == len(set(ids))
    for rb in runbooks:
        assert rb.id == rb.path.stem, rb.path
        assert rb.path.parent.parent == RUNBOOK_ROOT
        assert rb.area == rb.path.parent.name


def test_root_causes_are_unique(runbooks: list[Runbook]) -> None:
    causes = [rb.root_cause for rb in runbooks]
    duplicates = sorted({c for c in causes if causes.count(c) > 1})
    assert not duplicates


def test_playbooks_are_registered_with_a_level_not_below_the_default(runbooks: list[Runbook]) -> None:
    for rb in runbooks:
        for step in rb.playbooks:
            assert step.name in REGISTRY_LEVELS, f"{rb.path}: {step.name}"
            assert 1 <= step.level <= 3, f"{rb.path}: {step.name} level {step.level}"
            assert step.level >= REGISTRY_LEVELS[step.name], f"{rb.path}: {step.name} weakened"


def test_metric_names_are_real_exporter_families(runbooks: list[Runbook]) -> None:
    for rb in runbooks:
        for name in rb.signals.metrics:
            assert METRIC.match(name), f"{rb.path}: {name}"


def test_serving_relevant_xids_each_have_a_runbook(runbooks: list[Runbook]) -> None:
    cited = {code for rb in runbooks for code in rb.signals.xid}
    assert {13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 154} <= cited


def test_anomaly_signals_are_ones_the_detectors_emit(runbooks: list[Runbook]) -> None:
    # the catalog is derived from the detectors' declarations (tests/unit/test_detector_signals.py runs them)
    try:
        check_anomaly_signals(runbooks, signal_catalog())
    except ConfigError as exc:
        pytest.fail(str(exc))


def test_a_runbook_naming_a_signal_no_detector_emits_is_refused_with_its_file_and_signal(tmp_path: Path) -> None:
    path = tmp_path / "gpu" / "example.md"
    path.parent.mkdir()
    text = VALID_RUNBOOK.format(slug="example", playbook="page_oncall", level=3)
    path.write_text(
        text.replace("  events: [NodeNotReady]\n", "  events: [NodeNotReady]\n  anomalies: [gpu_xid, gpu_xyd]\n")
    )
    runbook = load_runbook(path)  # the loader checks the shape; which signals exist is the detectors' to say
    with pytest.raises(ConfigError) as err:
        check_anomaly_signals([runbook], signal_catalog())
    first = str(err.value).splitlines()[0]
    assert first == f"{path}: signals.anomalies names 'gpu_xyd', which no detector emits"
    assert "gpu_xid" in str(err.value).splitlines()[-1]  # the known signals are listed


def test_an_anomaly_signal_must_be_snake_case(tmp_path: Path) -> None:
    path = tmp_path / "gpu" / "example.md"
    path.parent.mkdir()
    text = VALID_RUNBOOK.format(slug="example", playbook="page_oncall", level=3)
    path.write_text(text.replace("  events: [NodeNotReady]\n", "  events: [NodeNotReady]\n  anomalies: [GpuXid]\n"))
    with pytest.raises(ConfigError, match="snake_case"):
        load_runbook(path)


def test_log_templates_use_drain3_wildcards(runbooks: list[Runbook]) -> None:
    for rb in runbooks:
        for template in rb.signals.logs:
            assert template.strip() and "{" not in template, f"{rb.path}: {template!r}"


def test_bodies_have_the_required_sections_and_a_readable_length(runbooks: list[Runbook]) -> None:
    for rb in runbooks:
        headings = [line[3:].strip() for line in rb.body.splitlines() if line.startswith("## ")]
        for section in REQUIRED_SECTIONS:
            assert any(h.startswith(section) for h in headings), f"{rb.path}: missing {section!r}"
        words = len(rb.body.split())
        assert 250 <= words <= 600, f"{rb.path}: {words} words"


def test_how_to_confirm_gives_concrete_commands(runbooks: list[Runbook]) -> None:
    for rb in runbooks:
        section = rb.body.split("## How to confirm", 1)[1].split("\n## ", 1)[0]
        assert "```" in section or "`" in section, f"{rb.path}: no command in How to confirm"


def test_remediation_mentions_the_first_playbook(runbooks: list[Runbook]) -> None:
    for rb in runbooks:
        section = rb.body.split("## Remediation", 1)[1].split("\n## ", 1)[0]
        assert rb.playbooks[0].name in section, f"{rb.path}: Remediation does not name {rb.playbooks[0].name}"


def test_a_valid_runbook_round_trips(tmp_path: Path) -> None:
    rb = load_runbook(_write(tmp_path))
    assert rb.id == "example-failure"
    assert rb.playbooks[0].name == "cordon_node"
    assert rb.body.startswith("## What it means")


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda t: t.replace("name: cordon_node", "name: fix_everything"), "fix_everything"),
        (lambda t: t.replace("level: 1", "level: 4"), "level"),
        (lambda t: t.replace("[DCGM_FI_DEV_GPU_TEMP]", "[gpu_temperature]"), "gpu_temperature"),
        (lambda t: t.replace("severity: warning", "severity: meh"), "severity"),
        (lambda t: t.replace("## Prevention\n", "## Afterwards\n"), "Prevention"),
        (lambda t: t.replace("symptoms: [something is slow]\n", ""), "symptoms"),
        (lambda t: t.replace("title: Example failure", "title: [unclosed"), "YAML"),
        (lambda t: t.replace("---\n", "", 1), "front matter"),
        (lambda t: t.replace("area: gpu", "area: gpu\ncolour: blue"), "colour"),
    ],
)
def test_an_invalid_runbook_raises_config_error_naming_the_file(
    tmp_path: Path, mutate: Callable[[str], str], fragment: str
) -> None:
    path = _write(tmp_path)
    path.write_text(mutate(path.read_text(encoding="utf-8")), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_runbooks(tmp_path)
    assert str(path) in str(caught.value)
    assert fragment in str(caught.value)


def test_a_slug_that_differs_from_the_id_is_rejected(tmp_path: Path) -> None:
    path = _write(tmp_path)
    renamed = path.with_name("other-name.md")
    path.rename(renamed)
    with pytest.raises(ConfigError, match="other-name"):
        load_runbook(renamed)


def test_a_runbook_may_not_lower_a_playbook_level(tmp_path: Path) -> None:
    path = _write(tmp_path, playbook="drain_node", level=1)
    with pytest.raises(ConfigError, match="below its default"):
        load_runbook(path)


def test_duplicate_root_causes_name_both_files(tmp_path: Path) -> None:
    first = _write(tmp_path, slug="example-failure")
    second = tmp_path / "gpu" / "example-copy.md"
    second.write_text(first.read_text(encoding="utf-8").replace("id: example-failure", "id: example-copy"))
    with pytest.raises(ConfigError) as caught:
        load_runbooks(tmp_path)
    assert str(first) in str(caught.value) and str(second) in str(caught.value)


def test_an_empty_folder_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no runbooks"):
        load_runbooks(tmp_path)


def test_postmortems_cite_known_root_causes_and_playbooks(runbooks: list[Runbook]) -> None:
    causes = {rb.root_cause for rb in runbooks}
    paths = sorted(POSTMORTEM_ROOT.glob("*.md"))
    assert len(paths) >= 3
    for path in paths:
        meta, body = split_front_matter(path.read_text(encoding="utf-8"), path)
        assert meta["id"] == path.stem, path
        assert {"title", "root_cause", "date", "services", "playbooks_run"} <= meta.keys(), path
        assert meta["root_cause"] in causes, f"{path}: unknown root cause {meta['root_cause']}"
        for run in meta["playbooks_run"]:
            name = run["name"] if isinstance(run, dict) else run
            assert name in REGISTRY_LEVELS, f"{path}: {name}"
        for section in ("Timeline", "Impact", "Root cause", "What went well", "Action items"):
            assert f"## {section}" in body, f"{path}: missing {section}"
