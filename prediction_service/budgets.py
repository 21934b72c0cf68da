"""Customers' budgets (caps per billing period) as serving's admission counts them, for the forecasts
(`budget` run-out) and the alerts (budget thresholds, forecast overspend): `ServingBudgets(database_url,
settings)` is the `budgets(customer_id, at) -> (cap, the billing period's spend) | None` callable that
`prediction_service.forecast.customer_forecasts` takes, and lists the customers with a cap.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from infermeter.db import get_engine
from infermeter.settings import Settings
from serving.budgets import AdmissionController, get_budget, list_budgets


class ServingBudgets:
    """serving.budgets read-only: the cap of `serving.budgets.set_budget` and the period's spend of
    `AdmissionController.spend` (metered cost, settled but not yet metered, reserved). Close it (or use
    it as a context manager): the controller holds a thread pool."""

    def __init__(self, database_url: str, settings: Settings) -> None:
        self.engine = get_engine(database_url)
        self.controller = AdmissionController(self.engine, settings)

    def __call__(self, customer_id: str, at: datetime) -> tuple[Decimal, Decimal] | None:
        budget = get_budget(self.engine, customer_id)
        if budget is None or budget.monthly_cap is None:
            return None
        return budget.monthly_cap, self.controller.spend(customer_id, now=at).total

    def customers(self) -> list[str]:
        """The customers with a monthly cap."""
        return [b.customer_id for b in list_budgets(self.engine) if b.monthly_cap is not None]

    def close(self) -> None:
        self.controller.close()

    def __enter__(self) -> ServingBudgets:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
