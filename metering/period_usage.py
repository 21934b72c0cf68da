"""The one read of usage for rating and billing: a period or a window in, typed rows out.

Metering keeps, at ingest and exactly, totals per customer x billing period (`metering.period_totals`,
docs/metering.md "Period totals and billing calendars"). `period_usages` gives each customer's usage
as a `PeriodUsage`, streamed in customer order, for every customer or one: one row per key
(model x deployment x project, meter, the customer's tasks, dedicated deployment x GPU type) instead of
every hour behind it. What is asked:

- the billing period labelled "YYYY-MM" (each customer's own, `label_periods`), or one customer's
  period given by its start (`customer_period`): read from the period totals;
- a window [start, end): metering decides per customer (`window_periods`, `totals_answer`). A
  customer whose billing period the window is, as metering's calendar knows it, is read from its
  period totals; every other customer from the hourly reads (`metering.period_reads`: whole UTC hours
  from the rollups, the partial hours at the edges from raw events, tasks at outcome time, dedicated
  GPU-ms of the hours that start in the window), in the same rows. The two agree exactly (the totals
  are kept as the sum of those reads, tests/metering/test_period_totals.py).

Which period a label means for a customer: its calendar's (`customer_calendars`, `calendar_periods`,
handed over by billing); a customer without one (or with the ('UTC', 1) schedule) by UTC calendar
month. The period labelled "YYYY-MM" is the one that starts on the anchor day of that month (the
month's last day for an anchor past it) at local midnight. Metering does no time zone arithmetic to
find it: every local midnight of that day lies between 10:00 UTC the day before (UTC+14) and 12:00 UTC
that day (UTC-12), and the next period starts at least 27 days later, so the label's period is the
schedule's period that contains 12:00 UTC of the anchor day. Labels run from 1970-01 to 2100-12 (the
span of periods kept per schedule, `metering.calendars.SPAN`).

What the totals do not hold stays on the hourly reads (`metering.period_reads`): the shared pool's GPU
time (attributed per deployment-hour by every customer's weighted tokens), task outcomes judged by a
book's trusted sources (they need each task's reports), usage with prefix caching off (experiments).
`Periods` says each customer's period (None for a customer read hourly), so a caller can read those
per period window.
"""

from __future__ import annotations

import calendar
import heapq
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import NamedTuple

import psycopg

from metering import period_reads

Window = tuple[datetime, datetime]  # [start, end), aware UTC datetimes

_LABEL = re.compile(r"(\d{4})-(\d{2})")
FIRST_YEAR, LAST_YEAR = 1970, 2100  # the labels of the periods kept per schedule (metering.calendars.SPAN)


class PeriodUsageError(ValueError):
    """A period the totals cannot answer for: the message says why."""


class RequestTotals(NamedTuple):
    """A customer's requests of its period per model (x deployment, '' when not read by deployment)
    (x project, '' when not read by project, and the project of requests made without one). The counts
    are named after the request meters (`pricing.meters.REQUEST_METERS`), as rating reads them."""

    model: str
    deployment_id: str
    project: str
    requests: int
    uncached_input_tokens: int
    cached_input_tokens: int
    output_tokens: int


class MeterTotal(NamedTuple):
    """An infermeter.usage.v1 meter's quantity in the period, and its events."""

    meter: str
    quantity: Decimal
    events: int


class TaskTotals(NamedTuple):
    """Tasks whose outcome's finished_at is in the period, by outcome, and the attempts of the succeeded
    and failed ones (an abandoned task's attempts are not counted)."""

    succeeded: int
    failed: int
    abandoned: int
    succeeded_attempts: int
    failed_attempts: int

    @property
    def attempts(self) -> int:
        return self.succeeded_attempts + self.failed_attempts


class GpuTotal(NamedTuple):
    """GPU-ms of a dedicated deployment the customer owns (an hour's GPU time in the period that
    contains the hour's start)."""

    deployment_id: str
    gpu_type: str
    gpu_ms: int


