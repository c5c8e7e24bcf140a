"""Stable fingerprints: the one hash behind every alert identity and delivery key.

Every fingerprint in ClusterMedic is :func:`fingerprint` of some parts: a detector's
``(detector, signal, entity)``, a label set's sorted name/value pairs (:func:`label_fingerprint`, the
identity of an alert whose producer set none, or of a webhook alert whose sender omitted
Alertmanager's), a delivery's ``(identity, status, time)``. What each one identifies is the caller's
to name; how it is hashed is decided here, once.
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


def label_fingerprint(labels: Mapping[str, str]) -> str:
    """The fingerprint of a label set, whatever the order of its labels: its sorted name, value pairs."""
    return fingerprint(*(part for item in sorted(labels.items()) for part in item))


def _escaped(part: str) -> str:
    if _SEPARATOR not in part and _ESCAPE not in part:
        return part
    return part.replace(_ESCAPE, _ESCAPE + _ESCAPE).replace(_SEPARATOR, _ESCAPE + "s")
