"""Budgets' reads (serving.budgets): the customer's billing period containing an instant
(`billing_period_of`), and the customer's metered tokens of that period together with which events
are recorded, from one statement (`period_tokens`).

Both read the customer's calendar as metering keeps it (`customer_calendars`, `calendar_periods`,
handed over by billing: docs/metering.md, "Period totals and billing calendars"): the period whose
[period_start, period_end) holds the instant; a customer without a calendar, on the ('UTC', 1)
schedule, or at an instant outside the periods handed over, counts by UTC calendar month, as the
period totals do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import psycopg

from infermeter.times import TimeInputError, Window

# The customer's period containing %(at)s: the latest of its schedule's periods starting at or before
# the instant, if it has not ended yet (one descent of calendar_periods' key), else the instant's UTC
# calendar month (no calendar, the ('UTC', 1) schedule, which has no period rows, or outside the span).
# The month is cut on timestamps without a zone, so the session's time zone plays no part.
PERIOD_CTE = """
period AS (
    SELECT coalesce(p.period_start, date_trunc('month', %(at)s AT TIME ZONE 'UTC') AT TIME ZONE 'UTC') AS period_start,
           coalesce(p.period_end,
                    (date_trunc('month', %(at)s AT TIME ZONE 'UTC') + interval '1 month') AT TIME ZONE 'UTC') AS period_end
    FROM (SELECT 1) AS one
    LEFT JOIN customer_calendars c ON c.customer_id = %(customer)s
    LEFT JOIN LATERAL (
        SELECT p.period_start, p.period_end FROM calendar_periods p
        WHERE p.timezone = c.timezone AND p.anchor_day = c.anchor_day AND p.period_start <= %(at)s
        ORDER BY p.period_start DESC LIMIT 1
    ) p ON p.period_end > %(at)s
)"""

BILLING_PERIOD_SQL = f"WITH {PERIOD_CTE}\nSELECT period_start, period_end FROM period"

# One statement, so one snapshot: the period (as above), its tokens per model and deployment from the
# period totals (every project, every request status), and which of the asked keys are recorded.
PERIOD_TOKENS_SQL = f"""
WITH {PERIOD_CTE}
SELECT 'period' AS part, NULL AS model, NULL AS deployment_id, NULL::bigint, NULL::bigint, NULL::bigint,
       NULL AS source, NULL AS event_id, period_start, period_end
FROM period
UNION ALL
SELECT 'tokens', t.model, t.deployment_id, sum(t.input_tokens - t.cached_input_tokens)::bigint,
       sum(t.cached_input_tokens)::bigint, sum(t.output_tokens)::bigint, NULL, NULL, NULL, NULL
FROM request_period_totals t JOIN period ON t.period_start = period.period_start
WHERE t.customer_id = %(customer)s
GROUP BY t.model, t.deployment_id
UNION ALL
SELECT 'recorded', NULL, NULL, NULL, NULL, NULL, k.source, k.event_id, NULL, NULL
FROM event_keys k JOIN unnest(%(sources)s::text[], %(ids)s::text[]) AS asked(source, event_id)
  ON k.source = asked.source COLLATE "C" AND k.event_id = asked.event_id COLLATE "C"
"""


@dataclass(frozen=True)
class PeriodTokens:
    """A customer's billing period, its metered tokens per (model, deployment): (uncached input,
    cached input, output), and the asked (source, event id) keys metering has recorded."""

    period: Window
    sums: dict[tuple[str, str], tuple[int, int, int]]
    recorded: set[tuple[str, str]]


def _instant(at: datetime) -> datetime:
    if not isinstance(at, datetime) or at.tzinfo is None:
        raise TimeInputError("the instant needs a time zone (e.g. 2026-11-30T18:30:00Z)")
    return at


def billing_period_of(conn: psycopg.Connection, customer_id: str, at: datetime) -> Window:
    """The customer's billing period [start, end) that contains the instant `at`, in UTC: from its
    calendar (its time zone and anchor day), or the UTC calendar month without one."""
    start, end = conn.execute(BILLING_PERIOD_SQL, {"customer": customer_id, "at": _instant(at)}).fetchone()
    return Window(start, end)


def period_tokens(
    conn: psycopg.Connection,
    customer_id: str,
    at: datetime,
    *,
    recorded_of: Sequence[tuple[str, str]] = (),
) -> PeriodTokens:
    """The customer's billing period containing `at` (as `billing_period_of`), its request tokens of
    that period per (model, deployment), and which of the (source, event id) keys in `recorded_of`
    metering has recorded.

    The tokens are the period totals metering keeps at ingest (`request_period_totals`: exact to the
    event, also when the period starts inside an hour, e.g. at 18:30 UTC for Asia/Kolkata), summed
    over projects. All three answers come from ONE statement, so from one snapshot; and metering
    writes an event's key (`event_keys`) and its share of the period totals in the same statement of
    the same transaction, so an event asked about is either counted in the sums and returned as
    recorded, or neither. The period comes from the same snapshot as the totals: a caller that read
    the period before (a cache) compares it with `period` to notice a calendar change."""
    keys = list(recorded_of)
    params = {"customer": customer_id, "at": _instant(at),
              "sources": [k[0] for k in keys], "ids": [k[1] for k in keys]}
    period: Window | None = None
    sums: dict[tuple[str, str], tuple[int, int, int]] = {}
    recorded: set[tuple[str, str]] = set()
    for part, model, deployment, uncached, cached, output, source, event_id, start, end in conn.execute(
        PERIOD_TOKENS_SQL, params
    ):
        if part == "period":
            period = Window(start, end)
        elif part == "tokens":
            sums[(model, deployment)] = (int(uncached), int(cached), int(output))
        else:
            recorded.add((source, event_id))
    assert period is not None  # the CTE has exactly one row
    return PeriodTokens(period, sums, recorded)