@dataclass(frozen=True, slots=True)
class PeriodUsage:
    """One customer's usage of [period_start, period_end): its billing period's totals, or a window's
    sums of the hourly reads."""

    customer_id: str
    period_start: datetime
    period_end: datetime
    requests: tuple[RequestTotals, ...] = ()
    meters: tuple[MeterTotal, ...] = ()
    tasks: TaskTotals | None = None
    gpu: tuple[GpuTotal, ...] = ()


@dataclass(frozen=True)
class Periods:
    """The customers whose period totals a read takes, and the period of each: `schedules` holds the
    period of each schedule (time zone, anchor day) in use but ('UTC', 1), `customers` each customer's
    schedule among those; any other customer's period is `utc_month`. For a label every customer has
    its period; for a window (`window_periods`) a customer whose period is not the window has None
    (its schedule's window, or `utc_month` for the customers kept by UTC month), and is read hourly."""

    utc_month: Window | None
    schedules: dict[tuple[str, int], Window | None] = field(default_factory=dict)
    customers: dict[str, tuple[str, int]] = field(default_factory=dict)

    def of(self, customer_id: str) -> Window | None:
        schedule = self.customers.get(customer_id)
        return self.utc_month if schedule is None else self.schedules[schedule]

    def windows(self) -> set[Window]:
        """The distinct periods of the customers read from the totals."""
        return {w for w in (self.utc_month, *self.schedules.values()) if w is not None}

    def hourly(self) -> tuple[list[str] | None, list[str]]:
        """The customers not read from the totals, as a read's (among, excluding): those listed when the
        customers kept by UTC month are read from the totals (among), else every customer but the listed
        ones whose period is read from the totals (excluding)."""
        if self.utc_month is not None:
            return [c for c, s in self.customers.items() if self.schedules[s] is None], []
        return None, [c for c, s in self.customers.items() if self.schedules[s] is not None]


def _month(label: object) -> tuple[int, int]:
    match = _LABEL.fullmatch(label) if isinstance(label, str) else None
    if match is None or not 1 <= int(match.group(2)) <= 12:
        raise PeriodUsageError(f"period label {label!r} is not of the form YYYY-MM (e.g. '2026-11')")
    year, month = int(match.group(1)), int(match.group(2))
    if not FIRST_YEAR <= year <= LAST_YEAR:
        raise PeriodUsageError(f"period label {label!r}: the period totals answer for {FIRST_YEAR}-01 to "
                               f"{LAST_YEAR}-12")
    return year, month


def _utc_month(year: int, month: int) -> Window:
    following = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
    return datetime(year, month, 1, tzinfo=UTC), following


# The period of each schedule in use (but ('UTC', 1)) that contains 12:00 UTC of its anchor day in the
# label's month (%(noons)s: that instant for anchor days 1..31), one descent of calendar_periods' key each.
SCHEDULE_PERIODS_SQL = """
SELECT s.timezone, s.anchor_day, p.period_start, p.period_end
FROM (SELECT DISTINCT timezone, anchor_day FROM customer_calendars
      WHERE (timezone, anchor_day) <> ('UTC', 1) {only}) s
CROSS JOIN LATERAL (
    SELECT p.period_start, p.period_end FROM calendar_periods p
    WHERE p.timezone = s.timezone AND p.anchor_day = s.anchor_day
      AND p.period_start <= (%(noons)s::timestamptz[])[s.anchor_day]
    ORDER BY p.period_start DESC LIMIT 1
) p
"""
CUSTOMER_SCHEDULES_SQL = """
SELECT customer_id, timezone, anchor_day FROM customer_calendars WHERE (timezone, anchor_day) <> ('UTC', 1) {only}
"""


