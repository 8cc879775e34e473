"""When a schedule fires: an interval, or a five-field cron expression in a time zone; and its jitter.

Cron fields are minute, hour, day of month, month, day of week (0 or 7 = Sunday), each `*`, a
number, a range `a-b`, a list `a,b` or a step `*/n` / `a-b/n`. When both day fields are restricted a
day matches either (as in Vixie cron). Times are found in the schedule's zone and returned in UTC; a
local time that a DST change skips moves forward with the clock, one that repeats fires once.

Pure functions: the instant they start from is the database clock's (scheduler/schedules.py).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))
_MAX_DAYS = 366 * 5  # a valid expression matches within this many days (29 February at worst)


@dataclass(frozen=True)
class Cron:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # day of month was `*`
    any_weekday: bool  # day of week was `*`

    def day_matches(self, day: dt.date) -> bool:
        weekday = (day.weekday() + 1) % 7
        by_day, by_weekday = day.day in self.days, weekday in self.weekdays
        if self.any_day or self.any_weekday:
            return by_day and by_weekday
        return by_day or by_weekday

    def next_after(self, instant: dt.datetime, zone: ZoneInfo) -> dt.datetime:
        """The first matching minute strictly after `instant` (aware), in UTC."""
        local = instant.astimezone(zone).replace(second=0, microsecond=0, tzinfo=None) + dt.timedelta(minutes=1)
        day = local.date()
        for _ in range(_MAX_DAYS):
            if day.month in self.months and self.day_matches(day):
                start = local.time() if day == local.date() else dt.time(0, 0)
                for hour in sorted(h for h in self.hours if h >= start.hour):
                    for minute in sorted(self.minutes):
                        if hour == start.hour and minute < start.minute:
                            continue
                        found = self._instant(dt.datetime.combine(day, dt.time(hour, minute)), zone)
                        if found > instant:
                            return found
            day += dt.timedelta(days=1)
        raise ValueError("the cron expression matches no time within five years")

    @staticmethod
    def _instant(local: dt.datetime, zone: ZoneInfo) -> dt.datetime:
        aware = local.replace(tzinfo=zone, fold=0)
        utc = aware.astimezone(dt.UTC)
        return utc


def _field(text: str, name: str, low: int, high: int) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        body, _, step_text = part.partition("/")
        step = _number(step_text, name) if step_text else 1
        if step < 1:
            raise ValueError(f"{name}: step must be at least 1")
        if body == "*":
            start, end = low, high
        elif "-" in body:
            first, _, last = body.partition("-")
            start, end = _number(first, name), _number(last, name)
        else:
            start = end = _number(body, name)
            if step_text:
                end = high
        if not low <= start <= end <= high:
            raise ValueError(f"{name}: {part!r} is outside {low}-{high}")
        values.update(range(start, end + 1, step))
    return frozenset(values)


def _number(text: str, name: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{name}: {text!r} is not a number")
    return int(text)


def parse_cron(expression: str) -> Cron:
    """A five-field expression, or ValueError saying which field is wrong."""
    parts = expression.split()
    if len(parts) != 5:
        raise ValueError("needs five fields: minute hour day-of-month month day-of-week")
    minutes, hours, days, months, weekdays = (_field(text, *spec) for text, spec in zip(parts, _FIELDS, strict=True))
    return Cron(minutes, hours, days, months, frozenset(d % 7 for d in weekdays),
                any_day=parts[2] == "*", any_weekday=parts[4] == "*")


def zone_of(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"{name!r} is not an IANA time zone") from None


@dataclass(frozen=True)
class Timing:
    """How a schedule's fire times follow one another."""

    interval_ms: int | None
    cron: Cron | None
    zone: ZoneInfo

    def next_after(self, instant: dt.datetime) -> dt.datetime:
        if self.interval_ms is not None:
            return instant + dt.timedelta(milliseconds=self.interval_ms)
        assert self.cron is not None
        return self.cron.next_after(instant, self.zone)

    def first_at_or_after(self, instant: dt.datetime, anchor: dt.datetime) -> dt.datetime:
        """The first fire time not before `instant`: interval fire times run on from `anchor`."""
        if self.interval_ms is None:
            return self.next_after(instant - dt.timedelta(microseconds=1))
        step = dt.timedelta(milliseconds=self.interval_ms)
        if instant <= anchor:
            return anchor
        behind = (instant - anchor) // step
        candidate = anchor + behind * step
        return candidate if candidate >= instant else candidate + step


def timing(interval_ms: int | None, cron: str | None, time_zone: str) -> Timing:
    return Timing(interval_ms, parse_cron(cron) if cron is not None else None, zone_of(time_zone))


def jitter_of(schedule_id: uuid.UUID, fire_at: dt.datetime, jitter_ms: int) -> dt.timedelta:
    """A delay in [0, jitter_ms] that depends only on the schedule and the fire time (the same on every replica)."""
    if jitter_ms <= 0:
        return dt.timedelta(0)
    digest = hashlib.sha256(f"{schedule_id}:{fire_at.isoformat()}".encode()).digest()
    return dt.timedelta(milliseconds=int.from_bytes(digest[:8], "big") % (jitter_ms + 1))
