"""A rule detector with a signal of its own: PCIe replays on a GPU's link.

==================== ================================================================ ==========
signal               when                                                             severity
==================== ================================================================ ==========
pcie_replay_errors   ``DCGM_FI_DEV_PCIE_REPLAY_COUNTER`` rose by >= ``threshold`` since     warning
                     the GPU's previous scrape (a healthy link replays ~never)
==================== ================================================================ ==========

The counter is cumulative: a drop is a reset (driver reload) and counts nothing. Fires at most once per
``hold_s`` per GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pipelines.detectors.rules_common import make_anomaly, topology_labels
from services.core.events import Anomaly, MetricBatch

REPLAYS = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"


@dataclass(frozen=True)
class PcieReplayDetector:
    """PCIe replay bursts per GPU, from the DCGM exporter (pure: time comes from the samples).

    Attributes:
        threshold: replays between two scrapes that count as a burst.
        hold_s: a GPU fires at most once in this many seconds.
    """

    name: ClassVar[str] = "pcie_replay"
    consumes: ClassVar[type] = MetricBatch
    signals: ClassVar[frozenset[str]] = frozenset({"pcie_replay_errors"})

    threshold: float = 10.0
    hold_s: float = 300.0

    def initial_state(self) -> dict[str, dict[str, float]]:
        """GPU UUID -> its last counter value and when it last fired (plain data: the table stores it)."""
        return {}

    def detect(self, batch: Sequence[Any], state: dict[str, dict[str, float]]) -> tuple[Any, list[Anomaly]]:
        """Compare each GPU's replay counter with its previous scrape."""
        out: list[Anomaly] = []
        for item in batch:
            for sample in item.samples if isinstance(item, MetricBatch) else ():
                uuid = sample.labels.get("UUID", "")
                if sample.name != REPLAYS or not uuid:
                    continue
                gpu = state.setdefault(uuid, {"last": sample.value, "fired": -self.hold_s})
                increase, gpu["last"] = sample.value - gpu["last"], sample.value
                if increase < self.threshold or sample.ts - gpu["fired"] < self.hold_s:
                    continue  # a drop (reset) is negative: nothing
                gpu["fired"] = sample.ts
                out.append(
                    make_anomaly(
                        detector=self.name,
                        signal="pcie_replay_errors",
                        entity=uuid,
                        entity_kind="gpu",
                        score=increase,
                        threshold=self.threshold,
                        severity="warning",
                        ts=sample.ts,
                        labels=topology_labels(sample.labels),
                        evidence={REPLAYS: sample.value, "replay_increase": increase},
                    )
                )
        return state, out
