from pipelines.detectors.rules_revision import RevisionDetector, RevisionState
from pipelines.features import FeatureVector
from services.core.events import Anomaly

OLD, NEW = "llama-70b-7d9f8b6c5d", "llama-70b-cj2wbtpt7w"


def vector(pod: str, ts: float, tpot: float, tokens: float = 400.0) -> FeatureVector:
    replica_set = pod.rsplit("-", 1)[0]
    labels = {"pod": pod, "model_name": "llama", "deployment": "llama-70b", "replica_set": replica_set}
    return FeatureVector(pod, "pod", ts, {"tpot_mean_s": tpot, "tpot_observations": tokens}, labels)


def run(detector: RevisionDetector, state: RevisionState, ticks: list[list[FeatureVector]]) -> list[Anomaly]:
    found: list[Anomaly] = []
    for batch in ticks:
        state, anomalies = detector.detect(batch, state)
        found += anomalies
    return found


def scrapes(start: float, n: int, new_tpot: float, old_tpot: float = 0.05) -> list[list[FeatureVector]]:
    return [
        [vector(f"{OLD}-aaaaa", start + 15 * i, old_tpot), vector(f"{OLD}-bbbbb", start + 15 * i, old_tpot * 1.1)]
        + ([vector(f"{NEW}-ccccc", start + 15 * i, new_tpot)] if new_tpot else [])
        for i in range(n)
    ]


def test_a_new_revision_slower_than_the_old_one_fires_once_on_its_pod() -> None:
    detector = RevisionDetector()
    state = detector.initial_state()
    run(detector, state, scrapes(0, 4, new_tpot=0.0))  # the old revision alone: nothing to compare
    found = run(detector, state, scrapes(60, 6, new_tpot=0.12))
    assert [(a.entity, a.status) for a in found] == [(f"{NEW}-ccccc", "firing")]
    first = found[0]
    assert first.ts == 75.0  # the second slower scrape (persistence 2)
    assert first.signal == "revision_regression" and first.entity_kind == "pod"
    assert first.evidence["replica_set"] == NEW and first.evidence["old_replica_set"] == OLD
    assert first.evidence["slower"]["tpot"]["ratio"] >= 2.0
    assert first.labels["pod"] == f"{NEW}-ccccc" and first.labels["model"] == "llama"


def test_a_new_revision_as_fast_as_the_old_one_is_quiet_and_the_old_pods_are_never_judged() -> None:
    detector = RevisionDetector()
    state = detector.initial_state()
    assert run(detector, state, scrapes(0, 4, new_tpot=0.0)) == []
    assert run(detector, state, scrapes(60, 8, new_tpot=0.055)) == []
    # a new revision that is faster makes the old pods look slow; they are the baseline, not the suspect
    assert run(detector, state, scrapes(180, 8, new_tpot=0.02, old_tpot=0.08)) == []


def test_too_few_tokens_are_no_evidence() -> None:
    detector = RevisionDetector()
    state = detector.initial_state()
    run(detector, state, scrapes(0, 4, new_tpot=0.0))
    thin = [[*b[:2], vector(f"{NEW}-ccccc", b[0].ts, 0.5, tokens=3)] for b in scrapes(60, 6, new_tpot=0.5)]
    assert run(detector, state, thin) == []


def test_it_resolves_when_the_new_revision_catches_up() -> None:
    detector = RevisionDetector()
    state = detector.initial_state()
    run(detector, state, scrapes(0, 4, new_tpot=0.0))
    assert [a.status for a in run(detector, state, scrapes(60, 4, new_tpot=0.15))] == ["firing"]
    assert [a.status for a in run(detector, state, scrapes(120, 8, new_tpot=0.05))] == ["resolved"]


def test_a_regression_stays_open_when_the_old_revision_is_gone() -> None:
    detector = RevisionDetector()
    state = detector.initial_state()
    run(detector, state, scrapes(0, 4, new_tpot=0.0))
    assert [a.status for a in run(detector, state, scrapes(60, 4, new_tpot=0.15))] == ["firing"]
    # the old pods stop reporting (the rollout finished): nothing to compare, so nothing is resolved
    alone = [[vector(f"{NEW}-ccccc", 120 + 15 * i, 0.15)] for i in range(12)]
    assert run(detector, state, alone) == []
    assert list(state.pods["llama-70b"]) == [f"{NEW}-ccccc"], "the old pods' windows were forgotten"
