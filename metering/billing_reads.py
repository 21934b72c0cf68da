"""Billing's reads of usage: a window's usage meters (`usage_meter_totals`: whole hours from the
rollups, the edges from raw events) for billing_service's usage of a window that is not a billing
period (a billing period is read from the period totals, `metering.period_usage`), and usage as
metering knew it at a moment (`usage_as_of`) for the finance exports. Tasks by outcome time are
`metering.period_reads.task_totals` (any window: finished_at is exact)."""

from __future__ import annotations

from datetime import datetime

import psycopg

from infermeter.times import Window

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
    `metering.period_reads.task_totals` count them. GPU time is not included (its attribution is pricing's)."""
    only = "AND customer_id = %(customer)s" if customer_id is not None else ""
    rows = conn.execute(
        USAGE_AS_OF_SQL.format(only=only),
        {"start": window.start, "end": window.end, "as_of": as_of, "customer": customer_id},
    ).fetchall()
    out = [{"customer_id": c, "meter": m, "model": model or "", "deployment_id": dep or "", "project": project,
            "quantity": q} for c, m, model, dep, project, q in rows if q]
    out.sort(key=lambda r: (r["customer_id"], r["meter"], r["model"], r["deployment_id"], r["project"]))
    return out
