"""Nezha's published RCA data (OnlineBoutique, TrainTicket) from ../shared/data/rca/nezha, replayed and ranked.

The loader, replay, detector and ranking are unit-tested on a small folder of their own
(tests/unit/test_diag_nezha.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from evals.nezha import evaluate_nezha, load_nezha, summarise
from services.core.paths import REPO_ROOT

KNOWLEDGE = REPO_ROOT / "knowledge"


@pytest.fixture(scope="module")
def published(shared_data: Path) -> Path:
    folder = shared_data / "rca" / "nezha"
    if not folder.is_dir():
        pytest.fail(f"{folder} is absent: put Nezha's OnlineBoutique data there (see its SOURCE.txt)")
    return folder


def test_published_days_replay_and_onlineboutique_finds_most_root_causes(published: Path) -> None:
    data = load_nezha(published)
    # OnlineBoutique (one day with metrics; 2022-08-23 has none) and TrainTicket (one day)
    assert [d.date for d in data.days] == ["2022-08-22", "2023-01-30"]
    assert [len(d.faults) for d in data.days] == [24, 17] and len(data.unreplayable) == 32
    assert {"cartservice", "checkoutservice", "productcatalogservice"} <= data.call_graph["frontend"]
    assert {"adservice", "ts-order-service", "ts-travel-service"} <= set(data.services)
    summary = summarise(evaluate_nezha(published, KNOWLEDGE))
    assert summary["cases_evaluated"] == 24 + 17
    assert any("adservice" in note for note in summary["notes"])  # its TimeStamps are 2e8 s off
    boutique = [c for c in summary["cases"] if c["case"].startswith("2022-08-22")]
    assert len(boutique) == 24
    top3 = sum(1 for c in boutique if c["service_rank"] is not None and c["service_rank"] <= 3) / len(boutique)
    # far from Nezha's 92.9% (it also reads logs and traces), but well above chance (1 in 10 services);
    # TrainTicket is scored too (the RCA issue raises its bar) but not held to one here
    assert top3 >= 0.5
