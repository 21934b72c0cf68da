"""The dashboards' router (every page's routes, in one) and the pages served alone.

Mount `router` on an app whose state has what dashboards.web.state lists, with the `DataFastPath`
middleware, the `AuthBackoff` middleware outside it (dashboards.web.backoff: failed authentications
slow their client down) and the read pool's lifespan hooks, as app.api.create_app does; or run
`create_dashboard_app` (`infermeter serve dashboards`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import psycopg
from fastapi import APIRouter, FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse

from dashboards import views
from dashboards.billing_views import BillingViews
from dashboards.prediction_views import PredictionViews
from dashboards.web import auth, customer, finance, invoices, ops, pricing, static
from dashboards.web.backoff import AuthBackoff
from dashboards.web.fast_path import DataFastPath
from dashboards.web.read_pool import close_read_pool, open_read_pool
from infermeter.http import data_error_handler, validation_error_handler

# the data endpoints and the metrics are in the OpenAPI document (dashboards.web.openapi); pages are not
router = APIRouter()
for _module in (static, auth, customer, invoices, pricing, ops, finance):
    router.include_router(_module.router)


def create_dashboard_app(settings, database_url: str, keys, *, billing: BillingViews | None = None,
                         clock: Callable[[], datetime] = views.now_utc,
                         billing_clock: Callable[[], datetime] | None = None,
                         predictions: PredictionViews | None = None) -> FastAPI:
    """The pages alone (no /v1 API): `infermeter serve dashboards`. `keys` is the key store, `billing`
    billing's parts of the pages (None: the pages without billing), `clock` now, `billing_clock` the
    instant billing figures are shown as of (None: now), `predictions` the predictors' and the alerts'
    parts (None: the pages without them)."""
    from contextlib import asynccontextmanager

    from psycopg_pool import ConnectionPool

    from infermeter.stack.postgres import to_libpq_url

    @asynccontextmanager
    async def lifespan(app_: FastAPI):
        await open_read_pool(app_)
        yield
        await close_read_pool(app_)
        app_.state.pool.close()

    app = FastAPI(title="infermeter dashboards", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.settings = settings
    app.state.database_url = database_url
    app.state.pool = ConnectionPool(to_libpq_url(database_url), min_size=1, max_size=4, open=True)
    app.state.keys = keys
    app.state.billing = billing
    app.state.predictions = predictions
    app.state.clock = clock
    app.state.billing_clock = billing_clock
    app.add_exception_handler(psycopg.DataError, data_error_handler)  # e.g. a NUL in a filter: 400, as on the API app
    app.add_exception_handler(RequestValidationError, validation_error_handler)  # 422 in the error shape too
    app.add_middleware(DataFastPath)
    app.add_middleware(AuthBackoff, settings=settings)  # outermost: it sees every answer, the fast path's too

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/dashboard", status_code=303)

    app.include_router(router)
    return app
