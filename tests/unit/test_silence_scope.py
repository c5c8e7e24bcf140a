"""Silences cannot mute everything by accident (issue 13, item 5): the matches-every-alert rule."""

from __future__ import annotations

import pytest

from services.alerting.labels import alert_labels
from services.alerting.matchers import parse_matchers
from services.alerting.silences import ALWAYS_PRESENT, ANY_VALUE_PROBES, Silence, Silences, matches_every_alert
from services.core.events import Anomaly


@pytest.mark.parametrize(
    "matchers",
    [
        'alertname=~".+"',
        'alertname=~".*"',
        'alertname=~"(.*)"',
        'alertname=~"(?:.+)|GpuXid"',
        'alertname=~"[\\s\\S]*"',
        'alertname!=""',
        'alertname!="GpuXid"',  # leaves out one name, mutes every other alert
        'alertname!~"Gpu.*"',
        'x!="nonexistent"',  # a label no alert carries reads as "", which is not "nonexistent"
        'nonexistent=""',
        'team=~"|ml"',
        'severity=~"info|warning|critical"',  # severity has exactly these three values
        'severity!="debug"',
        'entity_kind=~"gpu|node|pod|model|service|other"',
        'detector=~".{1,}", entity=~".+"',
        'alertname=~".+", x!="nonexistent"',
    ],
)
def test_matchers_that_every_alert_satisfies_are_found(matchers: str) -> None:
    assert matches_every_alert(parse_matchers(matchers))


@pytest.mark.parametrize(
    "matchers",
    [
        'alertname="GpuXid"',
        'node=~"gpu-node-0[0-3]"',
        'alertname=~".+", node="gpu-node-3"',
        'alertname=~"Gpu.*"',
        'severity="critical"',
        'severity!="info"',  # info alerts are left alone
        'entity_kind=~"gpu|node"',
        'node!=""',  # only alerts that have a node label
        'alertname!~".+"',  # matches no alert at all: not a mute-everything silence
    ],
)
def test_narrow_matchers_still_pass(matchers: str) -> None:
    assert not matches_every_alert(parse_matchers(matchers))


def test_no_matchers_match_everything() -> None:
    assert matches_every_alert(())


def test_always_present_labels_are_the_ones_every_alert_carries() -> None:
    # derived from alert_labels' own table, checked against an alert built from a minimal anomaly
    anomaly = Anomaly(entity="GPU-1", signal="gpu_xid", detector="xid_rules", score=1.0, threshold=0.5, ts=1.0)
    labels = alert_labels(anomaly)
    assert set(ALWAYS_PRESENT) <= set(labels) and all(labels[name] for name in ALWAYS_PRESENT)
    assert ALWAYS_PRESENT["severity"] == ("info", "warning", "critical")
    assert ALWAYS_PRESENT["alertname"] is None  # any non-empty string
    assert "" not in ANY_VALUE_PROBES and not any("\n" in p for p in ANY_VALUE_PROBES)


def test_a_confirmed_mute_all_silence_still_loads_into_the_engine() -> None:
    # the refusal is at creation (store, API, CLI); the engine must apply what was confirmed
    silence = Silences().add(Silence.of(['alertname=~".+"'], starts_at=0.0, ends_at=10.0))
    assert silence.mutes({"alertname": "Anything", "severity": "info"}, now=5.0)
