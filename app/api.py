"""The HTTP API app: composes each package's router on shared state.

    GET  /healthz
    metering.api          POST /v1/events, GET /v1/usage, /v1/tasks, /v1/tasks/{id}, /v1/dead-letters
    pricing_service.api   GET /v1/pricing/shadow
    billing_service.api   GET /v1/invoices/preview, /v1/billing/... (customers, plans, runs, invoices, credits,
                          exports)
    billing_service.stripe_api  POST /v1/stripe/webhook (Stripe-Signature is the credential)
    serving.capacity_api  GET /v1/deployments/{id}/capacity (admin)
    serving.residency_api GET, PUT /v1/customers/{id}/residency (admin)
    dashboards.web        the web pages: /dashboard, /admin/ops, /admin/pricing, /admin/finance, /metrics/metering;
                          billing's parts of them (invoices, current-period spend, the customer's own book, the
                          finance page and its exports) come from billing_service.dashboard_views, registered by
                          `register_dashboard_billing` (dashboards never imports billing_service)

State the routers read: `settings`, `pool` (a psycopg ConnectionPool), `keys` (the API-key store that
resolves bearer tokens), `publisher` (the event-bus publisher, None without a broker),
`stripe_webhook_events` (PostgresWebhookEventLog), `stripe_status_port` (records paid / payment_failed /
void through billing_service.run.record_payment_status, on its own connection and transaction), and
optionally `clock` (tests set it; the webhook's signature check and the status port read it).
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from decimal import Decimal

import psycopg
import sqlalchemy.exc
from fastapi import FastAPI
from psycopg_pool import ConnectionPool
from starlette.exceptions import HTTPException as StarletteHTTPException

from billing_service.api import router as billing_router
from billing_service.stripe.api import router as stripe_router
from billing_service.stripe.run import status_port
from billing_service.stripe.state import PostgresWebhookEventLog
from billing_service.stripe.webhook import utc_now
from dashboards.web import DataFastPath, close_read_pool, open_read_pool
from dashboards.web import router as dashboards_router
from infermeter.db import get_engine
from infermeter.http import data_error_handler, error_handler
from infermeter.settings import Settings
from infermeter.stack import to_libpq_url
from metering.api import Publisher
from metering.api import router as metering_router
from pricing_service.api import router as pricing_router
from serving.capacity_api import router as capacity_router
from serving.keys import KeyStore
from serving.residency_api import router as residency_router

ROUTERS = (metering_router, pricing_router, billing_router, stripe_router, capacity_router, residency_router,
           dashboards_router)


def register_dashboard_billing(settings: Settings, database_url: str) -> None:
    """Plug billing into the dashboards (dashboards.extensions): the customer's invoices and current-period
    spend (the billing preview, with its budget from serving.budgets), its own price book, and the finance
    page and its exports. Every provider is a billing_service.dashboard_views function."""
    from billing_service import dashboard_views as billing_views
    from billing_service.store import money_text
    from dashboards import extensions
    from pricing_service.books import read_cost_model
    from serving.budgets import get_budget

    engine = get_engine(database_url)

    def current_period_spend(conn, customer_id: str, now, period: str | None = None) -> dict:
        spend = billing_views.current_period_spend(conn, customer_id, now, period=period,
                                                   cost_model=read_cost_model(settings.pricing_cost_model))
        budget = get_budget(engine, customer_id)
        if spend["available"] and budget is not None and budget.monthly_cap is not None:
            cap = budget.monthly_cap
            spend["budget"] = {"monthly_cap": money_text(cap, spend["currency"]), "mode": budget.mode,
                               "used": None if not cap else round(float(Decimal(spend["subtotal"]) / cap), 6)}
        return spend

    extensions.register_invoices(billing_views.customer_invoices)
    extensions.register_invoice(billing_views.customer_invoice)
    extensions.register_current_period_spend(current_period_spend)
    extensions.register_customer_price_book(billing_views.customer_price_book)
    extensions.register_finance_page(billing_views.finance_view)
    extensions.register_finance_export(billing_views.export_file)


def create_app(settings: Settings, database_url: str, bootstrap: str | None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app_: FastAPI):
        await open_read_pool(app_)  # the customer dashboard's chart data endpoints read in the event loop
        yield
        await close_read_pool(app_)
        app_.state.pool.close()
        if app_.state.publisher:
            app_.state.publisher.close()

    app = FastAPI(title="infermeter", version="0.1.0", description=__doc__, lifespan=lifespan)
    app.state.settings = settings
    app.state.database_url = database_url
    app.state.pool = ConnectionPool(to_libpq_url(database_url), min_size=1, max_size=8, open=True)
    app.state.keys = KeyStore(get_engine(database_url), settings=settings)
    app.state.publisher = (
        Publisher(bootstrap, settings) if bootstrap else None
    )
    app.state.stripe_webhook_events = PostgresWebhookEventLog(get_engine(database_url))
    app.state.stripe_status_port = status_port(app.state.pool.connection,
                                               lambda: getattr(app.state, "clock", utc_now)())
    # Starlette's own HTTP errors too (a body that cannot be parsed, an unknown path, a wrong method):
    # every error answers {"error": {"message", "code"}}, the shape the OpenAPI document declares.
    app.add_exception_handler(StarletteHTTPException, error_handler)
    app.add_exception_handler(psycopg.DataError, data_error_handler)
    app.add_exception_handler(sqlalchemy.exc.DataError, data_error_handler)
    # the customer dashboard's chart JSON for a bearer API key, answered before routing (dashboards.web)
    app.add_middleware(DataFastPath)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    for router in ROUTERS:
        app.include_router(router)
    register_dashboard_billing(settings, database_url)
    return app
