"""Per-period forecasts on the metered history and billing's records (`prediction.periods` does the
statistics):

- `customer_forecasts(conn, as_of, ...)`: each customer's spend at the end of its current billing
  period (its plan's book, its time zone and anchor day: billing_service) with an 80% interval, when
  its prepaid credit runs out (billing_service `credits_view`), and when its monthly budget does
  (serving.budgets: the cap and the month's spend as admission counts it).
- `forecast_for(conn, customer_id, as_of=...)`: one customer's row of the above (the dashboards' read).
- `platform_forecasts(conn, as_of, books, cost_model)`: the calendar month's revenue under each book,
  cost (the cost model's) and margin.
- `spend_calibration(conn, start, end, cost_model)`: each customer-period whose middle falls in
  [start, end) and that ended by `end`, forecast at its middle, against what it came to.

The days drawn from are the whole days (24 h back from `as_of`, on the hour) of the LOOKBACK_DAYS
before it, from the first metered hour on; their usage is read as invoices read it
(`pricing_service.rate_period.load_period_usages`), once per day for every customer.

Layers: this module reads billing (billing_service) and budgets (serving), so prediction_service sits
above both; serving never imports prediction_service (the gateway is handed a `prediction.RequestModel`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

import psycopg

from billing.periods import Period, next_period, period_containing
from billing_service.credits import credits_view
from billing_service.store import Customer, all_customers, get_customer, load_book, plan_at, plans
from billing_service.usage import meters_of, period_usage
from infermeter.times import Window, floor_hour, utc_text
from metering import history_reads
from prediction.periods import (
    DAY,
    PlatformForecast,
    SpendForecast,
    forecast_platform,
    forecast_spend,
    remaining_slots,
    runs_out,
    spend_of,
)
from pricing.book import PriceBook
from pricing.bootstrap import day_draws
from pricing.cost import CostModel, attribute
from pricing.money import Currency
from pricing_service.rate_period import load_period_usages, priced_meters
from pricing_service.source import load_dataset

LOOKBACK_DAYS = 28
ZERO = Decimal(0)


class Days:
    """The observed days before an instant, and each day's usage per customer (read once, cached)."""

    def __init__(self, conn: psycopg.Connection, cost_model: CostModel | None, meters: set[str] | None) -> None:
        self.conn = conn
        self.cost_model = cost_model
        self.meters = meters
        self._usage: dict[tuple[datetime, datetime], dict] = {}
        self._cost: dict[tuple[datetime, datetime], Decimal] = {}
        self._first = history_reads.first_request_hour(conn)

    def before(self, as_of: datetime) -> list[tuple[datetime, datetime]]:
        """Whole days [as_of - k days, as_of - (k - 1) days), oldest first, LOOKBACK_DAYS at most, none
        before the first metered hour."""
        if self._first is None:
            return []
        end = floor_hour(as_of)
        days = []
        for k in range(1, LOOKBACK_DAYS + 1):
            start = end - k * DAY
            if start < self._first:
                break
            days.append((start, start + DAY))
        return days[::-1]

    def usage(self, day: tuple[datetime, datetime]) -> dict[str, dict]:
        found = self._usage.get(day)
        if found is None:
            usages = load_period_usages(self.conn, day[0], day[1], self.cost_model, meters=self.meters)
            found = self._usage[day] = {c: dict(u.quantities) for c, u in usages.items()}
        return found

    def cost(self, day: tuple[datetime, datetime]) -> Decimal:
        found = self._cost.get(day)
        if found is None:
            found = self._cost[day] = platform_cost(self.conn, day[0], day[1], self.cost_model)
        return found


def platform_cost(conn: psycopg.Connection, start: datetime, end: datetime, cost_model: CostModel) -> Decimal:
    """The cost model's cost of [start, end) (whole hours): GPU time and usage meters."""
    dataset = load_dataset(conn, start, end)
    return attribute(dataset, cost_model).total_cost + sum(
        (cost_model.usage_cost(m.meter, m.quantity) for m in dataset.meters), ZERO)


