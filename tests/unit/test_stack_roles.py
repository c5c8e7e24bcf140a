"""The supervisord configuration ``medic stack`` writes for its roles.

docker-compose.yml and infra/k8s run the same commands: tests/unit/test_compose.py takes its role
table from :data:`services.stack.ROLES`. (The compose and Kubernetes worker once consumed only the
remediation and notify queues, so no verification or finish task of a playbook was ever taken.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from services.core.settings import Settings
from services.stack import ROLES, ROLES_BY_NAME, Stack, StackError


def test_the_supervisord_config_runs_each_role_once_in_its_own_process_group(tmp_path: Path) -> None:
    (tmp_path / "kubeconfig").write_text("{}")  # else the events watch is skipped (below)
    text = Stack(Settings(ingest_k8s_kubeconfig=tmp_path / "kubeconfig"), run_dir=tmp_path).config_text()
    for role in ROLES:
        assert text.count(f"[program:{role.name}]") == 1
        assert f"-m services.cli {' '.join(role.argv)}\n" in text
    assert text.count("stopasgroup=true") == len(ROLES) and text.count("killasgroup=true") == len(ROLES)
    assert "chmod=0700" in text  # only this user can drive supervisord's socket
    assert "environment=CLUSTERMEDIC_FAUST_WEB_PORT=16067" in text  # two Faust workers, two web ports


def test_without_a_kubeconfig_the_events_watch_is_skipped_and_says_why(tmp_path: Path) -> None:
    stack = Stack(Settings(ingest_k8s_kubeconfig=None), run_dir=tmp_path)
    assert stack.skipped() == {"events": "not configured: CLUSTERMEDIC_INGEST_K8S_KUBECONFIG is unset"}
    text = stack.config_text()
    assert "[program:events]" not in text and "watch-k8s" not in text
    assert text.count("[program:") == len(ROLES) - 1  # every other role still runs


def test_with_a_kubeconfig_the_events_watch_runs_with_that_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "kubeconfig").write_text("{}")
    monkeypatch.chdir(tmp_path)  # a relative path: the role runs in the repository, so it gets it absolute
    stack = Stack(Settings(ingest_k8s_kubeconfig=Path("kubeconfig")), run_dir=tmp_path)
    assert stack.skipped() == {}
    text = stack.config_text()
    program = text.split("[program:events]\n", 1)[1].split("\n\n", 1)[0]
    assert "-m services.cli ingest watch-k8s\n" in program
    assert f"environment=CLUSTERMEDIC_INGEST_K8S_KUBECONFIG={tmp_path / 'kubeconfig'}" in program


def test_a_kubeconfig_that_is_no_file_fails_up_before_anything_starts(tmp_path: Path) -> None:
    stack = Stack(Settings(ingest_k8s_kubeconfig=tmp_path / "typo"), run_dir=tmp_path)
    with pytest.raises(StackError, match=r"role events: CLUSTERMEDIC_INGEST_K8S_KUBECONFIG=.*typo is no file"):
        stack.up(say=lambda _: None)
    assert not stack.conf.exists() and not stack.running()


def test_up_of_only_skipped_roles_starts_nothing(tmp_path: Path) -> None:
    stack = Stack(Settings(ingest_k8s_kubeconfig=None), run_dir=tmp_path, roles=(ROLES_BY_NAME["events"],))
    with pytest.raises(StackError, match="no role to start: events not configured"):
        stack.up(say=lambda _: None)
    assert not stack.running()
