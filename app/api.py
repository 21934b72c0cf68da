"""The HTTP API app: composes each package's router on shared state.

    GET  /healthz
    metering         POST /v1/events, GET /v1/usage, /v1/tasks, /v1/tasks/{id}, /v1/dead-letters
    pricing_service  GET /v1/pricing/shadow
    billing_service  GET /v1/invoices/preview, /v1/billing/... (customers, plans, runs, invoices, credits,
                     exports); POST /v1/stripe/webhook (Stripe-Signature is the credential)
    serving          GET /v1/deployments/{id}/capacity, GET and PUT /v1/customers/{id}/residency (admin)
    prediction_service POST /v1/quotes (a customer's key, or admin), GET /v1/predictions/status (admin)
    dashboards       the web pages: /dashboard, /admin/ops, /admin/pricing, /admin/finance, /metrics/metering;
                     billing's parts of them (invoices, current-period spend, the customer's own book, the
                     finance page and its exports) come from billing_service, built by `dashboard_billing`
                     and put on the state as `billing` (dashboards never imports billing_service: the pages
                     declare what they need of billing as a protocol); the predictors' and the alerts'
                     parts (the operations page's evaluation, the customer's invoice forecast and
                     alerts) likewise, built by `dashboard_predictions`, as `predictions`

State the routers read: `settings`, `pool` (a psycopg ConnectionPool), `keys` (the API-key store that
resolves bearer tokens), `billing` (billing's views for the dashboards), `predictions` (the predictors'
and the alerts' views for the dashboards), `clock` (now: what every
router acts at through `infermeter.http.now`, the dashboards' windows, the webhook's signature check,
the status port), `billing_clock` (None, or the instant the
dashboards show a customer's billing figures as of), `publisher` (the event-bus publisher, None
without a broker), `stripe_webhook_events` (the webhook's event log), `stripe_status_port` (records
paid / payment_failed / void through billing_service, on its own connection and transaction).
`create_app` takes the key store and the clocks as arguments (tests pass their own).

Every operation is behind `dashboards.web.backoff.AuthBackoff`: a client address whose bearer keys,
admin or producer tokens or sign-ins keep failing (401) is answered 429 with Retry-After for a while.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import asynccontextmanager
from datetime import datetime
from time import monotonic

import psycopg
import sqlalchemy.exc
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from psycopg_pool import ConnectionPool
from starlette.exceptions import HTTPException as StarletteHTTPException

from billing_service.api import router as billing_router
from billing_service.stripe.api import router as stripe_router
from billing_service.stripe.run import status_port
from billing_service.stripe.state import PostgresWebhookEventLog
from billing_service.stripe.webhook import utc_now
from dashboards.billing_views import BillingViews
from dashboards.prediction_views import PredictionViews
from dashboards.web.app import router as dashboards_router
from dashboards.web.backoff import AuthBackoff
from dashboards.web.fast_path import DataFastPath
from dashboards.web.read_pool import close_read_pool, open_read_pool
from infermeter.db import get_engine
from infermeter.http import data_error_handler, declare_error_shape, error_handler, validation_error_handler
from infermeter.settings import Settings
from infermeter.stack.postgres import to_libpq_url
from metering.api import Publisher
from metering.api import router as metering_router
from prediction_service.api import router as prediction_router
from pricing_service.api import router as pricing_router
from serving.capacity_api import router as capacity_router
from serving.keys import KeyStore
from serving.residency_api import router as residency_router

ROUTERS = (metering_router, pricing_router, billing_router, stripe_router, capacity_router, residency_router,
           prediction_router, dashboards_router)


def dashboard_billing(settings: Settings, database_url: str) -> BillingViews:
    """Billing's parts of the dashboards: the customer's invoices and current-period spend (the billing
    preview under the pricing cost model, with its budget from serving.budgets), its own price book, and
    the finance page and its exports (billing_service.dashboard_views.DashboardViews)."""
    from billing_service.dashboard_views import DashboardViews
    from pricing_service.books import read_cost_model
    from serving.budgets import get_budget

    engine = get_engine(database_url)
    return DashboardViews(cost_model=lambda: read_cost_model(settings.pricing_cost_model),
                          budget=lambda customer_id: get_budget(engine, customer_id))


def dashboard_predictions(settings: Settings, database_url: str) -> PredictionViews:
    """The predictors' and the alerts' parts of the dashboards: the operations page's evaluation, the
    customer's invoice forecast (with its budget from serving.budgets) and alerts
    (prediction_service.dashboard_views.DashboardViews, handed alerts.store.alerts_for)."""
    from alerts.store import alerts_for
    from prediction_service.budgets import ServingBudgets
    from prediction_service.dashboard_views import DashboardViews
    from pricing_service.books import read_cost_model

    return DashboardViews(cost_model=lambda: read_cost_model(settings.pricing_cost_model), alerts=alerts_for,
                          budgets=lambda: ServingBudgets(database_url, settings))


def create_app(settings: Settings, database_url: str, bootstrap: str | None, *, keys: KeyStore | None = None,
               clock: Callable[[], datetime] = utc_now, billing_clock: Callable[[], datetime] | None = None,
               auth_clock: Callable[[], float] = monotonic) -> FastAPI:
    """The API app on `database_url` (`bootstrap`: the broker, None for none). `keys`: the key store
    (default: one on the database, with the settings' key cache); `clock`: now; `billing_clock`: the
    instant the dashboards show billing figures as of (None: now; the demo: the instant its billing
    run is made as of); `auth_clock`: the seconds the backoff on failed authentication counts in."""
    @asynccontextmanager
    async def lifespan(app_: FastAPI):
        await open_read_pool(app_)  # the customer dashboard's chart data endpoints read in the event loop
        yield
        await close_read_pool(app_)
        app_.state.pool.close()
        if app_.state.publisher:
            app_.state.publisher.close()

    # No /docs or /redoc: FastAPI's pages load Swagger UI and ReDoc from public CDNs (blank offline) and
    # no maintained package ships their assets to serve instead; the document is /openapi.json.
    app = FastAPI(title="infermeter", version="0.1.0", description=__doc__, lifespan=lifespan, docs_url=None,
                  redoc_url=None)
    app.state.settings = settings
    app.state.database_url = database_url
    app.state.pool = ConnectionPool(to_libpq_url(database_url), min_size=1, max_size=8, open=True)
    app.state.keys = keys if keys is not None else KeyStore(get_engine(database_url), settings=settings)
    app.state.billing = dashboard_billing(settings, database_url)
    app.state.predictions = dashboard_predictions(settings, database_url)
    app.state.clock = clock
    app.state.billing_clock = billing_clock
    app.state.publisher = (
        Publisher(bootstrap, settings) if bootstrap else None
    )
    app.state.stripe_webhook_events = PostgresWebhookEventLog(get_engine(database_url))
    app.state.stripe_status_port = status_port(app.state.pool.connection, lambda: app.state.clock())
    # Starlette's own HTTP errors too (a body that cannot be parsed, an unknown path, a wrong method) and
    # the parameter checks' 422: every error answers {"error": {"message", "code"}}, the shape the
    # OpenAPI document declares.
    app.add_exception_handler(StarletteHTTPException, error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    declare_error_shape(app)
    app.add_exception_handler(psycopg.DataError, data_error_handler)
    app.add_exception_handler(sqlalchemy.exc.DataError, data_error_handler)
    # the customer dashboard's chart JSON for a bearer API key, answered before routing (dashboards.web)
    app.add_middleware(DataFastPath)
    # outermost: failed authentications (401 to a bearer key, an admin or producer token, a sign-in form)
    # slow their client down, on every router's operations and the fast path's (dashboards.web.backoff)
    app.add_middleware(AuthBackoff, settings=settings, clock=auth_clock)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    for router in ROUTERS:
        app.include_router(router)
    return app
