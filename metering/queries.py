"""Usage reads: a window's request usage per customer and the chosen dimensions (`usage`,
`usage_async`: what GET /v1/usage, `infermeter usage`, the dashboards and billing read), and the
vocabulary metering's reads share: `QueryError`, `parse_group_by`, `bucket_expr`, `utc_session`.

Windows are half-open [start, end) on event time. Whole hours come from the hourly rollups; a
window edge inside an hour is answered exactly from raw events for that part.

Metering's other reads: `metering.task_reads` (a customer's tasks), `metering.customer_dashboard_reads`
(the customer dashboard's charts and project filter), `metering.budget_reads` (budgets' metered
tokens), `metering.billing_reads` (a billing period's usage meters and tasks, usage as known at a
moment), `metering.ops_reads` (ingestion, consumers, dead letters, the fleet),
`metering.event_lookups` (which events are recorded), `metering.customers_with_usage` (whom to
bill) and `metering.period_reads` (rating a period).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import psycopg

from infermeter.times import HOUR, TimeInputError, Window, floor_hour, parse_time, utc_text  # noqa: F401 - re-exported

GROUP_BY_CHOICES = ("model", "deployment", "project", "region", "day", "hour")
TOKEN_FIELDS = ("requests", "input_tokens", "cached_input_tokens", "uncached_input_tokens", "output_tokens")


# Bad query parameters and bad times are one kind of error: a person gave a wrong input.
QueryError = TimeInputError


def utc_session(cur: psycopg.Cursor) -> None:
    """SET TIME ZONE 'UTC' (day and hour buckets are UTC) unless the session already is: the server
    reports TimeZone whenever it changes, so the check costs no round trip (bench.dashboards)."""
    if cur.connection.info.parameter_status("TimeZone") != "UTC":
        cur.execute("SET TIME ZONE 'UTC'")


async def utc_session_async(cur: psycopg.AsyncCursor) -> None:
    """`utc_session` on an async cursor."""
    if cur.connection.info.parameter_status("TimeZone") != "UTC":
        await cur.execute("SET TIME ZONE 'UTC'")


def parse_group_by(text: str | Sequence[str] | None) -> list[str]:
    if not text:
        return []
    parts = text.split(",") if isinstance(text, str) else [p for t in text for p in t.split(",")]
    parts = [p.strip() for p in parts if p.strip()]
    unknown = [p for p in parts if p not in GROUP_BY_CHOICES]
    if unknown:
        raise QueryError(f"group_by: unknown {', '.join(unknown)}; choose from {', '.join(GROUP_BY_CHOICES)}")
    if "day" in parts and "hour" in parts:
        raise QueryError("group_by: choose day or hour, not both")
    if "region" in parts and "project" in parts:
        raise QueryError("group_by: region and project cannot be combined (the region rollup is not kept per project)")
    return list(dict.fromkeys(parts))


_BUCKETS = {"hour": "hour", "day": "day", "minute": "minute"}


def bucket_expr(bucket: str | None, column: str) -> str | None:
    if bucket is None:
        return None
    if bucket not in _BUCKETS:
        raise QueryError(f"bucket: choose hour, day or minute, not {bucket!r}")
    return f"date_trunc('{_BUCKETS[bucket]}', {column})"


def _dimensions(group_by: list[str]) -> list[tuple[str, str, str]]:
    """(output name, rollup expression, raw-event expression)."""
    dims = [("customer_id", "customer_id", "customer_id")]
    if "model" in group_by:
        dims.append(("model", "model", "payload->'data'->>'model'"))
    if "deployment" in group_by:
        dims.append(("deployment_id", "deployment_id", "payload->'data'->>'deployment_id'"))
    if "project" in group_by:  # None: the requests without a project (rollup project '')
        dims.append(("project", "nullif(project, '')", "payload->'data'->>'project'"))
    if "region" in group_by:
        dims.append(("region", "region", "payload->'data'->>'region'"))
    if "day" in group_by:
        dims.append(("day", "date_trunc('day', hour)", "date_trunc('day', occurred_at)"))
    if "hour" in group_by:
        dims.append(("hour", "hour", "date_trunc('hour', occurred_at)"))
    return dims


def usage(
    conn: psycopg.Connection,
    window: Window,
    *,
    customer_id: str | None = None,
    group_by: list[str] | None = None,
    project: str | None = None,
) -> list[dict]:
    """Request usage per customer (and per the chosen dimensions), integers, sorted.

    By region: whole hours come from request_region_hourly (events that carry a region) plus, as
    region None, request_rollup_hourly minus request_region_hourly (the events without one; both are
    written in the same transaction, so the difference is exact). By project: the API key's project,
    None for the requests without one. `project` keeps only that project's requests ('' : those
    without one); not with region (the region rollup is not kept per project)."""
    sql, params, names = _usage_statement(window, customer_id, group_by or [], project)
    with conn.cursor(binary=True) as cur:  # binary rows: bigint and timestamptz parse faster (bench.dashboards)
        utc_session(cur)
        cur.execute(sql, params)
        rows = cur.fetchall()
    return _usage_items(rows, names)


async def usage_async(
    conn: psycopg.AsyncConnection,
    window: Window,
    *,
    customer_id: str | None = None,
    group_by: list[str] | None = None,
    project: str | None = None,
) -> list[dict]:
    """`usage` on an async connection: the same statement and rows (the dashboards' data endpoints
    read in the event loop, no worker thread)."""
    sql, params, names = _usage_statement(window, customer_id, group_by or [], project)
    async with conn.cursor(binary=True) as cur:
        await utc_session_async(cur)
        await cur.execute(sql, params)
        rows = await cur.fetchall()
    return _usage_items(rows, names)


def _usage_statement(window: Window, customer_id: str | None, group_by: list[str],
                     project: str | None = None) -> tuple[str, list, list[str]]:
    """`usage`'s SQL, its parameters and the names of its dimension columns."""
    if project is not None and "region" in group_by:
        raise QueryError("project: not with group_by region (the region rollup is not kept per project)")
    dims = _dimensions(group_by)
    names = [d[0] for d in dims]
    parts: list[str] = []
    params: list = []
    customer_filter = " AND customer_id = %s" if customer_id is not None else ""
    customer_params = [customer_id] if customer_id is not None else []
    raw_filter = customer_filter
    if project is not None:  # the rollup's column, the raw event's field ('' = none in both)
        customer_filter += " AND project = %s"
        raw_filter += " AND coalesce(payload->'data'->>'project', '') = %s"
        customer_params.append(project)
    sums = "sum(requests) AS requests, sum(input_tokens) AS input_tokens, " \
           "sum(cached_input_tokens) AS cached_input_tokens, sum(output_tokens) AS output_tokens"
    if hours := window.whole_hours:
        by_region = "region" in group_by
        plain = [d for d in dims if d[0] != "region"]
        no_region = ", ".join(("NULL::text AS region" if d[0] == "region" else f"{d[1]} AS {d[0]}") for d in dims)
        where = f"WHERE hour >= %s AND hour < %s{customer_filter}"
        if by_region:
            parts.append(
                f"SELECT {', '.join(f'{d[1]} AS {d[0]}' for d in dims)}, {sums} FROM request_region_hourly "
                f"{where} GROUP BY {', '.join(d[1] for d in dims)}"
            )
            parts.append(
                f"SELECT {no_region}, -sum(requests), -sum(input_tokens), -sum(cached_input_tokens), "
                f"-sum(output_tokens) FROM request_region_hourly {where} GROUP BY {', '.join(d[1] for d in plain)}"
            )
            params += [hours[0], hours[1], *customer_params] * 2
        parts.append(
            f"SELECT {no_region if by_region else ', '.join(f'{d[1]} AS {d[0]}' for d in dims)}, {sums} "
            f"FROM request_rollup_hourly {where} GROUP BY {', '.join(d[1] for d in plain)}"
        )
        params += [hours[0], hours[1], *customer_params]
        edges = [(window.start, hours[0]), (hours[1], window.end)]
    else:
        edges = [(window.start, window.end)]
    for edge_start, edge_end in edges:
        if edge_start >= edge_end:
            continue
        parts.append(
            f"SELECT {', '.join(f'{d[2]} AS {d[0]}' for d in dims)}, count(*) AS requests, "
            "sum((payload->'data'->>'input_tokens')::bigint) AS input_tokens, "
            "sum((payload->'data'->>'cached_input_tokens')::bigint) AS cached_input_tokens, "
            "sum((payload->'data'->>'output_tokens')::bigint) AS output_tokens "
            "FROM raw_events WHERE type = 'infermeter.request.v1' AND occurred_at >= %s AND occurred_at < %s"
            f"{raw_filter} GROUP BY {', '.join(d[2] for d in dims)}"
        )
        params += [edge_start, edge_end, *customer_params]
    if len(parts) == 1 and hours and "region" not in group_by:
        # whole hours only (the dashboards' case): the rollups' own GROUP BY is the answer, no outer one
        sql = (
            f"SELECT {', '.join(f'{d[1]} AS {d[0]}' for d in dims)}, {_BIGINT_SUMS} FROM request_rollup_hourly "
            f"WHERE hour >= %s AND hour < %s{customer_filter} GROUP BY {', '.join(d[1] for d in dims)} "
            f"ORDER BY {', '.join(names)}"
        )
    else:
        sql = (
            f"SELECT {', '.join(names)}, {_BIGINT_SUMS} "
            f"FROM ({' UNION ALL '.join(parts)}) AS u GROUP BY {', '.join(names)} "
            f"{'HAVING sum(requests) <> 0 ' if 'region' in group_by else ''}ORDER BY {', '.join(names)}"
        )
    return sql, params, names


