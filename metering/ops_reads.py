"""Metering's operations reads: what the operations page, the metering metrics and capacity planning
read about ingestion, the consumers and the fleet.

- Ingest health: events written and dead-lettered per minute of arrival (`ingest_rate`), how long
  after their event time events were written (`metering_delay`), the consumers' committed positions
  (`consumer_progress`), dead letters per reason (`dead_letter_reasons`) and the latest ones
  (`dead_letters`, also GET /v1/dead-letters and `infermeter events dead-letters`).
- GPU time per owner, deployment and GPU type from the hourly GPU ledger (`gpu_usage`).
- Capacity (serving.capacity): served demand per deployment and minute (`request_minutes`) and
  replica intervals' sums (`replica_interval_sums`), from raw events.
"""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg
from psycopg.rows import dict_row

from infermeter.times import Window, utc_text
from metering.queries import bucket_expr, utc_session


def ingest_rate(
    conn: psycopg.Connection, since: datetime, until: datetime, *, max_event_age_days: int = 62
) -> list[dict]:
    """Events metering wrote per minute of their arrival (raw_events.received_at, the write
    transaction's time) and events dead-lettered per minute, over [since, until).

    raw_events is partitioned by event time, not arrival: only events whose event time is at most
    `max_event_age_days` before `since` are counted, so the scan stays within recent partitions."""
    sql = """
    SELECT minute, sum(events)::bigint AS events, sum(dead_letters)::bigint AS dead_letters FROM (
        SELECT date_trunc('minute', received_at) AS minute, count(*) AS events, 0 AS dead_letters
        FROM raw_events WHERE received_at >= %(since)s AND received_at < %(until)s
          AND occurred_at >= %(since)s::timestamptz - make_interval(days => %(age)s)
        GROUP BY 1
        UNION ALL
        SELECT date_trunc('minute', received_at), 0, count(*) FROM dead_letters
        WHERE received_at >= %(since)s AND received_at < %(until)s GROUP BY 1
    ) AS m GROUP BY minute ORDER BY minute
    """
    with conn.cursor(row_factory=dict_row) as cur:
        utc_session(cur)
        cur.execute(sql, {"since": since, "until": until, "age": max_event_age_days})
        rows = cur.fetchall()
    return [{"minute": utc_text(r["minute"]), "events": int(r["events"]), "dead_letters": int(r["dead_letters"])}
            for r in rows]


def metering_delay(
    conn: psycopg.Connection, since: datetime, until: datetime, *, max_event_age_days: int = 62
) -> dict:
    """How long after their event time the events that arrived in [since, until) were written:
    received_at - occurred_at, in seconds (p50, p95, max). Consumer lag as metering's own tables
    see it (it includes time spent in the gateway's spool and on the bus)."""
    row = conn.execute(
        "SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM received_at - occurred_at)),"
        " percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM received_at - occurred_at)),"
        " max(extract(epoch FROM received_at - occurred_at))"
        " FROM raw_events WHERE received_at >= %(since)s AND received_at < %(until)s"
        " AND occurred_at >= %(since)s::timestamptz - make_interval(days => %(age)s)",
        {"since": since, "until": until, "age": max_event_age_days},
    ).fetchone()
    count, p50, p95, top = row
    as_float = lambda v: None if v is None else round(float(v), 3)  # noqa: E731
    return {"events": int(count), "p50_s": as_float(p50), "p95_s": as_float(p95), "max_s": as_float(top)}


