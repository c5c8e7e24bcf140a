"""The supervisord configuration ``medic stack`` writes for its roles.

docker-compose.yml and infra/k8s run the same commands: tests/unit/test_compose.py takes its role
table from :data:`services.stack.ROLES`. (The compose and Kubernetes worker once consumed only the
remediation and notify queues, so no verification or finish task of a playbook was ever taken.)
"""

from __future__ import annotations

from pathlib import Path

from services.core.settings import Settings
from services.stack import ROLES, Stack


def test_the_supervisord_config_runs_each_role_once_in_its_own_process_group(tmp_path: Path) -> None:
    text = Stack(Settings(), run_dir=tmp_path).config_text()
    for role in ROLES:
        assert text.count(f"[program:{role.name}]") == 1
        assert f"-m services.cli {' '.join(role.argv)}\n" in text
    assert text.count("stopasgroup=true") == len(ROLES) and text.count("killasgroup=true") == len(ROLES)
    assert "chmod=0700" in text  # only this user can drive supervisord's socket
    assert "environment=CLUSTERMEDIC_FAUST_WEB_PORT=16067" in text  # two Faust workers, two web ports