def label_periods(conn: psycopg.Connection, label: str, customer_id: str | None = None) -> Periods:
    """Every customer's period labelled `label` (or one customer's): see `Periods`."""
    year, month = _month(label)
    last = calendar.monthrange(year, month)[1]
    noons = [datetime(year, month, min(day, last), 12, tzinfo=UTC) for day in range(1, 32)]
    only = "" if customer_id is None else "AND customer_id = %(customer)s"
    params = {"noons": noons, "customer": customer_id}
    schedules = {(tz, anchor): (start, end)
                 for tz, anchor, start, end in conn.execute(SCHEDULE_PERIODS_SQL.format(only=only), params)}
    customers = {c: (tz, anchor) for c, tz, anchor in conn.execute(CUSTOMER_SCHEDULES_SQL.format(only=only), params)
                 if (tz, anchor) in schedules}
    return Periods(_utc_month(year, month), schedules, customers)


def customer_period(conn: psycopg.Connection, customer_id: str, period_start: datetime) -> Periods:
    """The customer's period that starts at `period_start` (a PeriodUsageError when none of its schedule
    does), as `Periods` of that customer."""
    if period_start.tzinfo is None:
        raise PeriodUsageError(f"period start {period_start.isoformat()} has no time zone")
    start = period_start.astimezone(UTC)
    row = conn.execute(
        "SELECT c.timezone, c.anchor_day, p.period_end FROM customer_calendars c LEFT JOIN calendar_periods p "
        "ON p.timezone = c.timezone AND p.anchor_day = c.anchor_day AND p.period_start = %s "
        "WHERE c.customer_id = %s AND (c.timezone, c.anchor_day) <> ('UTC', 1)", (start, customer_id)).fetchone()
    if row is not None:
        timezone, anchor_day, end = row
        if end is None:
            raise PeriodUsageError(f"no period of customer {customer_id} (schedule {timezone} / anchor day "
                                   f"{anchor_day}) starts at {start.isoformat()}")
        utc = _utc_month(start.year, start.month)
        return Periods(utc, {(timezone, anchor_day): (start, end)}, {customer_id: (timezone, anchor_day)})
    utc = _utc_month(start.year, start.month)
    if utc[0] != start:
        raise PeriodUsageError(f"customer {customer_id} is kept by UTC calendar month: {start.isoformat()} starts "
                               "no period of it")
    return Periods(utc)


# Which schedules in use (but ('UTC', 1)) have [start, end) as one of their periods.
WINDOW_SCHEDULES_SQL = """
SELECT s.timezone, s.anchor_day, EXISTS (
    SELECT 1 FROM calendar_periods p WHERE p.timezone = s.timezone AND p.anchor_day = s.anchor_day
      AND p.period_start = %(start)s AND p.period_end = %(end)s)
FROM (SELECT DISTINCT timezone, anchor_day FROM customer_calendars
      WHERE (timezone, anchor_day) <> ('UTC', 1) {only}) s
"""


def _utc(instant: datetime) -> datetime:
    if instant.tzinfo is None:
        raise PeriodUsageError(f"{instant.isoformat()} has no time zone")
    return instant.astimezone(UTC)


def window_periods(conn: psycopg.Connection, start: datetime, end: datetime,
                   customer_id: str | None = None) -> Periods:
    """Whose billing period is the window [start, end), as metering's calendar knows it (every
    customer's, or one customer's): a customer with a calendar when [start, end) is one of its
    schedule's periods, a customer kept by UTC month when it is a UTC calendar month. Their totals
    answer the window exactly; every other customer's usage of it is summed from the hourly rollups."""
    start, end = _utc(start), _utc(end)
    if end <= start:
        raise PeriodUsageError(f"the window [{start.isoformat()}, {end.isoformat()}) is empty")
    window = (start, end)
    only = "" if customer_id is None else "AND customer_id = %(customer)s"
    params = {"start": start, "end": end, "customer": customer_id}
    schedules = {(tz, anchor): window if matches else None
                 for tz, anchor, matches in conn.execute(WINDOW_SCHEDULES_SQL.format(only=only), params)}
    customers = {c: (tz, anchor) for c, tz, anchor in conn.execute(CUSTOMER_SCHEDULES_SQL.format(only=only), params)
                 if (tz, anchor) in schedules}
    utc_month = window if _utc_month(start.year, start.month) == window else None
    return Periods(utc_month, schedules, customers)


