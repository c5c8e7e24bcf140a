"""The anomaly history's role object and row building: batching, alert fingerprints, prune cadence on
event time, bounded evidence (no network)."""

from __future__ import annotations

import json

import pytest

from pipelines.correlate.history import AnomalyHistory, alert_fingerprint
from services.alerting.labels import alert_labels
from services.core.events import Anomaly
from services.core.fingerprint import label_fingerprint
from services.store.anomalies import DROPPED_KEY, anomaly_row, bounded_evidence


def make(ts: float = 1_800_000_000.0, **fields: object) -> Anomaly:
    values: dict[str, object] = {
        "entity": "GPU-1",
        "signal": "gpu_xid",
        "detector": "xid_rules",
        "score": 79.0,
        "threshold": 1.0,
        "ts": ts,
        "labels": {"node": "n1"},
    }
    values.update(fields)
    return Anomaly(**values)  # type: ignore[arg-type]


def test_a_queued_anomaly_carries_the_fingerprint_of_the_alert_it_updates() -> None:
    history = AnomalyHistory(retention_s=3600, batch_size=2)
    plain, named = make(), make(fingerprint="alertmanager:abc")
    history.add(plain)
    assert not history.full()
    history.add(named)

    assert history.full()
    batch = history.take()
    assert [a.fingerprint for a in batch] == [label_fingerprint(alert_labels(plain)), "alertmanager:abc"]
    assert alert_fingerprint(plain) == batch[0].fingerprint
    assert len(history) == 0 and history.take() == []


def test_prunes_follow_event_time_at_most_once_per_interval() -> None:
    history = AnomalyHistory(retention_s=7 * 86400, prune_every_s=3600)
    t0 = 1_800_000_000.0

    assert history.prune_before(None) is None  # no event seen yet: no clock, no prune
    assert history.prune_before(t0) == t0 - 7 * 86400
    assert history.prune_before(t0 + 3599) is None
    assert history.prune_before(t0 + 3600) == t0 + 3600 - 7 * 86400


def test_large_evidence_keeps_its_small_fields_and_names_the_dropped_ones() -> None:
    evidence = {"xid": 79, "reason": "Rollout", "window": list(range(4000)), "example": "x" * 9000}
    kept = bounded_evidence(evidence, max_bytes=512)

    assert kept == {"xid": 79, "reason": "Rollout", DROPPED_KEY: ["example", "window"]}
    assert len(json.dumps(kept, separators=(",", ":")).encode()) <= 512
    assert bounded_evidence({"xid": 79}, max_bytes=512) == {"xid": 79}  # small evidence is untouched


@pytest.mark.parametrize("ts", [float("nan"), float("inf"), 1e15])
def test_a_time_that_is_no_instant_cannot_become_a_row(ts: float) -> None:
    with pytest.raises(ValueError, match="anomaly time"):
        anomaly_row(make(ts=ts, fingerprint="f"))


def test_an_anomaly_without_a_fingerprint_cannot_become_a_row() -> None:
    with pytest.raises(ValueError, match="fingerprint"):
        anomaly_row(make())


def test_the_history_clock_is_the_earliest_cluster_clock() -> None:
    from pipelines.correlate.correlator import Correlator
    from services.alerting.config import loads_routing

    correlator = Correlator(loads_routing("route: {receiver: sre}\nreceivers: [{name: sre}]\n"), clock=lambda: 0.0)
    assert correlator.event_time() is None
    correlator.ingest("a", make(ts=1_800_000_000.0, labels={"cluster": "a"}))
    correlator.ingest("b", make(ts=1_900_000_000.0, labels={"cluster": "b"}))  # far ahead: it prunes no one

    assert correlator.event_time() == 1_800_000_000.0
