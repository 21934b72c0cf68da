"""Reads of metered history for the predictors (prediction_service): metering's SQL over its tables,
plain rows out. Metering owns its tables, so the statements live here.

- `request_rows`: every request event of [start, end) (event time), one row each, in event-time order,
  streamed: what a fit, the backtest and the evaluation replay.
- `task_outcome_rows`: the latest outcome of each task reported in [start, end).
- `first_request_hour`: the first hour with metered requests (None: none yet).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import psycopg

# The columns of a request row, in order. `max_tokens` and `prediction` are read from the event's data
# when a producer records them (the gateway's admission-time prediction, a JSON object), else NULL.
REQUEST_COLUMNS = ("source", "event_id", "customer_id", "model", "status", "input_tokens", "cached_input_tokens",
                   "output_tokens", "started_at", "finished_at", "task_id", "attempt", "max_tokens", "prefix_seen",
                   "prediction")
REQUEST_ROWS_SQL = """
SELECT source, event_id, customer_id,
       payload->'data'->>'model', payload->'data'->>'status',
       (payload->'data'->>'input_tokens')::bigint, (payload->'data'->>'cached_input_tokens')::bigint,
       (payload->'data'->>'output_tokens')::bigint, (payload->'data'->>'started_at')::timestamptz, occurred_at,
       payload->'data'->>'task_id', coalesce((payload->'data'->>'attempt')::int, 1),
       (payload->'data'->>'max_tokens')::bigint, (payload->'data'->>'prefix_seen')::boolean,
       payload->'data'->'prediction'
FROM raw_events
WHERE type = 'infermeter.request.v1' AND occurred_at >= %(start)s AND occurred_at < %(end)s
ORDER BY occurred_at, source, event_id
"""
STREAM_ROWS = 5000


def request_rows(conn: psycopg.Connection, start: datetime, end: datetime, *, customer_id: str | None = None
                 ) -> Iterator[tuple]:
    """The request events of [start, end) (optionally one customer's), as REQUEST_COLUMNS tuples."""
    sql = REQUEST_ROWS_SQL
    params: dict[str, object] = {"start": start, "end": end}
    if customer_id is not None:
        sql = sql.replace("AND occurred_at < %(end)s", "AND occurred_at < %(end)s AND customer_id = %(customer)s")
        params["customer"] = customer_id
    with conn.cursor() as cur:
        yield from cur.stream(sql, params, size=STREAM_ROWS)


def task_outcome_rows(conn: psycopg.Connection, start: datetime, end: datetime) -> list[tuple[str, str, str]]:
    """(customer, task, outcome) of the tasks whose latest outcome was reported in [start, end)."""
    return conn.execute(
        "SELECT customer_id, task_id, outcome FROM task_outcomes WHERE finished_at >= %s AND finished_at < %s",
        (start, end)).fetchall()


def first_request_hour(conn: psycopg.Connection) -> datetime | None:
    """The first hour with metered requests."""
    return conn.execute("SELECT min(hour) FROM request_rollup_hourly").fetchone()[0]