def totals_answer(conn: psycopg.Connection, customer_id: str, start: datetime, end: datetime) -> bool:
    """Whether the customer's period totals answer [start, end) exactly: the window is the customer's
    billing period (`window_periods`), so `period_usages` reads it from them."""
    return window_periods(conn, start, end, customer_id).of(customer_id) is not None


# The customers' period starts for a read of the totals: those of the customers with a schedule (its
# period handed in as arrays), every other customer's the UTC month's (NULL: not read from the totals). The scan's range covers every
# period start a label can have (the start lies within a day of its anchor day), so the key's
# period_start is checked on the index entries before any row is read.
_PERIOD_OF = """WITH schedules AS (
    SELECT * FROM unnest(%(timezones)s::text[], %(anchor_days)s::int[], %(starts)s::timestamptz[])
        AS s(timezone, anchor_day, period_start)
), own AS (
    SELECT c.customer_id, s.period_start FROM customer_calendars c JOIN schedules s USING (timezone, anchor_day)
    {only_own}
)"""
_IN_PERIOD = ("t.period_start >= %(low)s AND t.period_start <= %(high)s AND t.period_start = "
              "CASE WHEN o.customer_id IS NULL THEN %(utc_start)s::timestamptz ELSE o.period_start END {only}")

# The request totals of the label's period starts, read along the primary key (customer first) with
# no join and no grouping, so rows stream in customer order as the index gives them: which start a row
# has comes back as its position in %(starts)s (a small integer, not a timestamp to parse), and the
# caller keeps the rows at the customer's own start and sums them over deployments or projects when
# asked (`_request_totals`).
REQUEST_TOTALS_SQL = """
SELECT t.customer_id, array_position(%(starts)s::timestamptz[], t.period_start), t.model, t.deployment_id, t.project,
       t.requests, t.input_tokens - t.cached_input_tokens, t.cached_input_tokens, t.output_tokens
FROM request_period_totals t
WHERE t.period_start = ANY(%(starts)s::timestamptz[]) {only}
ORDER BY t.customer_id, t.period_start, t.model, t.deployment_id, t.project
"""
METER_TOTALS_SQL = _PERIOD_OF + """
SELECT t.customer_id, t.meter, t.quantity, t.events
FROM usage_period_totals t LEFT JOIN own o USING (customer_id)
WHERE """ + _IN_PERIOD + """ {meters}
ORDER BY t.customer_id, t.meter
"""
TASK_TOTALS_SQL = _PERIOD_OF + """
SELECT t.customer_id, t.succeeded, t.failed, t.abandoned, t.succeeded_attempts, t.failed_attempts
FROM task_period_totals t LEFT JOIN own o USING (customer_id)
WHERE """ + _IN_PERIOD + """
ORDER BY t.customer_id
"""
GPU_TOTALS_SQL = _PERIOD_OF + """
SELECT t.customer_id, t.deployment_id, t.gpu_type, t.gpu_ms
FROM gpu_period_totals t LEFT JOIN own o USING (customer_id)
WHERE """ + _IN_PERIOD + """
ORDER BY t.customer_id, t.deployment_id, t.gpu_type
"""
# The request totals are streamed as the hourly sums are (metering.period_reads.request_sums): in
# customer order by a reading thread, with settings for that statement only.
REQUEST_TOTALS_SETTINGS = period_reads.REQUEST_SUMS_SETTINGS


def _params(periods: Periods, customer_id: str | None) -> dict:
    starts = [start for start, _ in periods.windows()]
    schedules = list(periods.schedules.items())
    return {
        "timezones": [tz for (tz, _), _ in schedules], "anchor_days": [a for (_, a), _ in schedules],
        "starts": [w and w[0] for _, w in schedules], "utc_start": periods.utc_month and periods.utc_month[0],
        "low": min(starts), "high": max(starts), "customer": customer_id,
    }


