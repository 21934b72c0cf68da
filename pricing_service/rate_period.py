"""Rate a whole period for every customer straight from the rollups: the path invoices take.

SQL sums each customer's quantities over the period (per model and deployment for request meters),
so Python sees one row per customer x model x deployment, not one per hour; GPU time of the shared
pool is attributed by the cost model from the deployment-hours that had GPU time (docs/cost-model.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import psycopg

from pricing.book import PriceBook
from pricing.cost import CostModel, attribute
from pricing.rating import Rating, rate
from pricing.records import Dataset, GpuRecord, RequestRecord
from pricing.usage import Usage, UsageKey
from pricing_service.source import check_window

# The request meters and the rollup sums they come from; only the meters a book prices are summed.
REQUEST_METER_SUMS = {
    "uncached_input_tokens": "sum(input_tokens - cached_input_tokens)::bigint",
    "cached_input_tokens": "sum(cached_input_tokens)::bigint",
    "output_tokens": "sum(output_tokens)::bigint",
    "requests": "sum(requests)::bigint",
}
REQUEST_TOTALS_SQL = """
SELECT customer_id, model, {deployment}, {sums}
FROM request_rollup_hourly WHERE hour >= %(start)s AND hour < %(end)s
GROUP BY customer_id, model{group_deployment}
"""
TASK_TOTALS_SQL = """
SELECT o.customer_id, count(*) FILTER (WHERE o.outcome = 'succeeded'), count(*) FILTER (WHERE o.outcome = 'failed'),
       coalesce(sum((SELECT count(*) FROM task_attempts a WHERE a.customer_id = o.customer_id AND a.task_id = o.task_id)), 0)
FROM task_outcomes o WHERE o.finished_at >= %(start)s AND o.finished_at < %(end)s
GROUP BY o.customer_id
"""
METER_TOTALS_SQL = """
SELECT customer_id, meter, sum(quantity) FROM usage_rollup_hourly
WHERE hour >= %(start)s AND hour < %(end)s GROUP BY customer_id, meter
"""
GPU_HOURS_SQL = """
SELECT customer_id, deployment_id, gpu_type, hour, sum(gpu_ms)::bigint FROM gpu_ledger_hourly
WHERE hour >= %(start)s AND hour < %(end)s GROUP BY customer_id, deployment_id, gpu_type, hour
"""
SERVED_IN_GPU_HOURS_SQL = """
SELECT r.customer_id, r.model, r.deployment_id, r.hour, r.requests, r.input_tokens, r.cached_input_tokens, r.output_tokens
FROM request_rollup_hourly r
WHERE r.hour >= %(start)s AND r.hour < %(end)s
  AND EXISTS (SELECT 1 FROM gpu_ledger_hourly g WHERE g.deployment_id = r.deployment_id AND g.hour = r.hour)
"""


def load_period_usages(
    conn: psycopg.Connection,
    start: datetime,
    end: datetime,
    cost_model: CostModel | None = None,
    *,
    by_deployment: bool = True,
    meters: Iterable[str] | None = None,
) -> dict[str, Usage]:
    """Each customer's usage of [start, end). `by_deployment=False` sums request meters over
    deployments and `meters` limits the request meters summed (see `needs_deployment` and
    `priced_meters`: enough for books that name no deployment / do not price every meter)."""
    start, end = check_window(start, end)
    params = {"start": start, "end": end}
    request_meters = [m for m in REQUEST_METER_SUMS if meters is None or m in set(meters)]
    out: dict[str, dict[UsageKey, object]] = {}

    def add(customer: str, key: UsageKey, q) -> None:
        quantities = out.get(customer)
        if quantities is None:
            quantities = out[customer] = {}
        quantities[key] = quantities.get(key, 0) + q

    with conn.cursor() as cur:
        if request_meters:
            cur.execute(
                REQUEST_TOTALS_SQL.format(
                    deployment="deployment_id" if by_deployment else "''",
                    sums=", ".join(REQUEST_METER_SUMS[m] for m in request_meters),
                    group_deployment=", deployment_id" if by_deployment else "",
                ),
                params,
            )
            keys: dict[tuple[str, str], tuple[UsageKey, ...]] = {}
            for row in cur.fetchall():
                customer, model, deployment = row[0], row[1], row[2]
                k = keys.get((model, deployment))
                if k is None:
                    k = keys[(model, deployment)] = tuple(UsageKey(m, model, deployment) for m in request_meters)
                quantities = out.get(customer)
                if quantities is None:
                    quantities = out[customer] = {}
                # (customer, model[, deployment]) is the GROUP BY key: each key arrives once
                for key, q in zip(k, row[3:], strict=True):
                    quantities[key] = q
        cur.execute(TASK_TOTALS_SQL, params)
        for customer, ok, failed, attempts in cur:
            add(customer, UsageKey("successful_tasks"), ok)
            add(customer, UsageKey("failed_tasks"), failed)
            add(customer, UsageKey("task_attempts"), attempts)
        cur.execute(METER_TOTALS_SQL, params)
        for customer, meter, quantity in cur:
            add(customer, UsageKey("usage:" + meter), quantity)
        cur.execute(GPU_HOURS_SQL, params)
        gpu = tuple(GpuRecord(*r) for r in cur)
        if gpu:
            if cost_model is None:
                raise ValueError("GPU time in the period needs a cost model to attribute the shared pool")
            cur.execute(SERVED_IN_GPU_HOURS_SQL, params)
            served = tuple(RequestRecord(*r) for r in cur)
            attribution = attribute(Dataset(start, end, served, gpu), cost_model)
            for k, seconds in attribution.gpu_seconds.items():
                if k.customer_id:
                    add(k.customer_id, UsageKey("gpu_seconds", "", k.deployment_id, k.gpu_type), seconds)
    return {c: Usage.trusted(c, start, end, q) for c, q in out.items()}


def priced_meters(*books: PriceBook) -> set[str]:
    return {c.meter for b in books for c in b.charges}


def needs_deployment(*books: PriceBook) -> bool:
    return any(c.deployment is not None for b in books for c in b.charges)


def rate_period(
    conn: psycopg.Connection, book: PriceBook, start: datetime, end: datetime, cost_model: CostModel | None = None
) -> dict[str, Rating]:
    """Every customer's rating of [start, end) under a book."""
    usages = load_period_usages(conn, start, end, cost_model, by_deployment=needs_deployment(book),
                                meters=priced_meters(book))
    return {c: rate(book, u) for c, u in usages.items()}