def plan_of(conn: psycopg.Connection, customer: Customer, at: datetime) -> tuple[Period, PriceBook | None]:
    """The customer's billing period containing `at` and the book of its plan for it (None: no plan)."""
    period = period_containing(at, customer.timezone, customer.anchor_day)
    plan = plan_at(plans(conn, customer.customer_id), period.start)
    return period, None if plan is None else load_book(conn, plan.book_sha256).book


def spend_forecast(conn: psycopg.Connection, customer: Customer, period: Period, book: PriceBook, as_of: datetime,
                   days: Days, cost_model: CostModel | None) -> SpendForecast:
    """The customer's spend at the end of `period`, as of `as_of` (inside it)."""
    observed = days.before(as_of)
    to_date: dict = {}
    if as_of > period.start:
        to_date = dict(period_usage(conn, customer.customer_id, Window(period.start, as_of), meters=meters_of(book),
                                    cost_model=cost_model, task_outcomes=book.task_outcomes).quantities)
    daily = [days.usage(day).get(customer.customer_id, {}) for day in observed]
    draws = day_draws([d[0] for d in observed], remaining_slots(as_of, period.end),
                      seed=f"spend/{utc_text(as_of)}/{utc_text(period.end)}")
    return forecast_spend(book, customer.customer_id, period.label, period.start, period.end, as_of, to_date, daily,
                          draws)


def _forecast_json(f: SpendForecast) -> dict:
    money = Currency.of(f.currency)
    out = {"customer_id": f.customer_id, "available": True, "period": f.period,
           "period_start": utc_text(f.period_start), "period_end": utc_text(f.period_end), "as_of": utc_text(f.as_of),
           "currency": f.currency, "price_book": f.book_id, "spend_to_date": str(money.round(f.spend_to_date)),
           "days_observed": f.days_observed}
    if f.spend is None:
        out["forecast"] = None
        out["message"] = "no metered day to forecast from yet"
    else:
        out["forecast"] = {**f.spend.to_json(), "interval": "80%"}
    return out


def customer_forecasts(conn: psycopg.Connection, as_of: datetime, *, cost_model: CostModel | None = None,
                       customer_ids: Sequence[str] | None = None, budgets=None) -> list[dict]:
    """Each customer's forecast as of `as_of` (see the module doc). `budgets(customer_id, as_of)` gives
    (monthly cap, the month's spend so far) or None without a budget (the caller passes serving's)."""
    as_of = floor_hour(as_of)
    if customer_ids is None:
        customers = all_customers(conn)
    else:
        customers = [c if c is not None else cid for cid, c in ((cid, get_customer(conn, cid)) for cid in customer_ids)]
    planned = []
    out: list[dict] = []
    for customer in customers:
        if isinstance(customer, str):
            out.append({"customer_id": customer, "available": False, "message": f"unknown customer {customer}"})
            continue
        period, book = plan_of(conn, customer, as_of)
        if book is None:
            out.append({"customer_id": customer.customer_id, "available": False, "period": period.label,
                        "message": f"no price plan covers the period {period.label}"})
            continue
        planned.append((customer, period, book))
    days = Days(conn, cost_model, priced_meters(*{b.id: b for _, _, b in planned}.values()) if planned else None)
    for customer, period, book in planned:
        forecast = spend_forecast(conn, customer, period, book, as_of, days, cost_model)
        row = _forecast_json(forecast)
        credits = credits_view(conn, customer.customer_id, now=as_of)
        balance = Decimal(credits["balance"])
        if credits["grants"]:
            row["credit"] = runs_out(forecast, balance, forecast.spend_to_date).to_json(forecast.currency)
        budget = budgets(customer.customer_id, as_of) if budgets is not None else None
        if budget is not None:
            cap, spent = budget  # of the customer's billing period: `period` (serving.budgets counts it)
            result = runs_out(forecast, cap, spent).to_json(forecast.currency)
            result["month_end"] = utc_text(period.end)  # when the cap resets (the name kept for compatibility)
            result["within_month"] = result["runs_out_at"] is not None and result["runs_out_at"] < utc_text(period.end)
            row["budget"] = result
        out.append(row)
    out.sort(key=lambda r: r["customer_id"])
    return out