def _sql(template: str, customer_id: str | None, **parts: str) -> str:
    return template.format(only="" if customer_id is None else "AND t.customer_id = %(customer)s",
                           only_own="" if customer_id is None else "WHERE c.customer_id = %(customer)s", **parts)


def period_usages(
    conn: psycopg.Connection,
    label: str | None = None,
    *,
    customer_id: str | None = None,
    period_start: datetime | None = None,
    window: Window | None = None,
    from_totals: bool = True,
    periods: Periods | None = None,
    requests: bool = True,
    by_deployment: bool = True,
    by_project: bool = False,
    usage_meters: Collection[str] | None = None,
    tasks: bool = True,
    gpu: bool = True,
    chunk_rows: int = period_reads.STREAM_CHUNK_ROWS,
    chunks_ahead: int = period_reads.STREAM_CHUNKS_AHEAD,
) -> Iterator[PeriodUsage]:
    """Each customer's usage of a period or a window, in customer order, each customer once, only
    customers with usage in it (or one customer's: `customer_id`). What is asked, one of:

    - `label`: each customer's own billing period labelled `label` (`label_periods`), from the period
      totals; with `customer_id` alone, that customer's period of `label`;
    - `customer_id` and `period_start`: that customer's period starting there (`customer_period`), from
      its totals;
    - `window` ([start, end), aware): that window for every customer. Metering decides per customer
      (`window_periods`): the totals of a customer whose billing period the window is, the hourly
      rollups of every other customer (whole UTC hours, the partial hours at the edges from raw events,
      tasks at outcome time, the dedicated deployments' GPU-ms of the hours that start in the window).
      `from_totals=False`: the hourly rollups for every customer.

    What is read: `requests` (per model; per deployment unless `by_deployment=False`, which sums over
    deployments and leaves deployment_id ''; per project with `by_project`, else summed over projects,
    project ''), `usage_meters` (None: every meter; else only those named, none for an empty
    collection), `tasks`, `gpu` (dedicated deployments' GPU-ms). `periods`: the customers' periods when
    the caller has them already (`label_periods`; with `period_start`, that customer's period as
    `customer_period` gives it). The request rows of every customer are read by a thread (as
    `metering.period_reads.request_sums` reads the hourly sums), so PostgreSQL keeps reading the next
    customers while the caller works on this one; `conn` is the thread's until the iterator ends.
    `chunk_rows` and `chunks_ahead` are handed to it."""
    if sum(x is not None for x in (label, period_start, window)) != 1:
        raise PeriodUsageError("give a period label, a customer and its period start, or a window")
    if period_start is not None:
        if customer_id is None:
            raise PeriodUsageError("a period start names one customer's period: give its customer_id")
        if periods is None:
            periods = customer_period(conn, customer_id, period_start)
    elif label is not None:
        if periods is None:
            periods = label_periods(conn, label, customer_id)
    else:
        start, end = _utc(window[0]), _utc(window[1])
        if periods is None:
            periods = window_periods(conn, start, end, customer_id) if from_totals else Periods(None)
    what = {"requests": requests, "by_deployment": by_deployment, "by_project": by_project,
            "usage_meters": usage_meters, "tasks": tasks, "gpu": gpu, "chunk_rows": chunk_rows,
            "chunks_ahead": chunks_ahead}
    if window is None:
        return _totals_usages(conn, periods, customer_id, **what)
    if customer_id is not None:  # one customer: its totals or its hourly sums
        if periods.of(customer_id) is not None:
            return _totals_usages(conn, periods, customer_id, **what)
        return _hourly_usages(conn, start, end, customer_id, None, [], **what)
    among, excluding = periods.hourly()
    if not periods.windows():
        return _hourly_usages(conn, start, end, None, among, excluding, **what)
    totals = _totals_usages(conn, periods, None, **what)
    if among == []:
        return totals
    hourly = _hourly_usages(conn, start, end, None, among, excluding, **what)
    # Both: one connection streams one statement at a time, so the side limited to a list of customers
    # (the few whose period the window is not, or the few whose period it is) is read first, whole.
    if among is not None:
        hourly = iter(list(hourly))
    else:
        totals = iter(list(totals))
    return heapq.merge(totals, hourly, key=lambda u: u.customer_id)


