"""Scoring predictions against what happened (`infermeter predict eval`).

Per group (customer and model, and all requests together), over the requests that reached an engine
(rejected ones are not scored: nothing ran):
- `mae_p50`: mean absolute error of the p50 output, beside `baseline_mae_p50`, the online
  per-(customer, model) median's (`prediction.backtest.OnlineMedian`);
- `pinball_p90`, `pinball_p99`: the quantile (pinball) loss of those quantiles, lower is better;
- `coverage_p90`, `coverage_p99`: the share of requests whose output was at most the quantile
  (well calibrated: 0.90 and 0.99);
- `cached_fraction_mae`, `failure_brier`: the cached fraction's mean absolute error and the failure
  probability's Brier score.
The spend interval's calibration is `interval_coverage` of (p10, p90, actual) triples: the share of
customer-periods whose actual spend fell inside the forecast's 80% interval.

A scored row is a `Scored`: the prediction may come from the backtest or, once the gateway records
it, from the request event itself; scoring does not care which.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal

from prediction.request import NOT_LEARNED_STATUSES, RequestPrediction


@dataclass(frozen=True, slots=True)
class Scored:
    customer_id: str
    model: str
    status: str
    output_tokens: int
    cached_fraction: float
    failed: bool
    prediction: RequestPrediction
    baseline_p50: int


def pinball(q: float, actual: float, predicted: float) -> float:
    """The quantile loss of predicting `predicted` for the q-quantile when `actual` happened."""
    diff = actual - predicted
    return q * diff if diff >= 0 else (q - 1) * diff


METRICS = ("requests", "mae_p50", "baseline_mae_p50", "pinball_p90", "pinball_p99", "coverage_p90", "coverage_p99",
           "cached_fraction_mae", "failure_brier")


def _summary(rows: Sequence[Scored]) -> dict[str, float | int]:
    n = len(rows)
    if not n:
        return {"requests": 0}
    sums = [0.0] * 8
    for r in rows:
        p = r.prediction
        y = r.output_tokens
        sums[0] += abs(y - p.output_tokens_p50)
        sums[1] += abs(y - r.baseline_p50)
        sums[2] += pinball(0.9, y, p.output_tokens_p90)
        sums[3] += pinball(0.99, y, p.output_tokens_p99)
        sums[4] += y <= p.output_tokens_p90
        sums[5] += y <= p.output_tokens_p99
        sums[6] += abs(r.cached_fraction - p.cached_fraction)
        sums[7] += (p.failure_probability - r.failed) ** 2
    values = [round(s / n, 6) for s in sums]
    return {"requests": n, **dict(zip(METRICS[1:], values, strict=True))}


def score(rows: Iterable[Scored]) -> dict:
    """{"all": metrics, "groups": [{"customer_id", "model", **metrics}, ...]} (groups sorted)."""
    kept = [r for r in rows if r.status not in NOT_LEARNED_STATUSES]
    groups: dict[tuple[str, str], list[Scored]] = defaultdict(list)
    for r in kept:
        groups[(r.customer_id, r.model)].append(r)
    return {"all": _summary(kept),
            "groups": [{"customer_id": c, "model": m, **_summary(g)} for (c, m), g in sorted(groups.items())]}


def interval_coverage(intervals: Iterable[tuple[Decimal, Decimal, Decimal]]) -> dict:
    """{"periods", "inside", "coverage"}: how many actuals fell in their [low, high] interval."""
    items = list(intervals)
    inside = sum(1 for low, high, actual in items if low <= actual <= high)
    return {"periods": len(items), "inside": inside, "coverage": round(inside / len(items), 6) if items else None}