def forecast_for(conn: psycopg.Connection, customer_id: str, *, as_of: datetime, cost_model: CostModel | None = None,
                 budgets=None) -> dict:
    """One customer's row of `customer_forecasts` (the same keys; `available` false with a `message` for
    a customer without a billing record or a plan): what the customer dashboard shows beside the
    customer's alerts (docs/alerts.md, "For the dashboards")."""
    return customer_forecasts(conn, as_of, cost_model=cost_model, customer_ids=[customer_id], budgets=budgets)[0]


def platform_forecasts(conn: psycopg.Connection, as_of: datetime, books: Sequence[PriceBook],
                       cost_model: CostModel) -> dict:
    """The calendar month (UTC) containing `as_of`: revenue under each book, cost and margin."""
    as_of = floor_hour(as_of)
    month = Window.month_of(as_of)
    days = Days(conn, cost_model, priced_meters(*books))
    observed = days.before(as_of)
    to_date: dict = {}
    cost_to_date = ZERO
    if as_of > month.start:
        usages = load_period_usages(conn, month.start, as_of, cost_model, meters=priced_meters(*books))
        to_date = {c: dict(u.quantities) for c, u in usages.items()}
        cost_to_date = platform_cost(conn, month.start, as_of, cost_model)
    draws = day_draws([d[0] for d in observed], remaining_slots(as_of, month.end), draws=200,
                      seed=f"platform/{utc_text(as_of)}")
    results: list[PlatformForecast] = forecast_platform(
        books, month.start, month.end, to_date, [days.usage(d) for d in observed], cost_to_date,
        [days.cost(d) for d in observed], draws)
    return {"month": {"from": utc_text(month.start), "to": utc_text(month.end)}, "as_of": utc_text(as_of),
            "days_observed": len(observed),
            "books": [{"price_book": r.book_id, "currency": r.currency, "revenue_to_date": str(r.revenue_to_date),
                       "cost_to_date": str(r.cost_to_date), "revenue": r.revenue.to_json(),
                       "cost": r.cost.to_json(), "margin": r.margin.to_json()} for r in results]}


def _periods_in(customer: Customer, start: datetime, end: datetime) -> list[Period]:
    period = period_containing(start, customer.timezone, customer.anchor_day)
    out = []
    while period.start < end:
        out.append(period)
        period = next_period(period)
    return out


@dataclass(frozen=True)
class Calibrated:
    customer_id: str
    period: str
    as_of: datetime
    low: Decimal
    high: Decimal
    expected: Decimal
    actual: Decimal

    @property
    def inside(self) -> bool:
        return self.low <= self.actual <= self.high

    def to_json(self) -> dict:
        return {"customer_id": self.customer_id, "period": self.period, "as_of": utc_text(self.as_of),
                "low": str(self.low), "high": str(self.high), "expected": str(self.expected),
                "actual": str(self.actual), "inside": self.inside}


def spend_calibration(conn: psycopg.Connection, start: datetime, end: datetime, *,
                      cost_model: CostModel | None = None) -> list[Calibrated]:
    """The mid-period forecasts of the customer-periods whose middle is in [start, end) and that ended
    by `end`, each beside the period's actual spend (its whole usage rated under its plan)."""
    chosen = []
    for customer in all_customers(conn):
        for period in _periods_in(customer, start - timedelta(days=31), end):
            middle = floor_hour(period.start + (period.end - period.start) / 2)
            if not start <= middle < end or period.end > end:
                continue
            _, book = plan_of(conn, customer, period.start)
            if book is not None:
                chosen.append((customer, period, book, middle))
    days = Days(conn, cost_model, priced_meters(*{b.id: b for _, _, b, _ in chosen}.values()) if chosen else None)
    out = []
    for customer, period, book, middle in chosen:
        forecast = spend_forecast(conn, customer, period, book, middle, days, cost_model)
        if forecast.spend is None:
            continue
        usage = period_usage(conn, customer.customer_id, period, meters=meters_of(book), cost_model=cost_model,
                             task_outcomes=book.task_outcomes)
        actual = spend_of(book, customer.customer_id, usage.quantities, period.start, period.end)
        out.append(Calibrated(customer.customer_id, period.label, middle, forecast.spend.p10, forecast.spend.p90,
                              forecast.spend.mean, actual))
    return out
