"""Customers' billing calendars, handed to metering as data (metering imports no billing code).

Billing owns the rule that cuts a customer's periods (`billing.periods`: an IANA time zone and an
anchor day, DST and +05:30 zones included). It hands metering the result through `set_calendar`: the
customer's schedule (time zone, anchor day) and, the first time metering sees that schedule, the
schedule's periods as exact UTC instants, labelled 1970-01 to 2100-12 (`SPAN`). Metering never does
time zone arithmetic itself: PostgreSQL's time zone rules and zoneinfo's resolve a skipped or
repeated local midnight differently, and the periods must be billing's.

Why that span: no billing period starts before 1970 (`billing.periods.MIN_YEAR`), and the event
contract refuses times more than a few minutes ahead, so every accepted event until 2100 falls in
one of those periods. An instant outside them (an event backfilled from before its customer's first
period) counts in its UTC calendar month, which no billing period reads. 131 years x 12 periods =
1,572 rows a schedule.

A customer without a calendar is kept by UTC calendar month: schedule ('UTC', 1), which needs no
period rows (a UTC month starts on a whole UTC hour, `date_trunc('month', ...)` is exact).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg

from metering.period_totals import LOCK_CALENDARS, RebuildResult, has_usage, rebuild

UTC_MONTHS = ("UTC", 1)  # the schedule of a customer without a calendar
SPAN = ("1970-01", "2100-12")  # the labels of the periods to hand over for a schedule
# What the periods handed over must cover at least, whatever the schedule (the 1970-01 period of
# anchor day 31 at UTC-12 starts on 1970-01-31 12:00 UTC; the 2100-12 period of anchor day 1 at
# UTC+14 ends on 2100-12-31 10:00 UTC).
COVERS = (datetime(1970, 2, 1, tzinfo=UTC), datetime(2100, 12, 31, tzinfo=UTC))


class CalendarError(ValueError):
    """A calendar metering cannot keep: the message says what is wrong."""


@dataclass(frozen=True)
class CalendarChange:
    """What `set_calendar` did: the schedule's periods added (0 when metering had them), whether the
    customer's schedule changed, and the rebuild of its totals if it did and it has usage."""

    customer_id: str
    timezone: str
    anchor_day: int
    periods_added: int
    changed: bool
    rebuilt: RebuildResult | None


def set_calendar(
    conn: psycopg.Connection,
    customer_id: str,
    timezone: str,
    anchor_day: int,
    periods: Iterable[tuple[datetime, datetime]],
) -> CalendarChange:
    """Keep the customer's usage by the schedule (timezone, anchor_day) from now on, inside the
    caller's transaction (the caller commits; ingest waits for it, holding the calendar lock shared).

    `periods`: the schedule's [start, end) periods as aware datetimes, those labelled `SPAN`, in any
    order; read only if metering does not have the schedule yet (a generator is not even started
    otherwise), and ignored for ('UTC', 1). When the customer's schedule changes (no calendar counts
    as ('UTC', 1)) and metering holds usage of it, its period totals are rebuilt under the new one."""
    _check(customer_id, timezone, anchor_day)
    schedule = (timezone, anchor_day)
    with conn.cursor() as cur:
        cur.execute(LOCK_CALENDARS)
        added = 0
        if schedule != UTC_MONTHS:
            cur.execute("SELECT EXISTS (SELECT 1 FROM calendar_periods WHERE timezone = %s AND anchor_day = %s)",
                        schedule)
            if not cur.fetchone()[0]:
                rows = _tiled(periods, schedule)
                with cur.copy("COPY calendar_periods (timezone, anchor_day, period_start, period_end) FROM STDIN") as copy:
                    for start, end in rows:
                        copy.write_row((timezone, anchor_day, start, end))
                added = len(rows)
        cur.execute("SELECT timezone, anchor_day FROM customer_calendars WHERE customer_id = %s", (customer_id,))
        before = cur.fetchone()
        cur.execute(
            "INSERT INTO customer_calendars AS c (customer_id, timezone, anchor_day) VALUES (%s, %s, %s) "
            "ON CONFLICT (customer_id) DO UPDATE SET timezone = EXCLUDED.timezone, anchor_day = EXCLUDED.anchor_day, "
            "updated_at = now() WHERE (c.timezone, c.anchor_day) IS DISTINCT FROM (EXCLUDED.timezone, EXCLUDED.anchor_day)",
            (customer_id, timezone, anchor_day),
        )
    changed = (tuple(before) if before else UTC_MONTHS) != schedule
    rebuilt = rebuild(conn, customer_id) if changed and has_usage(conn, customer_id) else None
    return CalendarChange(customer_id, timezone, anchor_day, added, changed, rebuilt)


def calendar_of(conn: psycopg.Connection, customer_id: str) -> tuple[str, int]:
    """The customer's schedule (time zone, anchor day) metering keeps its usage by: ('UTC', 1) without one."""
    row = conn.execute("SELECT timezone, anchor_day FROM customer_calendars WHERE customer_id = %s",
                       (customer_id,)).fetchone()
    return (row[0], row[1]) if row else UTC_MONTHS


def _check(customer_id: object, timezone: object, anchor_day: object) -> None:
    if not isinstance(customer_id, str) or not customer_id:
        raise CalendarError("customer_id must be a non-empty string")
    if not isinstance(timezone, str) or not timezone:
        raise CalendarError(f"customer {customer_id}: the time zone must be an IANA name such as 'Asia/Kolkata'")
    if not isinstance(anchor_day, int) or isinstance(anchor_day, bool) or not 1 <= anchor_day <= 31:
        raise CalendarError(f"customer {customer_id}: anchor day {anchor_day!r} is not a day of the month 1..31")


def _tiled(periods: Iterable[tuple[datetime, datetime]], schedule: tuple[str, int]) -> list[tuple[datetime, datetime]]:
    """The periods sorted, checked: aware, non-empty, each ending where the next starts, covering COVERS."""
    name = f"schedule {schedule[0]} / anchor day {schedule[1]}"
    rows = []
    for start, end in periods:
        if not (isinstance(start, datetime) and isinstance(end, datetime) and start.tzinfo and end.tzinfo):
            raise CalendarError(f"{name}: periods are pairs of aware datetimes, got ({start!r}, {end!r})")
        if end <= start:
            raise CalendarError(f"{name}: period [{start.isoformat()}, {end.isoformat()}) is empty")
        rows.append((start.astimezone(UTC), end.astimezone(UTC)))
    rows.sort()
    if not rows:
        raise CalendarError(f"{name} is new to metering: give its periods (labelled {SPAN[0]} to {SPAN[1]})")
    for (_, end), (start, _) in zip(rows, rows[1:], strict=False):
        if end != start:
            raise CalendarError(f"{name}: the period ending {end.isoformat()} is followed by one starting "
                                f"{start.isoformat()}: periods must tile time")
    if rows[0][0] > COVERS[0] or rows[-1][1] < COVERS[1]:
        raise CalendarError(f"{name}: the periods run from {rows[0][0].isoformat()} to {rows[-1][1].isoformat()}; "
                            f"give those labelled {SPAN[0]} to {SPAN[1]} (they cover {COVERS[0]:%Y-%m-%d} to "
                            f"{COVERS[1]:%Y-%m-%d} UTC whatever the schedule)")
    return rows
