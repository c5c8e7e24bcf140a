"""PCI bus ids, the address every GPU source names a GPU by besides its UUID.

The sources write one address in different forms:

====================================  =========================  ==================================
source                                form                       example
====================================  =========================  ==================================
DCGM exporter ``pci_bus_id``, NVML    8-digit domain, upper case ``00000000:3B:00.0``
sysfs, ``lspci -D``, the simulator    4-digit domain, lower case ``0000:3b:00.0``
kernel ``NVRM: Xid (PCI:...)``        ``PCI:`` prefix, no function ``PCI:0000:3b:00``
``lspci``                             no domain                  ``3b:00.0``
====================================  =========================  ==================================

:func:`pci_bus_key` turns each into one key, ``dddd:bb:dd`` in lower case (``0000:3b:00``): the domain
is optional (absent means 0, as lspci prints it) and the function is dropped (NVRM does not print it,
and a GPU is function 0 of its device).
"""

from __future__ import annotations

import re

PCI_ID_MAX = 64
"""Longest text read as a PCI bus id (the longest real form has 16 characters)."""

_PCI_ID = re.compile(
    r"(?:PCI:)?(?:(?P<domain>[0-9a-f]{1,8}):)?(?P<bus>[0-9a-f]{1,2}):(?P<device>[0-9a-f]{1,2})(?:\.(?P<function>[0-7]))?",
    re.IGNORECASE,
)


def pci_bus_key(text: str) -> str:
    """The canonical key of a PCI bus id (``0000:3b:00``), or ``""`` when ``text`` is not one.

    Args:
        text: a bus id in any of the forms above; surrounding whitespace is ignored.
    """
    if len(text) > PCI_ID_MAX:
        return ""
    found = _PCI_ID.fullmatch(text.strip())
    if found is None:
        return ""
    device = int(found.group("device"), 16)
    if device > 0x1F:  # five bits: 00-1f
        return ""
    domain = int(found.group("domain") or "0", 16)
    return f"{domain:04x}:{int(found.group('bus'), 16):02x}:{device:02x}"
