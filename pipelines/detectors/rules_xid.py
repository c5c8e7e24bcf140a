"""XID rules: DCGM's last-XID field turned into one ``gpu_xid`` anomaly per new XID.

DCGM exporter's ``DCGM_FI_DEV_XID_ERRORS`` is a gauge holding the last XID the GPU raised (0: none)
and it keeps that value scrape after scrape. :class:`XidDetector` therefore fires on a *change* to a
non-zero code, and a code that comes back within ``hold_s`` of firing (79 → 0 → 79 as an exporter
clears and re-reads it) is a repeat, not news. Severity, required action and the playbook hint come
from NVIDIA's XID catalog (:mod:`pipelines.detectors.xid_catalog`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pipelines.detectors.rules_common import (
    forget_older,
    held_back,
    make_anomaly,
    plain,
    snapshots,
    topology_labels,
)
from pipelines.detectors.xid_catalog import XidCatalog
from services.core.events import Anomaly, MetricBatch

DETECTOR_NAME = "xid_rules"
XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"
_EVIDENCE_LABELS = ("gpu", "UUID", "Hostname", "hostname", "node", "modelName", "pod", "namespace", "container")


@dataclass
class XidGpuState:
    """What the detector remembers about one GPU.

    Attributes:
        last_code: the XID value of the latest sample (0: none).
        last_ts: timestamp of the latest sample.
        fired: XID code (as a string, for JSON) -> when it last fired.
    """

    last_code: int = 0
    last_ts: float = 0.0
    fired: dict[str, float] = field(default_factory=dict)


@dataclass
class XidState:
    """The detector's state: one :class:`XidGpuState` per GPU UUID."""

    gpus: dict[str, XidGpuState] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return the state as JSON-compatible values."""
        return plain(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> XidState:
        """Rebuild a state written by :meth:`to_dict`."""
        return cls(
            gpus={
                uuid: XidGpuState(
                    last_code=int(g.get("last_code", 0)),
                    last_ts=float(g.get("last_ts", 0.0)),
                    fired={str(k): float(v) for k, v in g.get("fired", {}).items()},
                )
                for uuid, g in data.get("gpus", {}).items()
            }
        )


class XidDetector:
    """Raises ``gpu_xid`` when a GPU reports a new XID, graded by NVIDIA's catalog.

    Args:
        catalog: the XID catalog; read from ``catalog_path`` when ``None``.
        catalog_path: folder (or CSV) holding ``nvidia_xid_catalog.csv``; defaults to
            ``shared_data_dir()/xid``.
        hold_s: a code that fired on a GPU less than this many seconds ago does not fire again
            (default 300 s).

    Raises:
        ConfigError: the catalog is absent or unreadable.
    """

    name: ClassVar[str] = DETECTOR_NAME
    consumes: ClassVar[type] = MetricBatch
    signals: ClassVar[frozenset[str]] = frozenset({"gpu_xid"})

    def __init__(
        self,
        catalog: XidCatalog | None = None,
        catalog_path: Path | str | None = None,
        hold_s: float = 300.0,
    ) -> None:
        self.catalog = catalog if catalog is not None else XidCatalog.load(catalog_path)
        self.hold_s = hold_s

    def initial_state(self) -> XidState:
        """Return an empty state."""
        return XidState()

    def detect(self, batch: Sequence[Any], state: XidState) -> tuple[XidState, list[Anomaly]]:
        """Read the XID samples of a micro-batch of DCGM metric batches.

        Args:
            batch: :class:`~services.core.events.MetricBatch` items (others are ignored).
            state: the state returned by the previous call (or :meth:`initial_state`).

        Returns:
            The updated state (changed in place) and one anomaly per new XID per GPU.
        """
        anomalies: list[Anomaly] = []
        for snap in snapshots(batch, entity_label="UUID"):
            samples = snap.samples.get(XID_METRIC)
            if not samples:
                continue
            sample = samples[0]
            gpu = state.gpus.setdefault(snap.entity, XidGpuState())
            if gpu.last_ts and snap.ts <= gpu.last_ts:
                continue  # late or repeated scrape
            code = int(sample.value)
            previous = gpu.last_code
            gpu.last_code, gpu.last_ts = code, snap.ts
            forget_older(gpu.fired, snap.ts, self.hold_s)
            if code <= 0 or code == previous:
                continue
            if held_back(gpu.fired, str(code), snap.ts, self.hold_s):
                continue
            entry = self.catalog.get(code)
            labels = topology_labels(sample.labels)
            evidence: dict[str, Any] = {
                "xid": code,
                "previous_xid": previous,
                "mnemonic": entry.mnemonic,
                "description": entry.description,
                "required_action": entry.action,
                "immediate_resolution": entry.immediate_resolution,
                "investigatory_resolution": entry.investigatory_resolution,
                "remediation": entry.remediation,
                "gpud_repair_actions": list(entry.gpud_repair_actions),
                "labels": {k: labels[k] for k in _EVIDENCE_LABELS if k in labels},
            }
            anomalies.append(
                make_anomaly(
                    detector=DETECTOR_NAME,
                    signal="gpu_xid",
                    entity=snap.entity,
                    entity_kind="gpu",
                    score=float(code),
                    threshold=1.0,
                    severity=entry.severity,
                    ts=snap.ts,
                    labels=labels,
                    evidence=evidence,
                )
            )
        return state, anomalies