# The outer sums of `usage`, as integers (sum() of bigint is numeric in PostgreSQL).
_BIGINT_SUMS = ("sum(requests)::bigint AS requests, sum(input_tokens)::bigint AS input_tokens, "
                "sum(cached_input_tokens)::bigint AS cached_input_tokens, sum(output_tokens)::bigint AS output_tokens")


def _usage_items(rows: list[tuple], names: list[str]) -> list[dict]:
    """`usage`'s rows (its dimensions, then the four sums, bigint already) as dicts with the uncached
    input tokens added; bucket times as UTC text, each distinct time formatted once (a month by model
    and day repeats each day once per model). Tight: it runs on every dashboard call (bench.dashboards)."""
    texts: dict[datetime, str] = {}
    out = []
    if len(names) == 3 and names[:2] == ["customer_id", "model"] and names[2] in ("day", "hour"):
        # the customer dashboard's shape, as a dict literal (half the time of the general loop below)
        bucket = names[2]
        for customer_id, model, moment, requests, input_tokens, cached, output in rows:
            text = texts.get(moment)
            if text is None:
                text = texts[moment] = utc_text(moment)
            out.append({"customer_id": customer_id, "model": model, bucket: text, "requests": requests,
                        "input_tokens": input_tokens, "cached_input_tokens": cached,
                        "uncached_input_tokens": input_tokens - cached, "output_tokens": output})
        return out
    width = len(names)
    keys = (*names, "requests", "input_tokens", "cached_input_tokens", "uncached_input_tokens", "output_tokens")
    times = [i for i, name in enumerate(names) if name in ("day", "hour")]
    for row in rows:
        values = list(row)
        for i in times:
            moment = values[i]
            text = texts.get(moment)
            if text is None:
                text = texts[moment] = utc_text(moment) if isinstance(moment, datetime) else moment
            values[i] = text
        values.insert(width + 3, values[width + 1] - values[width + 2])
        out.append(dict(zip(keys, values, strict=True)))
    return out
