"""Cron and interval fire times (scheduler/schedule_times.py)."""

import datetime as dt
import uuid

import pytest

from scheduler.schedule_times import jitter_of, parse_cron, timing, zone_of

UTC = dt.UTC


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


def test_weekday_mornings_in_a_time_zone_across_a_dst_change():
    paris = timing(None, "30 9 * * 1-5", "Europe/Paris")
    # Friday 27 March 2026 09:30 CET (08:30 UTC), then Monday 30 March 09:30 CEST (07:30 UTC).
    first = paris.next_after(at("2026-03-27T08:00:00+00:00"))
    assert first == at("2026-03-27T08:30:00+00:00")
    assert paris.next_after(first) == at("2026-03-30T07:30:00+00:00")


def test_steps_lists_ranges_and_the_day_fields_or_rule():
    cron = parse_cron("*/15 8-9 1,15 * 0")
    assert cron.minutes == frozenset({0, 15, 30, 45}) and cron.hours == frozenset({8, 9})
    # Day of month 1 or 15, or a Sunday (both restricted: either matches).
    times = timing(None, "0 8 1,15 * 0", "UTC")
    found, instant = [], at("2026-02-28T12:00:00+00:00")
    for _ in range(4):
        instant = times.next_after(instant)
        found.append(instant.date().isoformat())
    assert found == ["2026-03-01", "2026-03-08", "2026-03-15", "2026-03-22"]
    assert timing(None, "0 0 29 2 *", "UTC").next_after(at("2026-03-01T00:00:00+00:00")) == at(
        "2028-02-29T00:00:00+00:00")


@pytest.mark.parametrize("bad", ["* * * *", "60 * * * *", "* 24 * * *", "a * * * *", "*/0 * * * *",
                                 "5-1 * * * *", "0 0 31 2 *"])
def test_bad_expressions_are_refused(bad):
    with pytest.raises(ValueError):
        timing(None, bad, "UTC").next_after(at("2026-01-01T00:00:00+00:00"))


def test_unknown_zone_is_refused():
    with pytest.raises(ValueError, match="time zone"):
        zone_of("Mars/Olympus")


def test_interval_fire_times_keep_their_phase_and_jitter_is_stable():
    every = timing(2000, None, "UTC")
    anchor = at("2026-01-01T00:00:00+00:00")
    assert every.next_after(anchor) == at("2026-01-01T00:00:02+00:00")
    assert every.first_at_or_after(at("2026-01-01T00:00:05+00:00"), anchor) == at("2026-01-01T00:00:06+00:00")
    assert every.first_at_or_after(at("2026-01-01T00:00:06+00:00"), anchor) == at("2026-01-01T00:00:06+00:00")
    sid = uuid.uuid4()
    delays = {jitter_of(sid, anchor, 500) for _ in range(3)}
    assert len(delays) == 1 and dt.timedelta(0) <= delays.pop() <= dt.timedelta(milliseconds=500)
    assert jitter_of(sid, anchor, 0) == dt.timedelta(0)
