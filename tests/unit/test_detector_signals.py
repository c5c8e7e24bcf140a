"""Detector signals: each detector declares what it emits, and the signal catalog is derived from that.

That a detector emits nothing it does not declare is checked on every detector call of the unit and data
tiers (tests/detector_guard.py); that runbooks name only declared signals, in tests/unit/test_runbooks.py.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from pipelines.detectors.registry import DETECTORS, signal_catalog
from pipelines.detectors.rules_kube import KubeEventDetector
from services.core.events import Anomaly, KubeEvent, ObjectRef
from tests.detector_guard import UndeclaredSignal, declared_only

SNAKE = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$")


def test_every_registered_detector_declares_the_signals_it_emits() -> None:
    for name in DETECTORS:
        signals = DETECTORS.load(name).signals
        assert isinstance(signals, frozenset) and signals, f"{name}: `signals` must be a non-empty frozenset"
        assert all(SNAKE.match(s) for s in signals), f"{name}: signals must be snake_case: {sorted(signals)}"


def test_the_catalog_is_every_declared_signal_with_the_detectors_that_emit_it() -> None:
    catalog = signal_catalog()
    declared = {name: DETECTORS.load(name).signals for name in DETECTORS}
    assert set(catalog) == set().union(*declared.values())
    for signal, emitters in catalog.items():
        assert set(emitters) == {name for name, signals in declared.items() if signal in signals}, signal
    # two detectors may emit one signal: the XID rule from DCGM, the log detector from the kernel log
    assert catalog["gpu_xid"] == ("log_templates", "xid_rules")


def test_a_node_event_stream_emits_only_declared_signals() -> None:
    # the unit tier's guard is active here too: KubeEventDetector.detect is the checked one
    def event(reason: str, name: str, ts: float, kind: str = "Node") -> KubeEvent:
        return KubeEvent(reason=reason, type="Warning", involved_object=ObjectRef(kind=kind, name=name), ts=ts)

    detector = KubeEventDetector()
    state = detector.initial_state()
    flaps = [event("NodeNotReady" if i % 2 == 0 else "NodeReady", "gpu-node-1", 10.0 * i) for i in range(8)]
    state, anomalies = detector.detect(flaps, state)
    assert {"node_not_ready", "node_flapping"} <= {a.signal for a in anomalies}


class _Sloppy:
    """A detector that emits a signal it does not declare."""

    name: ClassVar[str] = "sloppy"
    consumes: ClassVar[type] = KubeEvent
    signals: ClassVar[frozenset[str]] = frozenset({"declared"})

    def initial_state(self) -> None:
        return None

    def detect(self, batch: Sequence[Any], state: Any) -> tuple[Any, list[Anomaly]]:
        anomaly = Anomaly(
            entity="e", entity_kind="other", signal="undeclared", detector=self.name, score=1.0, threshold=1.0,
            severity="warning", ts=0.0, fingerprint="f",
        )  # fmt: skip
        return state, [anomaly]


def test_the_guard_names_the_detector_and_the_undeclared_signal() -> None:
    checked = declared_only(_Sloppy, _Sloppy.detect)
    with pytest.raises(UndeclaredSignal, match=r"_Sloppy emitted \['undeclared'\].*\['declared'\]"):
        checked(_Sloppy(), [], None)


def test_the_cli_prints_the_catalog_and_refuses_runbooks_naming_a_signal_nothing_emits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from services.cli import app
    from services.core.paths import REPO_ROOT

    ok = CliRunner().invoke(app, ["detect", "signals"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["gpu_xid"] == ["log_templates", "xid_rules"]

    shutil.copytree(REPO_ROOT / "knowledge" / "runbooks", tmp_path / "runbooks")
    network = tmp_path / "runbooks" / "network" / "network-latency-packet-loss.md"
    network.write_text(network.read_text().replace("anomalies: [", "anomalies: [packet_loss, ", 1))
    monkeypatch.setenv("CLUSTERMEDIC_KB_DIR", str(tmp_path))
    refused = CliRunner().invoke(app, ["detect", "signals"])
    assert refused.exit_code == 1
    assert f"{network}: signals.anomalies names 'packet_loss', which no detector emits" in refused.output