def _merged(request_rows: Iterator[tuple[str, tuple[RequestTotals, ...]]], others: dict[str, dict[str, object]],
            window_of) -> Iterator[PeriodUsage]:
    """The customers' PeriodUsage in customer order: the request rows as they stream (customer order) with
    each customer's other rows (`others`: meters, tasks, gpu), and the customers with other rows only."""

    def usage(customer: str, rows: tuple[RequestTotals, ...]) -> PeriodUsage:
        start, end = window_of(customer)
        more = others.pop(customer, None)
        if more is None:
            return PeriodUsage(customer, start, end, rows)
        return PeriodUsage(customer, start, end, rows, tuple(more.get("meters", ())), more.get("tasks"),
                           tuple(more.get("gpu", ())))

    waiting = sorted(others)  # the customers with other rows, to merge in customer order
    at = 0
    for customer, rows in request_rows:
        while at < len(waiting) and waiting[at] < customer:
            yield usage(waiting[at], ())
            at += 1
        if at < len(waiting) and waiting[at] == customer:
            at += 1
        yield usage(customer, rows)
    for customer in waiting[at:]:
        yield usage(customer, ())


def _others() -> tuple[dict[str, dict[str, object]], object]:
    others: dict[str, dict[str, object]] = {}

    def other(customer: str) -> dict[str, object]:
        found = others.get(customer)
        if found is None:
            found = others[customer] = {}
        return found

    return others, other


def _totals_usages(conn: psycopg.Connection, periods: Periods, customer_id: str | None, *, requests: bool,
                   by_deployment: bool, by_project: bool, usage_meters: Collection[str] | None, tasks: bool,
                   gpu: bool, chunk_rows: int, chunks_ahead: int) -> Iterator[PeriodUsage]:
    """`period_usages` of the customers `periods` gives a period: their period totals."""
    params = _params(periods, customer_id)
    others, other = _others()
    if usage_meters is None or usage_meters:
        meter_only = "" if usage_meters is None else "AND t.meter = ANY(%(meters)s::text[])"
        rows = conn.execute(_sql(METER_TOTALS_SQL, customer_id, meters=meter_only),
                            {**params, "meters": sorted(usage_meters or ())})
        for customer, meter, quantity, events in rows:
            other(customer).setdefault("meters", []).append(MeterTotal(meter, quantity, events))
    if tasks:
        for customer, *counts in conn.execute(_sql(TASK_TOTALS_SQL, customer_id), params):
            other(customer)["tasks"] = TaskTotals(*counts)
    if gpu:
        for customer, deployment, gpu_type, gpu_ms in conn.execute(_sql(GPU_TOTALS_SQL, customer_id), params):
            other(customer).setdefault("gpu", []).append(GpuTotal(deployment, gpu_type, gpu_ms))
    request_rows = (_request_totals(conn, periods, customer_id, by_deployment, by_project, chunk_rows, chunks_ahead)
                    if requests else iter(()))
    return _merged(request_rows, others, periods.of)


