"""Alertmanager time intervals: ``times``, ``weekdays``, ``days_of_month``, ``months``, ``years``,
``location``.

An interval contains an instant when every field it sets contains it (an unset field contains every
instant); a named time interval is a list of intervals and contains an instant when any of them does.
Ranges are inclusive (``monday:friday``, ``1:5``) except ``times``, whose end is exclusive
(``start_time: "09:00", end_time: "17:00"`` ends at 16:59:59; ``24:00`` is allowed as an end).
Negative days of the month count from the end (``-1`` is the last day); a range is clamped to the
length of the month. Everything is evaluated in ``location`` (an IANA zone, default UTC).
"""

from __future__ import annotations

import calendar
import re
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

WEEKDAYS: dict[str, int] = {
    name: i for i, name in enumerate(("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday"))
}
MONTHS: dict[str, int] = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
_CLOCK = re.compile(r"^(\d{2}):(\d{2})$")

IntRange = tuple[int, int]


def _split_range(text: object, what: str) -> tuple[str, str]:
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"expected a {what} or a '{what}:{what}' range, got {text!r}")
    parts = text.strip().split(":")
    if len(parts) == 1:
        return parts[0].strip(), parts[0].strip()
    if len(parts) == 2:
        return parts[0].strip(), parts[1].strip()
    raise ValueError(f"invalid {what} range {text!r}: use 'begin:end'")


def _named_or_int(token: str, names: dict[str, int], what: str, lo: int, hi: int) -> int:
    low = token.lower()
    if low in names:
        return names[low]
    try:
        value = int(low)
    except ValueError:
        raise ValueError(f"{token!r} is not a valid {what}") from None
    if not lo <= value <= hi:
        raise ValueError(f"{token!r} is not a valid {what}: out of range {lo}..{hi}")
    return value


def _clock_minutes(text: str, *, is_end: bool) -> int:
    match = _CLOCK.match(text)
    if match is None:
        raise ValueError(f"invalid time {text!r}: use HH:MM (24-hour clock)")
    hours, minutes = int(match.group(1)), int(match.group(2))
    if hours == 24 and minutes == 0 and is_end:
        return 24 * 60
    if hours > 23 or minutes > 59:
        raise ValueError(f"invalid time {text!r}: out of range (00:00..23:59, or 24:00 as an end)")
    return hours * 60 + minutes


