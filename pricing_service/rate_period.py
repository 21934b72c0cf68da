"""Rate a whole period straight from the rollups: the path invoices and shadow rating take.

SQL sums each customer's quantities over the period (per model, and per deployment when a charge
names one), so Python sees one row per customer x model, not one per hour. The GPU time of each
deployment-hour is attributed in SQL by the cost model's method (docs/cost-model.md): shared by the
customers served in that hour in proportion to their weighted tokens; idle hours of a dedicated
deployment are its customer's. The SQL keeps 20 decimal places per deployment-hour share (numeric),
so its GPU-seconds agree with the exact pure `pricing.cost.attribute` to far below the 12-place
scale (tests/pricing_service/test_rate_period.py).
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from decimal import Decimal

import psycopg

from pricing.book import GPU_METER, PriceBook
from pricing.cost import CostModel
from pricing.money import precise
from pricing.rating import Rating, rate
from pricing.usage import Usage, UsageKey
from pricing_service.source import check_window

# The request meters and the rollup sums they come from; only the meters a book prices are summed.
REQUEST_METER_SUMS = {
    "uncached_input_tokens": "sum(input_tokens - cached_input_tokens)::bigint",
    "cached_input_tokens": "sum(cached_input_tokens)::bigint",
    "output_tokens": "sum(output_tokens)::bigint",
    "requests": "sum(requests)::bigint",
}
# With cached input summed anyway, uncached input is the difference of two sums (PostgreSQL computes
# the shared sum(cached_input_tokens) once): one subtraction per group instead of one per row.
UNCACHED_FROM_SUMS = "(sum(input_tokens) - sum(cached_input_tokens))::bigint"
# Memory for the grouping query's hash table (SET LOCAL, that query only): at the default 4MB x
# hash_mem_multiplier a parallel worker holding a larger share of the groups can spill to disk.
GROUPING_WORK_MEM = "64MB"
REQUEST_TOTALS_SQL = """
SELECT customer_id, model, {deployment}, {sums}
FROM request_rollup_hourly WHERE hour >= %(start)s AND hour < %(end)s {only}
GROUP BY customer_id, model{group_deployment}
"""
TASK_TOTALS_SQL = """
SELECT o.customer_id, count(*) FILTER (WHERE o.outcome = 'succeeded'), count(*) FILTER (WHERE o.outcome = 'failed'),
       coalesce(sum((SELECT count(*) FROM task_attempts a WHERE a.customer_id = o.customer_id AND a.task_id = o.task_id)), 0)
