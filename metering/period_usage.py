"""A billing period's usage from the period totals kept at ingest: a period in, typed rows out.

Metering keeps, at ingest and exactly, totals per customer x billing period (`metering.period_totals`,
docs/metering.md "Period totals and billing calendars"). This module reads them: for the billing period
labelled "YYYY-MM" (or one customer's period given by its start), each customer's totals as a
`PeriodUsage`, streamed in customer order, for every customer or one. One row per key
(model x deployment x project, meter, the customer's tasks, dedicated deployment x GPU type) instead of
every hour behind it.

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
`LabelPeriods` says each customer's period, so a caller can read those per period window.
"""

from __future__ import annotations

import calendar
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
    (x project, '' when not read by project, and the project of requests made without one)."""

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
    """One customer's totals of one billing period [period_start, period_end)."""

    customer_id: str
    period_start: datetime
    period_end: datetime
    requests: tuple[RequestTotals, ...] = ()
    meters: tuple[MeterTotal, ...] = ()
    tasks: TaskTotals | None = None
    gpu: tuple[GpuTotal, ...] = ()


@dataclass(frozen=True)
class LabelPeriods:
    """Each customer's period of one label: `schedules` holds the period of each schedule (time zone,
    anchor day) in use but ('UTC', 1), `customers` each customer's schedule among those; any other
    customer's period is `utc_month`."""

    utc_month: Window
    schedules: dict[tuple[str, int], Window] = field(default_factory=dict)
    customers: dict[str, tuple[str, int]] = field(default_factory=dict)

    def of(self, customer_id: str) -> Window:
        schedule = self.customers.get(customer_id)
        return self.utc_month if schedule is None else self.schedules[schedule]

    def windows(self) -> set[Window]:
        """The distinct periods of the customers (the UTC month always among them)."""
        return {self.utc_month, *self.schedules.values()}


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


def label_periods(conn: psycopg.Connection, label: str, customer_id: str | None = None) -> LabelPeriods:
    """Every customer's period labelled `label` (or one customer's): see `LabelPeriods`."""
    year, month = _month(label)
    last = calendar.monthrange(year, month)[1]
    noons = [datetime(year, month, min(day, last), 12, tzinfo=UTC) for day in range(1, 32)]
    only = "" if customer_id is None else "AND customer_id = %(customer)s"
    params = {"noons": noons, "customer": customer_id}
    schedules = {(tz, anchor): (start, end)
                 for tz, anchor, start, end in conn.execute(SCHEDULE_PERIODS_SQL.format(only=only), params)}
    customers = {c: (tz, anchor) for c, tz, anchor in conn.execute(CUSTOMER_SCHEDULES_SQL.format(only=only), params)
                 if (tz, anchor) in schedules}
    return LabelPeriods(_utc_month(year, month), schedules, customers)


def customer_period(conn: psycopg.Connection, customer_id: str, period_start: datetime) -> LabelPeriods:
    """The customer's period that starts at `period_start` (a PeriodUsageError when none of its schedule
    does), as `LabelPeriods` of that customer."""
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
        return LabelPeriods(utc, {(timezone, anchor_day): (start, end)}, {customer_id: (timezone, anchor_day)})
    utc = _utc_month(start.year, start.month)
    if utc[0] != start:
        raise PeriodUsageError(f"customer {customer_id} is kept by UTC calendar month: {start.isoformat()} starts "
                               "no period of it")
    return LabelPeriods(utc)


# The customers' period starts for a read of the totals: those of the customers with a schedule (its
# period handed in as arrays), every other customer's the UTC month's. The scan's range covers every
# period start a label can have (the start lies within a day of its anchor day), so the key's
# period_start is checked on the index entries before any row is read.
_PERIOD_OF = """WITH schedules AS (
    SELECT * FROM unnest(%(timezones)s::text[], %(anchor_days)s::int[], %(starts)s::timestamptz[])
        AS s(timezone, anchor_day, period_start)
), own AS (
    SELECT c.customer_id, s.period_start FROM customer_calendars c JOIN schedules s USING (timezone, anchor_day)
    {only_own}
)"""
_IN_PERIOD = ("t.period_start >= %(low)s AND t.period_start <= %(high)s "
              "AND t.period_start = coalesce(o.period_start, %(utc_start)s) {only}")

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


