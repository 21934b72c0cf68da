"""A customer's tasks: each task's attempts, requests, tokens and outcome (`tasks`: GET /v1/tasks,
GET /v1/tasks/{id}, `infermeter tasks`), and whether metering recorded any attempt of a task
(`task_exists`: the gateway's task endpoints)."""

from __future__ import annotations

import psycopg
from psycopg.rows import dict_row

from infermeter.times import utc_text

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