<<<<<<< HEAD
=======



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


TASKS_SQL = """
WITH attempts AS (
    SELECT customer_id, task_id, count(*) AS attempts, max(attempt) AS last_attempt,
           sum(requests) AS requests, sum(input_tokens) AS input_tokens,
           sum(cached_input_tokens) AS cached_input_tokens, sum(output_tokens) AS output_tokens,
           min(first_request_at) AS first_request_at, max(last_request_at) AS last_request_at
    FROM task_attempts WHERE customer_id = %(customer)s {task_filter}
    GROUP BY customer_id, task_id
)
SELECT coalesce(a.task_id, o.task_id) AS task_id, coalesce(a.customer_id, o.customer_id) AS customer_id,
       coalesce(a.attempts, 0) AS attempts, coalesce(a.requests, 0) AS requests,
       coalesce(a.input_tokens, 0) AS input_tokens, coalesce(a.cached_input_tokens, 0) AS cached_input_tokens,
       coalesce(a.output_tokens, 0) AS output_tokens, o.outcome, o.finished_at,
       a.first_request_at, a.last_request_at
FROM attempts a
FULL JOIN (SELECT * FROM task_outcomes WHERE customer_id = %(customer)s {task_filter}) o
       ON o.customer_id = a.customer_id AND o.task_id = a.task_id
ORDER BY coalesce(a.first_request_at, o.finished_at), 1
LIMIT %(limit)s
"""


