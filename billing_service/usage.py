"""A customer's usage over one billing period (or any window), read through metering's one period-usage
read (`metering.period_usage.period_usages`), turned into rating's quantities by
`pricing_service.rate_period.totals_quantities` as every reader turns it.

Metering decides where the rows come from (to the cent the same either way:
tests/pricing_service/test_period_usage_paths.py):

- A billing period (`billing.periods.Period`) that is the customer's period as metering's calendar
  knows it (`kept_in_totals`: `metering.period_usage.totals_answer`) is read from the period totals
  metering keeps at ingest: requests per model and deployment (and project when asked), usage meters,
  and tasks when every outcome counts. So previews, per-customer drafts, reconcile and the forecast's
  calibration read what the bulk run (`rate_billing_period`) reads.
- Any other period, and a `Window` (the forecast's period to date; billing asks metering for a
  `Window` as the rollups hold it, `from_totals=False`), is summed from the hourly rollups: requests at event time, whole UTC
  hours from the rollups, the partial hours at the edges of a period in a +05:30 / +05:45 zone from
  raw events; usage meters (infermeter.usage.v1) likewise; tasks at outcome time.
- On both: GPU time (the edge-hour rule below) and the tasks of a book that names its trusted
  outcome sources come from the hourly reads, as in `rate_billing_period`. Tasks count at outcome time
  (`finished_at` of the task's outcome, exact to the microsecond), with all their attempts, as rating
  counts them (every outcome: the period totals or metering's `metering.period_reads.task_totals`;
  under a book that names its trusted outcome sources (`task_outcomes`,
  `pricing_service.rate_period.usage_beyond_totals`), only their outcomes count and a task without one within its timeout is billed by
  the book's rule at its deadline; docs/billing.md, "Trusted task outcomes").
- Unbilled usage (a customer without a record or without a plan: no book, so no trusted sources):
  `unbilled_usage` finds it for a period (billing runs and reconcile report it), `unbilled_summary` counts tasks as a book without `task_outcomes` would (every source's latest
  outcome) and labels what rests on the customer's own word (`label_tasks`); see docs/billing.md,
  "Unbilled usage and task outcomes".
- GPU time: metering splits replica intervals at UTC hour boundaries (gpu_ledger_hourly) and pricing
  attributes each deployment-hour by the cost model. The edge-hour rule: a UTC hour's GPU time belongs
  wholly to the billing period that contains the hour's START. So the GPU hours of a period
  [start, end) are [ceil_hour(start), ceil_hour(end)). Every hour lands in exactly one period, the
  quantities are the rollup's exactly, and the shared pool's attribution (by the customers' weighted
  tokens over the whole deployment-hour) stays the one pricing computes; splitting an hour would need
  an attribution over part of an hour that no other report uses. docs/billing.md, "GPU time at edges".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

import psycopg

from billing.periods import UTC_SCHEDULE, Period, billing_period
from billing_service.store import Customer, all_customers, get_customer, plan_at, plans, plans_of
from infermeter.times import Window, utc_text
from metering.contract import CUSTOMER_SOURCE_PREFIX
from metering.customers_with_usage import customers_with_usage
from metering.period_reads import task_reports
from metering.period_usage import period_usages, totals_answer
from pricing.book import PriceBook, TaskOutcomeTrust
from pricing.cost import CostModel
from pricing.meters import (
    ABANDONED_TASKS,
    GPU_METER,
    REQUEST_METERS,
    TASK_ATTEMPTS,
    TASK_METERS,
    TASK_OUTCOME_METERS,
    is_usage_meter,
)
from pricing.task_outcomes import TaskReports, tasks_from_rows
from pricing.usage import Usage, UsageKey
from pricing_service.rate_period import totals_quantities, usage_beyond_totals


def meters_of(book: PriceBook | None) -> set[str] | None:
    return None if book is None else {c.meter for c in book.charges}


def by_project_of(book: PriceBook) -> dict[str, bool]:
    """`period_usage`'s keyword for a book: the usage per project for a book that splits its invoice
    lines by project, nothing otherwise (a reader without that keyword still serves every other book)."""
    return {"by_project": True} if book.lines_by_project else {}


def kept_in_totals(conn: psycopg.Connection, customer_id: str, period: Period | Window) -> Period | None:
    """`period` when metering reads the customer's usage of it from the period totals: a billing period
    whose window is the customer's period as metering's calendar knows it
    (`metering.period_usage.totals_answer`); None for a `Window` and any other period (the hourly reads)."""
    if isinstance(period, Period) and totals_answer(conn, customer_id, period.start, period.end):
        return period
    return None


def period_usage(
    conn: psycopg.Connection,
    customer_id: str,
    period: Period | Window,
    *,
    meters: Iterable[str] | None = None,
    cost_model: CostModel | None = None,
    task_outcomes: TaskOutcomeTrust | None = None,
    with_tasks: bool = True,
    by_project: bool = False,
) -> Usage:
    """The customer's usage of [period.start, period.end), read by metering's period-usage read
    (`metering.period_usage.period_usages` of the window): a `Period` from the period totals when it is
    the customer's billing period as metering's calendar knows it (metering decides: `kept_in_totals`),
    else, and for a `Window`, from the hourly rollups (see the module's docstring). `meters` limits what
    is read (the meters a book prices); GPU time is read only with a cost model (it attributes the shared pool);
    `task_outcomes` is the book's trust in task outcomes (None: every outcome counts); `with_tasks=False`
    leaves the task meters out (`unbilled_summary` counts tasks its own way); `by_project=True` keeps the
    request meters per project (`UsageKey.project`, '' for requests without one), for a book that
    splits its invoice lines by project (`PriceBook.lines_by_project`)."""
    wanted = None if meters is None else set(meters)
    window = period.window if isinstance(period, Period) else period
    quantities: dict[UsageKey, Decimal | int] = {}

    def add(key: UsageKey, quantity) -> None:
        if quantity:
            quantities[key] = quantities.get(key, 0) + quantity

    requests = wanted is None or bool(wanted & set(REQUEST_METERS))
    usage_meters = wanted is None or any(map(is_usage_meter, wanted))
    tasks = with_tasks and (wanted is None or bool(wanted & set(TASK_METERS)))
    every_outcome = tasks and task_outcomes is None  # else a book's trusted sources: each task's reports decide
    if requests or usage_meters or every_outcome:
        for row in period_usages(conn, window=(window.start, window.end), customer_id=customer_id,
                                 from_totals=isinstance(period, Period), requests=requests, by_project=by_project,
                                 usage_meters=None if usage_meters else (), tasks=every_outcome, gpu=False):
            for key, quantity in totals_quantities(row).items():
                add(key, quantity)
    gpu = wanted is None and cost_model is not None or wanted is not None and GPU_METER in wanted
    beyond = usage_beyond_totals(conn, window.start, window.end, cost_model, gpu=gpu,
                                 trust=task_outcomes if tasks else None, customer_id=customer_id)
    for key, quantity in beyond.get(customer_id, {}).items():
        add(key, quantity)
    return Usage.build(customer_id, window.start, window.end, quantities.items())


def usage_summary(u: Usage) -> dict[str, str]:
    """{"meter[/model or GPU type]": quantity} for reports of unbilled usage."""
    out: dict[str, Decimal] = {}
    for key, quantity in u.quantities.items():
        name = key.meter + (f"/{key.group}" if key.group else "")
        out[name] = out.get(name, Decimal(0)) + quantity
    return {k: format(v.normalize(), "f") if v == v.to_integral_value() else format(v, "f") for k, v in sorted(out.items())}


# ---------------------------------------------------------------- unbilled usage

SELF_REPORTED = "[self_reported]"  # label: the outcome counted came from the customer's own key
EVERY_SOURCE = ("",)  # every source starts with ""


def label_tasks(tasks: Iterable[TaskReports], start: datetime, end: datetime) -> dict[str, int]:
    """Tasks of [start, end) for a report of unbilled usage, where no book says whom to trust (pure):

    - each task counts once, at its latest outcome from any source (latest by finished_at, then source,
      then event id: metering's latest outcome, what a book without `task_outcomes` bills), when that
      falls in the window: `successful_tasks`, `failed_tasks`, `abandoned_tasks`, and `task_attempts`
      (the attempts of the successful and failed ones, as rating counts them);
    - `<meter>[self_reported]`: of those, the tasks whose counted outcome came from the customer's own
      key (`//customer/<id>`): a book that names trusted sources would not believe it and would bill the
      task by its rule instead (an abandoned or failed task may then be billed as a success);
    - `tasks_without_outcome`: tasks whose first request is in the window and that have no outcome from
      anyone yet (a book with `task_outcomes` bills them at their deadline by its rule; one without, not
      until an outcome comes)."""
    out: Counter[str] = Counter()
    for task in tasks:
        latest = max(task.reports, key=lambda r: (r.finished_at, r.source, r.event_id), default=None)
        if latest is None:
            if task.first_request_at is not None and start <= task.first_request_at < end:
                out["tasks_without_outcome"] += 1
            continue
        if not start <= latest.finished_at < end:
            continue
        meter = TASK_OUTCOME_METERS[latest.outcome]
        out[meter] += 1
        if meter != ABANDONED_TASKS:
            out[TASK_ATTEMPTS] += task.attempts
        if latest.source.startswith(CUSTOMER_SOURCE_PREFIX):
            out[meter + SELF_REPORTED] += 1
    return {k: v for k, v in sorted(out.items()) if v}


# ---------------------------------------------------------------- unbilled usage


def unbilled_summary(conn: psycopg.Connection, customer_id: str, period: Period | Window,
                     cost_model: CostModel | None = None) -> dict[str, str]:
    """{"meter[/model or GPU type]": quantity} of a customer's usage that no invoice carries: requests,
    usage meters and GPU time as `period_usage` reads them, tasks labelled by `label_tasks`."""
    window = period.window if isinstance(period, Period) else period
    summary = usage_summary(period_usage(conn, customer_id, period, cost_model=cost_model, with_tasks=False))
    rows = task_reports(conn, window.start, window.end, timedelta(0), EVERY_SOURCE, customer_id)
    summary.update({k: str(v) for k, v in label_tasks(tasks_from_rows(rows), window.start, window.end).items()})
    return dict(sorted(summary.items()))


@dataclass
class Unbilled:
    customer_id: str
    period: str
    period_start: datetime
    period_end: datetime
    reason: str
    quantities: dict[str, str]

    def to_json(self) -> dict:
        return {"customer_id": self.customer_id, "period": self.period, "period_start": utc_text(self.period_start),
                "period_end": utc_text(self.period_end), "reason": self.reason, "quantities": self.quantities}


def unbilled_usage(
    conn: psycopg.Connection,
    period: str,
    *,
    customers: list[Customer] | None = None,
    only: str | None = None,
    cost_model: CostModel | None = None,
) -> list[Unbilled]:
    """Usage in `period` that no invoice will carry: customers without a record (in the UTC period of
    that label) and customers whose period has no plan."""
    known = {c.customer_id: c for c in (customers if customers is not None else all_customers(conn))}
    out: list[Unbilled] = []
    utc = billing_period(period, *UTC_SCHEDULE)
    candidates = [only] if only is not None else sorted(set(customers_with_usage(conn, utc.window)) | set(known))
    assigned = plans_of(conn, [c for c in candidates if c in known])  # one query, not one per customer
    found: list[tuple[str, Period, str, bool]] = []  # (customer, its window, reason, has a record)
    for cid in candidates:
        customer = known.get(cid) or (get_customer(conn, cid) if only is None else None)
        if customer is None:
            found.append((cid, utc, "no customer record (`infermeter customers set`)", False))
            continue
        window = billing_period(period, customer.timezone, customer.anchor_day)
        if plan_at(assigned[cid] if cid in assigned else plans(conn, cid), window.start) is None:
            found.append((cid, window, "no plan for this period (`infermeter plans assign`)", True))
    # customers with a record but no plan: usage in their own window? (one query per window, not per customer)
    windows: dict[Period, list[str]] = {}
    for cid, window, _, recorded in found:
        if recorded:
            windows.setdefault(window, []).append(cid)
    with_usage = {(cid, w) for w, ids in windows.items() for cid in customers_with_usage(conn, w.window, among=ids)}
    for cid, window, reason, recorded in found:
        if recorded and (cid, window) not in with_usage:
            continue
        summary = unbilled_summary(conn, cid, window, cost_model)  # tasks: every source, labelled
        if summary:
            out.append(Unbilled(cid, period, window.start, window.end, reason, summary))
    return out
