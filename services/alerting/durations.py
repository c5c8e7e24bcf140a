"""Prometheus duration strings (``30s``, ``5m``, ``1h30m``, ``1d``), as Alertmanager reads them.

Units must appear largest first (``y w d h m s ms``), each at most once; ``0`` alone is zero. A year is
365 days and a week 7 days, as in Prometheus. Values are returned in (float) seconds.
"""

from __future__ import annotations

import re

_DURATION = re.compile(
    r"^(?:(?P<y>\d+)y)?(?:(?P<w>\d+)w)?(?:(?P<d>\d+)d)?(?:(?P<h>\d+)h)?"
    r"(?:(?P<m>\d+)m)?(?:(?P<s>\d+)s)?(?:(?P<ms>\d+)ms)?$"
)
_UNIT_SECONDS: dict[str, float] = {
    "y": 365 * 86400.0,
    "w": 7 * 86400.0,
    "d": 86400.0,
    "h": 3600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 0.001,
}


def parse_duration(text: str) -> float:
    """Parse a Prometheus duration string into seconds.

    Args:
        text: e.g. ``"30s"``, ``"5m"``, ``"4h"``, ``"1h30m"`` or ``"0"``.

    Returns:
        The duration in seconds.

    Raises:
        ValueError: the text is not a Prometheus duration (the message says what is expected).
    """
    if not isinstance(text, str):
        raise ValueError(f"expected a duration string such as '30s', '5m' or '4h', got {text!r}")
    if text == "0":
        return 0.0
    match = _DURATION.match(text)
    if not text or match is None or not any(match.groupdict().values()):
        raise ValueError(f"invalid duration {text!r}: use a Prometheus duration such as 30s, 5m, 4h or 1h30m")
    return sum(int(v) * _UNIT_SECONDS[unit] for unit, v in match.groupdict().items() if v is not None)


def format_duration(seconds: float) -> str:
    """Format seconds back into the shortest Prometheus duration string (``90`` -> ``"1m30s"``)."""
    if seconds <= 0:
        return "0s"
    millis = round(seconds * 1000)
    parts: list[str] = []
    for unit in ("d", "h", "m", "s"):
        size = round(_UNIT_SECONDS[unit] * 1000)
        count, millis = divmod(millis, size)
        if count:
            parts.append(f"{count}{unit}")
    if millis:
        parts.append(f"{millis}ms")
    return "".join(parts)