class TimeRange(BaseModel):
    """A clock range within a day: ``start_time`` inclusive, ``end_time`` exclusive."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    start_time: str
    end_time: str

    @model_validator(mode="after")
    def _check(self) -> TimeRange:
        if self.start_minute >= self.end_minute:
            raise ValueError(f"start_time {self.start_time} must be before end_time {self.end_time}")
        return self

    @property
    def start_minute(self) -> int:
        """Minutes after midnight where the range starts."""
        return _clock_minutes(self.start_time, is_end=False)

    @property
    def end_minute(self) -> int:
        """Minutes after midnight where the range ends (exclusive)."""
        return _clock_minutes(self.end_time, is_end=True)


class TimeInterval(BaseModel):
    """One Alertmanager time interval; every field it sets must contain the instant."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    times: tuple[TimeRange, ...] = ()
    weekdays: tuple[IntRange, ...] = ()
    days_of_month: tuple[IntRange, ...] = ()
    months: tuple[IntRange, ...] = ()
    years: tuple[IntRange, ...] = ()
    location: str = "UTC"

    @field_validator("weekdays", mode="before")
    @classmethod
    def _weekdays(cls, value: object) -> tuple[IntRange, ...]:
        out = []
        for item in _as_list(value, "weekdays"):
            begin, end = _split_range(item, "weekday")
            if begin.lower() not in WEEKDAYS or end.lower() not in WEEKDAYS:
                raise ValueError(f"{item!r} is not a weekday or weekday range (use e.g. monday:friday)")
            b, e = WEEKDAYS[begin.lower()], WEEKDAYS[end.lower()]
            if b > e:
                raise ValueError(f"weekday range {item!r}: start day is after end day (weeks start on sunday)")
            out.append((b, e))
        return tuple(out)

    @field_validator("days_of_month", mode="before")
    @classmethod
    def _days(cls, value: object) -> tuple[IntRange, ...]:
        out = []
        for item in _as_list(value, "days_of_month"):
            begin, end = _split_range(item, "day")
            b = _named_or_int(begin, {}, "day of the month", -31, 31)
            e = _named_or_int(end, {}, "day of the month", -31, 31)
            if b == 0 or e == 0:
                raise ValueError(f"{item!r}: 0 is not a day of the month")
            if b < 0 < e:
                raise ValueError(f"{item!r}: end day must be negative if start day is negative")
            # Negative days are only known per month; compare on a 28-day month to catch ranges that
            # are always empty.
            if (28 + b if b < 0 else b) > (28 + e if e < 0 else e):
                raise ValueError(f"{item!r}: end day is before start day")
            out.append((b, e))
        return tuple(out)

    @field_validator("months", mode="before")
    @classmethod
    def _months(cls, value: object) -> tuple[IntRange, ...]:
        out = []
        for item in _as_list(value, "months"):
            begin, end = _split_range(item, "month")
            b = _named_or_int(begin, MONTHS, "month", 1, 12)
            e = _named_or_int(end, MONTHS, "month", 1, 12)
            if b > e:
                raise ValueError(f"month range {item!r}: start month is after end month")
            out.append((b, e))
        return tuple(out)

    @field_validator("years", mode="before")
    @classmethod
    def _years(cls, value: object) -> tuple[IntRange, ...]:
        out = []
        for item in _as_list(value, "years"):
            begin, end = _split_range(item, "year")
            b = _named_or_int(begin, {}, "year", 1, 9999)
            e = _named_or_int(end, {}, "year", 1, 9999)
            if b > e:
                raise ValueError(f"year range {item!r}: start year is after end year")
            out.append((b, e))
        return tuple(out)

    @field_validator("location")
    @classmethod
    def _location(cls, value: str) -> str:
        if value == "Local":
            raise ValueError("location 'Local' depends on the host; name the zone (e.g. Europe/Berlin or UTC)")
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown location {value!r}: use an IANA time zone such as Europe/Berlin") from None
        return value

    def contains(self, ts: float) -> bool:
        """Whether the UNIX time ``ts`` falls inside this interval."""
        at = datetime.fromtimestamp(ts, tz=ZoneInfo(self.location))
        if self.times:
            minute = at.hour * 60 + at.minute
            if not any(r.start_minute <= minute < r.end_minute for r in self.times):
                return False
        if self.weekdays:
            weekday = (at.weekday() + 1) % 7  # Python counts from Monday, Alertmanager from Sunday
            if not any(b <= weekday <= e for b, e in self.weekdays):
                return False
        if self.days_of_month:
            length = calendar.monthrange(at.year, at.month)[1]
            hit = False
            for b, e in self.days_of_month:
                begin = max(length + b + 1 if b < 0 else b, 1)
                end = min(length + e + 1 if e < 0 else e, length)
                hit = hit or begin <= at.day <= end
            if not hit:
                return False
        if self.months and not any(b <= at.month <= e for b, e in self.months):
            return False
        return not (self.years and not any(b <= at.year <= e for b, e in self.years))


class NamedTimeInterval(BaseModel):
    """A top-level ``time_intervals`` entry: a name and the intervals it stands for."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    time_intervals: tuple[TimeInterval, ...]

    def contains(self, ts: float) -> bool:
        """Whether any of the intervals contains ``ts``."""
        return any(interval.contains(ts) for interval in self.time_intervals)


def _as_list(value: object, key: str) -> list[object]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    raise ValueError(f"{key} must be a list, got {value!r}")
