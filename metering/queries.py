"""Usage and task queries (read side), shared by the CLI and the HTTP API.

Windows are half-open [start, end) on event time. Whole hours come from the hourly rollups; a
window edge inside an hour is answered exactly from raw events for that part.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import psycopg
from psycopg.rows import dict_row

from infermeter.times import HOUR, TimeInputError, Window, parse_time, utc_text  # noqa: F401 - re-exported

GROUP_BY_CHOICES = ("model", "deployment", "day", "hour")
TOKEN_FIELDS = ("requests", "input_tokens", "cached_input_tokens", "uncached_input_tokens", "output_tokens")


# Bad query parameters and bad times are one kind of error: a person gave a wrong input.
QueryError = TimeInputError


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
    return list(dict.fromkeys(parts))


def _dimensions(group_by: list[str]) -> list[tuple[str, str, str]]:
    """(output name, rollup expression, raw-event expression)."""
    dims = [("customer_id", "customer_id", "customer_id")]
    if "model" in group_by:
        dims.append(("model", "model", "payload->'data'->>'model'"))
    if "deployment" in group_by:
        dims.append(("deployment_id", "deployment_id", "payload->'data'->>'deployment_id'"))
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
) -> list[dict]:
    """Request usage per customer (and per the chosen dimensions), integers, sorted."""
    group_by = group_by or []
    dims = _dimensions(group_by)
    names = [d[0] for d in dims]
    parts: list[str] = []
    params: list = []
    customer_filter = " AND customer_id = %s" if customer_id is not None else ""
    if hours := window.whole_hours:
        parts.append(
            f"SELECT {', '.join(f'{d[1]} AS {d[0]}' for d in dims)}, sum(requests) AS requests, "
            "sum(input_tokens) AS input_tokens, sum(cached_input_tokens) AS cached_input_tokens, "
            "sum(output_tokens) AS output_tokens "
            f"FROM request_rollup_hourly WHERE hour >= %s AND hour < %s{customer_filter} "
            f"GROUP BY {', '.join(d[1] for d in dims)}"
        )
        params += [hours[0], hours[1]] + ([customer_id] if customer_id is not None else [])
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
            f"{customer_filter} GROUP BY {', '.join(d[2] for d in dims)}"
        )
        params += [edge_start, edge_end] + ([customer_id] if customer_id is not None else [])
    sql = (
        f"SELECT {', '.join(names)}, sum(requests)::bigint AS requests, sum(input_tokens)::bigint AS input_tokens, "
        "sum(cached_input_tokens)::bigint AS cached_input_tokens, sum(output_tokens)::bigint AS output_tokens "
        f"FROM ({' UNION ALL '.join(parts)}) AS u GROUP BY {', '.join(names)} ORDER BY {', '.join(names)}"
    )
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SET TIME ZONE 'UTC'")
        cur.execute(sql, params)
        rows = cur.fetchall()
    out = []
    for row in rows:
        item = {name: row[name] for name in names}
        for key in ("day", "hour"):
            if key in item and isinstance(item[key], datetime):
                item[key] = utc_text(item[key])
        item.update(
            requests=int(row["requests"]),
            input_tokens=int(row["input_tokens"]),
            cached_input_tokens=int(row["cached_input_tokens"]),
            uncached_input_tokens=int(row["input_tokens"]) - int(row["cached_input_tokens"]),
            output_tokens=int(row["output_tokens"]),
        )
        out.append(item)
    return out


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


def dead_letters(conn: psycopg.Connection, *, limit: int = 100, reason: str | None = None) -> list[dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            'SELECT id, received_at, topic, partition, "offset", reason, detail, event_source, event_id, customer_id, '
            "octet_length(payload) AS payload_bytes, encode(substring(payload from 1 for 512), 'escape') AS payload_head "
            "FROM dead_letters WHERE (%s::text IS NULL OR reason = %s) ORDER BY id DESC LIMIT %s",
            (reason, reason, limit),
        )
        rows = cur.fetchall()
    for row in rows:
        row["received_at"] = utc_text(row["received_at"])
    return rows


def request_event_totals(conn: psycopg.Connection, request_ids: Sequence[str]) -> dict[str, int]:
    """What metering recorded for these request events (by event id): how many, and their tokens.

    Replay checks call it to compare metered tokens with the engine's own counters."""
    count, input_tokens, cached, output_tokens = conn.execute(
        "SELECT count(*), coalesce(sum((payload->'data'->>'input_tokens')::bigint), 0),"
        " coalesce(sum((payload->'data'->>'cached_input_tokens')::bigint), 0),"
        " coalesce(sum((payload->'data'->>'output_tokens')::bigint), 0)"
        " FROM raw_events WHERE type = 'infermeter.request.v1' AND event_id = ANY(%s)",
        (list(request_ids),),
    ).fetchone()
    return {"events": int(count), "input_tokens": int(input_tokens),
            "cached_input_tokens": int(cached), "output_tokens": int(output_tokens)}


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