def _hourly_usages(conn: psycopg.Connection, start: datetime, end: datetime, customer_id: str | None,
                   among: list[str] | None, excluding: list[str], *, requests: bool, by_deployment: bool,
                   by_project: bool, usage_meters: Collection[str] | None, tasks: bool, gpu: bool, chunk_rows: int,
                   chunks_ahead: int) -> Iterator[PeriodUsage]:
    """`period_usages` of [start, end) summed from the hourly reads (`metering.period_reads`) for one
    customer or the customers `among` / but `excluding`: the shapes of the period totals."""
    who = {"customer_id": customer_id, "among": among, "excluding": excluding}
    others, other = _others()
    if usage_meters is None or usage_meters:
        for customer, meter, quantity, events in period_reads.meter_totals(conn, start, end, **who):
            if usage_meters is None or meter in usage_meters:
                other(customer).setdefault("meters", []).append(MeterTotal(meter, quantity, events))
    if tasks:
        for customer, *counts in period_reads.task_totals(conn, start, end, **who):
            other(customer)["tasks"] = TaskTotals(*counts)
    if gpu:
        for customer, deployment, gpu_type, gpu_ms in period_reads.dedicated_gpu_ms(conn, start, end, **who):
            other(customer).setdefault("gpu", []).append(GpuTotal(deployment, gpu_type, gpu_ms))
    request_rows: Iterator = iter(())
    if requests:
        rows = period_reads.request_sums(conn, start, end, by_deployment=by_deployment, by_project=by_project,
                                         chunk_rows=chunk_rows, chunks_ahead=chunks_ahead, **who)
        make = RequestTotals._make
        if by_project:
            request_rows = ((c, tuple(make(row[1:]) for row in found)) for c, found in rows)
        else:
            request_rows = ((c, tuple(make((m, d, "", *sums)) for _, m, d, *sums in found)) for c, found in rows)
    return _merged(request_rows, others, lambda _: (start, end))


def _request_totals(conn: psycopg.Connection, periods: Periods, customer_id: str | None, by_deployment: bool,
                    by_project: bool, chunk_rows: int, chunks_ahead: int) -> Iterator[tuple[str, tuple]]:
    """(customer, its RequestTotals) in customer order: the rows at the customer's own period start,
    summed over deployments (unless `by_deployment`) and projects (unless `by_project`)."""
    starts = sorted({start for start, _ in periods.windows()})
    position = {start: i + 1 for i, start in enumerate(starts)}  # array_position counts from 1
    positions = {w: position[w[0]] for w in periods.windows()}
    utc = positions.get(periods.utc_month)  # None: read hourly, its rows are skipped
    own = {c: positions.get(periods.schedules[s]) for c, s in periods.customers.items()}
    sql = REQUEST_TOTALS_SQL.format(only="" if customer_id is None else "AND t.customer_id = %(customer)s")
    params = {"starts": starts, "customer": customer_id}
    if customer_id is not None:
        chunks: Iterator[list[tuple]] = iter([conn.execute(sql, params).fetchall()])
    else:
        chunks = period_reads.read_ahead(conn, sql, params, chunk_rows=chunk_rows, chunks_ahead=chunks_ahead,
                                         settings=REQUEST_TOTALS_SETTINGS)
    whole = by_deployment and by_project  # the key's rows as they are, nothing to sum
    make = RequestTotals._make
    current: str | None = None
    mine = utc
    rows: list[RequestTotals] = []
    summed: dict[tuple[str, str, str], list[int]] = {}

    def done() -> tuple[RequestTotals, ...]:
        if whole:
            return tuple(rows)
        return tuple(make((*key, *counts)) for key, counts in sorted(summed.items()))

    try:
        for chunk in chunks:
            for row in chunk:
                customer = row[0]
                if customer != current:
                    if current is not None and (rows or summed):
                        yield current, done()
                    current, mine, rows, summed = customer, own.get(customer, utc), [], {}
                if row[1] != mine:
                    continue  # another period of the customer's schedule that starts in the range, or hourly
                if whole:
                    rows.append(make(row[2:]))
                    continue
                key = (row[2], row[3] if by_deployment else "", row[4] if by_project else "")
                counts = summed.get(key)
                if counts is None:
                    summed[key] = list(row[5:])
                else:
                    for i, q in enumerate(row[5:]):
                        counts[i] += q
        if current is not None and (rows or summed):
            yield current, done()
    finally:
        if hasattr(chunks, "close"):
            chunks.close()  # the caller stopped early: stop the reading thread now