def _params(periods: LabelPeriods, customer_id: str | None) -> dict:
    starts = [start for start, _ in periods.windows()]
    schedules = list(periods.schedules.items())
    return {
        "timezones": [tz for (tz, _), _ in schedules], "anchor_days": [a for (_, a), _ in schedules],
        "starts": [w[0] for _, w in schedules], "utc_start": periods.utc_month[0],
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
    periods: LabelPeriods | None = None,
    requests: bool = True,
    by_deployment: bool = True,
    by_project: bool = False,
    usage_meters: Collection[str] | None = None,
    tasks: bool = True,
    gpu: bool = True,
    chunk_rows: int = period_reads.STREAM_CHUNK_ROWS,
    chunks_ahead: int = period_reads.STREAM_CHUNKS_AHEAD,
) -> Iterator[PeriodUsage]:
    """Each customer's totals of its period labelled `label` (or, with `customer_id` and
    `period_start`, of that customer's period starting there), in customer order, each customer once,
    only customers with totals in the period. `customer_id` alone: that customer's period of `label`.

    What is read: `requests` (per model; per deployment unless `by_deployment=False`, which sums over
    deployments and leaves deployment_id ''; per project with `by_project`, else summed over projects,
    project ''), `usage_meters` (None: every meter; else only those named, none for an empty
    collection), `tasks`, `gpu` (dedicated deployments' GPU-ms). `periods`: the customers' periods of
    `label` when the caller has them already (`label_periods`; with `period_start`, that customer's period
    as `customer_period` gives it). The request totals of every customer
    are read by a thread (as `metering.period_reads.request_sums` reads the hourly sums), so
    PostgreSQL keeps reading the next customers while the caller works on this one; `conn` is the
    thread's until the iterator ends. `chunk_rows` and `chunks_ahead` are handed to it."""
    if (label is None) == (period_start is None):
        raise PeriodUsageError("give a period label, or a customer and its period start")
    if period_start is not None:
        if customer_id is None:
            raise PeriodUsageError("a period start names one customer's period: give its customer_id")
        if periods is None:
            periods = customer_period(conn, customer_id, period_start)
    elif periods is None:
        periods = label_periods(conn, label, customer_id)
    params = _params(periods, customer_id)
    others: dict[str, dict[str, object]] = {}

    def other(customer: str) -> dict[str, object]:
        found = others.get(customer)
        if found is None:
            found = others[customer] = {}
        return found

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

    def usage(customer: str, request_rows: tuple[RequestTotals, ...]) -> PeriodUsage:
        start, end = periods.of(customer)
        more = others.pop(customer, None)
        if more is None:
            return PeriodUsage(customer, start, end, request_rows)
        return PeriodUsage(customer, start, end, request_rows, tuple(more.get("meters", ())), more.get("tasks"),
                           tuple(more.get("gpu", ())))

    waiting = sorted(others)  # the customers with other totals, to merge in customer order
    at = 0
    if requests:
        for customer, request_rows in _request_totals(conn, periods, customer_id, by_deployment, by_project,
                                                      chunk_rows, chunks_ahead):
            while at < len(waiting) and waiting[at] < customer:
                yield usage(waiting[at], ())
                at += 1
            if at < len(waiting) and waiting[at] == customer:
                at += 1
            yield usage(customer, request_rows)
    for customer in waiting[at:]:
        yield usage(customer, ())


def _request_totals(conn: psycopg.Connection, periods: LabelPeriods, customer_id: str | None, by_deployment: bool,
                    by_project: bool, chunk_rows: int, chunks_ahead: int) -> Iterator[tuple[str, tuple]]:
    """(customer, its RequestTotals) in customer order: the rows at the customer's own period start,
    summed over deployments (unless `by_deployment`) and projects (unless `by_project`)."""
    starts = sorted({start for start, _ in periods.windows()})
    position = {start: i + 1 for i, start in enumerate(starts)}  # array_position counts from 1
    utc = position[periods.utc_month[0]]
    own = {c: position[periods.schedules[s][0]] for c, s in periods.customers.items()}
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
                    continue  # another period of the customer's schedule that starts in the label's range
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
