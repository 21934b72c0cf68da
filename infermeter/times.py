"""Time and windows, defined once: aware UTC instants, half-open windows [start, end), hours, months.

Every package parses user-given times with `parse_time`, checks windows with `Window`, cuts hours
and calendar months (UTC) with the helpers below, and writes an instant as text with `utc_text`;
`utc_now` is the default clock of what takes one.
Errors are `TimeInputError` (a ValueError) with a message a person can act on.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

HOUR = timedelta(hours=1)


class TimeInputError(ValueError):
    """A time or window given by a user is malformed; the message says which and why."""


def parse_time(text: str, name: str, *, bare_date: bool = True) -> datetime:
    """An ISO 8601 / RFC 3339 time with a zone, as aware UTC. `name` says which input it was.

    A bare date (2026-11-02) means midnight UTC when `bare_date`; any other time without a zone
    is refused (an instant must not depend on the reader's zone)."""
    if not isinstance(text, str):
        raise TimeInputError(f"{name}: must be an RFC 3339 timestamp string (e.g. 2026-11-02T00:00:00Z)")
    stripped = text.strip()
    try:
        value = datetime.fromisoformat(stripped.replace("Z", "+00:00"))
    except ValueError:
        raise TimeInputError(f"{name}: {text!r} is not an ISO 8601 time (e.g. 2026-11-02T00:00:00Z)") from None
    if value.tzinfo is None:
        if bare_date and len(stripped) == 10:
            return value.replace(tzinfo=UTC)
        raise TimeInputError(f"{name}: {text!r} has no time zone; add Z or an offset")
    return value.astimezone(UTC)


def floor_hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def ceil_hour(moment: datetime) -> datetime:
    floor = floor_hour(moment)
    return floor if floor == moment else floor + HOUR


def month_start(moment: datetime) -> datetime:
    """The first instant of `moment`'s calendar month in UTC."""
    moment = moment.astimezone(UTC)
    return datetime(moment.year, moment.month, 1, tzinfo=UTC)


def next_month(moment: datetime) -> datetime:
    """The first instant of the calendar month (UTC) after `moment`'s."""
    moment = moment.astimezone(UTC)
    return datetime(moment.year + moment.month // 12, moment.month % 12 + 1, 1, tzinfo=UTC)


def add_months(month: datetime, months: int) -> datetime:
    """The first instant of the UTC calendar month `months` after (negative: before) `month`'s."""
    month = month.astimezone(UTC)
    year, index = divmod(month.year * 12 + month.month - 1 + months, 12)
    return datetime(year, index + 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Window:
    """A half-open window [start, end) of aware instants, kept in UTC."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        for edge in (self.start, self.end):
            if not isinstance(edge, datetime) or edge.tzinfo is None:
                raise TimeInputError("from/to need a time zone (e.g. 2026-11-02T00:00:00Z)")
        object.__setattr__(self, "start", self.start.astimezone(UTC))
        object.__setattr__(self, "end", self.end.astimezone(UTC))
        if self.end <= self.start:
            raise TimeInputError("to must be after from: windows are half-open [from, to)")

    @classmethod
    def month_of(cls, moment: datetime) -> Window:
        """[first of the month 00:00 UTC, first of the next month) containing `moment`."""
        return cls(month_start(moment), next_month(moment))

    def __contains__(self, moment: object) -> bool:
        return isinstance(moment, datetime) and moment.tzinfo is not None and self.start <= moment < self.end

    @property
    def duration(self) -> timedelta:
        return self.end - self.start

    @property
    def whole_hours(self) -> tuple[datetime, datetime] | None:
        """[first whole hour, end of last whole hour) inside the window, or None."""
        first = ceil_hour(self.start)
        last = floor_hour(self.end)
        return (first, last) if first < last else None

    @property
    def on_hours(self) -> bool:
        """Both edges fall on whole UTC hours."""
        return floor_hour(self.start) == self.start and floor_hour(self.end) == self.end


def utc_now() -> datetime:
    """The current instant, aware UTC (the default clock of whatever takes one)."""
    return datetime.now(UTC)


def utc_text(moment: datetime) -> str:
    """An instant as ISO 8601 in UTC with a 'Z' (microseconds only when there are any)."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