FROM task_outcomes o WHERE o.finished_at >= %(start)s AND o.finished_at < %(end)s {only}
GROUP BY o.customer_id
"""
METER_TOTALS_SQL = """
SELECT customer_id, meter, sum(quantity) FROM usage_rollup_hourly
WHERE hour >= %(start)s AND hour < %(end)s {only} GROUP BY customer_id, meter
"""
# GPU-ms of each deployment-hour shared by weighted tokens; idle dedicated hours to their owner.
# With a customer, only the deployment-hours that customer was served in (or owns) are read.
GPU_ATTRIBUTION_SQL = """
WITH hours AS (
    SELECT DISTINCT deployment_id, hour FROM gpu_ledger_hourly
    WHERE hour >= %(start)s AND hour < %(end)s {gpu_only}
), weights AS (
    SELECT r.customer_id, r.deployment_id, r.hour,
           sum(%(pw)s * (r.input_tokens - r.cached_input_tokens) + %(dw)s * r.output_tokens) AS weight
    FROM request_rollup_hourly r JOIN hours h ON h.deployment_id = r.deployment_id AND h.hour = r.hour
    GROUP BY r.customer_id, r.deployment_id, r.hour
), totals AS (
    SELECT deployment_id, hour, sum(weight) AS total FROM weights GROUP BY deployment_id, hour
), gpu AS (
    SELECT g.customer_id AS owner, g.deployment_id, g.gpu_type, g.hour, sum(g.gpu_ms) AS gpu_ms
    FROM gpu_ledger_hourly g JOIN hours h ON h.deployment_id = g.deployment_id AND h.hour = g.hour
    GROUP BY g.customer_id, g.deployment_id, g.gpu_type, g.hour
)
SELECT w.customer_id, g.deployment_id, g.gpu_type, sum((g.gpu_ms * w.weight)::numeric(70, 20) / t.total)
FROM gpu g
JOIN totals t ON t.deployment_id = g.deployment_id AND t.hour = g.hour AND t.total > 0
JOIN weights w ON w.deployment_id = g.deployment_id AND w.hour = g.hour AND w.weight > 0 {weights_only}
GROUP BY w.customer_id, g.deployment_id, g.gpu_type
UNION ALL
SELECT g.owner, g.deployment_id, g.gpu_type, sum(g.gpu_ms)
FROM gpu g LEFT JOIN totals t ON t.deployment_id = g.deployment_id AND t.hour = g.hour
WHERE g.owner <> '' AND coalesce(t.total, 0) = 0 {owner_only}
GROUP BY g.owner, g.deployment_id, g.gpu_type
"""
CUSTOMER_GPU_HOURS = """AND (customer_id = %(customer)s OR (deployment_id, hour) IN (
        SELECT deployment_id, hour FROM request_rollup_hourly
        WHERE customer_id = %(customer)s AND hour >= %(start)s AND hour < %(end)s))"""


def load_period_usages(
    conn: psycopg.Connection,
    start: datetime,
    end: datetime,
    cost_model: CostModel | None = None,
    *,
    by_deployment: bool = True,
    meters: Iterable[str] | None = None,
    customer_id: str | None = None,
) -> dict[str, Usage]:
    """Each customer's usage of [start, end) (or one customer's). `by_deployment=False` sums request
    meters over deployments and `meters` limits the meters read (see `needs_deployment` and
    `priced_meters`: enough for books that name no deployment / do not price every meter). GPU time
    needs the cost model (its weights attribute the shared pool)."""
    start, end = check_window(start, end)
    wanted = None if meters is None else set(meters)
    params: dict[str, object] = {"start": start, "end": end, "customer": customer_id}
    only = "" if customer_id is None else "AND customer_id = %(customer)s"
    request_meters = [m for m in REQUEST_METER_SUMS if wanted is None or m in wanted]
    out: dict[str, dict[UsageKey, object]] = {}

    def add(customer: str, key: UsageKey, q) -> None:
        quantities = out.get(customer)
        if quantities is None:
            quantities = out[customer] = {}
        quantities[key] = quantities.get(key, 0) + q

    sums = {m: REQUEST_METER_SUMS[m] for m in request_meters}
    if "uncached_input_tokens" in sums and "cached_input_tokens" in sums:
        sums["uncached_input_tokens"] = UNCACHED_FROM_SUMS
    with conn.cursor() as cur, _gc_paused():
        if request_meters:
            with conn.transaction():
                cur.execute("SELECT set_config('work_mem', %s, true)", (GROUPING_WORK_MEM,))
                cur.execute(
                    REQUEST_TOTALS_SQL.format(
                        deployment="deployment_id" if by_deployment else "''",
                        sums=", ".join(sums.values()),
                        group_deployment=", deployment_id" if by_deployment else "",
                        only=only,
                    ),
                    params,
                )
                rows = cur.fetchall()
            keys: dict[tuple[str, str], tuple[UsageKey, ...]] = {}
            for row in rows:
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
        if wanted is None or wanted & {"successful_tasks", "failed_tasks", "task_attempts"}:
            cur.execute(TASK_TOTALS_SQL.format(only=only.replace("customer_id", "o.customer_id")), params)
            for customer, ok, failed, attempts in cur:
                add(customer, UsageKey("successful_tasks"), ok)
                add(customer, UsageKey("failed_tasks"), failed)
                add(customer, UsageKey("task_attempts"), attempts)
        if wanted is None or any(m.startswith("usage:") for m in wanted):
            cur.execute(METER_TOTALS_SQL.format(only=only), params)
            for customer, meter, quantity in cur:
                add(customer, UsageKey("usage:" + meter), quantity)
        if wanted is None or GPU_METER in wanted:
            for customer, deployment, gpu_type, seconds in gpu_seconds(conn, start, end, cost_model, customer_id):
                add(customer, UsageKey(GPU_METER, "", deployment, gpu_type), seconds)
    return {c: Usage.trusted(c, start, end, q) for c, q in out.items()}


def gpu_seconds(
    conn: psycopg.Connection, start: datetime, end: datetime, cost_model: CostModel | None, customer_id: str | None = None
) -> list[tuple[str, str, str, Decimal]]:
    """(customer, deployment, gpu_type, GPU-seconds) attributed over [start, end)."""
    if cost_model is None:
        has_gpu = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM gpu_ledger_hourly WHERE hour >= %s AND hour < %s)", (start, end)
        ).fetchone()[0]
        if has_gpu:
            raise ValueError("GPU time in the period needs a cost model to attribute the shared pool")
        return []
    mine = customer_id is not None
    sql = GPU_ATTRIBUTION_SQL.format(
        gpu_only=CUSTOMER_GPU_HOURS if mine else "",
        weights_only="AND w.customer_id = %(customer)s" if mine else "",
        owner_only="AND g.owner = %(customer)s" if mine else "",
    )
    params = {"start": start, "end": end, "customer": customer_id,
              "pw": cost_model.prefill_weight, "dw": cost_model.decode_weight}
    rows = conn.execute(sql, params).fetchall()
    return [(c, d, g, precise(Decimal(ms) / 1000)) for c, d, g, ms in rows if ms]


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
    return rate_usages(book, usages)


def rate_usages(book: PriceBook, usages: Mapping[str, Usage]) -> dict[str, Rating]:
    """Each customer's rating under a book (the pure `rate`, with the cyclic garbage collector paused)."""
    with _gc_paused():
        return {c: rate(book, u) for c, u in usages.items()}


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Building 10^5 acyclic lines and usage dicts triggers many full-heap cyclic collections that find
    nothing (a fifth of the rating time); pause the collector for the bulk work, then restore it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
