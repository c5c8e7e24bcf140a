"""Stable fingerprints: the identity dedup decides on."""

from __future__ import annotations

import hashlib


def fingerprint(*parts: str) -> str:
    """A short stable hash of the parts (order matters), e.g. ``fingerprint(detector, signal, entity)``."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()
    return digest[:16]