def tasks(conn: psycopg.Connection, customer_id: str, *, task_id: str | None = None, limit: int = 10_000) -> list[dict]:
    sql = TASKS_SQL.format(task_filter="AND task_id = %(task)s" if task_id else "")
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sql, {"customer": customer_id, "task": task_id, "limit": limit})
        rows = cur.fetchall()
    out = []
    for row in rows:
        item = dict(row)
        for key in ("attempts", "requests", "input_tokens", "cached_input_tokens", "output_tokens"):
            item[key] = int(item[key])
        item["uncached_input_tokens"] = item["input_tokens"] - item["cached_input_tokens"]
        item["outcome"] = item["outcome"] or "pending"
        for key in ("finished_at", "first_request_at", "last_request_at"):
            if item[key] is not None:
                item[key] = utc_text(item[key])
        out.append(item)
    return out


def task_exists(conn: psycopg.Connection, customer_id: str, task_id: str) -> bool:
    """Has metering recorded any attempt of this task for this customer?"""
    return conn.execute(
        "SELECT 1 FROM task_attempts WHERE customer_id = %s AND task_id = %s LIMIT 1", (customer_id, task_id)
    ).fetchone() is not None


# --- budgets' reads (serving.budgets): a customer's metered tokens and which events are recorded ---

METERED_TOKENS_SQL = """
SELECT model, deployment_id, sum(input_tokens - cached_input_tokens)::bigint, sum(cached_input_tokens)::bigint,
       sum(output_tokens)::bigint, NULL::text, NULL::text
FROM request_rollup_hourly WHERE customer_id = %(customer)s AND hour >= %(start)s AND hour < %(end)s
GROUP BY model, deployment_id
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, k.source, k.event_id
FROM event_keys k JOIN unnest(%(sources)s::text[], %(ids)s::text[]) AS asked(source, event_id)
  ON k.source = asked.source COLLATE "C" AND k.event_id = asked.event_id COLLATE "C"
"""


def customer_token_sums(
    conn: psycopg.Connection,
    customer_id: str,
    window: Window,
    *,
    recorded_of: Sequence[tuple[str, str]] = (),
) -> tuple[dict[tuple[str, str], tuple[int, int, int]], set[tuple[str, str]]]:
    """A customer's request tokens over `window` (whole UTC hours: read from the hourly rollups, every
    request status) per (model, deployment): (uncached input, cached input, output); and which of the
    (source, event id) keys in `recorded_of` metering has recorded.

    Both answers come from ONE statement, so from one snapshot: metering commits an event's rollup
    and its key in one transaction, so an event asked about is either counted in the sums and
    returned as recorded, or neither."""
    if not window.on_hours:
        raise TimeInputError("customer_token_sums reads hourly rollups: the window must start and end on whole hours")
    keys = list(recorded_of)
    params = {"customer": customer_id, "start": window.start, "end": window.end,
              "sources": [k[0] for k in keys], "ids": [k[1] for k in keys]}
    sums: dict[tuple[str, str], tuple[int, int, int]] = {}
    recorded: set[tuple[str, str]] = set()
    for model, deployment, uncached, cached, output, source, event_id in conn.execute(METERED_TOKENS_SQL, params):
        if source is None:
            sums[(model, deployment)] = (int(uncached), int(cached), int(output))
        else:
            recorded.add((source, event_id))
    return sums, recorded


