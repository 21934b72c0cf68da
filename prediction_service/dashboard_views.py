"""The predictors' and the alerts' parts of the dashboards (dashboards.prediction_views.PredictionViews):
the operations page's evaluation (`infermeter predict eval --json --no-spend`), and the customer page's
invoice forecast (prediction_service.forecast.forecast_for) and alerts. prediction_service does not
import alerts: the app hands the alerts' read in (alerts.store.alerts_for)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime

import psycopg

from prediction_service.evaluate import evaluate
from prediction_service.forecast import forecast_for

AlertsRead = Callable[[psycopg.Connection, str], list[dict]]


class DashboardViews:
    """`cost_model()` reads the pricing cost model (GPU time in the forecasts); `alerts(conn, customer_id)`
    the customer's alerts, newest first; `budgets()` opens serving's budgets for the forecast's budget
    run-out (prediction_service.budgets.ServingBudgets; None: no budget shown)."""

    def __init__(self, *, cost_model: Callable[[], object], alerts: AlertsRead,
                 budgets: Callable[[], AbstractContextManager] | None = None) -> None:
        self._cost_model = cost_model
        self._alerts = alerts
        self._budgets = budgets

    def evaluation(self, conn: psycopg.Connection, start: datetime, end: datetime) -> dict:
        return evaluate(conn, start, end, spend=False)

    def invoice_forecast(self, conn: psycopg.Connection, customer_id: str, as_of: datetime) -> dict:
        if self._budgets is None:
            return forecast_for(conn, customer_id, as_of=as_of, cost_model=self._cost_model())
        with self._budgets() as budgets:
            return forecast_for(conn, customer_id, as_of=as_of, cost_model=self._cost_model(), budgets=budgets)

    def alerts(self, conn: psycopg.Connection, customer_id: str) -> list[dict]:
        return self._alerts(conn, customer_id)
