"""A customer's usage over one billing period, read through metering's queries.

- Requests count at event time: whole UTC hours from the hourly rollups, the partial hours at the
  edges of a period in a +05:30 / +05:45 zone from raw events (`metering.queries.usage`).
- Usage meters (infermeter.usage.v1) likewise (`metering.queries.usage_meter_totals`).
- Tasks count at outcome time (`finished_at` of the task's outcome, exact to the microsecond), with
  all their attempts (`metering.queries.task_totals`). Under a book that names its trusted outcome
  sources (`task_outcomes`), only their outcomes count and a task without one within its timeout
  is billed by the book's rule at its deadline (`pricing_service.rate_period.task_totals`;
  docs/billing.md, "Trusted task outcomes").
- GPU time: metering splits replica intervals at UTC hour boundaries (gpu_ledger_hourly) and pricing
  attributes each deployment-hour by the cost model. The edge-hour rule: a UTC hour's GPU time belongs
  wholly to the billing period that contains the hour's START. So the GPU hours of a period
  [start, end) are [ceil_hour(start), ceil_hour(end)). Every hour lands in exactly one period, the
  quantities are the rollup's exactly, and the shared pool's attribution (by the customers' weighted
  tokens over the whole deployment-hour) stays the one pricing computes; splitting an hour would need
  an attribution over part of an hour that no other report uses. docs/billing.md, "GPU time at edges".
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal

import psycopg

from billing.periods import Period
from infermeter.times import Window, ceil_hour
from metering.queries import task_totals, usage, usage_meter_totals
from pricing.book import GPU_METER, REQUEST_METERS, TASK_METERS, PriceBook, TaskOutcomeTrust
from pricing.cost import CostModel
from pricing.usage import Usage, UsageKey
from pricing_service.rate_period import gpu_seconds
from pricing_service.rate_period import task_totals as trusted_task_totals


def gpu_window(period: Period | Window) -> Window | None:
    """The UTC hours whose GPU time a period bills: those that START inside it."""
    start, end = ceil_hour(period.start), ceil_hour(period.end)
    return Window(start, end) if start < end else None


def meters_of(book: PriceBook | None) -> set[str] | None:
    return None if book is None else {c.meter for c in book.charges}


def period_usage(
    conn: psycopg.Connection,
    customer_id: str,
    period: Period | Window,
    *,
    meters: Iterable[str] | None = None,
    cost_model: CostModel | None = None,
    task_outcomes: TaskOutcomeTrust | None = None,
) -> Usage:
    """The customer's usage of [period.start, period.end). `meters` limits what is read (the meters a
    book prices); GPU time is read only with a cost model (it attributes the shared pool);
    `task_outcomes` is the book's trust in task outcomes (None: every outcome counts)."""
    wanted = None if meters is None else set(meters)
    window = period.window if isinstance(period, Period) else period
    quantities: dict[UsageKey, Decimal | int] = {}

    def add(key: UsageKey, quantity) -> None:
        if quantity:
            quantities[key] = quantities.get(key, 0) + quantity

    if wanted is None or wanted & set(REQUEST_METERS):
        for row in usage(conn, window, customer_id=customer_id, group_by=["model", "deployment"]):
            for meter in REQUEST_METERS:
                add(UsageKey(meter, row["model"], row["deployment_id"]), row[meter])
    if wanted is None or any(m.startswith("usage:") for m in wanted):
        for row in usage_meter_totals(conn, window, customer_id=customer_id):
            add(UsageKey("usage:" + row["meter"]), row["quantity"])
    if wanted is None or wanted & set(TASK_METERS):
        if task_outcomes is None:
            totals = [(r["customer_id"], r["succeeded"], r["failed"], r["attempts"])
                      for r in task_totals(conn, window, customer_id=customer_id)]
        else:
            totals = trusted_task_totals(conn, window.start, window.end, customer_id, task_outcomes)
        for _, succeeded, failed, attempts in totals:
            add(UsageKey("successful_tasks"), succeeded)
            add(UsageKey("failed_tasks"), failed)
            add(UsageKey("task_attempts"), attempts)
    hours = gpu_window(window)
    if (wanted is None and cost_model is not None or wanted is not None and GPU_METER in wanted) and hours:
        for customer, deployment, gpu_type, seconds in gpu_seconds(conn, hours.start, hours.end, cost_model, customer_id):
            if customer == customer_id:
                add(UsageKey(GPU_METER, "", deployment, gpu_type), seconds)
    return Usage.build(customer_id, window.start, window.end, quantities.items())


def usage_summary(u: Usage) -> dict[str, str]:
    """{"meter[/model or GPU type]": quantity} for reports of unbilled usage."""
    out: dict[str, Decimal] = {}
    for key, quantity in u.quantities.items():
        name = key.meter + (f"/{key.group}" if key.group else "")
        out[name] = out.get(name, Decimal(0)) + quantity
    return {k: format(v.normalize(), "f") if v == v.to_integral_value() else format(v, "f") for k, v in sorted(out.items())}