# ---------------------------------------------------------------- reads for billing periods
# A billing period is a window in a customer's time zone; its edges may fall inside a UTC hour
# (Asia/Kolkata +05:30). Whole hours are read from the hourly rollups, the partial edge hours from
# raw events (the same split `usage` makes), so every event counts in exactly one period.


def _edge_parts(window: Window) -> tuple[tuple[datetime, datetime] | None, list[tuple[datetime, datetime]]]:
    """(the whole UTC hours inside the window or None, the partial edge windows read from raw events)."""
    hours = window.whole_hours
    if hours is None:
        return None, [(window.start, window.end)]
    return hours, [(a, b) for a, b in ((window.start, hours[0]), (hours[1], window.end)) if a < b]


def usage_meter_totals(conn: psycopg.Connection, window: Window, *, customer_id: str | None = None) -> list[dict]:
    """infermeter.usage.v1 quantities per customer and meter over [start, end) of event time:
    [{customer_id, meter, quantity (Decimal)}], sorted. Edge parts of hours come from raw events."""
    hours, edges = _edge_parts(window)
    only = " AND customer_id = %s" if customer_id is not None else ""
    extra = [customer_id] if customer_id is not None else []
    parts: list[str] = []
    params: list = []
    if hours is not None:
        parts.append(f"SELECT customer_id, meter, quantity FROM usage_rollup_hourly WHERE hour >= %s AND hour < %s{only}")
        params += [hours[0], hours[1], *extra]
    for a, b in edges:
        parts.append(
            "SELECT customer_id, payload->'data'->>'meter' AS meter, (payload->'data'->>'quantity')::numeric AS quantity "
            f"FROM raw_events WHERE type = 'infermeter.usage.v1' AND occurred_at >= %s AND occurred_at < %s{only}"
        )
        params += [a, b, *extra]
    sql = (f"SELECT customer_id, meter, sum(quantity) FROM ({' UNION ALL '.join(parts)}) AS u "
           "GROUP BY customer_id, meter HAVING sum(quantity) <> 0 ORDER BY customer_id, meter")
    rows = conn.execute(sql, params).fetchall()
    return [{"customer_id": c, "meter": m, "quantity": q} for c, m, q in rows]


def task_totals(conn: psycopg.Connection, window: Window, *, customer_id: str | None = None) -> list[dict]:
    """Tasks by outcome time: per customer, the tasks whose outcome's finished_at is in [start, end)
    that succeeded, that failed, and the attempts of those tasks (succeeded or failed):
    [{customer_id, succeeded, failed, attempts}], sorted. finished_at is exact, so no hour split."""
    rows = conn.execute(
        "SELECT o.customer_id, count(*) FILTER (WHERE o.outcome = 'succeeded'), "
        "count(*) FILTER (WHERE o.outcome = 'failed'), "
        "coalesce(sum((SELECT count(*) FROM task_attempts a WHERE a.customer_id = o.customer_id "
        "AND a.task_id = o.task_id)) FILTER (WHERE o.outcome IN ('succeeded', 'failed')), 0) "
        "FROM task_outcomes o WHERE o.finished_at >= %s AND o.finished_at < %s "
        "AND (%s::text IS NULL OR o.customer_id = %s) GROUP BY o.customer_id ORDER BY o.customer_id",
        (window.start, window.end, customer_id, customer_id),
    ).fetchall()
    return [{"customer_id": c, "succeeded": int(s), "failed": int(f), "attempts": int(a)} for c, s, f, a in rows]


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


# ---------------------------------------------------------------- usage as known at a moment (finance exports)
# Rollups add late events in place, so what was known at a past moment is read from raw events, each
# with the `received_at` metering wrote it at: an event counts if it was received at or before `as_of`.