def consumer_progress(conn: psycopg.Connection) -> list[dict]:
    """The metering consumers' committed positions (consumer_offsets, written in the same transaction
    as the events): per group, topic and partition, the next offset and when it last moved."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            "SELECT group_id, topic, partition, next_offset, updated_at,"
            " extract(epoch FROM clock_timestamp() - updated_at) AS seconds_since_commit"
            " FROM consumer_offsets ORDER BY group_id, topic, partition"
        )
        rows = cur.fetchall()
    for row in rows:
        row["next_offset"] = int(row["next_offset"])
        row["updated_at"] = utc_text(row["updated_at"])
        row["seconds_since_commit"] = round(float(row["seconds_since_commit"]), 3)
    return rows


def dead_letter_reasons(conn: psycopg.Connection) -> list[dict]:
    """Dead letters per reason: how many, first and last arrival."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            "SELECT reason, count(*) AS count, min(received_at) AS first_received_at,"
            " max(received_at) AS last_received_at FROM dead_letters GROUP BY reason ORDER BY count(*) DESC, reason"
        )
        rows = cur.fetchall()
    for row in rows:
        row["count"] = int(row["count"])
        row["first_received_at"] = utc_text(row["first_received_at"])
        row["last_received_at"] = utc_text(row["last_received_at"])
    return rows


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



def gpu_usage(
    conn: psycopg.Connection,
    window: Window,
    *,
    customer_id: str | None = None,
    bucket: str | None = None,
) -> list[dict]:
    """GPU time from the hourly GPU ledger (replica intervals split at hours), per owner, deployment
    and GPU type (and `bucket`: hour or day): GPU-ms, busy GPU-ms, prompt and generation tokens, replicas.

    The ledger is hourly: the hours counted are those starting in [floor(window.start), window.end).
    `customer_id` limits it to that customer's dedicated deployments ('' is the shared pool)."""
    sql, params = _gpu_statement(window, customer_id, bucket)
    with conn.cursor(row_factory=dict_row) as cur:
        utc_session(cur)
        cur.execute(sql, params)
        return _gpu_items(cur.fetchall(), bucket)


def _gpu_statement(window: Window, customer_id: str | None, bucket: str | None) -> tuple[str, dict]:
    b = bucket_expr(bucket, "hour")
    cols = ["customer_id", "deployment_id", "gpu_type"] + ([f"{b} AS {bucket}"] if b else [])
    group = ["customer_id", "deployment_id", "gpu_type"] + ([b] if b else [])
    sql = (
        f"SELECT {', '.join(cols)}, sum(gpu_ms)::bigint AS gpu_ms, sum(busy_ms)::bigint AS busy_ms, "
        "sum(prompt_tokens)::bigint AS prompt_tokens, sum(generation_tokens)::bigint AS generation_tokens, "
        "count(DISTINCT replica_id) AS replicas, sum(intervals)::bigint AS intervals "
        "FROM gpu_ledger_hourly WHERE hour >= date_trunc('hour', %(start)s::timestamptz) AND hour < %(end)s "
        "AND (%(customer)s::text IS NULL OR customer_id = %(customer)s) "
        f"GROUP BY {', '.join(group)} ORDER BY {', '.join(group)}"
    )
    return sql, {"start": window.start, "end": window.end, "customer": customer_id}


def _gpu_items(rows: list[dict], bucket: str | None) -> list[dict]:
    for row in rows:
        for key in ("gpu_ms", "busy_ms", "prompt_tokens", "generation_tokens", "replicas", "intervals"):
            row[key] = int(row[key])
        if bucket and isinstance(row.get(bucket), datetime):
            row[bucket] = utc_text(row[bucket])
    return rows


# ---------------------------------------------------------------- reads for capacity (serving.capacity)
# Minute-level demand and replica busy time over a short trailing window (an hour), from raw events.
# Index-friendly: the only predicate on an indexed column is the range on `occurred_at` (the event
# time), which prunes raw_events to its monthly partition(s) and lets the BRIN index skip to the block
# ranges of the last hour (rows arrive roughly in event-time order, so the ranges are tight; on a small
# partition the planner may prefer a plain scan); type, status and deployment are filtered on those
# rows only. Minutes are UTC minutes (date_bin from a UTC origin, whatever the session time zone).

_MINUTE_ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)

