"""A made-up XID catalog for tests that need *an* :class:`XidCatalog`, not NVIDIA's.

NVIDIA's catalog lives in ``../shared/data/xid`` and is read only by the data tier (tests/data); it is
never copied into the project, not even a few rows. The codes below (9001-9003) are not NVIDIA XIDs
and the mnemonics say so: they only give the detector an entry of each kind of action to report.
Action and severity come from the project's own policy (:func:`classify`), as they do for real rows.
"""

from __future__ import annotations

from pipelines.detectors.xid_catalog import PLAYBOOK_FOR_ACTION, XidCatalog, XidEntry, classify

REBOOT_CODE = 9001
"""A made-up XID whose resolution is ``RESTART_BM``: reboot the node, critical."""
RESET_CODE = 9002
"""A made-up XID whose resolution is ``RESET_GPU``: reset the GPU, critical."""
APP_CODE = 9003
"""A made-up XID whose resolution is ``RESTART_APP``: restart the pod, a warning."""


def made_up_entry(code: int, mnemonic: str, immediate: str) -> XidEntry:
    """Return a test entry for ``code``, classified by the project's policy from ``immediate``."""
    action, severity = classify(immediate, (), "")
    return XidEntry(
        code=code,
        mnemonic=mnemonic,
        description=f"made-up XID {code} for tests",
        immediate_resolution=immediate,
        investigatory_resolution="",
        gpud_repair_actions=(),
        gpud_event_type="",
        action=action,
        severity=severity,
        remediation=PLAYBOOK_FOR_ACTION[action],
    )


def made_up_xid_catalog() -> XidCatalog:
    """Return a three-entry catalog of made-up codes (any other code is unknown: page a human)."""
    entries = [
        made_up_entry(REBOOT_CODE, "TEST_ONLY_REBOOT", "RESTART_BM"),
        made_up_entry(RESET_CODE, "TEST_ONLY_RESET", "RESET_GPU"),
        made_up_entry(APP_CODE, "TEST_ONLY_APP", "RESTART_APP"),
    ]
    return XidCatalog({e.code: e for e in entries}, source="tests/made_up_xids.py")
