"""What the dashboards need of the predictors and the alerts: `PredictionViews`, which the app factory
puts on `app.state.predictions` (app.api.create_app wires prediction_service.dashboard_views.DashboardViews,
handed the alerts' read), or None when they are not wired. dashboards imports neither prediction_service
nor alerts (an import contract): an implementation has this shape without naming it.

Without them (None) the operations page says the predictions' evaluation is not wired, and the customer
page shows no "Alerts" and no "Invoice forecast" section. Amounts are decimal strings; rates floats.
"""

from datetime import datetime
from typing import Any, Protocol, Required, TypedDict

import psycopg


class Scores(TypedDict, total=False):
    """One group's scores (`infermeter predict eval --json`'s): `requests` 0 alone when none was scored."""

    requests: Required[int]
    customer_id: str
    model: str
    mae_p50: float
    baseline_mae_p50: float  # the online per-(customer, model) median's (the backtest's groups only)
    pinball_p90: float
    pinball_p99: float
    coverage_p90: float
    coverage_p99: float
    cached_fraction_mae: float
    failure_brier: float


class AdmissionScores(TypedDict):
    """The predictions made at admission, as metering scored them at ingest, over whole hours."""

    hours: dict[str, str]  # {"from", "to"}
    all: Scores
    groups: list[Scores]
    models: list[Scores]


class Evaluation(TypedDict, total=False):
    """`infermeter predict eval --from --to --json --no-spend`."""

    window: Required[dict[str, str]]
    all: Required[Scores]  # the backtest's
    groups: Required[list[Scores]]
    models: Required[list[Scores]]
    admission: Required[AdmissionScores]
    unscored: int
    predictions: str


class SpendInterval(TypedDict, total=False):
    expected: str
    low: str  # the 80% interval's ends
    median: str
    high: str
    interval: str


class InvoiceForecast(TypedDict, total=False):
    """The customer's spend at the end of its billing period (`infermeter predict forecast --json`'s row);
    `available` False with a `message` without a billing record or plan."""

    customer_id: Required[str]
    available: Required[bool]
    message: str
    period: str
    period_start: str
    period_end: str
    as_of: str
    currency: str
    price_book: str
    spend_to_date: str
    days_observed: int
    forecast: SpendInterval | None  # None before a metered day to forecast from
    credit: dict[str, Any]  # when it runs out: runs_out_at, earliest, latest
    budget: dict[str, Any]


class Alert(TypedDict, total=False):
    """One alert fired for the customer (`infermeter alerts list --json`'s), with its deliveries."""

    alert_id: Required[str]
    customer_id: str
    kind: Required[str]
    threshold: Required[str]
    period: Required[str]
    fired_at: Required[str]
    data: dict[str, Any]
    deliveries: list[dict[str, Any]]


class PredictionViews(Protocol):
    """The predictors' and the alerts' parts of the pages. Each reads on `conn` (the pages' pooled
    connection) and writes nothing."""

    def evaluation(self, conn: psycopg.Connection, start: datetime, end: datetime) -> Evaluation:
        """The predictions' scores over [start, end): the backtest's with its baseline and those made at
        admission (what `infermeter predict eval --json --no-spend` prints)."""
        ...

    def invoice_forecast(self, conn: psycopg.Connection, customer_id: str, as_of: datetime) -> InvoiceForecast:
        """The customer's spend at the end of its billing period containing `as_of`, with the 80% interval."""
        ...

    def alerts(self, conn: psycopg.Connection, customer_id: str) -> list[Alert]:
        """The customer's alerts, newest first."""
        ...