USAGE_AS_OF_SQL = """
WITH req AS (
    SELECT customer_id, payload->'data'->>'model' AS model, payload->'data'->>'deployment_id' AS deployment_id,
           (payload->'data'->>'input_tokens')::bigint AS input_tokens,
           (payload->'data'->>'cached_input_tokens')::bigint AS cached_input_tokens,
           (payload->'data'->>'output_tokens')::bigint AS output_tokens,
           coalesce(payload->'data'->>'project', '') AS project
    FROM raw_events WHERE type = 'infermeter.request.v1' AND occurred_at >= %(start)s AND occurred_at < %(end)s
      AND (%(as_of)s::timestamptz IS NULL OR received_at <= %(as_of)s) {only}
), outcome AS (
    SELECT DISTINCT ON (customer_id, payload->'data'->>'task_id') customer_id,
           payload->'data'->>'task_id' AS task_id, payload->'data'->>'outcome' AS outcome,
           (payload->'data'->>'finished_at')::timestamptz AS finished_at
    FROM raw_events WHERE type = 'infermeter.task.v1'
      AND (%(as_of)s::timestamptz IS NULL OR received_at <= %(as_of)s) {only}
    ORDER BY customer_id, payload->'data'->>'task_id', (payload->'data'->>'finished_at')::timestamptz DESC,
             source DESC, event_id DESC
), done AS (
    SELECT * FROM outcome WHERE finished_at >= %(start)s AND finished_at < %(end)s
      AND outcome IN ('succeeded', 'failed')
), attempts AS (
    SELECT d.customer_id, count(DISTINCT coalesce((r.payload->'data'->>'attempt')::int, 1)) AS n
    FROM done d JOIN raw_events r ON r.type = 'infermeter.request.v1' AND r.customer_id = d.customer_id
      AND r.payload->'data'->>'task_id' = d.task_id
      AND (%(as_of)s::timestamptz IS NULL OR r.received_at <= %(as_of)s)
    GROUP BY d.customer_id, d.task_id
)
SELECT customer_id, m.meter, model, deployment_id, project, sum(m.value)::numeric FROM req,
LATERAL (VALUES ('requests', 1::bigint), ('uncached_input_tokens', input_tokens - cached_input_tokens),
                ('cached_input_tokens', cached_input_tokens), ('output_tokens', output_tokens)) AS m(meter, value)
GROUP BY 1, 2, 3, 4, 5
UNION ALL
SELECT customer_id, 'usage:' || (payload->'data'->>'meter'), '', '', '', sum((payload->'data'->>'quantity')::numeric)
FROM raw_events WHERE type = 'infermeter.usage.v1' AND occurred_at >= %(start)s AND occurred_at < %(end)s
  AND (%(as_of)s::timestamptz IS NULL OR received_at <= %(as_of)s) {only}
GROUP BY 1, 2
UNION ALL
SELECT customer_id, CASE outcome WHEN 'succeeded' THEN 'successful_tasks' ELSE 'failed_tasks' END, '', '', '',
       count(*)::numeric FROM done GROUP BY 1, 2
UNION ALL
SELECT customer_id, 'task_attempts', '', '', '', sum(n)::numeric FROM attempts GROUP BY 1
"""


def usage_as_of(
    conn: psycopg.Connection, window: Window, *, as_of: datetime | None = None, customer_id: str | None = None
) -> list[dict]:
    """Usage over [start, end) as metering knew it at `as_of` (events with received_at <= as_of; None: all),
    from raw events only: [{customer_id, meter, model, deployment_id, project, quantity (Decimal)}], sorted
    by customer, meter, model, deployment, project, zero quantities left out. Meters: requests,
    uncached_input_tokens, cached_input_tokens, output_tokens (per model, deployment and project — the
    event's, '' for none — at event time); usage:<meter> (event
    time); successful_tasks, failed_tasks, task_attempts (the latest outcome of each task known then, at its
    finished_at, with the attempts of its requests known then), as `usage`, `usage_meter_totals` and
    `task_totals` count them. GPU time is not included (its attribution is pricing's)."""
    only = "AND customer_id = %(customer)s" if customer_id is not None else ""
    rows = conn.execute(
        USAGE_AS_OF_SQL.format(only=only),
        {"start": window.start, "end": window.end, "as_of": as_of, "customer": customer_id},
    ).fetchall()
    out = [{"customer_id": c, "meter": m, "model": model or "", "deployment_id": dep or "", "project": project,
            "quantity": q} for c, m, model, dep, project, q in rows if q]
    out.sort(key=lambda r: (r["customer_id"], r["meter"], r["model"], r["deployment_id"], r["project"]))
    return out
>>>>>>> project-invoices
