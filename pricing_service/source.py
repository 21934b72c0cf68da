"""Load what pricing rates from the metering tables: the adapter between Postgres and pricing/.

Metering reads its own tables (`metering.period_reads` holds the SQL); this module checks the window
and makes `pricing.records` of the rows it returns.

Quantities for [start, end) (both whole UTC hours, because the rollups are hourly):
- request meters from request_rollup_hourly, hour in [start, end)
  (uncached_input_tokens = input_tokens - cached_input_tokens);
- GPU time from gpu_ledger_hourly, hour in [start, end), gpu_ms summed over replicas
  (customer_id '' = the shared pool);
- tasks from task_outcomes whose finished_at is in [start, end), with all their attempts from
  task_attempts and their tool/verification usage from task_usage;
- usage meters from usage_rollup_hourly, hour in [start, end).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from decimal import Decimal

import psycopg

from infermeter.stack.postgres import to_libpq_url
from infermeter.times import HOUR, TimeInputError, Window, floor_hour, month_start
from metering import period_reads
from pricing.records import AttemptRecord, Dataset, GpuRecord, MeterRecord, RequestRecord, TaskRecord


def check_window(start: datetime, end: datetime) -> tuple[datetime, datetime]:
    """Aware, whole-hour, non-empty [start, end) in UTC (infermeter.times.Window), or a TimeInputError
    saying what is wrong."""
    for name, t in (("--from", start), ("--to", end)):
        if t.tzinfo is None:
            raise TimeInputError(f"{name} {t.isoformat()} has no time zone; add Z (UTC) or an offset")
    window = Window(start, end)  # non-empty, or TimeInputError
    for name, t in (("--from", window.start), ("--to", window.end)):
        if floor_hour(t) != t:
            raise TimeInputError(
                f"{name} {t.isoformat()} is not a whole hour: pricing reads the hourly rollups, so a window "
                "starts and ends on the hour (e.g. 2026-11-02T00:00:00Z)"
            )
    return floor_hour(window.start), floor_hour(window.end)


def connect(database_url: str) -> psycopg.Connection:
    conn = psycopg.connect(to_libpq_url(database_url))
    conn.execute("SET TIME ZONE 'UTC'")
    return conn


def load_dataset(conn: psycopg.Connection, start: datetime, end: datetime, customer_id: str | None = None) -> Dataset:
    """Everything pricing needs for [start, end); with customer_id, only what that customer's rating
    and cost need (its rows and the rows of the deployment-hours it shared)."""
    start, end = check_window(start, end)
    requests = tuple(RequestRecord(*row) for row in period_reads.hourly_requests(conn, start, end, customer_id))
    gpu = tuple(GpuRecord(*row) for row in period_reads.hourly_gpu(conn, start, end, customer_id))
    task_usage: dict[tuple[str, str], dict[str, Decimal]] = defaultdict(dict)
    for customer, task, meter, quantity in period_reads.task_usage(conn, start, end, customer_id):
        task_usage[(customer, task)][meter] = quantity
    tasks: list[TaskRecord] = []
    current: tuple | None = None
    attempts: list[AttemptRecord] = []

    def flush() -> None:
        if current is not None:
            customer, task, outcome, finished = current
            tasks.append(TaskRecord(customer, task, outcome, finished, tuple(attempts), task_usage.get((customer, task), {})))

    for customer, task, outcome, finished, attempt, n, inp, cached, out in period_reads.task_attempts(
        conn, start, end, customer_id
    ):
        if current is None or current[:2] != (customer, task):
            flush()
            current, attempts = (customer, task, outcome, finished), []
        if attempt is not None:
            attempts.append(AttemptRecord(attempt, n, inp, cached, out))
    flush()
    meters = tuple(MeterRecord(*row) for row in period_reads.hourly_meters(conn, start, end, customer_id))
    return Dataset(start, end, requests, gpu, tuple(tasks), meters)


def current_period(now: datetime) -> tuple[datetime, datetime]:
    """The calendar month (UTC) containing `now`, as [first hour, the hour after now's hour):
    the running period shadow rating reports on."""
    return month_start(now), floor_hour(now) + HOUR
