"""PCI bus ids: every form a GPU source writes (DCGM, NVML, sysfs, the kernel's NVRM lines, lspci) gives
one key, so a kernel XID's address finds the GPU DCGM reported there."""

from __future__ import annotations

import pytest

from services.core.pci import pci_bus_key


@pytest.mark.parametrize(
    "text",
    ["00000000:3B:00.0", "0000:3b:00.0", "PCI:0000:3b:00", "pci:0000:3B:00", "3b:00.0", "3b:00", " 0000:3b:00 "],
)
def test_every_form_of_one_pci_address_gives_one_key(text: str) -> None:
    assert pci_bus_key(text) == "0000:3b:00"


def test_other_addresses_and_non_addresses_give_other_keys_or_none() -> None:
    assert pci_bus_key("00000001:3B:00.0") == "0001:3b:00"  # another domain is another address
    assert pci_bus_key("0000:3b:01.0") != pci_bus_key("0000:3b:00.0")
    assert pci_bus_key("0000:5d:00.0") != pci_bus_key("0000:3b:00.0")
    for bad in ("", "GPU-1", "3b", "0000:3b:20.0", "0000:3b:00.8", "0000:zz:00", "0000:3b:00:00", "0" * 5000):
        assert pci_bus_key(bad) == "", bad
