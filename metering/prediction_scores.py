"""Admission-time predictions scored at ingest: `prediction_scores_hourly` (migration 0019).

A request event may carry the prediction the gateway made when it admitted the request
(`data.prediction`: metering.contract.AdmissionPrediction). The writer scores it against the request's
actual outcome in the same statement as the rollups (`SCORES_CTE`, a CTE of metering.writer's batch
statement), from the batch's fresh events only: a duplicate (same source and id) is never scored
twice. Per customer x model x hour of event time it adds:

- `requests`: the requests scored (every status but `rejected`: a refused request never ran);
- `abs_error_p50`: the sum of |actual output tokens - p50|;
- `pinball_p90`, `pinball_p99`: the sums of the pinball (quantile) loss at 0.9 and 0.99;
- `under_p90`, `under_p99`: how many actual outputs were at most the p90, the p99 (hits);
- `abs_error_cached_fraction`: the sum of |actual cached fraction - predicted| (actual: cached input
  tokens / input tokens, 0 without input);
- `failures` and `brier_failure`: the failed requests (`error`, `cancelled`) and the sum of
  (failure probability - failed)^2, the Brier score's numerator.

The pinball losses and the Brier sum are exact NUMERIC (the probability as the producer wrote it);
`scores(conn, start, end)` adds the hours of a window up per customer and model. A rate is a sum
over `requests` (prediction_service.evaluate).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

import psycopg

# The statuses that count as a failure (prediction.request.FAILED_STATUSES; a test holds them equal)
# and those not scored (prediction.request.NOT_LEARNED_STATUSES).
FAILED_STATUSES = ("error", "cancelled")
UNSCORED_STATUSES = ("rejected",)
SCORE_COUNTS = ("requests", "failures", "abs_error_p50", "under_p90", "under_p99",
                "pinball_p90", "pinball_p99", "abs_error_cached_fraction", "brier_failure")


def _pinball(q: str, quantile: str) -> str:
    return f"CASE WHEN output_tokens >= {quantile} THEN {q} * (output_tokens - {quantile}) " \
           f"ELSE (1 - {q}) * ({quantile} - output_tokens) END"


def _listed(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


# The body of the writer's `scores` CTE: reads its `fresh` relation (the batch's new events).
SCORES_CTE = f"""INSERT INTO prediction_scores_hourly AS ps (customer_id, model, hour, {", ".join(SCORE_COUNTS)})
    SELECT customer_id, model, hour, count(*), count(*) FILTER (WHERE failed),
           sum(abs(output_tokens - p50)),
           count(*) FILTER (WHERE output_tokens <= p90), count(*) FILTER (WHERE output_tokens <= p99),
           sum({_pinball("0.9", "p90")}), sum({_pinball("0.99", "p99")}),
           sum(abs(cached_fraction - predicted_cached_fraction)),
           sum((failure_probability - failed::int) * (failure_probability - failed::int))
    FROM (
        SELECT customer_id, hour, payload->'data'->>'model' AS model,
               (payload->'data'->>'status') IN ({_listed(FAILED_STATUSES)}) AS failed,
               (payload->'data'->>'output_tokens')::bigint AS output_tokens,
               coalesce((payload->'data'->>'cached_input_tokens')::numeric
                        / nullif((payload->'data'->>'input_tokens')::numeric, 0), 0) AS cached_fraction,
               (payload->'data'->'prediction'->>'output_tokens_p50')::bigint AS p50,
               (payload->'data'->'prediction'->>'output_tokens_p90')::bigint AS p90,
               (payload->'data'->'prediction'->>'output_tokens_p99')::bigint AS p99,
               (payload->'data'->'prediction'->>'cached_fraction')::numeric AS predicted_cached_fraction,
               (payload->'data'->'prediction'->>'failure_probability')::numeric AS failure_probability
        FROM fresh
        WHERE type = 'infermeter.request.v1' AND jsonb_typeof(payload->'data'->'prediction') = 'object'
          AND (payload->'data'->>'status') NOT IN ({_listed(UNSCORED_STATUSES)})
    ) scored
    GROUP BY customer_id, model, hour
    ORDER BY customer_id, model, hour
    ON CONFLICT (customer_id, model, hour) DO UPDATE SET
        {", ".join(f"{c} = ps.{c} + EXCLUDED.{c}" for c in SCORE_COUNTS)}"""


@dataclass(frozen=True, slots=True)
class ScoreSums:
    """The scores of one customer x model over a window of hours (the columns' sums)."""

    customer_id: str
    model: str
    requests: int
    failures: int
    abs_error_p50: int
    under_p90: int
    under_p99: int
    pinball_p90: Decimal
    pinball_p99: Decimal
    abs_error_cached_fraction: Decimal
    brier_failure: Decimal


def scores(conn: psycopg.Connection, start: datetime, end: datetime) -> list[ScoreSums]:
    """Per customer and model (in that order), the sums of the hours that start in [start, end)."""
    rows = conn.execute(
        f"SELECT customer_id, model, {', '.join(f'sum({c})' for c in SCORE_COUNTS)} "
        "FROM prediction_scores_hourly WHERE hour >= %s AND hour < %s "
        "GROUP BY customer_id, model ORDER BY customer_id, model",
        (start, end),
    ).fetchall()
    return [ScoreSums(customer, model, *(int(v) for v in values[:5]), *values[5:])
            for customer, model, *values in rows]
