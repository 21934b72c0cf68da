"""Load what pricing rates from the metering tables: the adapter between Postgres and pricing/.

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

from infermeter.stack import to_libpq_url
from infermeter.times import HOUR, TimeInputError, Window, floor_hour, month_start
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


REQUESTS_SQL = """
SELECT customer_id, model, deployment_id, hour, requests, input_tokens, cached_input_tokens, output_tokens
FROM request_rollup_hourly WHERE hour >= %(start)s AND hour < %(end)s
"""
GPU_SQL = """
SELECT customer_id, deployment_id, gpu_type, hour, sum(gpu_ms)::bigint
FROM gpu_ledger_hourly WHERE hour >= %(start)s AND hour < %(end)s
GROUP BY customer_id, deployment_id, gpu_type, hour
"""
TASKS_SQL = """
SELECT o.customer_id, o.task_id, o.outcome, o.finished_at,
       a.attempt, a.requests, a.input_tokens, a.cached_input_tokens, a.output_tokens
FROM task_outcomes o LEFT JOIN task_attempts a ON a.customer_id = o.customer_id AND a.task_id = o.task_id
WHERE o.finished_at >= %(start)s AND o.finished_at < %(end)s
ORDER BY o.customer_id, o.task_id, a.attempt
"""
TASK_USAGE_SQL = """
SELECT u.customer_id, u.task_id, u.meter, u.quantity
FROM task_usage u JOIN task_outcomes o ON o.customer_id = u.customer_id AND o.task_id = u.task_id
WHERE o.finished_at >= %(start)s AND o.finished_at < %(end)s
"""
METERS_SQL = """
SELECT customer_id, meter, hour, quantity FROM usage_rollup_hourly WHERE hour >= %(start)s AND hour < %(end)s
"""


# One customer's view: its own rows, plus every row of the deployment-hours it was served in (the
# shared pool's GPU time is attributed across everyone served in the same deployment-hour).
CUSTOMER_REQUESTS_SQL = """
WITH mine AS (
    SELECT DISTINCT deployment_id, hour FROM request_rollup_hourly
    WHERE customer_id = %(customer)s AND hour >= %(start)s AND hour < %(end)s
)
SELECT r.customer_id, r.model, r.deployment_id, r.hour, r.requests, r.input_tokens, r.cached_input_tokens,
       r.output_tokens
FROM request_rollup_hourly r JOIN mine m ON m.deployment_id = r.deployment_id AND m.hour = r.hour
"""
CUSTOMER_GPU_SQL = """
WITH mine AS (
    SELECT DISTINCT deployment_id, hour FROM request_rollup_hourly
    WHERE customer_id = %(customer)s AND hour >= %(start)s AND hour < %(end)s
)
SELECT g.customer_id, g.deployment_id, g.gpu_type, g.hour, sum(g.gpu_ms)::bigint
FROM gpu_ledger_hourly g
WHERE g.hour >= %(start)s AND g.hour < %(end)s
  AND (g.customer_id = %(customer)s OR (g.deployment_id, g.hour) IN (SELECT deployment_id, hour FROM mine))
GROUP BY g.customer_id, g.deployment_id, g.gpu_type, g.hour
"""


def _only(sql: str, alias: str) -> str:
    return sql.replace("WHERE ", f"WHERE {alias}customer_id = %(customer)s AND ", 1)


def load_dataset(conn: psycopg.Connection, start: datetime, end: datetime, customer_id: str | None = None) -> Dataset:
    """Everything pricing needs for [start, end); with customer_id, only what that customer's rating
    and cost need (its rows and the rows of the deployment-hours it shared)."""
    start, end = check_window(start, end)
    params = {"start": start, "end": end, "customer": customer_id}
    mine = customer_id is not None
    with conn.cursor() as cur:
        cur.execute(CUSTOMER_REQUESTS_SQL if mine else REQUESTS_SQL, params)
        requests = tuple(RequestRecord(*row) for row in cur)
        cur.execute(CUSTOMER_GPU_SQL if mine else GPU_SQL, params)
        gpu = tuple(GpuRecord(*row) for row in cur)
        cur.execute(_only(TASK_USAGE_SQL, "u.") if mine else TASK_USAGE_SQL, params)
        task_usage: dict[tuple[str, str], dict[str, Decimal]] = defaultdict(dict)
        for customer, task, meter, quantity in cur:
            task_usage[(customer, task)][meter] = quantity
        cur.execute(_only(TASKS_SQL, "o.") if mine else TASKS_SQL, params)
        tasks: list[TaskRecord] = []
        current: tuple | None = None
        attempts: list[AttemptRecord] = []

        def flush() -> None:
            if current is not None:
                customer, task, outcome, finished = current
                tasks.append(TaskRecord(customer, task, outcome, finished, tuple(attempts), task_usage.get((customer, task), {})))

        for customer, task, outcome, finished, attempt, n, inp, cached, out in cur:
            if current is None or current[:2] != (customer, task):
                flush()
                current, attempts = (customer, task, outcome, finished), []
            if attempt is not None:
                attempts.append(AttemptRecord(attempt, n, inp, cached, out))
        flush()
        cur.execute(_only(METERS_SQL, "") if mine else METERS_SQL, params)
        meters = tuple(MeterRecord(*row) for row in cur)
    return Dataset(start, end, requests, gpu, tuple(tasks), meters)


def current_period(now: datetime) -> tuple[datetime, datetime]:
    """The calendar month (UTC) containing `now`, as [first hour, the hour after now's hour):
    the running period shadow rating reports on."""
    return month_start(now), floor_hour(now) + HOUR
