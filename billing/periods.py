"""Billing periods: a customer's month in its own time zone, as a half-open window of aware UTC datetimes.

A customer bills monthly from an anchor day (1..31) in an IANA time zone. The period labelled
"YYYY-MM" is the one that STARTS in that month: [anchor day 00:00 local, the next month's anchor day
00:00 local). An anchor past a month's end means that month's last day (anchor 31: Feb 28, then
Mar 31). Local midnight is turned into UTC with zoneinfo, so DST months are 743 h or 745 h long;
where a time zone skips midnight (a DST gap at 00:00) the period starts at the first instant of the
anchor day, and where midnight repeats, at the first 00:00.

Consecutive periods tile time: a period's end is, by construction, the next period's start.

Time zones whose offset is not a whole number of hours (Asia/Kolkata +05:30, Asia/Kathmandu +05:45)
put period edges inside a UTC hour; `split_hours` names the partial windows at the edges, where the
hourly rollups are not enough, and `whole_hours` the span the rollups can serve.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from billing._common import aware_utc
from billing.errors import PeriodError
from infermeter.times import Window, ceil_hour, floor_hour  # noqa: F401 - Window is part of this API

_LABEL = re.compile(r"(\d{4})-(\d{2})")
MIN_YEAR = 1970
MAX_YEAR = 9998  # the period of 9998-12 ends in 9999; one more would overflow datetime
# (time zone, anchor day) of usage that no customer record places: unbilled usage of a customer
# without a record, and the usage export's rows of such customers, are in UTC periods from day 1
UTC_SCHEDULE = ("UTC", 1)


@dataclass(frozen=True)
class Period:
    """One billing period of a customer schedule: [start, end) in UTC, labelled by the month it starts in
    (in the customer's time zone). Build it with `billing_period` or `period_containing`."""

    start: datetime
    end: datetime
    label: str
    timezone: str
    anchor_day: int

    def __post_init__(self) -> None:
        parse_label(self.label)
        check_anchor_day(self.anchor_day)
        zone(self.timezone)
        object.__setattr__(self, "start", aware_utc(self.start, "period start", PeriodError))
        object.__setattr__(self, "end", aware_utc(self.end, "period end", PeriodError))
        if self.end <= self.start:
            raise PeriodError(f"period end {self.end.isoformat()} is not after its start {self.start.isoformat()}")

    def __contains__(self, instant: object) -> bool:
        return isinstance(instant, datetime) and self.start <= aware_utc(instant, "instant", PeriodError) < self.end

    @property
    def window(self) -> Window:
        return Window(self.start, self.end)

    @property
    def duration(self) -> timedelta:
        return self.end - self.start


# ---------------------------------------------------------------- validation


_LABELS: dict[str, tuple[int, int]] = {}  # labels already parsed (invoice lines check theirs on every copy)


def parse_label(label: object) -> tuple[int, int]:
    """(year, month) of a "YYYY-MM" label; PeriodError naming the expected form otherwise."""
    if type(label) is str and label in _LABELS:
        return _LABELS[label]
    if not isinstance(label, str):
        raise PeriodError(f"period must be a string 'YYYY-MM' (e.g. '2026-02'), got {type(label).__name__}")
    match = _LABEL.fullmatch(label)
    if match is None:
        raise PeriodError(
            f"period {label!r} is not of the form YYYY-MM: write a four-digit year and a two-digit month, "
            f"e.g. '2026-02'"
        )
    year, month = int(match.group(1)), int(match.group(2))
    if not 1 <= month <= 12:
        raise PeriodError(f"period {label!r} has month {month:02d}: the month must be 01..12")
    if not MIN_YEAR <= year <= MAX_YEAR:
        raise PeriodError(f"period {label!r} has year {year}: billing periods run from {MIN_YEAR} to {MAX_YEAR}")
    if type(label) is str:
        _LABELS[label] = (year, month)
    return year, month


def format_label(year: int, month: int) -> str:
    return f"{year:04d}-{month:02d}"


def zone(name: object) -> ZoneInfo:
    """The ZoneInfo of an IANA time zone name; PeriodError for an unknown or malformed name."""
    if not isinstance(name, str) or not name:
        raise PeriodError("time zone must be an IANA name such as 'Europe/Berlin' or 'UTC'")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise PeriodError(
            f"unknown time zone {name!r}: use an IANA name such as 'Europe/Berlin', 'Asia/Kolkata' or 'UTC' "
            f"(names are case-sensitive)"
        ) from None


def check_anchor_day(anchor_day: object) -> int:
    if not isinstance(anchor_day, int) or isinstance(anchor_day, bool) or not 1 <= anchor_day <= 31:
        raise PeriodError(
            f"anchor day {anchor_day!r} is out of range: it must be a whole day of the month 1..31 "
            f"(31 means the last day of shorter months)"
        )
    return anchor_day


# ---------------------------------------------------------------- periods


def _anchor_instant(year: int, month: int, anchor_day: int, tz: ZoneInfo) -> datetime:
    """00:00 local on the anchor day of a month (the month's last day if the anchor is past it), in UTC.
    fold=0: in a gap this is the first instant of the day, at a repeated midnight the first 00:00."""
    day = min(anchor_day, calendar.monthrange(year, month)[1])
    return datetime(year, month, day, tzinfo=tz).astimezone(UTC)


def _shift(year: int, month: int, months: int) -> tuple[int, int]:
    index = year * 12 + (month - 1) + months
    return index // 12, index % 12 + 1


_PERIODS: dict[tuple[str, str, int], Period] = {}  # periods already cut (a bulk run cuts each one per customer)


def billing_period(period: str, timezone: str, anchor_day: int) -> Period:
    """The period that starts in month `period` ("YYYY-MM") of a schedule (time zone, anchor day)."""
    key = (period, timezone, anchor_day)
    if type(period) is str and type(timezone) is str and type(anchor_day) is int and key in _PERIODS:
        return _PERIODS[key]
    found = _billing_period(period, timezone, anchor_day)
    if type(period) is str and type(timezone) is str and type(anchor_day) is int:
        if len(_PERIODS) >= 4096:
            _PERIODS.clear()
        _PERIODS[key] = found
    return found


def _billing_period(period: str, timezone: str, anchor_day: int) -> Period:
    year, month = parse_label(period)
    tz = zone(timezone)
    check_anchor_day(anchor_day)
    next_year, next_month = _shift(year, month, 1)
    if next_year > MAX_YEAR + 1:
        raise PeriodError(f"period {period!r} ends after year {MAX_YEAR + 1}")
    start = _anchor_instant(year, month, anchor_day, tz)
    end = _anchor_instant(next_year, next_month, anchor_day, tz)
    return Period(start, end, format_label(year, month), timezone, anchor_day)


def next_period(period: Period) -> Period:
    year, month = _shift(*parse_label(period.label), 1)
    return billing_period(format_label(year, month), period.timezone, period.anchor_day)


def previous_period(period: Period) -> Period:
    year, month = _shift(*parse_label(period.label), -1)
    return billing_period(format_label(year, month), period.timezone, period.anchor_day)


def periods_between(first: str, last: str, timezone: str, anchor_day: int) -> Iterator[Period]:
    """The periods of a schedule labelled `first` to `last` ("YYYY-MM", both included), in order
    (what metering is handed as a customer's calendar: `metering.calendars.SPAN`)."""
    period, end = billing_period(first, timezone, anchor_day), parse_label(last)
    while parse_label(period.label) <= end:
        yield period
        if period.label == last:
            return
        period = next_period(period)


def period_containing(instant: datetime, timezone: str, anchor_day: int) -> Period:
    """The period of the schedule (time zone, anchor day) with start <= instant < end."""
    when = aware_utc(instant, "instant", PeriodError)
    tz = zone(timezone)
    check_anchor_day(anchor_day)
    local = when.astimezone(tz)
    found = billing_period(format_label(local.year, local.month), timezone, anchor_day)
    while when < found.start:
        found = previous_period(found)
    while when >= found.end:
        found = next_period(found)
    return found


# ---------------------------------------------------------------- UTC hours at the edges


def split_hours(period: Period | Window) -> list[Window]:
    """The partial UTC hours at the edges of a period: [start, next whole hour) if the period starts
    inside a UTC hour and [last whole hour, end) if it ends inside one. Empty when both edges are whole
    UTC hours. The other part of each split hour belongs to the neighbouring period, so an adapter
    must read these windows from raw events: the hourly rollups cannot split an hour."""
    start_ceil, end_floor = ceil_hour(period.start), floor_hour(period.end)
    if start_ceil > end_floor:  # both edges inside one UTC hour (only a window shorter than an hour)
        return [Window(period.start, period.end)]
    out: list[Window] = []
    if start_ceil != period.start:
        out.append(Window(period.start, start_ceil))
    if end_floor != period.end:
        out.append(Window(end_floor, period.end))
    return out


def whole_hours(period: Period | Window) -> Window | None:
    """The span of whole UTC hours inside a period (what the hourly rollups can serve), or None."""
    start, end = ceil_hour(period.start), floor_hour(period.end)
    return Window(start, end) if start < end else None


# ---------------------------------------------------------------- the grace window


def grace_over(period: Period, now: datetime, grace: timedelta) -> bool:
    """True from the instant the grace window after the period ends: [period.end, period.end + grace)
    is the window in which late usage still refreshes the draft, and at period.end + grace exactly the
    invoice is due for finalization."""
    return now >= period.end + grace