REQUEST_MINUTES_SQL = """
SELECT payload->'data'->>'deployment_id' AS deployment_id,
       date_bin('1 minute', occurred_at, %(origin)s) AS minute,
       count(*) AS requests,
       sum((payload->'data'->>'input_tokens')::bigint) AS input_tokens,
       sum((payload->'data'->>'output_tokens')::bigint) AS output_tokens,
       percentile_cont(0.9) WITHIN GROUP (ORDER BY extract(epoch FROM
           (payload->'data'->>'first_token_at')::timestamptz - (payload->'data'->>'started_at')::timestamptz)
       ) AS ttft_p90_s
FROM raw_events
WHERE occurred_at >= %(start)s AND occurred_at < %(end)s AND type = 'infermeter.request.v1'
  AND payload->'data'->>'status' <> 'rejected'
  AND (%(deployment)s::text IS NULL OR payload->'data'->>'deployment_id' = %(deployment)s::text)
GROUP BY 1, 2 ORDER BY 1, 2
"""


def request_minutes(conn: psycopg.Connection, window: Window, *, deployment_id: str | None = None) -> list[dict]:
    """Served demand per deployment and UTC minute of event time (a request's `finished_at`) in
    [start, end): [{deployment_id, minute, requests, input_tokens, output_tokens, ttft_p90_s}], sorted.

    Every request status but `rejected` counts (a refused request asked for nothing the engine did).
    `input_tokens` are all prompt tokens, cached ones included (the engine's prompt token counter
    counts them too). `ttft_p90_s`: the 90th percentile of `first_token_at - started_at` over the
    minute's requests that have a first token (None if none has). Minutes without requests are absent."""
    params = {"origin": _MINUTE_ORIGIN, "start": window.start, "end": window.end, "deployment": deployment_id}
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(REQUEST_MINUTES_SQL, params)
        rows = cur.fetchall()
    return [{"deployment_id": r["deployment_id"], "minute": r["minute"].astimezone(UTC), "requests": int(r["requests"]),
             "input_tokens": int(r["input_tokens"]), "output_tokens": int(r["output_tokens"]),
             "ttft_p90_s": None if r["ttft_p90_s"] is None else float(r["ttft_p90_s"])} for r in rows]


REPLICA_SUMS_SQL = """
SELECT payload->'data'->>'deployment_id' AS deployment_id, payload->'data'->>'replica_id' AS replica_id,
       count(*) AS intervals,
       sum(extract(epoch FROM (payload->'data'->>'interval_end')::timestamptz
                              - (payload->'data'->>'interval_start')::timestamptz))::float8 AS interval_s,
       sum((payload->'data'->>'busy_seconds')::numeric)::float8 AS busy_s,
       sum((payload->'data'->>'prompt_tokens')::bigint) AS prompt_tokens,
       sum((payload->'data'->>'generation_tokens')::bigint) AS generation_tokens,
       max(occurred_at) AS last_interval_end
FROM raw_events
WHERE occurred_at >= %(start)s AND occurred_at < %(end)s AND type = 'infermeter.replica.v1'
  AND (%(deployment)s::text IS NULL OR payload->'data'->>'deployment_id' = %(deployment)s::text)
GROUP BY 1, 2 ORDER BY 1, 2
"""


def replica_interval_sums(conn: psycopg.Connection, window: Window, *, deployment_id: str | None = None) -> list[dict]:
    """Per deployment and replica, the `infermeter.replica.v1` intervals whose event time (the
    interval's end) is in [start, end): [{deployment_id, replica_id, intervals, interval_s, busy_s,
    prompt_tokens, generation_tokens, last_interval_end}], sorted. Seconds are wall-clock seconds of
    the replica (not multiplied by its GPU count) as floats: capacity planning, not billing."""
    params = {"start": window.start, "end": window.end, "deployment": deployment_id}
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(REPLICA_SUMS_SQL, params)
        rows = cur.fetchall()
    return [{"deployment_id": r["deployment_id"], "replica_id": r["replica_id"], "intervals": int(r["intervals"]),
             "interval_s": float(r["interval_s"]), "busy_s": float(r["busy_s"]),
             "prompt_tokens": int(r["prompt_tokens"]), "generation_tokens": int(r["generation_tokens"]),
             "last_interval_end": r["last_interval_end"].astimezone(UTC)} for r in rows]
