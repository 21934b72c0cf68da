"""`infermeter reconcile`: raw events against every rollup and ledger, per customer and meter.

The window must be whole hours (rollups are hourly). Request meters compare raw request events
(by event time) with request_rollup_hourly, and those of the events that carry a region with
request_region_hourly (meters `region:<region>:<meter>`); usage meters with usage_rollup_hourly; task outcomes
(latest per task, by finished_at) with task_outcomes, and every task outcome event (by finished_at)
with task_outcome_reports (each report and its source, what trusted-outcome books read); replica GPU time (each interval's overlap
with the window, in ms x gpu_count) with gpu_ledger_hourly.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

import psycopg

from metering.queries import QueryError, Window
from pricing.meters import USAGE_PREFIX

RAW_REQUESTS = """
SELECT customer_id, m.meter, sum(m.value)::numeric FROM raw_events r,
LATERAL (VALUES ('requests', 1::bigint),
                ('input_tokens', (payload->'data'->>'input_tokens')::bigint),
                ('cached_input_tokens', (payload->'data'->>'cached_input_tokens')::bigint),
                ('output_tokens', (payload->'data'->>'output_tokens')::bigint)) AS m(meter, value)
WHERE type = 'infermeter.request.v1' AND occurred_at >= %(start)s AND occurred_at < %(end)s
GROUP BY 1, 2
UNION ALL
SELECT customer_id, 'region:' || (payload->'data'->>'region') || ':' || m.meter, sum(m.value)::numeric
FROM raw_events r,
LATERAL (VALUES ('requests', 1::bigint),
                ('input_tokens', (payload->'data'->>'input_tokens')::bigint),
                ('cached_input_tokens', (payload->'data'->>'cached_input_tokens')::bigint),
                ('output_tokens', (payload->'data'->>'output_tokens')::bigint)) AS m(meter, value)
WHERE type = 'infermeter.request.v1' AND occurred_at >= %(start)s AND occurred_at < %(end)s
  AND payload->'data'->>'region' IS NOT NULL
GROUP BY 1, 2
UNION ALL
SELECT customer_id, %(usage_prefix)s::text || (payload->'data'->>'meter'), sum((payload->'data'->>'quantity')::numeric)
FROM raw_events WHERE type = 'infermeter.usage.v1' AND occurred_at >= %(start)s AND occurred_at < %(end)s
GROUP BY 1, 2
UNION ALL
SELECT customer_id, 'tasks:' || outcome, count(*)::numeric FROM (
    SELECT DISTINCT ON (customer_id, payload->'data'->>'task_id') customer_id,
           payload->'data'->>'outcome' AS outcome, (payload->'data'->>'finished_at')::timestamptz AS finished_at
    FROM raw_events WHERE type = 'infermeter.task.v1'
    ORDER BY customer_id, payload->'data'->>'task_id', (payload->'data'->>'finished_at')::timestamptz DESC,
             source DESC, event_id DESC
) t WHERE finished_at >= %(start)s AND finished_at < %(end)s GROUP BY 1, 2
UNION ALL
SELECT customer_id, 'task_reports:' || (payload->'data'->>'outcome'), count(*)::numeric
FROM raw_events WHERE type = 'infermeter.task.v1'
  AND (payload->'data'->>'finished_at')::timestamptz >= %(start)s AND (payload->'data'->>'finished_at')::timestamptz < %(end)s
GROUP BY 1, 2
UNION ALL
SELECT coalesce(payload->'data'->>'customer_id', ''), 'gpu_ms:' || (payload->'data'->>'gpu_type'),
       sum((floor(extract(epoch FROM least((payload->'data'->>'interval_end')::timestamptz, %(end)s)) * 1000)
          - floor(extract(epoch FROM greatest((payload->'data'->>'interval_start')::timestamptz, %(start)s)) * 1000))
          * (payload->'data'->>'gpu_count')::bigint)
FROM raw_events WHERE type = 'infermeter.replica.v1'
  AND (payload->'data'->>'interval_start')::timestamptz < %(end)s
  AND (payload->'data'->>'interval_end')::timestamptz > %(start)s
GROUP BY 1, 2
"""

ROLLUPS = """
SELECT customer_id, m.meter, sum(m.value)::numeric FROM request_rollup_hourly r,
LATERAL (VALUES ('requests', requests), ('input_tokens', input_tokens),
                ('cached_input_tokens', cached_input_tokens), ('output_tokens', output_tokens)) AS m(meter, value)
WHERE hour >= %(start)s AND hour < %(end)s GROUP BY 1, 2
UNION ALL
SELECT customer_id, 'region:' || region || ':' || m.meter, sum(m.value)::numeric FROM request_region_hourly r,
LATERAL (VALUES ('requests', requests), ('input_tokens', input_tokens),
                ('cached_input_tokens', cached_input_tokens), ('output_tokens', output_tokens)) AS m(meter, value)
WHERE hour >= %(start)s AND hour < %(end)s GROUP BY 1, 2
UNION ALL
SELECT customer_id, %(usage_prefix)s::text || meter, sum(quantity) FROM usage_rollup_hourly
WHERE hour >= %(start)s AND hour < %(end)s GROUP BY 1, 2
UNION ALL
SELECT customer_id, 'tasks:' || outcome, count(*)::numeric FROM task_outcomes
WHERE finished_at >= %(start)s AND finished_at < %(end)s GROUP BY 1, 2
UNION ALL
SELECT customer_id, 'task_reports:' || outcome, count(*)::numeric FROM task_outcome_reports
WHERE finished_at >= %(start)s AND finished_at < %(end)s GROUP BY 1, 2
UNION ALL
SELECT customer_id, 'gpu_ms:' || gpu_type, sum(gpu_ms)::numeric FROM gpu_ledger_hourly
WHERE hour >= %(start)s AND hour < %(end)s GROUP BY 1, 2
"""


@dataclass(frozen=True)
class Difference:
    customer_id: str
    meter: str
    raw: Decimal
    rollup: Decimal


@dataclass
class Reconciliation:
    checked: int
    differences: list[Difference]
    totals: dict[str, Decimal]

    @property
    def ok(self) -> bool:
        return not self.differences


def reconcile(conn: psycopg.Connection, window: Window) -> Reconciliation:
    if not window.on_hours:
        raise QueryError("reconcile needs whole hours: from and to must be on the hour (rollups are hourly)")
    params = {"start": window.start, "end": window.end, "usage_prefix": USAGE_PREFIX}
    raw = {(c, m): v for c, m, v in conn.execute(RAW_REQUESTS, params).fetchall()}
    rolled = {(c, m): v for c, m, v in conn.execute(ROLLUPS, params).fetchall()}
    differences = []
    totals: dict[str, Decimal] = {}
    for key in sorted(set(raw) | set(rolled)):
        a, b = raw.get(key, Decimal(0)), rolled.get(key, Decimal(0))
        totals[key[1]] = totals.get(key[1], Decimal(0)) + a
        if a != b:
            differences.append(Difference(key[0], key[1], a, b))
    return Reconciliation(checked=len(set(raw) | set(rolled)), differences=differences, totals=totals)
