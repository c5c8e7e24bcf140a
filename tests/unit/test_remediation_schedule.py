"""The recovery sweep runs on a schedule: `medic worker` embeds beat with the sweep in its schedule."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from services.celery_app import RECOVER_TASK, app, beat_schedule


def test_the_beat_schedule_sends_the_sweep_every_interval_and_lets_an_untaken_one_expire():
    entry = beat_schedule(7.0)[RECOVER_TASK]
    assert entry["task"] == RECOVER_TASK == "clustermedic.remediation.recover"
    assert entry["schedule"] == 7.0
    assert entry["options"] == {"queue": "default", "expires": 7.0}


@pytest.mark.parametrize(("flags", "beat"), [([], True), (["--no-beat"], False)])
def test_medic_worker_embeds_beat_with_an_in_memory_schedule_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch, flags: list[str], beat: bool
):
    from services.cli import app as cli

    argv: list[str] = []
    monkeypatch.setattr(app, "worker_main", lambda args: argv.extend(args))
    monkeypatch.setenv("CLUSTERMEDIC_REMEDIATION_RECOVER_INTERVAL_S", "12")
    app.conf.beat_schedule = {}
    result = CliRunner().invoke(cli, ["worker", *flags])
    assert result.exit_code == 0, result.output
    assert ("--beat" in argv) is beat
    if beat:
        assert argv[argv.index("--scheduler") + 1] == "celery.beat:Scheduler", "a shelve file would be shared"
        schedule: dict[str, Any] = app.conf.beat_schedule
        assert schedule[RECOVER_TASK]["schedule"] == 12.0
