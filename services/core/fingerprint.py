"""Stable fingerprints: the one hash behind every alert identity and delivery key.

Every fingerprint in ClusterMedic is :func:`fingerprint` of some parts: a detector's
``(detector, signal, entity)``, a delivery's ``(identity, status, time)``. A label set (the identity
of an alert whose producer set none, or of a webhook alert whose sender omitted Alertmanager's) is
hashed by :func:`label_fingerprint`, which is Alertmanager's own algorithm so that both sides name
an alert alike. What each one identifies is the caller's to name; how it is hashed is decided here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

_SEPARATOR = "\x1f"  # ASCII unit separator, between parts
_ESCAPE = "\x1e"  # marks a separator or an escape that belongs to a part


def fingerprint(*parts: str) -> str:
    """A short stable hash of the parts (order matters), e.g. ``fingerprint(detector, signal, entity)``.

    SHA-256 of the parts joined by the unit separator, as 16 hex digits. A part that holds the
    separator or the escape character is escaped first, so two different tuples never hash the
    same text; a part without them (every real name) hashes as it is, so values stay what they were.
    """
    text = _SEPARATOR.join(_escaped(p) for p in parts)
    # surrogatepass: a lone surrogate decoded from JSON must give a fingerprint, not an exception
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


_FNV64_OFFSET = 0xCBF29CE484222325
_FNV64_PRIME = 0x100000001B3
_LABEL_SEPARATOR = b"\xff"  # no UTF-8 text holds this byte


def label_fingerprint(labels: Mapping[str, str]) -> str:
    """The fingerprint of a label set, whatever the order of its labels: Alertmanager's own.

    FNV-1a 64 over the sorted ``name 0xff value 0xff`` bytes, as 16 hex digits, as Prometheus'
    ``labels.Fingerprint`` computes it, so that an alert ClusterMedic pushes to Alertmanager has the
    same fingerprint there as here (a silence or an API lookup can name it).
    """
    h = _FNV64_OFFSET
    for name in sorted(labels):
        value = labels[name]
        for chunk in (name.encode("utf-8", "surrogatepass"), _LABEL_SEPARATOR,
                      value.encode("utf-8", "surrogatepass"), _LABEL_SEPARATOR):  # fmt: skip
            for byte in chunk:
                h ^= byte
                h = (h * _FNV64_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def _escaped(part: str) -> str:
    if _SEPARATOR not in part and _ESCAPE not in part:
        return part
    return part.replace(_ESCAPE, _ESCAPE + _ESCAPE).replace(_SEPARATOR, _ESCAPE + "s")
