"""Evaluating the thresholds: each customer's budget, credit and forecast read as of an instant, the
thresholds crossed (`alerts.rules.crossings`) recorded once per period (`alerts.store.record`).

Which customers: those with a monthly budget cap (serving.budgets), with prepaid credit granted
(billing), or with thresholds of their own; a customer with none of these cannot cross anything.
What is read for each (docs/alerts.md):
- budget: the cap and the month's spend as admission counts it (`budgets(customer_id, at)`, in
  production `prediction_service.budgets.ServingBudgets`);
- credit, the invoice forecast and when the credit runs out: `prediction_service.forecast.
  customer_forecasts` (the credit balance against the billing period's spend to date; the forecast's
  median and 80% interval; the run-out date at the median daily rate).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Protocol

import psycopg

from alerts import store
from alerts.rules import Crossing, Forecast, Level, ThresholdError, Thresholds, crossings, parse_percents
from billing_service.store import PgCreditLedger, all_customers
from infermeter.settings import Settings
from infermeter.times import Window
from prediction_service.forecast import customer_forecasts
from pricing.cost import CostModel


class Budgets(Protocol):
    """Monthly budgets: (cap, the month's spend so far) of a customer at an instant, or None without a cap."""

    def __call__(self, customer_id: str, at: datetime) -> tuple[Decimal, Decimal] | None: ...

    def customers(self) -> list[str]: ...


def default_thresholds(settings: Settings) -> Thresholds:
    """The thresholds of the settings (INFERMETER_ALERT_*); a malformed percentage list is an error that
    names its variable."""
    try:
        return Thresholds(parse_percents(settings.alert_budget_percents, "INFERMETER_ALERT_BUDGET_PERCENTS"),
                          parse_percents(settings.alert_credit_percents, "INFERMETER_ALERT_CREDIT_PERCENTS"),
                          settings.alert_forecast_overspend, settings.alert_credit_runout_days)
    except ThresholdError as exc:
        raise store.AlertError(str(exc)) from None


@dataclass(frozen=True)
class Fired:
    crossing: Crossing
    alert_id: str
    new: bool  # False: it had fired already this period (nothing sent again)
    deliveries: list[str]

    def to_json(self) -> dict:
        c = self.crossing
        return {"alert_id": self.alert_id, "customer_id": c.customer_id, "kind": c.kind, "threshold": c.threshold,
                "period": c.period, "new": self.new, "deliveries": self.deliveries, "data": c.data}


def candidates(conn: psycopg.Connection, budgets: Budgets | None) -> list[str]:
    """Every customer that could cross a threshold: a budget cap, prepaid credit, or thresholds of its own."""
    found = set(budgets.customers()) if budgets is not None else set()
    ledger = PgCreditLedger(conn)
    found.update(c.customer_id for c in all_customers(conn) if ledger.grants(c.customer_id))
    found.update(store.customers_with_thresholds(conn))
    return sorted(found)


def _when(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text.replace("Z", "+00:00"))


def customer_crossings(conn: psycopg.Connection, customer_ids: Sequence[str], *, now: datetime, defaults: Thresholds,
                       budgets: Budgets | None, cost_model: CostModel | None = None) -> list[Crossing]:
    """The thresholds each of `customer_ids` has crossed as of `now`."""
    if not customer_ids:
        return []
    rows = {r["customer_id"]: r for r in customer_forecasts(conn, now, cost_model=cost_model,
                                                            customer_ids=list(customer_ids), budgets=budgets)}
    utc_month = f"{Window.month_of(now).start:%Y-%m}"
    out: list[Crossing] = []
    for customer in customer_ids:
        thresholds, _ = store.thresholds_for(conn, customer, defaults)
        row = rows.get(customer) or {"available": False}
        currency = row.get("currency")
        cap = budgets(customer, now) if budgets is not None else None
        # a budget counts the customer's billing period (serving.budgets): its label, the UTC month's
        # without a billing record (no calendar)
        period = row.get("period") or utc_month
        budget = None if cap is None else Level(period, Decimal(cap[0]), Decimal(cap[1]), currency)
        credit = forecast = runs_out_at = None
        if row["available"] and row.get("credit"):
            c = row["credit"]
            credit = Level(row["period"], Decimal(c["available"]), Decimal(c["used"]), currency)
            runs_out_at = _when(c["runs_out_at"])
        if row["available"] and row.get("forecast"):
            f = row["forecast"]
            forecast = Forecast(row["period"], Decimal(f["median"]), Decimal(f["low"]), Decimal(f["high"]), currency)
        out += crossings(customer, thresholds, now=now, budget=budget, credit=credit, forecast=forecast,
                         credit_runs_out_at=runs_out_at)
    return out


def evaluate(conn: psycopg.Connection, *, now: datetime, defaults: Thresholds, budgets: Budgets | None,
             cost_model: CostModel | None = None, customer_ids: Sequence[str] | None = None) -> list[Fired]:
    """Evaluate every candidate customer (or `customer_ids`) as of `now` and record what crossed; an alert
    that already fired this period is listed with `new` false and sends nothing. `conn` is in
    autocommit mode (each alert is recorded in its own transaction)."""
    ids = candidates(conn, budgets) if customer_ids is None else list(customer_ids)
    out = []
    for crossing in customer_crossings(conn, ids, now=now, defaults=defaults, budgets=budgets, cost_model=cost_model):
        recorded = store.record(conn, crossing, now=now)
        ident = store.alert_id(*crossing.key)
        out.append(Fired(crossing, ident, recorded is not None, recorded.deliveries if recorded else []))
    return out


def send_test(conn: psycopg.Connection, customer_id: str, *, now: datetime) -> store.Recorded:
    """A test alert for `customer_id` (kind `test`, its period the instant, so every test is new) with a
    delivery to each endpoint that takes the customer's alerts; an error if there is none."""
    if not store.endpoints(conn, customer_id):
        raise store.AlertError(f"no webhook endpoint takes {customer_id}'s alerts: add one with "
                               "`infermeter alerts endpoint set --url URL`")
    crossing = Crossing(customer_id, "test", "test", now.isoformat().replace("+00:00", "Z"),
                        {"message": "a test delivery from `infermeter alerts test`"})
    recorded = store.record(conn, crossing, now=now)
    if recorded is None:  # the same instant twice: nothing new to send
        raise store.AlertError("a test alert was already sent at this instant; try again")
    return recorded
