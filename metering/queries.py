"""Usage reads: a window's request usage per customer and the chosen dimensions (`usage`,
`usage_async`: what GET /v1/usage, `infermeter usage`, the dashboards and billing read), and the
vocabulary metering's reads share: `QueryError`, `parse_group_by`, `bucket_expr`, `utc_session`.

Windows are half-open [start, end) on event time. Whole hours come from the hourly rollups; a
window edge inside an hour is answered exactly from raw events for that part.

Metering's other reads: `metering.task_reads` (a customer's tasks), `metering.customer_dashboard_reads`
(the customer dashboard's charts and project filter), `metering.budget_reads` (budgets': a
customer's billing period and its metered tokens), `metering.billing_reads` (usage as known at a
moment), `metering.ops_reads` (ingestion, consumers, dead letters, the fleet),
`metering.event_lookups` (which events are recorded), `metering.customers_with_usage` (whom to
bill), `metering.period_usage` (a period's or a window's usage for rating and billing: the period
totals where they answer, else `metering.period_reads` over the hourly rollups).
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
    keys = (*names, *TOKEN_FIELDS)
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
