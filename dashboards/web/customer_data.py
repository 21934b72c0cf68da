"""What the customer dashboard shows and how it is read: the page's view (the sync pool, in a worker
thread), the chart data endpoints' views (the async read pool, in the event loop; in a worker thread
when there is none in this loop), and `chart_data`, the one handler of the chart data endpoints:
it authenticates the caller, checks its scope, parses the query and reads the chart. The route
(customer.py) and the fast path (fast_path.py) both call it and only adapt the request and the
answer.
"""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from functools import partial

import psycopg
from fastapi import Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from dashboards import views
from dashboards.billing_views import BillingViews
from dashboards.web.auth import SignInNeeded, Viewer, authenticate, customer_scope
from dashboards.web.read_pool import read_pool
from dashboards.web.responses import error_json
from dashboards.web.state import billing_now, billing_views, now, prediction_views
from infermeter.times import TimeInputError, Window

CUSTOMER_CHARTS = ("tokens", "requests", "cache_hit", "gpu", "tasks", "summary")
# what the project filter covers: request usage is kept per API key project, the rest is not
PROJECT_TRACKING = ("requests and tokens are kept per project (the API key's); GPU time, tasks and spend "
                    "cover all of the customer's API keys")
ALL_PARTS = frozenset({"usage", "gpu", "tasks"})
# what each data endpoint reads (an endpoint reads only its own part)
CHART_PARTS = {"tokens": {"usage"}, "requests": {"usage"}, "cache_hit": {"usage"}, "gpu": {"gpu"},
               "tasks": {"tasks"}, "summary": ALL_PARTS}


