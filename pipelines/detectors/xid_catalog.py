"""NVIDIA's XID catalog, typed, with the action, severity and playbook each XID calls for.

Two files from ``shared/data/xid`` (see its ``SOURCE.txt``; both mirrored by leptonai/gpud):

* ``nvidia_xid_catalog.csv``: NVIDIA's "Analyzing Xid Errors with the Xid Catalog" spreadsheet,
  columns ``Code, Mnemonic, Description, ImmediateResolution, InvestigatoryResolution``;
* ``gpud_xid_policy.csv``: gpud's own policy, columns ``xid, description, gpud_repair_actions,
  gpud_event_type`` (``RebootSystem;HardwareInspection``, ``Fatal``...).

NVIDIA's ``ImmediateResolution`` decides (:data:`RESOLUTION_POLICY`); gpud's policy fills in where
NVIDIA gives none (XIDs 162-172) and points the "ignore" XIDs 43 and 137 at the application.
Each entry ends up with one :data:`XidAction`, a severity and a remediation hint naming a playbook:

=================== ============== ===================================================
action              playbook       from
=================== ============== ===================================================
``restart_app``     restart_pod    RESTART_APP, CHECK_UVM; gpud CheckUserAppAndGPU
``reset_gpu``       reset_gpu      RESET_GPU, WORKFLOW_XID_48, WORKFLOW_NVLINK(5)_ERR
``reboot_node``     reboot_node    RESTART_BM, RESTART_VM; gpud RebootSystem
``inspect_hardware`` drain_node    CHECK_MECHANICALS; gpud HardwareInspection alone
``contact_support`` page_oncall    CONTACT_SUPPORT, UPDATE_SWFW, codes not in the catalog
``none``            (none)         IGNORE, WORKFLOW_XID_45, XID_154
=================== ============== ===================================================

The catalog is read when asked (:meth:`XidCatalog.load`), never at import time.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from services.core.errors import ConfigError
from services.core.events import Severity
from services.core.paths import shared_data_dir

XidAction = Literal["none", "restart_app", "reset_gpu", "reboot_node", "inspect_hardware", "contact_support"]

CATALOG_FILE = "nvidia_xid_catalog.csv"
POLICY_FILE = "gpud_xid_policy.csv"

PLAYBOOK_FOR_ACTION: dict[str, str | None] = {
    "none": None,
    "restart_app": "restart_pod",
    "reset_gpu": "reset_gpu",
    "reboot_node": "reboot_node",
    "inspect_hardware": "drain_node",
    "contact_support": "page_oncall",
}
"""Remediation playbook hinted for each action (``None``: nothing to do)."""

RESOLUTION_POLICY: dict[str, tuple[XidAction, Severity]] = {
    "RESTART_APP": ("restart_app", "warning"),
    "CHECK_UVM": ("restart_app", "warning"),
    "RESET_GPU": ("reset_gpu", "critical"),
    # NVIDIA's workflows for 48 (DBE) and 74 (NVLink) start with a GPU reset.
    "WORKFLOW_XID_48": ("reset_gpu", "critical"),
    "WORKFLOW_NVLINK_ERR": ("reset_gpu", "critical"),
    # 144-150: whether NVLink5 errors are fatal depends on the error status in the kernel line,
    # which DCGM's XID field does not carry; a warning with a reset hint until the log confirms.
    "WORKFLOW_NVLINK5_ERR": ("reset_gpu", "warning"),
    "RESTART_BM": ("reboot_node", "critical"),
    "RESTART_VM": ("reboot_node", "critical"),
    "CHECK_MECHANICALS": ("inspect_hardware", "critical"),
    "CONTACT_SUPPORT": ("contact_support", "warning"),
    "UPDATE_SWFW": ("contact_support", "warning"),
    # 45 follows another XID (that one is the fault); 154 only reports a recovery action changed.
    "WORKFLOW_XID_45": ("none", "info"),
    "XID_154": ("none", "info"),
    "IGNORE": ("none", "info"),
}
"""NVIDIA ``ImmediateResolution`` -> (action, severity)."""

_GPUD_SEVERITY: dict[str, Severity] = {"fatal": "critical", "warning": "warning", "info": "info"}


@dataclass(frozen=True)
class XidEntry:
    """One XID code: NVIDIA's text and resolutions, gpud's policy, and what ClusterMedic makes of them.

    Attributes:
        code: the XID number.
        mnemonic: NVIDIA's mnemonic (``ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS``).
        description: what it means (``GPU has fallen off the bus``).
        immediate_resolution: NVIDIA's first resolution (``RESTART_BM``), '' when none.
        investigatory_resolution: NVIDIA's follow-up (``CONTACT_SUPPORT``), '' when none.
        gpud_repair_actions: gpud's repair actions (``RebootSystem``, ``HardwareInspection``...).
        gpud_event_type: gpud's classification (``Fatal``, ``Warning``, ``Info``), '' when absent.
        action: the required action, normalised.
        severity: anomaly severity for this XID.
        remediation: the playbook to propose, or ``None`` when nothing needs doing.
    """

    code: int
    mnemonic: str
    description: str
    immediate_resolution: str
    investigatory_resolution: str
    gpud_repair_actions: tuple[str, ...]
    gpud_event_type: str
    action: XidAction
    severity: Severity
    remediation: str | None

    @property
    def app_level(self) -> bool:
        """True when the fault is the application's to recover from (restart the pod)."""
        return self.action == "restart_app"


