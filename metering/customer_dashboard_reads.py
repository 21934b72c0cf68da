"""The customer dashboard's reads: its charts' series and its project filter, each chart's statement
with an async twin (the same statement and rows on a `psycopg.AsyncConnection`).

- `customer_usage_series`: a customer's request usage per hour or day summed over its models (or of
  one model), with the models it used, from one statement (whole hours, from the hourly rollups).
- `customer_projects`: the projects of a customer's requests in a window.
- `dedicated_gpu_ms`: GPU-ms of the customer's dedicated deployments per deployment and hour or day.
- `task_summary`: the customer's tasks that finished in the window, by outcome, with their attempts.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache

import psycopg
from psycopg.rows import dict_row

from infermeter.times import Window, utc_text
from metering.queries import QueryError, bucket_expr, utc_session, utc_session_async

# --- the customer dashboard's usage charts: per-bucket sums and the customer's models, one statement ---

CUSTOMER_USAGE_SERIES_SQL = """
SELECT grouping(model) AS per_bucket, {bucket} AS bucket, model,
       (sum(requests){only})::bigint, (sum(input_tokens){only})::bigint,
       (sum(cached_input_tokens){only})::bigint, (sum(output_tokens){only})::bigint
FROM request_rollup_hourly
WHERE customer_id = %(customer)s AND hour >= %(start)s AND hour < %(end)s{project}
GROUP BY GROUPING SETS (({bucket}), (model))
{having}ORDER BY 1, 2, 3
"""
# the per-bucket sums alone (the charts' JSON, which carries no model list): the cheapest statement
# that returns them (bench.dashboards times it bare as the usage endpoints' bare SQL)
CUSTOMER_USAGE_BUCKETS_SQL = """
SELECT {bucket} AS bucket, sum(requests)::bigint, sum(input_tokens)::bigint, sum(cached_input_tokens)::bigint,
       sum(output_tokens)::bigint
FROM request_rollup_hourly
WHERE customer_id = %(customer)s AND hour >= %(start)s AND hour < %(end)s{only}
GROUP BY 1 ORDER BY 1
"""
# the window's sums per model (bucket None: the summary's totals, and the model list)
CUSTOMER_USAGE_MODELS_SQL = """
SELECT model, sum(requests)::bigint, sum(input_tokens)::bigint, sum(cached_input_tokens)::bigint,
       sum(output_tokens)::bigint
