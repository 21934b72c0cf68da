"""Billing periods at their exact edges: half-open windows to the microsecond, anchor days 28..31 in
February (leap and common years), midnights that DST skips or repeats, +05:30/+05:45 zones, and the
first and last periods the calendar allows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from billing.errors import PeriodError
from billing.periods import (
    Period,
    Window,
    billing_period,
    grace_over,
    next_period,
    period_containing,
    previous_period,
    split_hours,
    whole_hours,
)

US = timedelta(microseconds=1)
H = timedelta(hours=1)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


# ---------------------------------------------------------------- anchor days at the end of February


@pytest.mark.parametrize(
    ("year", "anchor", "january_end", "february_end"),
    [
        # common year: February has 28 days, so anchors 28..31 all start the February period on the 28th
        (2026, 28, (2026, 2, 28), (2026, 3, 28)),
        (2026, 29, (2026, 2, 28), (2026, 3, 29)),
        (2026, 30, (2026, 2, 28), (2026, 3, 30)),
        (2026, 31, (2026, 2, 28), (2026, 3, 31)),
        # leap year: the 29th exists
        (2028, 28, (2028, 2, 28), (2028, 3, 28)),
        (2028, 29, (2028, 2, 29), (2028, 3, 29)),
        (2028, 30, (2028, 2, 29), (2028, 3, 30)),
        (2028, 31, (2028, 2, 29), (2028, 3, 31)),
        # anchor 27: the last anchor that is a day of every February
        (2026, 27, (2026, 2, 27), (2026, 3, 27)),
    ],
)
def test_february_periods_of_late_anchor_days(year, anchor, january_end, february_end):
    january = billing_period(f"{year}-01", "UTC", anchor)
    february = billing_period(f"{year}-02", "UTC", anchor)
    assert january.end == february.start == utc(*january_end)
    assert february.end == utc(*february_end)
    assert next_period(february).start == february.end


@pytest.mark.parametrize(
    ("label", "anchor", "start", "end"),
    [
        ("2026-04", 31, (2026, 4, 30), (2026, 5, 31)),  # a 30-day month: its last day
        ("2026-04", 30, (2026, 4, 30), (2026, 5, 30)),
        ("2026-05", 31, (2026, 5, 31), (2026, 6, 30)),
        ("2026-12", 31, (2026, 12, 31), (2027, 1, 31)),  # over the year's end
        ("2026-01", 1, (2026, 1, 1), (2026, 2, 1)),
    ],
)
def test_anchor_days_past_a_months_end_mean_its_last_day(label, anchor, start, end):
    period = billing_period(label, "UTC", anchor)
    assert (period.start, period.end) == (utc(*start), utc(*end))


# ---------------------------------------------------------------- half-open windows to the microsecond


@pytest.mark.parametrize("tz", ["UTC", "Europe/Berlin", "Asia/Kolkata", "Asia/Kathmandu", "America/Havana"])
def test_a_period_holds_its_start_and_not_its_end(tz):
    period = billing_period("2026-11", tz, 1)
    assert period.start - US not in period
    assert period.start in period
    assert period.end - US in period
    assert period.end not in period
    assert period_containing(period.start - US, tz, 1) == previous_period(period)
    assert period_containing(period.start, tz, 1) == period
    assert period_containing(period.end - US, tz, 1) == period
    assert period_containing(period.end, tz, 1) == next_period(period)


def test_an_instant_given_in_a_local_zone_is_placed_by_its_utc_value():
    period = billing_period("2026-03", "Asia/Kolkata", 1)  # starts 2026-02-28 18:30 UTC
    local_start = datetime(2026, 3, 1, tzinfo=ZoneInfo("Asia/Kolkata"))
    assert local_start in period and local_start - US not in period
    assert period_containing(local_start - US, "Asia/Kolkata", 1).label == "2026-02"


def test_a_period_is_at_least_one_microsecond_long():
    start = utc(2026, 1, 1)
    with pytest.raises(PeriodError, match="is not after its start"):
        Period(start, start, "2026-01", "UTC", 1)
    with pytest.raises(PeriodError, match="is not after its start"):
        Period(start, start - US, "2026-01", "UTC", 1)
    assert Period(start, start + US, "2026-01", "UTC", 1).duration == US


def test_things_that_are_not_instants_are_in_no_period():
    period = billing_period("2026-01", "UTC", 1)
    assert "2026-01-15" not in period
    assert period.window == Window(period.start, period.end)


# ---------------------------------------------------------------- DST at midnight


def test_a_repeated_midnight_starts_the_period_at_the_first_midnight():
    # America/Havana falls back from 01:00 to 00:00 on 2026-11-01: midnight happens twice
    period = billing_period("2026-11", "America/Havana", 1)
    assert period.start == utc(2026, 11, 1, 4)  # the first 00:00 (-04:00), not the second (05:00 UTC)
    assert previous_period(period).end == period.start
    assert period.duration == timedelta(hours=30 * 24 + 1)  # the repeated hour belongs to November
    assert period_containing(utc(2026, 11, 1, 4, 30), "America/Havana", 1) == period


def test_a_skipped_midnight_starts_the_period_at_the_first_instant_of_the_day():
    # Asia/Beirut springs forward at 00:00 on 2026-03-29: the day starts at 01:00 (+03:00), 22:00 UTC
    period = billing_period("2026-03", "Asia/Beirut", 29)
    assert period.start == utc(2026, 3, 28, 22)
    assert period.start.astimezone(ZoneInfo("Asia/Beirut")).hour == 1
    assert period_containing(period.start - US, "Asia/Beirut", 29).label == "2026-02"


@pytest.mark.parametrize(
    ("tz", "label", "hours"),
    [
        ("America/Havana", "2026-03", 743),  # 2026-03-08 skips 00:00-01:00
        ("America/Havana", "2026-11", 721),
        ("America/Santiago", "2026-09", 719),  # 30-day month less the skipped hour
        ("Australia/Lord_Howe", "2026-10", 744 - 0.5),  # a half-hour DST shift
    ],
)
def test_periods_over_a_dst_change_lose_or_gain_the_shifted_time(tz, label, hours):
    assert billing_period(label, tz, 1).duration == timedelta(hours=hours)


# ---------------------------------------------------------------- edges inside a UTC hour


@pytest.mark.parametrize(
    ("tz", "minute"),
    [("Asia/Kolkata", 30), ("Asia/Kathmandu", 15), ("America/St_Johns", 30), ("Pacific/Chatham", 15)],
)
def test_split_hours_at_every_partial_edge(tz, minute):
    period = billing_period("2026-07", tz, 1)
    assert period.start.minute == minute and period.end.minute == minute
    first, last = split_hours(period)
    assert first == Window(period.start, period.start.replace(minute=0) + H)
    assert last == Window(period.end.replace(minute=0), period.end)
    assert whole_hours(period) == Window(first.end, last.start)


@pytest.mark.parametrize(
    ("start", "end", "split", "whole"),
    [
        # both edges on whole hours: nothing to split
        (utc(2026, 1, 1, 10), utc(2026, 1, 1, 11), [], (utc(2026, 1, 1, 10), utc(2026, 1, 1, 11))),
        # one microsecond past an hour at the start: that hour is split
        (utc(2026, 1, 1, 10) + US, utc(2026, 1, 1, 12),
         [(utc(2026, 1, 1, 10) + US, utc(2026, 1, 1, 11))], (utc(2026, 1, 1, 11), utc(2026, 1, 1, 12))),
        # one microsecond before an hour at the end
        (utc(2026, 1, 1, 10), utc(2026, 1, 1, 12) - US,
         [(utc(2026, 1, 1, 11), utc(2026, 1, 1, 12) - US)], (utc(2026, 1, 1, 10), utc(2026, 1, 1, 11))),
        # one microsecond after a whole hour: the one split window is the whole window
        (utc(2026, 1, 1, 10), utc(2026, 1, 1, 10) + US, [(utc(2026, 1, 1, 10), utc(2026, 1, 1, 10) + US)], None),
        # ending exactly on the next hour from inside one: a split start and no whole hour
        (utc(2026, 1, 1, 10, 30), utc(2026, 1, 1, 11), [(utc(2026, 1, 1, 10, 30), utc(2026, 1, 1, 11))], None),
        # from one hour's inside to the next hour's inside: two split windows, no whole hour
        (utc(2026, 1, 1, 10, 30), utc(2026, 1, 1, 11, 30),
         [(utc(2026, 1, 1, 10, 30), utc(2026, 1, 1, 11)), (utc(2026, 1, 1, 11), utc(2026, 1, 1, 11, 30))], None),
    ],
    ids=["whole", "start-1us-late", "end-1us-early", "one-us", "to-the-hour", "across-one-hour"],
)
def test_split_and_whole_hours_of_windows_at_hour_edges(start, end, split, whole):
    window = Window(start, end)
    assert split_hours(window) == [Window(a, b) for a, b in split]
    assert whole_hours(window) == (None if whole is None else Window(*whole))


# ---------------------------------------------------------------- the calendar's first and last periods


def test_the_first_and_last_periods_the_calendar_allows():
    first = billing_period("1970-01", "UTC", 1)
    assert first.start == utc(1970, 1, 1)
    last = billing_period("9998-12", "UTC", 1)
    assert last.end == utc(9999, 1, 1)
    with pytest.raises(PeriodError, match="year 9999"):
        billing_period("9999-01", "UTC", 1)
    with pytest.raises(PeriodError, match="year 1969"):
        billing_period("1969-12", "UTC", 1)


@pytest.mark.parametrize(("label", "after", "before"), [("2026-12", "2027-01", "2026-11"), ("2026-01", "2026-02", "2025-12")])
def test_next_and_previous_periods_cross_the_year(label, after, before):
    period = billing_period(label, "Europe/Berlin", 15)
    assert next_period(period).label == after
    assert previous_period(period).label == before
    assert previous_period(period).end == period.start and next_period(period).start == period.end


@pytest.mark.parametrize("anchor", [1, 31])
def test_the_first_and_last_anchor_days_are_valid(anchor):
    assert billing_period("2026-01", "UTC", anchor).anchor_day == anchor


# ---------------------------------------------------------------- the grace window


@pytest.mark.parametrize(
    ("now", "over"),
    [
        (timedelta(hours=72) - US, False),  # the last microsecond of the grace window: still a draft
        (timedelta(hours=72), True),  # exactly at its end: finalization is due
        (timedelta(hours=72) + US, True),
        (timedelta(0), False),  # the instant the period ends
    ],
    ids=["one-us-before", "exactly-at-the-end", "one-us-after", "at-the-period-end"],
)
def test_the_grace_window_is_over_from_its_end_instant(now, over):
    period = billing_period("2026-02", "Asia/Kolkata", 31)
    assert grace_over(period, period.end + now, timedelta(hours=72)) is over


def test_without_grace_the_period_end_itself_is_over():
    period = billing_period("2026-02", "UTC", 1)
    assert grace_over(period, period.end, timedelta(0)) is True
    assert grace_over(period, period.end - US, timedelta(0)) is False


def test_asking_whether_a_naive_instant_is_in_a_period_is_an_error():
    with pytest.raises(PeriodError, match=r"^instant 2026-01-15T00:00:00 has no time zone"):
        datetime(2026, 1, 15) in billing_period("2026-01", "UTC", 1)  # noqa: B015
    with pytest.raises(PeriodError, match=r"^instant 2026-01-15T00:00:00 has no time zone: give an aware datetime"):
        period_containing(datetime(2026, 1, 15), "UTC", 1)


def test_a_period_keeps_its_edges_in_utc_whatever_zone_they_are_given_in():
    berlin = ZoneInfo("Europe/Berlin")
    period = Period(datetime(2026, 1, 1, tzinfo=berlin), datetime(2026, 2, 1, tzinfo=berlin), "2026-01", "Europe/Berlin", 1)
    assert (period.start, period.end) == (utc(2025, 12, 31, 23), utc(2026, 1, 31, 23))
    assert period.start.tzinfo is UTC and period.end.tzinfo is UTC


@pytest.mark.parametrize("edge", ["start", "end"])
def test_a_naive_period_edge_is_named_in_the_error(edge):
    edges = {"start": utc(2026, 1, 1), "end": utc(2026, 2, 1)}
    edges[edge] = edges[edge].replace(tzinfo=None)
    with pytest.raises(PeriodError, match=f"^period {edge} 2026-0.-01T00:00:00 has no time zone"):
        Period(edges["start"], edges["end"], "2026-01", "UTC", 1)


@pytest.mark.parametrize("name", ["", None, 123])
def test_a_time_zone_must_be_a_non_empty_name(name):
    with pytest.raises(PeriodError, match=r"^time zone must be an IANA name such as 'Europe/Berlin' or 'UTC'$"):
        billing_period("2026-01", name, 1)