def classify(immediate: str, gpud_actions: tuple[str, ...], gpud_event_type: str) -> tuple[XidAction, Severity]:
    """Return the (action, severity) an XID calls for.

    Args:
        immediate: NVIDIA's ``ImmediateResolution`` ('' when the catalog gives none).
        gpud_actions: gpud's repair actions for the code.
        gpud_event_type: gpud's event type for the code.
    """
    gpud_severity = _GPUD_SEVERITY.get(gpud_event_type.strip().lower(), "warning")
    policy = RESOLUTION_POLICY.get(immediate.strip().upper())
    if policy is not None:
        action, severity = policy
        # NVIDIA says no GPU action, gpud says look at the application: an app-level fault (43, 137).
        if action == "none" and immediate.strip().upper() == "IGNORE" and "CheckUserAppAndGPU" in gpud_actions:
            return "restart_app", "info"
        return action, severity
    if immediate.strip():
        return "contact_support", "warning"  # a resolution newer than this table: a human decides
    if "RebootSystem" in gpud_actions:
        return "reboot_node", gpud_severity
    if "HardwareInspection" in gpud_actions:
        return "inspect_hardware", gpud_severity
    if "CheckUserAppAndGPU" in gpud_actions:
        return "restart_app", gpud_severity
    return "none", gpud_severity


def unknown_entry(code: int) -> XidEntry:
    """Return the entry used for a code absent from the catalog: page a human."""
    return XidEntry(
        code=code,
        mnemonic="UNKNOWN",
        description=f"Xid {code} (not in the catalog)",
        immediate_resolution="",
        investigatory_resolution="",
        gpud_repair_actions=(),
        gpud_event_type="",
        action="contact_support",
        severity="warning",
        remediation=PLAYBOOK_FOR_ACTION["contact_support"],
    )


class XidCatalog:
    """XID code -> :class:`XidEntry`.

    Args:
        entries: the entries, keyed by code.
        source: where they were read from (shown in errors and evidence).
    """

    def __init__(self, entries: dict[int, XidEntry], source: str = "") -> None:
        self.entries = dict(entries)
        self.source = source

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, code: object) -> bool:
        return code in self.entries

    def get(self, code: int) -> XidEntry:
        """Return the entry for ``code``; a code the catalog lacks gets :func:`unknown_entry`."""
        return self.entries.get(code) or unknown_entry(code)

    @classmethod
    def default_dir(cls) -> Path:
        """Return ``shared_data_dir()/xid``.

        Raises:
            ConfigError: the shared data folder is absent.
        """
        return shared_data_dir() / "xid"

    @classmethod
    def load(cls, path: Path | str | None = None) -> XidCatalog:
        """Read the catalog (and gpud's policy, when beside it).

        Args:
            path: the folder holding ``nvidia_xid_catalog.csv``, or the CSV itself;
                :meth:`default_dir` when ``None``.

        Raises:
            ConfigError: the catalog is absent, unreadable or has no ``Code`` column.
        """
        base = Path(path) if path is not None else cls.default_dir()
        catalog_path = base / CATALOG_FILE if base.is_dir() else base
        if not catalog_path.is_file():
            raise ConfigError(
                f"NVIDIA XID catalog {catalog_path} is absent: put {CATALOG_FILE} there "
                "(see shared/data/xid/SOURCE.txt) or set CLUSTERMEDIC_SHARED_DATA"
            )
        policy = _read_policy(catalog_path.parent / POLICY_FILE)
        entries: dict[int, XidEntry] = {}
        try:
            with catalog_path.open(newline="", encoding="utf-8") as fh:
                reader = csv.DictReader(fh)
                if reader.fieldnames is None or "Code" not in reader.fieldnames:
                    raise ConfigError(f"{catalog_path}: expected a 'Code' column, got {reader.fieldnames}")
                for row in reader:
                    code = int(row["Code"])
                    actions, event_type = policy.get(code, ((), ""))
                    immediate = (row.get("ImmediateResolution") or "").strip()
                    action, severity = classify(immediate, actions, event_type)
                    entries[code] = XidEntry(
                        code=code,
                        mnemonic=(row.get("Mnemonic") or "").strip(),
                        description=(row.get("Description") or "").strip(),
                        immediate_resolution=immediate,
                        investigatory_resolution=(row.get("InvestigatoryResolution") or "").strip(),
                        gpud_repair_actions=actions,
                        gpud_event_type=event_type,
                        action=action,
                        severity=severity,
                        remediation=PLAYBOOK_FOR_ACTION[action],
                    )
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(f"NVIDIA XID catalog {catalog_path} is unreadable: {exc}") from exc
        return cls(entries, str(catalog_path))


def _read_policy(path: Path) -> dict[int, tuple[tuple[str, ...], str]]:
    """Read gpud's policy: code -> (repair actions, event type); empty when the file is absent."""
    if not path.is_file():
        return {}
    out: dict[int, tuple[tuple[str, ...], str]] = {}
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                actions = tuple(a.strip() for a in (row.get("gpud_repair_actions") or "").split(";") if a.strip())
                out[int(row["xid"])] = (actions, (row.get("gpud_event_type") or "").strip())
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"gpud XID policy {path} is unreadable: {exc}") from exc
    return out