@contextmanager
def _reads(conn):
    """Reads without a transaction (each statement sees what is committed, as it would in a READ
    COMMITTED transaction): no BEGIN, and no ROLLBACK when the connection goes back to the pool."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        yield  # already in a transaction: read in it
        return
    conn.autocommit = True
    try:
        yield
    finally:
        if not conn.closed:  # a broken connection: the pool discards it
            conn.autocommit = False


Target = tuple[Window, str | None, str | None, str | None]  # the window, customer, model and project a view shows


def _view_target(request: Request, viewer: Viewer, params: dict[str, str | None]) -> Target:
    """The window, customer, model and project a customer view shows (TimeInputError for bad times).
    No project (or an empty one): every project."""
    window = views.page_window(params.get("from"), params.get("to"), now=now(request), default=timedelta(days=7))
    customer = viewer.customer_id if not viewer.is_admin else params.get("customer_id")
    return window, customer, params.get("model") or None, params.get("project") or None


def customer_view(request: Request, viewer: Viewer, params: dict[str, str | None], *, spend: bool,
                  parts: frozenset[str] | set[str] = ALL_PARTS, with_billing: bool = False, models: bool = True,
                  totals_only: bool = False) -> dict:
    window, customer, model, project = _view_target(request, viewer, params)
    settings = request.app.state.settings
    billing = billing_views(request)
    with request.app.state.pool.connection() as conn:
        if customer is None:  # an admin who has not picked a customer yet
            customers = sorted({r["customer_id"] for r in views.queries.usage(conn, window)})
            return {"window": window, "customer_id": None, "customers": customers}
        with _reads(conn):
            usage = views.customer_usage(conn, window, customer, model, models=models, totals_only=totals_only,
                                         project=project) if "usage" in parts else None
            gpu = views.customer_gpu(conn, window, customer, totals_only=totals_only) if "gpu" in parts else None
            tasks = views.customer_tasks(conn, window, customer) if "tasks" in parts else None
            # the page's project filter: the named projects of the window (and the one asked for)
            projects = sorted({p for p in views.customer_dashboard_reads.customer_projects(conn, window, customer)
                               if p} | ({project} if project else set())) if with_billing else None
        result = {"window": window, "customer_id": customer, "model": model, "project": project,
                  "projects": projects, "usage": usage, "gpu": gpu, "tasks": tasks, "spend": None, "invoices": None,
                  "current_period": None}
        if spend:
            book, rated = _rated_spend(conn, settings, billing, window, customer)
            result["spend"] = views.spend_view(book, rated, tasks["totals"]["succeeded"])
        if with_billing and billing is not None:  # the page's billing sections (endpoints: invoices.py)
            result["customer_name"] = billing.customer_name(conn, customer)
            result["invoices"] = billing.invoices(conn, customer)
            result["current_period"] = billing.current_period_spend(
                conn, customer, billing_now(request), period=params.get("period") or None)
        predictions = prediction_views(request) if with_billing else None
        if predictions is not None:  # the page's alerts and invoice forecast, as of the billing figures' instant
            result["invoice_forecast"] = predictions.invoice_forecast(conn, customer, billing_now(request))
            result["alerts"] = predictions.alerts(conn, customer)
    return result


def _rated_spend(conn, settings, billing: BillingViews | None, window: Window,
                 customer: str) -> tuple[views.PriceBook, Decimal]:
    """The customer's book (its plan's, else the baseline) and its spend over the window under it."""
    own = billing.customer_price_book(conn, customer, window.start) if billing is not None else None
    book = own or views.baseline_book(settings)
    with _reads(conn):
        return book, views.rated_spend(conn, window, customer, book, views.cost_model(settings))


def _pooled_rated_spend(request: Request, window: Window, customer: str) -> tuple[views.PriceBook, Decimal]:
    with request.app.state.pool.connection() as conn:
        return _rated_spend(conn, request.app.state.settings, billing_views(request), window, customer)


async def _chart_view(pool, target: Target, parts: set[str] | frozenset[str], *, totals_only: bool = False) -> dict:
    """What `customer_view` gives a chart's data endpoint (no spend, no billing), read in the event
    loop from the async read pool: the same statements (the `*_async` twins of metering.queries and
    metering.customer_dashboard_reads), no hop to a worker thread. No model list: no data endpoint
    answers it. `totals_only` (the summary): usage and GPU totals from per-model and per-deployment
    sums, no series."""
    window, customer, model, project = target
    reads = {"usage": partial(views.customer_usage_async, window=window, customer_id=customer, model=model,
                              models=False, totals_only=totals_only, project=project),
             "gpu": partial(views.customer_gpu_async, window=window, customer_id=customer, totals_only=totals_only),
             "tasks": partial(views.customer_tasks_async, window=window, customer_id=customer)}
    wanted = [part for part in ("usage", "gpu", "tasks") if part in parts]
    if len(wanted) == 1:
        found = {wanted[0]: await _pooled_read(pool, reads[wanted[0]])}
    else:  # the summary: each data set on its own pooled connection, at once
        found = dict(zip(wanted, await asyncio.gather(*(_pooled_read(pool, reads[p]) for p in wanted)), strict=True))
    return {"window": window, "customer_id": customer, "model": model, "project": project,
            "usage": found.get("usage"), "gpu": found.get("gpu"), "tasks": found.get("tasks")}


async def _pooled_read(pool, read):
    async with pool.connection() as conn:
        return await read(conn)


async def _summary_view(request: Request, pool, target: Target) -> dict:
    """What `customer_view` gives the summary (spend, no billing), in two halves at once: the spend
    (the book lookup and pricing's synchronous rating) in a worker thread on the sync pool while the
    three data sets are read in the event loop from the async read pool."""
    window, customer, _, _ = target
    halves = await asyncio.gather(run_in_threadpool(_pooled_rated_spend, request, window, customer),
                                  _chart_view(pool, target, ALL_PARTS, totals_only=True),
                                  return_exceptions=True)
    for half in halves:
        if isinstance(half, BaseException):
            raise half
    (book, rated), view = halves
    view["spend"] = views.spend_view(book, rated, view["tasks"]["totals"]["succeeded"])
    return view


async def _data_view(request: Request, viewer: Viewer, params: dict[str, str | None], chart: str) -> dict:
    """What a data endpoint shows: in the event loop from the async read pool when it is open in this
    loop, else in a worker thread from the sync pool (TimeInputError for bad times, before any read)."""
    pool = read_pool(request)
    if pool is None:
        return await run_in_threadpool(customer_view, request, viewer, params, spend=chart == "summary",
                                       parts=CHART_PARTS[chart], models=False, totals_only=chart == "summary")
    target = _view_target(request, viewer, params)
    if chart == "summary":
        return await _summary_view(request, pool, target)
    return await _chart_view(pool, target, CHART_PARTS[chart])


# --- the chart data endpoints' handler -------------------------------------------------------------


class DataRefused(Exception):
    """The answer instead of the chart's data: an error in the API's shape."""

    def __init__(self, status: int, message: str, code: str):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code

    def response(self) -> Response:
        return error_json(self.status, self.message, self.code)


class NotACustomer(Exception):
    """`chart_data(..., customers_only=True)` asked by an admin or a producer: the route answers."""


@dataclass(frozen=True, slots=True)
class ChartData:
    """One chart's data as a data endpoint answers it: `payload()` is its JSON, `csv_rows()` its CSV."""

    chart: str  # one of CUSTOMER_CHARTS
    view: dict

    def payload(self) -> dict:
        return _summary(self.view) if self.chart == "summary" else _chart_of(self.view, self.chart).to_json()

    def csv_rows(self) -> list[dict]:
        if self.chart != "summary":
            return _chart_of(self.view, self.chart).rows
        found = _summary(self.view)
        return [{"customer_id": found["customer_id"], **found["window"],
                 **{k: v for k, v in found["usage"].items()}, "gpu_hours": found["gpu_hours"],
                 **{f"tasks_{k}": v for k, v in found["tasks"].items()},
                 **{f"spend_{k}": v for k, v in (found["spend"] or {}).items()}}]


async def chart_data(request: Request, chart: str, *, customers_only: bool = False) -> ChartData:
    """GET /dashboard/data/{chart}.{json|csv}: who asks (a bearer token, else the session), whether it
    may see the customer asked for (a customer only itself; an admin names one with customer_id), the
    query (from, to, model; the last value of a repeated parameter) and the chart's data. DataRefused
    for what the endpoint answers with an error; `customers_only` (the fast path): NotACustomer for an
    admin or a producer, before anything is read."""
    params = dict(request.query_params)
    try:
        viewer = await authenticate(request, admin=False)
    except SignInNeeded as exc:
        raise DataRefused(401, exc.reason or "sign in first", "unauthenticated") from None
    if customers_only and viewer.principal.kind != "customer":
        raise NotACustomer
    if not customer_scope(viewer, params.get("customer_id")):
        raise DataRefused(404, "not found", "not_found")
    if viewer.is_admin and not params.get("customer_id"):
        raise DataRefused(400, "customer_id is required for admin credentials", "invalid_query")
    try:
        view = await _data_view(request, viewer, params, chart)
    except TimeInputError as exc:
        raise DataRefused(400, str(exc), "invalid_query") from None
    return ChartData(chart, view)


def _summary(view: dict) -> dict:
    return {"customer_id": view["customer_id"], "window": views.window_json(view["window"]), "model": view["model"],
            "project": view["project"], "usage": view["usage"]["totals"], "gpu_hours": view["gpu"]["total_gpu_hours"],
            "tasks": view["tasks"]["totals"], "spend": view["spend"],
            "project_tracking": PROJECT_TRACKING}


def _chart_of(view: dict, chart: str) -> views.Chart:
    """One chart of a data endpoint's view (not the summary)."""
    if chart in ("tokens", "requests", "cache_hit"):
        found = {c.id: c for c in views.usage_charts(view["usage"])}[chart]
    else:
        found = views.gpu_chart(view["gpu"]) if chart == "gpu" else views.tasks_chart(view["tasks"])
    found.extra = {"customer_id": view["customer_id"], "window": views.window_json(view["window"]),
                   "model": view["model"], "project": view["project"]}
    return found