FROM request_rollup_hourly
WHERE customer_id = %(customer)s AND hour >= %(start)s AND hour < %(end)s{project}
GROUP BY model ORDER BY model
"""
# the projects a customer's requests of a window were made under ('' : with keys without a project)
CUSTOMER_PROJECTS_SQL = """
SELECT DISTINCT project FROM request_rollup_hourly
WHERE customer_id = %(customer)s AND hour >= %(start)s AND hour < %(end)s ORDER BY 1
"""
# one project's rows only (the customer dashboard's project filter; '' : the requests without one)
_PROJECT_ONLY = " AND project = %(project)s"
_SERIES_BUCKETS = {"hour": "hour", "day": "date_trunc('day', hour)"}
# a bucket's UTC text, formatted once per bucket time: the charts' rows repeat the same hours and days
# call after call (~1 us a row saved; bench.dashboards)
_bucket_text = lru_cache(maxsize=8192)(utc_text)


def customer_usage_series(conn: psycopg.Connection, window: Window, customer_id: str, *, bucket: str | None,
                          model: str | None = None, models: bool = True,
                          project: str | None = None) -> tuple[list[dict], list[str] | None]:
    """A customer's request usage per `bucket` (hour or day) summed over its models (only `model`'s
    when given), sorted, and every model it used in the window (whatever `model`), from one statement:
    what `usage(..., group_by=["model", bucket])` summed per bucket gives, the sums done by PostgreSQL
    (the customer dashboard's charts; bench.dashboards). Rows: {bucket: UTC text, requests,
    input_tokens, cached_input_tokens, uncached_input_tokens, output_tokens}. Whole hours only
    (QueryError otherwise: `usage` reads the edges of other windows from raw events). `models=False`:
    the buckets only, None for the models (one GROUP BY, ~0.1 ms less: the charts' JSON endpoints).
    `bucket=None`: the window's totals, one row without a bucket key (none without usage), and the
    models, from the customer's sums per model (the summary). `project`: that project's requests only
    (the models too; '' : the requests made without one)."""
    sql, params = _customer_usage_series_statement(window, customer_id, bucket, model, models, project)
    with conn.cursor(binary=True) as cur:
        utc_session(cur)
        cur.execute(sql, params)
        return _customer_usage_series_items(cur.fetchall(), bucket, models, model)


async def customer_usage_series_async(conn: psycopg.AsyncConnection, window: Window, customer_id: str, *,
                                      bucket: str | None, model: str | None = None,
                                      models: bool = True, project: str | None = None) -> tuple[list[dict], list[str] | None]:
    """`customer_usage_series` on an async connection: the same statement and rows."""
    sql, params = _customer_usage_series_statement(window, customer_id, bucket, model, models, project)
    async with conn.cursor(binary=True) as cur:
        await utc_session_async(cur)
        await cur.execute(sql, params)
        return _customer_usage_series_items(await cur.fetchall(), bucket, models, model)


def _customer_usage_series_statement(window: Window, customer_id: str, bucket: str | None, model: str | None,
                                     models: bool = True, project: str | None = None) -> tuple[str, dict]:
    if bucket is not None and bucket not in _SERIES_BUCKETS:
        raise QueryError(f"bucket: choose hour or day, not {bucket!r}")
    if not window.on_hours:
        raise QueryError("customer_usage_series reads hourly rollups: the window must start and end on whole hours")
    params = {"customer": customer_id, "start": window.start, "end": window.end, "model": model, "project": project}
    project_only = _PROJECT_ONLY if project is not None else ""
    if bucket is None:
        return CUSTOMER_USAGE_MODELS_SQL.format(project=project_only), params
    if not models:
        only = (" AND model = %(model)s" if model else "") + project_only
        return CUSTOMER_USAGE_BUCKETS_SQL.format(bucket=_SERIES_BUCKETS[bucket], only=only), params
    # with a model, the buckets sum that model's rows only and keep only the buckets it has rows in;
    # the per-model rows (the model list) stay unfiltered
    only = " FILTER (WHERE model = %(model)s)" if model else ""
    having = "HAVING grouping(model) = 0 OR count(*) FILTER (WHERE model = %(model)s) > 0\n" if model else ""
    return CUSTOMER_USAGE_SERIES_SQL.format(bucket=_SERIES_BUCKETS[bucket], only=only, having=having,
                                            project=project_only), params


def customer_projects(conn: psycopg.Connection, window: Window, customer_id: str) -> list[str]:
    """The projects of the customer's requests in the window (whole hours), sorted; '' for the requests
    made with keys without a project (the customer dashboard's project filter)."""
    params = {"customer": customer_id, "start": window.start, "end": window.end}
    return [project for (project,) in conn.execute(CUSTOMER_PROJECTS_SQL, params)]


def _customer_usage_series_items(rows: list[tuple], bucket: str | None, models: bool,
                                 model: str | None = None) -> tuple[list[dict], list[str] | None]:
    if bucket is None:  # per model: the totals of all (or of `model`) and the model list
        chosen = [r for r in rows if model is None or r[0] == model]
        sums = [sum(r[i] for r in chosen) for i in range(1, 5)]
        series = [{"requests": sums[0], "input_tokens": sums[1], "cached_input_tokens": sums[2],
                   "uncached_input_tokens": sums[1] - sums[2], "output_tokens": sums[3]}] if chosen else []
        return series, [r[0] for r in rows] if models else None
    if not models:
        return [_bucket_row(bucket, *row) for row in rows], None
    series: list[dict] = []
    names: list[str] = []
    for per_bucket, moment, model, *sums in rows:
        if per_bucket:
            series.append(_bucket_row(bucket, moment, *sums))
        else:
            names.append(model)
    return series, sorted(names)


def _bucket_row(bucket: str, moment: datetime, requests: int, input_tokens: int, cached: int, output: int) -> dict:
    return {bucket: _bucket_text(moment), "requests": requests, "input_tokens": input_tokens,
            "cached_input_tokens": cached, "uncached_input_tokens": input_tokens - cached, "output_tokens": output}


# --- the customer dashboard's GPU and task charts ---------------------------------------------


def dedicated_gpu_ms(conn: psycopg.Connection, window: Window, customer_id: str, *, bucket: str | None) -> list[dict]:
    """GPU-ms of the customer's dedicated deployments per deployment and `bucket` (hour or day; None:
    the window's, rows without a bucket key): the GPU ledger's hours counted as in `gpu_usage`, only
    the columns the customer dashboard draws."""
    with conn.cursor(binary=True) as cur:
        utc_session(cur)
        cur.execute(_dedicated_gpu_sql(bucket), {"start": window.start, "end": window.end, "customer": customer_id})
        return _dedicated_gpu_items(cur.fetchall(), bucket)


async def dedicated_gpu_ms_async(conn: psycopg.AsyncConnection, window: Window, customer_id: str, *,
                                 bucket: str | None) -> list[dict]:
    """`dedicated_gpu_ms` on an async connection: the same statement and rows."""
    async with conn.cursor(binary=True) as cur:
        await utc_session_async(cur)
        await cur.execute(_dedicated_gpu_sql(bucket), {"start": window.start, "end": window.end,
                                                       "customer": customer_id})
        return _dedicated_gpu_items(await cur.fetchall(), bucket)


def _dedicated_gpu_sql(bucket: str | None) -> str:
    b = bucket_expr(bucket, "hour")
    if b is None:
        return ("SELECT deployment_id, sum(gpu_ms)::bigint AS gpu_ms FROM gpu_ledger_hourly "
                "WHERE customer_id = %(customer)s AND hour >= date_trunc('hour', %(start)s::timestamptz) "
                "AND hour < %(end)s GROUP BY deployment_id ORDER BY deployment_id")
    return (
        f"SELECT deployment_id, {b} AS {bucket}, sum(gpu_ms)::bigint AS gpu_ms FROM gpu_ledger_hourly "
        "WHERE customer_id = %(customer)s AND hour >= date_trunc('hour', %(start)s::timestamptz) AND hour < %(end)s "
        f"GROUP BY deployment_id, {b} ORDER BY deployment_id, {b}"
    )


def _dedicated_gpu_items(rows: list[tuple], bucket: str | None) -> list[dict]:
    if bucket is None:
        return [{"deployment_id": deployment_id, "gpu_ms": gpu_ms} for deployment_id, gpu_ms in rows]
    return [{"deployment_id": deployment_id, bucket: _bucket_text(moment), "gpu_ms": gpu_ms}
            for deployment_id, moment, gpu_ms in rows]


TASK_SUMMARY_SQL = """
WITH finished AS (
    SELECT customer_id, task_id, outcome, finished_at FROM task_outcomes
    WHERE customer_id = %(customer)s AND finished_at >= %(start)s AND finished_at < %(end)s
), attempts AS (
    SELECT a.task_id, count(*) AS attempts, sum(a.requests) AS requests
    FROM task_attempts a JOIN finished f ON f.customer_id = a.customer_id AND f.task_id = a.task_id
    WHERE a.customer_id = %(customer)s GROUP BY a.task_id
)
SELECT {bucket_cols} count(*) AS tasks,
       count(*) FILTER (WHERE f.outcome = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE f.outcome = 'failed') AS failed,
       count(*) FILTER (WHERE f.outcome NOT IN ('succeeded', 'failed')) AS other_outcomes,
       coalesce(sum(a.attempts), 0) AS attempts,
       coalesce(sum(greatest(a.attempts - 1, 0)), 0) AS retried_attempts,
       coalesce(sum(a.requests), 0) AS requests
FROM finished f LEFT JOIN attempts a ON a.task_id = f.task_id
{group_by}
"""


def task_summary(
    conn: psycopg.Connection, window: Window, customer_id: str, *, bucket: str | None = None
) -> list[dict]:
    """A customer's tasks that finished (task_outcomes.finished_at) in the window: how many, by
    outcome, with their attempts (every attempt metered for them) and retried attempts (all but one
    per task); per `bucket` (hour or day of finishing) or one row. Tasks still running are not counted."""
    with conn.cursor(row_factory=dict_row) as cur:
        utc_session(cur)
        cur.execute(_task_summary_sql(bucket), {"customer": customer_id, "start": window.start, "end": window.end})
        return _task_summary_items(cur.fetchall())


async def task_summary_async(
    conn: psycopg.AsyncConnection, window: Window, customer_id: str, *, bucket: str | None = None
) -> list[dict]:
    """`task_summary` on an async connection: the same statement and rows."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await utc_session_async(cur)
        await cur.execute(_task_summary_sql(bucket), {"customer": customer_id, "start": window.start,
                                                      "end": window.end})
        return _task_summary_items(await cur.fetchall())


def _task_summary_sql(bucket: str | None) -> str:
    b = bucket_expr(bucket, "f.finished_at")
    return TASK_SUMMARY_SQL.format(
        bucket_cols=f"{b} AS {bucket}," if b else "",
        group_by=f"GROUP BY {b} ORDER BY {b}" if b else "",
    )


def _task_summary_items(rows: list[dict]) -> list[dict]:
    return [{k: (utc_text(v) if isinstance(v, datetime) else int(v)) for k, v in row.items()} for row in rows]
