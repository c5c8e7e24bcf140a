"""The offline ranker on the recorded cases in tests/evals/diagnose (one folder per case)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.core.events import IncidentEvent
from services.core.paths import REPO_ROOT
from services.diagnostician.ranker import rank, runbook_index
from services.diagnostician.tools import gather_evidence

CASES = sorted(p for p in (REPO_ROOT / "tests" / "evals" / "diagnose").iterdir() if (p / "expected.json").exists())


def test_there_are_recorded_cases() -> None:
    assert len(CASES) >= 10


@pytest.mark.parametrize("case", CASES, ids=[p.name for p in CASES])
def test_recorded_case(case: Path) -> None:
    incident = IncidentEvent.model_validate_json((case / "incident.json").read_text())
    expected = json.loads((case / "expected.json").read_text())
    causes = [h.cause for h in rank(gather_evidence(incident), runbook_index())]
    right = expected.get("root_causes") or [expected["root_cause"]]
    assert any(cause in right for cause in causes[: expected.get("top_k", 1)]), causes[:5]
