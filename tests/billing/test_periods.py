"""Billing periods: anchor days, time zones, DST, half-hour offsets, tiling, errors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from billing.errors import BillingError, PeriodError
from billing.periods import (
    Window,
    billing_period,
    next_period,
    period_containing,
    previous_period,
    split_hours,
    whole_hours,
)
from tests.examples import examples


def local(tz: str, *args: int) -> datetime:
    return datetime(*args, tzinfo=ZoneInfo(tz)).astimezone(UTC)


@pytest.mark.parametrize(
    ("label", "tz", "anchor", "start", "end"),
    [
        # the brief's example: 2026-02-07 00:00 Berlin .. 2026-03-07 00:00 Berlin
        ("2026-02", "Europe/Berlin", 7, (2026, 2, 7), (2026, 3, 7)),
        # anchor 31: Feb 28, then the next period starts on Mar 31
        ("2026-02", "Europe/Berlin", 31, (2026, 2, 28), (2026, 3, 31)),
        ("2026-03", "Europe/Berlin", 31, (2026, 3, 31), (2026, 4, 30)),
        ("2026-04", "UTC", 31, (2026, 4, 30), (2026, 5, 31)),
        ("2028-02", "UTC", 30, (2028, 2, 29), (2028, 3, 30)),  # leap year
        ("2026-12", "America/New_York", 15, (2026, 12, 15), (2027, 1, 15)),  # year boundary
        ("2026-01", "UTC", 1, (2026, 1, 1), (2026, 2, 1)),
    ],
)
def test_period_edges_are_local_midnight_of_the_anchor_day(label, tz, anchor, start, end):
    period = billing_period(label, tz, anchor)
    assert period.start == local(tz, *start)
    assert period.end == local(tz, *end)
    assert period.label == label
    assert period.start.tzinfo is UTC and period.end.tzinfo is UTC
    assert next_period(period).start == period.end


def test_berlin_february_in_utc():
    period = billing_period("2026-02", "Europe/Berlin", 7)
    assert period.start == datetime(2026, 2, 6, 23, tzinfo=UTC)
    assert period.end == datetime(2026, 3, 6, 23, tzinfo=UTC)


@pytest.mark.parametrize(
    ("label", "tz", "anchor", "hours"),
    [
        ("2026-03", "America/New_York", 1, 743),  # spring forward on 2026-03-08: a 23 h day
        ("2026-11", "America/New_York", 1, 721),  # fall back on 2026-11-01: a 25 h day
        ("2026-03", "Europe/Berlin", 1, 743),
        ("2026-10", "Europe/Berlin", 1, 745),
        ("2026-03", "UTC", 1, 744),
        ("2026-02", "Asia/Kolkata", 1, 672),
    ],
)
def test_dst_months_have_23_or_25_hour_days(label, tz, anchor, hours):
    assert billing_period(label, tz, anchor).duration == timedelta(hours=hours)


def test_a_midnight_skipped_by_dst_starts_the_period_at_the_first_instant_of_the_day():
    # America/Santiago springs forward at 00:00 on 2026-09-06: that day starts at 01:00 local
    period = billing_period("2026-09", "America/Santiago", 6)
    assert period.start == datetime(2026, 9, 6, 4, tzinfo=UTC)
    assert period.start.astimezone(ZoneInfo("America/Santiago")).hour == 1
    assert previous_period(period).end == period.start


@pytest.mark.parametrize(
    ("tz", "start", "end"),
    [
        ("Asia/Kolkata", datetime(2026, 2, 28, 18, 30, tzinfo=UTC), datetime(2026, 3, 31, 18, 30, tzinfo=UTC)),
        ("Asia/Kathmandu", datetime(2026, 2, 28, 18, 15, tzinfo=UTC), datetime(2026, 3, 31, 18, 15, tzinfo=UTC)),
    ],
)
def test_half_and_quarter_hour_offsets_split_utc_hours(tz, start, end):
    period = billing_period("2026-03", tz, 1)
    assert (period.start, period.end) == (start, end)
    assert split_hours(period) == [
        Window(start, start.replace(minute=0) + timedelta(hours=1)),
        Window(end.replace(minute=0), end),
    ]
    whole = whole_hours(period)
    assert whole == Window(start.replace(minute=0) + timedelta(hours=1), end.replace(minute=0))
    # the split windows and the whole hours cover the period exactly
    parts = sorted([*split_hours(period), whole], key=lambda w: w.start)
    assert parts[0].start == period.start and parts[-1].end == period.end
    assert all(a.end == b.start for a, b in zip(parts, parts[1:], strict=False))


@pytest.mark.parametrize("tz", ["UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo"])
def test_whole_hour_zones_split_no_hour(tz):
    period = billing_period("2026-03", tz, 1)
    assert split_hours(period) == []
    assert whole_hours(period) == period.window


def test_split_hours_of_windows_inside_one_hour():
    t = datetime(2026, 1, 1, 10, tzinfo=UTC)
    assert split_hours(Window(t + timedelta(minutes=15), t + timedelta(minutes=45))) == [
        Window(t + timedelta(minutes=15), t + timedelta(minutes=45))
    ]
    assert whole_hours(Window(t + timedelta(minutes=15), t + timedelta(minutes=45))) is None
    assert split_hours(Window(t, t + timedelta(minutes=45))) == [Window(t, t + timedelta(minutes=45))]
    assert split_hours(Window(t + timedelta(minutes=15), t + timedelta(hours=1, minutes=15))) == [
        Window(t + timedelta(minutes=15), t + timedelta(hours=1)),
        Window(t + timedelta(hours=1), t + timedelta(hours=1, minutes=15)),
    ]


def test_period_containing_edges():
    period = billing_period("2026-02", "Europe/Berlin", 7)
    assert period_containing(period.start, "Europe/Berlin", 7) == period
    assert period_containing(period.end - timedelta(microseconds=1), "Europe/Berlin", 7) == period
    assert period_containing(period.end, "Europe/Berlin", 7) == next_period(period)
    # 2026-02-03 is before the anchor day: it belongs to the period that started in January
    assert period_containing(datetime(2026, 2, 3, tzinfo=UTC), "Europe/Berlin", 7).label == "2026-01"
    # an instant given in another zone is the same instant
    berlin_start = period.start.astimezone(ZoneInfo("Europe/Berlin"))
    assert period_containing(berlin_start, "Europe/Berlin", 7) == period
    assert period.start in period and period.end not in period


ZONES = ["UTC", "Europe/Berlin", "America/New_York", "America/Santiago", "Asia/Kolkata", "Asia/Kathmandu",
         "Australia/Lord_Howe", "Pacific/Chatham", "America/St_Johns"]


@settings(max_examples=examples(300), deadline=None)
@given(
    instant=st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2060, 1, 1), timezones=st.just(UTC)),
    tz=st.sampled_from(ZONES),
    anchor=st.integers(1, 31),
)
def test_every_instant_belongs_to_exactly_one_period(instant, tz, anchor):
    period = period_containing(instant, tz, anchor)
    assert period.start <= instant < period.end
    before, after = previous_period(period), next_period(period)
    assert before.end == period.start and period.end == after.start  # no gap, no overlap
    assert instant not in before and instant not in after
    assert timedelta(days=27) < period.duration < timedelta(days=32)


@settings(max_examples=examples(100), deadline=None)
@given(year=st.integers(1971, 2100), month=st.integers(1, 12), tz=st.sampled_from(ZONES), anchor=st.integers(1, 31))
def test_consecutive_periods_tile_time(year, month, tz, anchor):
    period = billing_period(f"{year:04d}-{month:02d}", tz, anchor)
    following = next_period(period)
    assert following.start == period.end
    assert previous_period(following) == period
    assert period_containing(period.end, tz, anchor) == following
    assert period_containing(period.end - timedelta(microseconds=1), tz, anchor) == period


@pytest.mark.parametrize(
    ("label", "tz", "anchor", "message"),
    [
        ("2026-2", "UTC", 1, "not of the form YYYY-MM"),
        ("2026-13", "UTC", 1, "month must be 01..12"),
        ("2026-00", "UTC", 1, "month must be 01..12"),
        ("foo", "UTC", 1, "not of the form YYYY-MM"),
        (" 2026-02", "UTC", 1, "not of the form YYYY-MM"),
        (202602, "UTC", 1, "must be a string"),
        ("2026-02", "Europe/Berlinn", 1, "unknown time zone 'Europe/Berlinn'"),
        ("2026-02", "America", 1, "unknown time zone"),
        ("2026-02", "../etc/passwd", 1, "unknown time zone"),
        ("2026-02", "", 1, "IANA name"),
        ("2026-02", "UTC", 0, "anchor day 0 is out of range"),
        ("2026-02", "UTC", 32, "anchor day 32 is out of range"),
        ("2026-02", "UTC", True, "out of range"),
        ("1969-12", "UTC", 1, "year 1969"),
    ],
)
def test_bad_inputs_give_clear_errors(label, tz, anchor, message):
    with pytest.raises(PeriodError, match=message) as caught:
        billing_period(label, tz, anchor)
    assert isinstance(caught.value, BillingError) and isinstance(caught.value, ValueError)


def test_naive_instants_are_refused():
    with pytest.raises(PeriodError, match="no time zone"):
        period_containing(datetime(2026, 2, 3), "UTC", 1)