def recorded_event_keys(conn: psycopg.Connection, keys: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
    """Which of these (source, event id) keys metering has recorded (accepted and deduplicated)."""
    if not keys:
        return set()
    rows = conn.execute(
        "SELECT k.source, k.event_id FROM event_keys k"
        " JOIN unnest(%s::text[], %s::text[]) AS asked(source, event_id)"
        " ON k.source = asked.source COLLATE \"C\" AND k.event_id = asked.event_id COLLATE \"C\"",
        ([k[0] for k in keys], [k[1] for k in keys]),
    ).fetchall()
    return {(source, event_id) for source, event_id in rows}


HANDLED_EVENT_IDS_SQL = """
WITH asked AS (
    SELECT a.event_id, a.n FROM jsonb_array_elements_text(%(ids)s::jsonb) WITH ORDINALITY AS a(event_id, n)
), dead AS (
    SELECT d.event_id FROM dead_letters d
    WHERE d.received_at >= %(since)s AND d.event_source = %(source)s AND d.event_id IS NOT NULL
)
SELECT string_agg(
    CASE WHEN EXISTS (SELECT 1 FROM event_keys k
                      WHERE k.source = %(source)s COLLATE "C" AND k.event_id = a.event_id COLLATE "C")
              OR a.event_id IN (SELECT event_id FROM dead)
         THEN '1' ELSE '0' END, '' ORDER BY a.n)
FROM asked a
"""


def handled_event_keys(
    conn: psycopg.Connection, keys: Sequence[tuple[str, str]], *, since: float | datetime | None = None
) -> set[tuple[str, str]]:
    """Which of these (source, event id) keys metering has handled: recorded (in `event_keys`) or
    dead-lettered. The producers' outbox asks this, in batches of thousands, to know which events
    it may forget (metering/outbox.py).

    `since` (unix seconds or a datetime): only dead letters received from then on are looked at
    (dead_letters is indexed by received_at, not by key); None looks at all of them. One statement
    per distinct source: the ids go as one JSON array and come back as one string of 0/1 flags,
    which keeps the cost per key to the two index probes."""
    from datetime import UTC

    import msgspec

    if not keys:
        return set()
    if isinstance(since, int | float):
        since = datetime.fromtimestamp(since, UTC)
    by_source: dict[str, list[str]] = {}
    for source, event_id in keys:
        by_source.setdefault(source, []).append(event_id)
    handled: set[tuple[str, str]] = set()
    for source, ids in by_source.items():
        flags = conn.execute(HANDLED_EVENT_IDS_SQL, {
            "ids": msgspec.json.encode(ids).decode(), "source": source,
            "since": since or datetime(1970, 1, 1, tzinfo=UTC),
        }).fetchone()[0] or ""
        handled.update((source, event_id) for event_id, flag in zip(ids, flags, strict=True) if flag == "1")
    return handled
