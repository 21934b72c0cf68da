"""The cost anatomy's reads (docs/cost-model.md): what each deployment's engines did per hour, and the
raw request events of a window that are not plain new compute, by class. Metering owns its tables, so
the statements live here; `pricing_service.anatomy` turns the rows into the records of the pure
`pricing.anatomy`. Windows are [start, end) on whole UTC hours (pricing checks them).
"""

from __future__ import annotations

from datetime import datetime

import psycopg

# What each deployment's engines did per hour, summed over replicas: busy GPU-ms (busy wall ms x
# gpu_count, i.e. busy_ms x gpu_ms / wall_ms; rows written before migration 0008 have no wall_ms and
# count busy_ms once), KV-cache memory-time, request-ms waiting and running.
ENGINE_SQL = """
SELECT deployment_id, hour,
       sum(CASE WHEN wall_ms > 0 THEN busy_ms::numeric * gpu_ms / wall_ms ELSE busy_ms END),
       sum(kv_cache_gpu_ms)::bigint, sum(queue_ms)::bigint, sum(running_ms)::bigint
FROM gpu_ledger_hourly WHERE hour >= %(start)s AND hour < %(end)s {only}
GROUP BY deployment_id, hour
"""

# The request events of [start, end) by class (raw events: the rollups keep no status x task x
# router dimension), leaving out the plain ones (ok, outside any task, no failover, no seen prefix):
# they are new compute, which the cost anatomy takes from the rollups. wasted: the request belongs to
# a task attempt that was retried (a later attempt exists) or whose task failed or was abandoned;
# failovers: upstream attempts beyond the first
# (`upstream_attempts`, a number or a list, when the gateway records it); prefix: '' (not seen
# before, or seen and the engine reused cached tokens), 'same' or 'other' (seen, nothing came from the
# cache, and the replica that had served it is the same one or another one).
REQUEST_CLASSES_SQL = """
WITH req AS (
    SELECT customer_id, date_trunc('hour', occurred_at) AS hour, payload->'data' AS d
    FROM raw_events
    WHERE type = 'infermeter.request.v1' AND occurred_at >= %(start)s AND occurred_at < %(end)s {only}
      AND (payload->'data'->>'status' <> 'ok' OR payload->'data'->>'task_id' IS NOT NULL
           OR payload->'data'->>'prefix_seen' = 'true'
           OR jsonb_typeof(payload->'data'->'upstream_attempts') = 'array'
           OR (jsonb_typeof(payload->'data'->'upstream_attempts') = 'number'
               AND (payload->'data'->>'upstream_attempts')::numeric > 1))
), flat AS (
    SELECT customer_id, hour, d->>'model' AS model, d->>'deployment_id' AS deployment_id, d->>'status' AS status,
           coalesce(d->'tags'->>'error', '') AS error, coalesce(d->'tags'->>'reason', '') AS reason,
           d->>'task_id' AS task_id, coalesce((d->>'attempt')::int, 1) AS attempt,
           greatest(CASE jsonb_typeof(d->'upstream_attempts')
                        WHEN 'number' THEN (d->>'upstream_attempts')::numeric::int
                        WHEN 'array' THEN jsonb_array_length(d->'upstream_attempts') ELSE 1 END - 1, 0) AS failovers,
           CASE WHEN d->>'prefix_seen' = 'true' AND (d->>'cached_input_tokens')::bigint = 0 THEN
               CASE WHEN d->>'prefix_seen_replica' IS NOT NULL AND d->>'prefix_seen_replica' IS DISTINCT FROM d->>'replica_id'
                    THEN 'other' ELSE 'same' END
           ELSE '' END AS prefix,
           (d->>'input_tokens')::bigint - (d->>'cached_input_tokens')::bigint AS uncached,
           (d->>'output_tokens')::bigint AS output
    FROM req
), tasks AS (
    SELECT a.customer_id, a.task_id, max(a.attempt) AS last_attempt, min(o.outcome) AS outcome,
           min(o.failure_cause) AS failure_cause
    FROM task_attempts a LEFT JOIN task_outcomes o ON o.customer_id = a.customer_id AND o.task_id = a.task_id
    WHERE (a.customer_id, a.task_id) IN (SELECT DISTINCT customer_id, task_id FROM flat WHERE task_id IS NOT NULL)
    GROUP BY a.customer_id, a.task_id
)
SELECT f.customer_id, f.model, f.deployment_id, f.hour, f.status, count(*), sum(f.uncached)::bigint,
       sum(f.output)::bigint, f.error, f.reason,
       coalesce(f.attempt < t.last_attempt OR t.outcome IN ('failed', 'abandoned'), false),
       coalesce(t.failure_cause, ''), f.failovers, f.prefix
FROM flat f LEFT JOIN tasks t ON t.customer_id = f.customer_id AND t.task_id = f.task_id
GROUP BY 1, 2, 3, 4, 5, 9, 10, 11, 12, 13, 14
"""


def engine_hours(
    conn: psycopg.Connection, start: datetime, end: datetime, deployment_id: str | None = None
) -> list[tuple]:
    """(deployment, hour, busy GPU-ms (numeric), kv_cache_gpu_ms, queue_ms, running_ms) of [start, end)."""
    only = "" if deployment_id is None else "AND deployment_id = %(deployment)s"
    return conn.execute(ENGINE_SQL.format(only=only),
                        {"start": start, "end": end, "deployment": deployment_id}).fetchall()


def request_classes(
    conn: psycopg.Connection, start: datetime, end: datetime, deployment_id: str | None = None
) -> list[tuple]:
    """The raw request events of [start, end) that are not plain new compute, summed by class: (customer,
    model, deployment, hour,
    status, requests, uncached input tokens, output tokens, tags.error, tags.reason, wasted task
    attempt, the task's failure_cause, failovers per request, prefix) — see REQUEST_CLASSES_SQL.
    Reads raw_events (a time-range scan of the window's partitions)."""
    only = "" if deployment_id is None else "AND payload->'data'->>'deployment_id' = %(deployment)s"
    return conn.execute(REQUEST_CLASSES_SQL.format(only=only),
                        {"start": start, "end": end, "deployment": deployment_id}).fetchall()
