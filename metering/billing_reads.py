"""Billing's read of usage as metering knew it at a moment (`usage_as_of`), for the finance exports.
A period's or a window's usage as known now is `metering.period_usage.period_usages`."""

from __future__ import annotations

from datetime import datetime

import psycopg

from infermeter.times import Window
from pricing.meters import (
    CACHED_INPUT_TOKENS,
    FAILED_TASKS,
    OUTPUT_TOKENS,
    REQUESTS,
    SUCCESSFUL_TASKS,
    TASK_ATTEMPTS,
    UNCACHED_INPUT_TOKENS,
    USAGE_PREFIX,
)

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
LATERAL (VALUES (%(requests)s::text, 1::bigint), (%(uncached_input_tokens)s, input_tokens - cached_input_tokens),
                (%(cached_input_tokens)s, cached_input_tokens), (%(output_tokens)s, output_tokens)) AS m(meter, value)
GROUP BY 1, 2, 3, 4, 5
UNION ALL
SELECT customer_id, %(usage_prefix)s::text || (payload->'data'->>'meter'), '', '', '',
       sum((payload->'data'->>'quantity')::numeric)
FROM raw_events WHERE type = 'infermeter.usage.v1' AND occurred_at >= %(start)s AND occurred_at < %(end)s
  AND (%(as_of)s::timestamptz IS NULL OR received_at <= %(as_of)s) {only}
GROUP BY 1, 2
UNION ALL
SELECT customer_id, CASE outcome WHEN 'succeeded' THEN %(successful_tasks)s::text ELSE %(failed_tasks)s::text END,
       '', '', '', count(*)::numeric FROM done GROUP BY 1, 2
UNION ALL
SELECT customer_id, %(task_attempts)s::text, '', '', '', sum(n)::numeric FROM attempts GROUP BY 1
"""
# The meters' names (the vocabulary's) handed to USAGE_AS_OF_SQL.
METER_NAMES = {"requests": REQUESTS, "uncached_input_tokens": UNCACHED_INPUT_TOKENS,
               "cached_input_tokens": CACHED_INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS, "usage_prefix": USAGE_PREFIX,
               "successful_tasks": SUCCESSFUL_TASKS, "failed_tasks": FAILED_TASKS, "task_attempts": TASK_ATTEMPTS}


def usage_as_of(
    conn: psycopg.Connection, window: Window, *, as_of: datetime | None = None, customer_id: str | None = None
) -> list[dict]:
    """Usage over [start, end) as metering knew it at `as_of` (events with received_at <= as_of; None: all),
    from raw events only: [{customer_id, meter, model, deployment_id, project, quantity (Decimal)}], sorted
    by customer, meter, model, deployment, project, zero quantities left out. Meters: requests,
    uncached_input_tokens, cached_input_tokens, output_tokens (per model, deployment and project — the
    event's, '' for none — at event time); usage:<meter> (event
    time); successful_tasks, failed_tasks, task_attempts (the latest outcome of each task known then, at its
    finished_at, with the attempts of its requests known then), as `metering.period_usage.period_usages`
    counts them. GPU time is not included (its attribution is pricing's)."""
    only = "AND customer_id = %(customer)s" if customer_id is not None else ""
    rows = conn.execute(
        USAGE_AS_OF_SQL.format(only=only),
        {"start": window.start, "end": window.end, "as_of": as_of, "customer": customer_id, **METER_NAMES},
    ).fetchall()
    out = [{"customer_id": c, "meter": m, "model": model or "", "deployment_id": dep or "", "project": project,
            "quantity": q} for c, m, model, dep, project, q in rows if q]
    out.sort(key=lambda r: (r["customer_id"], r["meter"], r["model"], r["deployment_id"], r["project"]))
    return out
