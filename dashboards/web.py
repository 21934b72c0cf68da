"""The dashboards' web pages, their JSON and CSV endpoints, sign-in and the static assets.

Mount `router` on an app whose state has `settings`, `pool` (psycopg ConnectionPool) and `keys` (a
key store: `async authenticate(token) -> Principal`, `async session_principal(key_id) -> Principal |
None`), as app.api.create_app does; or run `create_dashboard_app` (`infermeter serve dashboards`).

    GET  /signin, POST /signin                customer sign-in with an API key
    GET  /admin/signin, POST /admin/signin    admin sign-in with INFERMETER_ADMIN_TOKEN
    POST /signout
    GET  /dashboard                           the customer dashboard (?from=&to=&model=; admins add &customer_id=)
    GET  /dashboard/data/{chart}.{json|csv}   tokens, requests, cache_hit, gpu, tasks, summary
    GET  /admin/pricing                       pricing experiments (?from=&to=&book=...), live shadow rating
    GET  /admin/pricing/data/{chart}.{json|csv}  overview, customers, caching, retries, shadow, comparison (json)
    POST /admin/pricing/books                 store an uploaded price book version (YAML)
    GET  /admin/ops                           operations (?from=&to= for deployments; ?reconcile_from=&reconcile_to=)
    GET  /admin/ops/data/{chart}.{json|csv}   ingest, deployments, dead_letters, consumers, gateways, reconcile
    GET  /dashboard/invoices.{json|csv}, /dashboard/invoice-lines.csv   the customer's invoices (billing registered)
    GET  /dashboard/invoices/{id}[.json|.csv] one of the customer's invoices (another's: 404)
    GET  /dashboard/current-period.{json|csv} current-period spend: the billing preview (?period=YYYY-MM)
    GET  /admin/finance                       finance (?period=YYYY-MM; a placeholder until billing registers it)
    GET  /admin/finance/data/{table}.{json|csv}  revenue_month, revenue_customer, revenue_model, revenue_meter,
                                              invoice_status, credits
    GET  /admin/finance/exports/{kind}.{csv|parquet}?period=   the finance exports, for the signed-in admin
    GET  /metrics/metering                    metering's Prometheus metrics (dashboards.metering_metrics)
    GET  /static/plotly.min.js, /static/dashboards.js, /static/dashboards.css

Pages sign in with a session cookie (dashboards.sessions); the data endpoints also take
`Authorization: Bearer <API key or admin token>`. A customer sees only itself everywhere: asking
for another customer id answers 404, and admin pages answer 403.
"""

from __future__ import annotations

import asyncio
import csv
import hmac
import io
import json
import tempfile
import time
import urllib.parse
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import jinja2
import orjson
import psycopg
from fastapi import APIRouter, FastAPI, Request
from fastapi import Path as PathParam
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.concurrency import run_in_threadpool

from dashboards import extensions, gateway_metrics, metering_metrics, views
from dashboards.sessions import (
    CSRF_COOKIE,
    CSRF_FIELD,
    SESSION_COOKIE,
    Session,
    Signer,
    new_nonce,
    read_session,
)
from infermeter.auth import AuthError, Principal, bearer_token
from infermeter.http import data_error_handler
from infermeter.times import TimeInputError, Window, parse_time, utc_text

HERE = Path(__file__).resolve().parent
STATIC = HERE / "static"
MAX_FORM_BYTES = 1_000_000

router = APIRouter(include_in_schema=False)
_templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, undefined=jinja2.StrictUndefined
)
_templates.filters["num"] = lambda v: "-" if v is None else (f"{v:,}" if isinstance(v, int) else str(v))
_templates.filters["pct"] = lambda v: "-" if v is None else f"{float(v) * 100:.1f}%"
_templates.filters["duration"] = lambda s: views.duration_text(s)

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; object-src 'none'; "
    "frame-ancestors 'none'; base-uri 'self'; form-action 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def now() -> datetime:
    """The current time (tests override the module attribute)."""
    return views.now_utc()


def billing_now(request: Request) -> datetime:
    """The instant the customer's billing figures (the current period's preview, the prepaid credit
    balance) are shown as of: `app.state.billing_clock()` when the app has one (the demo: the instant
    its billing run is made as of, so the page agrees with the demo's invoices), else now."""
    clock = getattr(request.app.state, "billing_clock", None)
    return clock() if clock is not None else now()


def plotly_js_path() -> Path:
    import plotly

    return Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"


# --- plumbing ----------------------------------------------------------------------------------


def _signer(request: Request) -> Signer:
    state = request.app.state
    signer = getattr(state, "dashboards_signer", None)
    if signer is None:
        signer = state.dashboards_signer = Signer(state.settings.session_secret)
    return signer


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def _set_cookie(response: Response, request: Request, name: str, value: str, max_age: int | None) -> None:
    response.set_cookie(name, value, max_age=max_age, path="/", httponly=True, samesite="lax", secure=_secure(request))


def _csrf_nonce(request: Request) -> tuple[str, bool]:
    """The browser's CSRF nonce, or a new one (True: set it in the response)."""
    nonce = request.cookies.get(CSRF_COOKIE)
    if nonce and 16 <= len(nonce) <= 64:
        return nonce, False
    return new_nonce(), True


def render(request: Request, template: str, status: int = 200, *, viewer: Viewer | None = None,
           nonce: str | None = None, **context: Any) -> HTMLResponse:
    fresh = False
    if nonce is None:
        nonce, fresh = _csrf_nonce(request)
    body = _templates.get_template(template).render(
        viewer=viewer, csrf_field=CSRF_FIELD, csrf=_signer(request).csrf_token(nonce), path=request.url.path,
        **context,
    )
    response = HTMLResponse(body, status_code=status, headers=SECURITY_HEADERS)
    if fresh or nonce != request.cookies.get(CSRF_COOKIE):
        _set_cookie(response, request, CSRF_COOKIE, nonce, None)
    return response


async def _form(request: Request) -> dict[str, str]:
    """An application/x-www-form-urlencoded body (the only kind the pages post)."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return {}
    parsed = urllib.parse.parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[-1] for k, v in parsed.items()}


def _csrf_refused(request: Request, form: dict[str, str]) -> Response | None:
    if _signer(request).csrf_ok(request.cookies.get(CSRF_COOKIE), form.get(CSRF_FIELD)):
        return None
    return render(request, "message.html", 403, title="Form refused",
                  message="This form's CSRF token is missing or does not match this browser. "
                  "Reload the page and submit the form again.")


@dataclass(frozen=True)
class Viewer:
    principal: Principal
    session: Session | None

    @property
    def is_admin(self) -> bool:
        return self.principal.is_admin

    @property
    def customer_id(self) -> str | None:
        return self.principal.customer_id


class SignInNeeded(Exception):
    def __init__(self, reason: str, admin: bool):
        self.reason, self.admin = reason, admin


async def _viewer(request: Request, *, admin: bool) -> Viewer:
    """Who is asking: a bearer token (data endpoints), else the session cookie. SignInNeeded when
    neither holds a live sign-in; a customer on an admin page gets Viewer and the caller answers 403."""
    keys = request.app.state.keys
    settings = request.app.state.settings
    if request.headers.get("authorization"):
        try:
            return Viewer(await keys.authenticate(bearer_token(request.headers["authorization"])), None)
        except AuthError as exc:
            raise SignInNeeded(str(exc) or "invalid credentials", admin) from None
    state, session = read_session(_signer(request), request.cookies.get(SESSION_COOKIE))
    if state == "none":
        raise SignInNeeded("", admin)
    if state == "invalid":
        raise SignInNeeded("Your session is not valid any more; sign in again.", admin)
    if state == "expired":
        raise SignInNeeded("Your session expired; sign in again.", admin or session.kind == "admin")
    if session.kind == "admin":
        if not hmac.compare_digest(session.admin_fingerprint or "", _signer(request).admin_fingerprint(settings.admin_token)):
            raise SignInNeeded("The admin token changed; sign in again.", True)
        return Viewer(Principal(kind="admin"), session)
    # the session's key, from the key store's verified-key cache as a bearer call's (revocation: the same)
    principal = await keys.session_principal(session.key_id) if session.key_id else None
    if principal is None or principal.customer_id != session.customer_id:
        raise SignInNeeded("The API key of this session has been revoked; sign in with a valid key.", admin)
    return Viewer(principal, session)


def _sign_in_response(request: Request, exc: SignInNeeded, data: bool) -> Response:
    if data:
        return JSONResponse({"error": {"message": exc.reason or "sign in first", "code": "unauthenticated"}},
                            status_code=401)
    target = "/admin/signin" if exc.admin else "/signin"
    query = {"next": request.url.path + (f"?{request.url.query}" if request.url.query else "")}
    if exc.reason:
        query["reason"] = exc.reason
    return RedirectResponse(f"{target}?{urllib.parse.urlencode(query)}", status_code=303)


def _forbidden(request: Request, viewer: Viewer, data: bool) -> Response:
    message = "This page is for administrators. Sign in with the admin token at /admin/signin."
    if data:
        return JSONResponse({"error": {"message": message, "code": "forbidden"}}, status_code=403)
    return render(request, "message.html", 403, viewer=viewer, title="Administrators only", message=message)


def _not_found(request: Request, viewer: Viewer, data: bool) -> Response:
    if data:
        return JSONResponse({"error": {"message": "not found", "code": "not_found"}}, status_code=404)
    return render(request, "message.html", 404, viewer=viewer, title="Not found", message="There is nothing here.")


def _bad_input(request: Request, viewer: Viewer, data: bool, message: str) -> Response:
    if data:
        return JSONResponse({"error": {"message": message, "code": "invalid_query"}}, status_code=400)
    return render(request, "message.html", 400, viewer=viewer, title="Check the filters", message=message)


def _safe_next(target: str | None, default: str) -> str:
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return default


def _csv(rows: list[dict], name: str) -> Response:
    columns: list[str] = []
    for row in rows:
        for key, value in row.items():
            if key not in columns and not isinstance(value, list | dict):
                columns.append(key)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in columns})
    return Response(out.getvalue(), media_type="text/csv; charset=utf-8",
                    headers={"Content-Disposition": f'attachment; filename="{name}.csv"', "Cache-Control": "no-store"})


def _json(payload: Any) -> Response:
    """JSON as JSONResponse writes it (compact, UTF-8), encoded by orjson (~5x faster than json here)."""
    return Response(orjson.dumps(payload), media_type="application/json", headers={"Cache-Control": "no-store"})


# --- the data endpoints in the API's OpenAPI document -------------------------------------------------
# The JSON and CSV data endpoints are API (bearer credentials work): they are declared, and fuzzed by
# tests/test_openapi_fuzz.py. Pages, forms (sign-in, CSRF) and static files stay out of the document.

_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "code"],
    "properties": {"message": {"type": "string"}, "code": {"type": "string"}}}}}
_WINDOW_QUERY = [
    {"name": "from", "in": "query", "required": False, "schema": {"type": "string"},
     "description": "window start, RFC 3339 (floored to the hour); default: `to` minus the page's default span"},
    {"name": "to", "in": "query", "required": False, "schema": {"type": "string"},
     "description": "window end, RFC 3339 (rounded up to the hour); default: the end of the current hour"},
]


def _data_route(names: list[str], query: list[dict], *, admin: bool) -> dict[str, Any]:
    """The decorator arguments that declare a data endpoint: its query parameters and its answers
    (JSON or CSV; errors in the API's {"error": {message, code}} shape)."""
    who = "Admin credentials (session or bearer token)" if admin else \
        "A customer (session or bearer API key: only itself) or an admin (with customer_id)"
    errors = {400: "bad filters", 401: "not signed in", 403: "not for these credentials", 404: "no such chart "
              "(or another customer's data: existence is not disclosed)"}
    return {
        "description": f"{who}. `name` is a chart and a format: {', '.join(names)}.",
        "openapi_extra": {"parameters": query},
        "responses": {
            200: {"description": "the chart's data", "content": {
                "application/json": {"schema": {"type": "object"}}, "text/csv": {"schema": {"type": "string"}}}},
            **{status: {"description": text, "content": {"application/json": {"schema": _ERROR}}}
               for status, text in errors.items()},
        },
    }


def _chart_names(charts: tuple[str, ...], *, no_csv: tuple[str, ...] = ()) -> list[str]:
    return [f"{c}.{fmt}" for c in charts for fmt in ("json", "csv") if not (fmt == "csv" and c in no_csv)]


def _name_param(names: list[str]):
    return PathParam(description="chart.format", json_schema_extra={"enum": names})


def _chart_context(charts: list[views.Chart], base: str, query: str) -> list[dict]:
    suffix = f"?{query}" if query else ""
    return [{"chart": c, "spec": json.dumps(c.spec(), default=str).replace("<", "\\u003c").replace("&", "\\u0026"),
             "json_url": f"{base}/{c.id}.json{suffix}", "csv_url": f"{base}/{c.id}.csv{suffix}"} for c in charts]


def _database_url(request: Request) -> str:
    return getattr(request.app.state, "database_url", None) or request.app.state.settings.database_url


# --- static ------------------------------------------------------------------------------------


@router.get("/static/plotly.min.js")
def plotly_js() -> FileResponse:
    return FileResponse(plotly_js_path(), media_type="text/javascript",
                        headers={"Cache-Control": "public, max-age=86400"})


@router.get("/static/{name}")
def static_file(name: str) -> Response:
    if name not in ("dashboards.js", "dashboards.css"):
        return PlainTextResponse("not found", status_code=404)
    media = "text/javascript" if name.endswith(".js") else "text/css"
    return FileResponse(STATIC / name, media_type=media, headers={"Cache-Control": "no-cache"})


# --- sign-in -----------------------------------------------------------------------------------


@router.get("/signin")
def signin_page(request: Request, next: str | None = None, reason: str | None = None,
                signed_out: int = 0) -> Response:
    return render(request, "signin.html", admin=False, error=None, next=_safe_next(next, "/dashboard"),
                  reason=reason, signed_out=bool(signed_out))


@router.get("/admin/signin")
def admin_signin_page(request: Request, next: str | None = None, reason: str | None = None,
                      signed_out: int = 0) -> Response:
    return render(request, "signin.html", admin=True, error=None, next=_safe_next(next, "/admin/ops"),
                  reason=reason, signed_out=bool(signed_out))


def _start_session(request: Request, session: Session, target: str) -> Response:
    response = RedirectResponse(target, status_code=303)
    ttl = request.app.state.settings.session_ttl_s
    _set_cookie(response, request, SESSION_COOKIE, _signer(request).sign(session.to_payload()), ttl)
    _set_cookie(response, request, CSRF_COOKIE, new_nonce(), None)  # a new CSRF nonce with every sign-in
    return response


@router.post("/signin")
async def signin(request: Request) -> Response:
    form = await _form(request)
    if (refused := _csrf_refused(request, form)) is not None:
        return refused
    target = _safe_next(form.get("next"), "/dashboard")
    token = form.get("api_key", "").strip()
    error = None
    principal = None
    if not token:
        error = "Enter your API key."
    else:
        try:
            principal = await request.app.state.keys.authenticate(token)
        except AuthError as exc:
            error = f"Sign-in failed: {exc or 'invalid API key'}. Check the key (`infermeter keys create` makes one)."
    if principal is not None and principal.kind == "admin":
        error, principal = "That is the admin token: sign in on the admin sign-in page (/admin/signin).", None
    elif principal is not None and principal.kind != "customer":
        error, principal = "Producer tokens cannot sign in to the dashboards.", None
    if principal is None:
        return render(request, "signin.html", 401, admin=False, error=error, next=target, reason=None,
                      signed_out=False)
    ttl = request.app.state.settings.session_ttl_s
    session = Session("customer", time.time() + ttl, principal.customer_id, principal.api_key_id)
    return _start_session(request, session, target if target.startswith("/dashboard") else "/dashboard")


@router.post("/admin/signin")
async def admin_signin(request: Request) -> Response:
    form = await _form(request)
    if (refused := _csrf_refused(request, form)) is not None:
        return refused
    target = _safe_next(form.get("next"), "/admin/ops")
    token = form.get("admin_token", "").strip()
    settings = request.app.state.settings
    if not token or not hmac.compare_digest(token.encode(), settings.admin_token.encode()):
        return render(request, "signin.html", 401, admin=True, next=target, reason=None, signed_out=False,
                      error="Sign-in failed: that is not the admin token (INFERMETER_ADMIN_TOKEN).")
    session = Session("admin", time.time() + settings.session_ttl_s,
                      admin_fingerprint=_signer(request).admin_fingerprint(settings.admin_token))
    return _start_session(request, session, target)


@router.post("/signout")
async def signout(request: Request) -> Response:
    form = await _form(request)
    if (refused := _csrf_refused(request, form)) is not None:
        return refused
    _, session = read_session(_signer(request), request.cookies.get(SESSION_COOKIE))
    target = "/admin/signin?signed_out=1" if session and session.kind == "admin" else "/signin?signed_out=1"
    response = RedirectResponse(target, status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="lax", secure=_secure(request))
    _set_cookie(response, request, CSRF_COOKIE, new_nonce(), None)
    return response


# --- the customer dashboard ----------------------------------------------------------------------

CUSTOMER_CHARTS = ("tokens", "requests", "cache_hit", "gpu", "tasks", "summary")
ALL_PARTS = frozenset({"usage", "gpu", "tasks"})
# what each data endpoint reads (an endpoint reads only its own part: bench.dashboards)
CHART_PARTS = {"tokens": {"usage"}, "requests": {"usage"}, "cache_hit": {"usage"}, "gpu": {"gpu"},
               "tasks": {"tasks"}, "summary": ALL_PARTS}


@contextmanager
def _reads(conn):
    """Reads without a transaction (each statement sees what is committed, as it would in a READ
    COMMITTED transaction): no BEGIN, and no ROLLBACK when the connection goes back to the pool
    (bench.dashboards; psycopg's pipeline mode was slower here than these plain round trips)."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        yield  # already in a transaction: read in it
        return
    conn.autocommit = True
    try:
        yield
    finally:
        if not conn.closed:  # a broken connection: the pool discards it
            conn.autocommit = False


def _view_target(viewer: Viewer, params: dict[str, str | None]) -> tuple[Window, str | None, str | None]:
    """The window, customer and model a customer view shows (TimeInputError for bad times)."""
    window = views.page_window(params.get("from"), params.get("to"), now=now(), default=timedelta(days=7))
    customer = viewer.customer_id if not viewer.is_admin else params.get("customer_id")
    return window, customer, params.get("model") or None


def _customer_view(request: Request, viewer: Viewer, params: dict[str, str | None], *, spend: bool,
                   parts: frozenset[str] | set[str] = ALL_PARTS, billing: bool = False, models: bool = True,
                   totals_only: bool = False) -> dict:
    window, customer, model = _view_target(viewer, params)
    settings = request.app.state.settings
    with request.app.state.pool.connection() as conn:
        if customer is None:  # an admin who has not picked a customer yet
            customers = sorted({r["customer_id"] for r in views.queries.usage(conn, window)})
            return {"window": window, "customer_id": None, "customers": customers}
        with _reads(conn):
            usage = views.customer_usage(conn, window, customer, model, models=models, totals_only=totals_only) \
                if "usage" in parts else None
            gpu = views.customer_gpu(conn, window, customer, totals_only=totals_only) if "gpu" in parts else None
            tasks = views.customer_tasks(conn, window, customer) if "tasks" in parts else None
        result = {"window": window, "customer_id": customer, "model": model, "usage": usage, "gpu": gpu,
                  "tasks": tasks, "spend": None, "invoices": None, "current_period": None}
        if spend:
            book, rated = _rated_spend(conn, settings, window, customer)
            result["spend"] = views.spend_view(book, rated, tasks["totals"]["succeeded"])
        if billing and extensions.PROVIDERS.invoices:  # the page's billing sections (their endpoints: below)
            result["invoices"] = extensions.PROVIDERS.invoices(conn, customer)
        if billing and extensions.PROVIDERS.current_period_spend:
            result["current_period"] = extensions.PROVIDERS.current_period_spend(
                conn, customer, billing_now(request), period=params.get("period") or None)
    return result


def _rated_spend(conn, settings, window: Window, customer: str) -> tuple[views.PriceBook, Decimal]:
    """The customer's book (its plan's, else the baseline) and its spend over the window under it."""
    provided = extensions.PROVIDERS.customer_price_book
    book = (provided(conn, customer, window.start) if provided else None) or views.baseline_book(settings)
    with _reads(conn):
        return book, views.rated_spend(conn, window, customer, book, views.cost_model(settings))


def _pooled_rated_spend(request: Request, window: Window, customer: str) -> tuple[views.PriceBook, Decimal]:
    with request.app.state.pool.connection() as conn:
        return _rated_spend(conn, request.app.state.settings, window, customer)


async def _chart_view(pool, viewer: Viewer, params: dict[str, str | None], parts: set[str] | frozenset[str], *,
                      totals_only: bool = False) -> dict:
    """What `_customer_view` gives a chart's data endpoint (no spend, no billing), read in the event
    loop from the async read pool: the same statements (metering.queries' `*_async` twins), no hop to
    a worker thread (bench.dashboards). No model list: no data endpoint answers it. `totals_only` (the
    summary): usage and GPU totals from per-model and per-deployment sums, no series."""
    window, customer, model = _view_target(viewer, params)
    reads = {"usage": partial(views.customer_usage_async, window=window, customer_id=customer, model=model,
                              models=False, totals_only=totals_only),
             "gpu": partial(views.customer_gpu_async, window=window, customer_id=customer, totals_only=totals_only),
             "tasks": partial(views.customer_tasks_async, window=window, customer_id=customer)}
    wanted = [part for part in ("usage", "gpu", "tasks") if part in parts]
    if len(wanted) == 1:
        found = {wanted[0]: await _pooled_read(pool, reads[wanted[0]])}
    else:  # the summary: each data set on its own pooled connection, at once
        found = dict(zip(wanted, await asyncio.gather(*(_pooled_read(pool, reads[p]) for p in wanted)), strict=True))
    return {"window": window, "customer_id": customer, "model": model, "usage": found.get("usage"),
            "gpu": found.get("gpu"), "tasks": found.get("tasks")}


async def _pooled_read(pool, read):
    async with pool.connection() as conn:
        return await read(conn)


async def _summary_view(request: Request, pool, viewer: Viewer, params: dict[str, str | None]) -> dict:
    """What `_customer_view` gives the summary (spend, no billing), in two halves at once: the spend
    (the book lookup and pricing's synchronous rating) in a worker thread on the sync pool while the
    three data sets are read in the event loop from the async read pool (bench.dashboards)."""
    window, customer, _ = _view_target(viewer, params)  # TimeInputError before anything runs
    halves = await asyncio.gather(run_in_threadpool(_pooled_rated_spend, request, window, customer),
                                  _chart_view(pool, viewer, params, ALL_PARTS, totals_only=True),
                                  return_exceptions=True)
    for half in halves:
        if isinstance(half, BaseException):
            raise half
    (book, rated), view = halves
    view["spend"] = views.spend_view(book, rated, view["tasks"]["totals"]["succeeded"])
    return view


# --- the async read pool of the chart data endpoints ------------------------------------------------

READ_POOL_MAX = 4


async def open_read_pool(app: FastAPI) -> None:
    """Open the pool the customer dashboard's chart data endpoints read from in the event loop
    (autocommit connections in UTC). Call it in the app's lifespan, with `close_read_pool` after: an
    app whose lifespan did not run (or a request from another event loop) reads in a worker thread
    from `state.pool`, as the pages do."""
    from psycopg_pool import AsyncConnectionPool

    from infermeter.stack import to_libpq_url

    async def utc(conn) -> None:
        await conn.execute("SET TIME ZONE 'UTC'")

    url = getattr(app.state, "database_url", None) or app.state.settings.database_url
    pool = AsyncConnectionPool(to_libpq_url(url), min_size=1, max_size=READ_POOL_MAX, open=False,
                               kwargs={"autocommit": True}, configure=utc)
    await pool.open()
    app.state.dashboards_read_pool = (asyncio.get_running_loop(), pool)


async def close_read_pool(app: FastAPI) -> None:
    held = getattr(app.state, "dashboards_read_pool", None)
    app.state.dashboards_read_pool = None
    if held is not None:
        await held[1].close()


def _read_pool(request: Request):
    """The async read pool, when it was opened in this request's event loop; else None."""
    held = getattr(request.app.state, "dashboards_read_pool", None)
    return held[1] if held is not None and held[0] is asyncio.get_running_loop() else None


def _summary(view: dict) -> dict:
    return {"customer_id": view["customer_id"], "window": views.window_json(view["window"]), "model": view["model"],
            "usage": view["usage"]["totals"], "gpu_hours": view["gpu"]["total_gpu_hours"],
            "tasks": view["tasks"]["totals"], "spend": view["spend"],
            "project_tracking": "usage is not tracked per project: every figure covers all of the customer's API keys"}


def _customer_scope(viewer: Viewer, requested: str | None) -> bool:
    """False when a customer asks for another customer's data (answered 404, existence not disclosed)."""
    return viewer.is_admin or requested in (None, viewer.customer_id)


@router.get("/dashboard")
async def dashboard(request: Request) -> Response:
    params = dict(request.query_params)
    try:
        viewer = await _viewer(request, admin=False)
    except SignInNeeded as exc:
        return _sign_in_response(request, exc, data=False)
    if not _customer_scope(viewer, params.get("customer_id")):
        return _not_found(request, viewer, data=False)
    try:
        view = await run_in_threadpool(_customer_view, request, viewer, params, spend=True, billing=True)
    except TimeInputError as exc:
        return _bad_input(request, viewer, False, str(exc))
    query = urllib.parse.urlencode({k: v for k, v in params.items()
                                    if k in ("from", "to", "model", "customer_id", "period") and v})
    charts = []
    if view["customer_id"] is not None:
        charts = _chart_context(views.customer_charts(view["usage"], view["gpu"], view["tasks"]), "/dashboard/data", query)
    return render(request, "customer.html", viewer=viewer, view=view, charts=charts, query=query,
                  window=views.window_json(view["window"]), project_id=viewer.principal.project_id,
                  project_asked=params.get("project"), summary_json=f"/dashboard/data/summary.json?{query}",
                  summary_csv=f"/dashboard/data/summary.csv?{query}", billing_query=_billing_query(view, params), request_params=params)


CUSTOMER_DATA = _chart_names(CUSTOMER_CHARTS)


@router.get("/dashboard/data/{name}", **_data_route(CUSTOMER_DATA, _WINDOW_QUERY + [
    {"name": "model", "in": "query", "required": False, "schema": {"type": "string"}},
    {"name": "customer_id", "in": "query", "required": False, "schema": {"type": "string"},
     "description": "admins: required; customers: their own id or nothing"}], admin=False))
async def dashboard_data(request: Request, name: Annotated[str, _name_param(CUSTOMER_DATA)]) -> Response:
    chart, _, fmt = name.partition(".")
    params = dict(request.query_params)
    if chart not in CUSTOMER_CHARTS or fmt not in ("json", "csv"):
        return JSONResponse({"error": {"message": "not found", "code": "not_found"}}, status_code=404)
    try:
        viewer = await _viewer(request, admin=False)
    except SignInNeeded as exc:
        return _sign_in_response(request, exc, data=True)
    if not _customer_scope(viewer, params.get("customer_id")):
        return _not_found(request, viewer, data=True)
    if viewer.is_admin and not params.get("customer_id"):
        return _bad_input(request, viewer, True, "customer_id is required for admin credentials")
    try:
        view = await _data_view(request, _read_pool(request), viewer, params, chart)
    except TimeInputError as exc:
        return _bad_input(request, viewer, True, str(exc))
    if chart == "summary":
        summary = _summary(view)
        if fmt == "json":
            return _json(summary)
        flat = {"customer_id": summary["customer_id"], **summary["window"],
                **{k: v for k, v in summary["usage"].items()}, "gpu_hours": summary["gpu_hours"],
                **{f"tasks_{k}": v for k, v in summary["tasks"].items()},
                **{f"spend_{k}": v for k, v in (summary["spend"] or {}).items()}}
        return _csv([flat], "summary")
    found = _chart(view, chart)
    return _json(found.to_json()) if fmt == "json" else _csv(found.rows, chart)


async def _data_view(request: Request, pool, viewer: Viewer, params: dict[str, str | None], chart: str) -> dict:
    """What a data endpoint shows: in the event loop from the async read pool when it is open in this
    loop, else in a worker thread from the sync pool (TimeInputError for bad times)."""
    if pool is not None and chart == "summary":
        return await _summary_view(request, pool, viewer, params)
    if pool is not None:
        return await _chart_view(pool, viewer, params, CHART_PARTS[chart])
    return await run_in_threadpool(_customer_view, request, viewer, params, spend=chart == "summary",
                                   parts=CHART_PARTS[chart], models=False, totals_only=chart == "summary")


def _chart(view: dict, chart: str) -> views.Chart:
    """One chart of a data endpoint's view (not the summary)."""
    if chart in ("tokens", "requests", "cache_hit"):
        found = {c.id: c for c in views.usage_charts(view["usage"])}[chart]
    else:
        found = views.gpu_chart(view["gpu"]) if chart == "gpu" else views.tasks_chart(view["tasks"])
    found.extra = {"customer_id": view["customer_id"], "window": views.window_json(view["window"]),
                   "model": view["model"]}
    return found


# --- the chart data endpoints' fast path ---------------------------------------------------------------
# GET /dashboard/data/{chart}.json with a customer's bearer API key is what a dashboard polls and what
# bench.dashboards times against the bare SQL: answered by an ASGI middleware before FastAPI's routing
# (matching the path against every route of the API app, the endpoint's parameter handling) with the
# same functions the route calls. Anything else, and any request it cannot answer as the route would
# (no bearer key, an admin or producer token, a bad key, another customer's id, bad times, a database
# error, no read pool in this event loop), goes on to the route unchanged: only reads have happened.

_FAST_PATHS = {f"/dashboard/data/{chart}.json": chart for chart in CUSTOMER_CHARTS}


class DataFastPath:
    """ASGI middleware: the customer chart data endpoints' fast path (above). Add it to an app that
    mounts `router` (app.add_middleware(DataFastPath))."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and not scope.get("root_path"):
            chart = _FAST_PATHS.get(scope["path"])
            if chart is not None:
                body = await _fast_data(scope, receive, chart)
                if body is not None:
                    # the headers `_json`'s Response sends, in its order
                    await send({"type": "http.response.start", "status": 200, "headers": [
                        (b"cache-control", b"no-store"), (b"content-length", str(len(body)).encode("latin-1")),
                        (b"content-type", b"application/json")]})
                    await send({"type": "http.response.body", "body": body})
                    return
        await self.app(scope, receive, send)


async def _fast_data(scope, receive, chart: str) -> bytes | None:
    """`dashboard_data`'s JSON body for a customer's bearer key, or None: the route answers. Reads the
    headers and the query as Starlette's Request does (the first Authorization header; the last value
    of a repeated query parameter)."""
    authorization = next((value for name, value in scope["headers"] if name == b"authorization"), None)
    request = Request(scope, receive)
    pool = _read_pool(request)
    if not authorization or pool is None:
        return None
    try:
        principal = await request.app.state.keys.authenticate(bearer_token(authorization.decode("latin-1")))
    except AuthError:
        return None
    params = dict(urllib.parse.parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
    if principal.kind != "customer" or params.get("customer_id") not in (None, principal.customer_id):
        return None
    try:
        view = await _data_view(request, pool, Viewer(principal, None), params, chart)
    except Exception:  # noqa: BLE001 - bad times, a database error: the route answers it (only reads ran)
        return None
    return orjson.dumps(_summary(view) if chart == "summary" else _chart(view, chart).to_json())


# --- the customer dashboard: billing (registered by the roof through dashboards.extensions) ------------

INVOICE_COLUMNS = ("number", "period", "period_start", "period_end", "status", "status_label", "currency", "subtotal",
                   "credits_applied", "total", "issued_at", "id")
LINE_COLUMNS = ("invoice_number", "invoice_period", "meter", "model", "group", "kind", "quantity", "unit_price",
                "amount", "period", "adjustment")


def _billing_query(view: dict, params: dict[str, str]) -> str:
    """The query the billing links carry: an admin's customer_id and the previewed period."""
    keep = {"customer_id": params.get("customer_id") if view.get("customer_id") else None,
            "period": params.get("period")}
    return urllib.parse.urlencode({k: v for k, v in keep.items() if v})


def _invoice_lines(invoices: list[dict]) -> list[dict]:
    return [{"invoice_number": i["number"], "invoice_period": i["period"], **line}
            for i in invoices for line in i["lines"]]


async def _billing_viewer(request: Request, data: bool) -> tuple[Viewer, str] | Response:
    """The viewer and the customer whose billing it may see (its own; an admin names one), or the
    response that refuses (sign in, 404 for another customer, 400 for an admin without customer_id, 404
    while billing is not wired)."""
    try:
        viewer = await _viewer(request, admin=False)
    except SignInNeeded as exc:
        return _sign_in_response(request, exc, data=data)
    requested = request.query_params.get("customer_id")
    if not _customer_scope(viewer, requested) or extensions.PROVIDERS.invoices is None:
        return _not_found(request, viewer, data=data)
    customer = viewer.customer_id if not viewer.is_admin else requested
    if not customer:
        return _bad_input(request, viewer, data, "customer_id is required for admin credentials")
    return viewer, customer


async def _customer_invoices(request: Request, customer: str) -> list[dict]:
    """The customer's invoices with their lines, from billing's registered provider."""

    def load() -> list[dict]:
        with request.app.state.pool.connection() as conn:
            return extensions.PROVIDERS.invoices(conn, customer)

    return await run_in_threadpool(load)


@router.get("/dashboard/invoices.{fmt}")
async def customer_invoices_data(request: Request, fmt: str) -> Response:
    """The customer's invoices (JSON: with their lines; CSV: one row per invoice; lines.csv below)."""
    if fmt not in ("json", "csv"):
        return JSONResponse({"error": {"message": "not found", "code": "not_found"}}, status_code=404)
    found = await _billing_viewer(request, data=True)
    if isinstance(found, Response):
        return found
    _, customer = found

    invoices = await _customer_invoices(request, customer)
    if fmt == "json":
        return _json({"customer_id": customer, "invoices": invoices})
    return _csv([{k: i.get(k) for k in INVOICE_COLUMNS} for i in invoices], "invoices")


@router.get("/dashboard/invoice-lines.csv")
async def customer_invoice_lines_csv(request: Request) -> Response:
    """Every line of the customer's invoices, one row each, with the invoice's number and period."""
    found = await _billing_viewer(request, data=True)
    if isinstance(found, Response):
        return found
    _, customer = found

    lines = _invoice_lines(await _customer_invoices(request, customer))
    return _csv([{k: r.get(k) for k in LINE_COLUMNS} for r in lines], "invoice-lines")


@router.get("/dashboard/invoices/{name}")
async def customer_invoice(request: Request, name: str) -> Response:
    """One invoice of the signed-in customer: its page, `.json` or `.csv` (its lines). Another
    customer's invoice id answers 404, as an unknown one does."""
    invoice_id, _, fmt = name.partition(".")
    data = fmt != ""
    if fmt not in ("", "json", "csv"):
        return JSONResponse({"error": {"message": "not found", "code": "not_found"}}, status_code=404)
    found = await _billing_viewer(request, data=data)
    if isinstance(found, Response):
        return found
    viewer, customer = found

    def load() -> dict | None:
        provider = extensions.PROVIDERS.invoice
        if provider is None:
            return None
        with request.app.state.pool.connection() as conn:
            return provider(conn, customer, invoice_id)

    invoice = await run_in_threadpool(load)
    if invoice is None:
        return _not_found(request, viewer, data=data)
    if fmt == "json":
        return _json(invoice)
    if fmt == "csv":
        return _csv([{k: r.get(k) for k in LINE_COLUMNS} for r in _invoice_lines([invoice])], f"invoice-{invoice_id}")
    query = urllib.parse.urlencode({"customer_id": customer} if viewer.is_admin else {})
    return render(request, "invoice.html", viewer=viewer, invoice=invoice, query=query)


@router.get("/dashboard/current-period.{fmt}")
async def current_period_data(request: Request, fmt: str) -> Response:
    """Current-period spend (the billing preview, `infermeter invoice preview`) against the budget or the
    prepaid credit balance; `?period=YYYY-MM` previews another period. CSV: one row per line."""
    if fmt not in ("json", "csv"):
        return JSONResponse({"error": {"message": "not found", "code": "not_found"}}, status_code=404)
    found = await _billing_viewer(request, data=True)
    if isinstance(found, Response):
        return found
    viewer, customer = found
    if extensions.PROVIDERS.current_period_spend is None:
        return _not_found(request, viewer, data=True)

    def load() -> dict:
        with request.app.state.pool.connection() as conn:
            return extensions.PROVIDERS.current_period_spend(conn, customer, billing_now(request),
                                                              period=request.query_params.get("period") or None)

    try:
        spend = await run_in_threadpool(load)
    except TimeInputError as exc:
        return _bad_input(request, viewer, True, str(exc))
    if fmt == "json":
        return _json(spend)
    head = {k: spend.get(k) for k in ("customer_id", "period", "period_start", "period_end", "currency", "subtotal",
                                      "credits_applied", "total", "credit_balance")}
    return _csv([{**head, **line} for line in spend.get("lines", [])] or [head], "current-period")


# --- admin: pricing experiments --------------------------------------------------------------------

PRICING_CHARTS = ("overview", "customers", "caching", "retries", "shadow", "comparison")


def _pricing_view(request: Request, params: list[tuple[str, str]]) -> dict:
    single = dict(params)
    window = views.page_window(single.get("from"), single.get("to"), now=now(), default=timedelta(hours=24))
    specs = [v for k, v in params if k == "book" and v] or views.default_book_specs()
    settings = request.app.state.settings
    with request.app.state.pool.connection() as conn:
        choices = views.book_choices(conn, settings)
        shadow = views.live_shadow(conn, settings, now())
        from pricing_service.books import list_versions

        versions = list_versions(conn)
    report = views.pricing_comparison(_database_url(request), window, specs, settings.pricing_cost_model)
    return {"window": window, "specs": specs, "choices": choices, "report": report, "shadow": shadow,
            "versions": versions, "charts": views.pricing_charts(report, shadow)}


async def _admin_viewer(request: Request, *, data: bool) -> Viewer | Response:
    """The signed-in admin, or the response that sends anyone else away (to sign in, or 403)."""
    try:
        viewer = await _viewer(request, admin=True)
    except SignInNeeded as exc:
        return _sign_in_response(request, exc, data=data)
    refused = _admin_only(viewer, request, data)
    return viewer if refused is None else refused


def _admin_only(viewer: Viewer, request: Request, data: bool) -> Response | None:
    return None if viewer.is_admin else _forbidden(request, viewer, data)


PRICING_ERRORS: tuple[type[Exception], ...] = (TimeInputError, ValueError)


@router.get("/admin/pricing")
async def pricing_page(request: Request, uploaded: str | None = None) -> Response:
    viewer = await _admin_viewer(request, data=False)
    if isinstance(viewer, Response):
        return viewer
    params = list(request.query_params.multi_items())
    try:
        view = await run_in_threadpool(_pricing_view, request, params)
    except PRICING_ERRORS as exc:
        return _bad_input(request, viewer, False, str(exc))
    query = urllib.parse.urlencode([(k, v) for k, v in params if k in ("from", "to", "book") and v])
    return render(request, "pricing.html", viewer=viewer, view=view, uploaded=uploaded,
                  window=views.window_json(view["window"]), query=query,
                  charts=_chart_context(view["charts"], "/admin/pricing/data", query),
                  default_effective=utc_text(view["window"].start))


PRICING_DATA = _chart_names(PRICING_CHARTS, no_csv=("comparison",))


@router.get("/admin/pricing/data/{name}", **_data_route(PRICING_DATA, _WINDOW_QUERY + [
    {"name": "book", "in": "query", "required": False, "schema": {"type": "array", "items": {"type": "string"}},
     "style": "form", "explode": True,
     "description": "books to compare (paths of book files, or stored:<id>); the first is the baseline"}],
    admin=True))
async def pricing_data(request: Request, name: Annotated[str, _name_param(PRICING_DATA)]) -> Response:
    chart, _, fmt = name.partition(".")
    if chart not in PRICING_CHARTS or fmt not in ("json", "csv") or (chart == "comparison" and fmt == "csv"):
        return JSONResponse({"error": {"message": "not found", "code": "not_found"}}, status_code=404)
    viewer = await _admin_viewer(request, data=True)
    if isinstance(viewer, Response):
        return viewer
    try:
        view = await run_in_threadpool(_pricing_view, request, list(request.query_params.multi_items()))
    except PRICING_ERRORS as exc:
        return _bad_input(request, viewer, True, str(exc))
    if chart == "comparison":
        return _json(view["report"])
    found = {c.id: c for c in view["charts"]}[chart]
    return _json(found.to_json()) if fmt == "json" else _csv(found.rows, chart)


@router.post("/admin/pricing/books")
async def upload_book(request: Request) -> Response:
    viewer = await _admin_viewer(request, data=False)
    if isinstance(viewer, Response):
        return viewer
    form = await _form(request)
    if (refused := _csrf_refused(request, form)) is not None:
        return refused
    text = form.get("yaml", "")
    if not text.strip():
        return _bad_input(request, viewer, False, "Paste a price book (YAML) or choose a file.")

    def store() -> str:
        from pricing_service.books import import_book

        at = parse_time(form.get("effective_from") or "", "effective from")
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / (Path(form.get("filename") or "uploaded.yaml").name or "uploaded.yaml")
            path.write_text(text, encoding="utf-8")
            with request.app.state.pool.connection() as conn:
                book, _ = import_book(conn, path, at)
        return book.id

    try:
        book_id = await run_in_threadpool(store)
    except (ValueError, OSError) as exc:
        return _bad_input(request, viewer, False, f"The price book was not stored: {exc}")
    query = urllib.parse.urlencode({"uploaded": book_id})
    return RedirectResponse(f"/admin/pricing?{query}", status_code=303)


# --- admin: operations -----------------------------------------------------------------------------

OPS_CHARTS = ("ingest", "deployments", "dead_letters", "consumers", "gateways", "reconcile")


def _reconcile(request: Request, from_text: str, to_text: str) -> dict:
    from metering.reconcile import reconcile

    window = Window(parse_time(from_text, "reconcile from"), parse_time(to_text, "reconcile to"))
    with request.app.state.pool.connection() as conn:
        result = reconcile(conn, window)
    record = {"ran_at": utc_text(now()), "window": views.window_json(window), "ok": result.ok,
              "checked": result.checked,
              "differences": [{"customer_id": d.customer_id, "meter": d.meter, "raw": str(d.raw),
                               "rollup": str(d.rollup)} for d in result.differences[:50]],
              "difference_count": len(result.differences)}
    request.app.state.dashboards_last_reconcile = record
    return record


def _ops_view(request: Request, params: dict[str, str]) -> dict:
    at = now()
    window = views.page_window(params.get("from"), params.get("to"), now=at, default=timedelta(hours=24))
    settings = request.app.state.settings
    with request.app.state.pool.connection() as conn:
        ingest = views.ops_ingest(conn, at)
        dead = views.ops_dead_letters(conn)
        deployments = views.ops_deployments(conn, window)
    urls = gateway_metrics.configured_urls(settings.gateway_metrics_urls)
    return {"window": window, "ingest": ingest, "dead_letters": dead, "deployments": deployments,
            "gateway_urls": urls, "gateways": gateway_metrics.scrape(urls) if urls else [],
            "reconcile": getattr(request.app.state, "dashboards_last_reconcile", None),
            "charts": views.ops_charts(ingest, deployments, dead)}


@router.get("/admin/ops")
async def ops_page(request: Request) -> Response:
    viewer = await _admin_viewer(request, data=False)
    if isinstance(viewer, Response):
        return viewer
    params = dict(request.query_params)
    try:
        if params.get("reconcile_from") and params.get("reconcile_to"):
            await run_in_threadpool(_reconcile, request, params["reconcile_from"], params["reconcile_to"])
        view = await run_in_threadpool(_ops_view, request, params)
    except TimeInputError as exc:
        return _bad_input(request, viewer, False, str(exc))
    query = urllib.parse.urlencode({k: v for k, v in params.items() if k in ("from", "to") and v})
    end = views.floor_hour(now())
    return render(request, "ops.html", viewer=viewer, view=view, window=views.window_json(view["window"]),
                  query=query, charts=_chart_context(view["charts"], "/admin/ops/data", query),
                  reconcile_default={"from": utc_text(end - timedelta(hours=24)), "to": utc_text(end)})


OPS_DATA = _chart_names(OPS_CHARTS)


@router.get("/admin/ops/data/{name}", **_data_route(OPS_DATA, _WINDOW_QUERY, admin=True))
async def ops_data(request: Request, name: Annotated[str, _name_param(OPS_DATA)]) -> Response:
    chart, _, fmt = name.partition(".")
    if chart not in OPS_CHARTS or fmt not in ("json", "csv"):
        return JSONResponse({"error": {"message": "not found", "code": "not_found"}}, status_code=404)
    viewer = await _admin_viewer(request, data=True)
    if isinstance(viewer, Response):
        return viewer
    try:
        view = await run_in_threadpool(_ops_view, request, dict(request.query_params))
    except TimeInputError as exc:
        return _bad_input(request, viewer, True, str(exc))
    tables = {
        "consumers": {"rows": view["ingest"]["consumers"], "delay": view["ingest"]["delay"]},
        "gateways": {"configured": view["gateway_urls"], "rows": view["gateways"]},
        "reconcile": {"recorded": view["reconcile"] is not None, "rows": [view["reconcile"]] if view["reconcile"] else []},
        "dead_letters": {"rows": view["dead_letters"]},
    }
    if chart in tables:
        payload = {"chart": chart, **tables[chart]}
        if fmt == "json":
            return _json(payload)
        rows = payload["rows"]
        if chart == "gateways":
            rows = [{"url": g["url"], "ok": g["ok"], **s} for g in rows for s in (g["spools"] or [{}])]
        return _csv(rows, chart)
    found = {c.id: c for c in view["charts"]}[chart]
    return _json(found.to_json()) if fmt == "json" else _csv(found.rows, chart)


# --- admin: finance (billing's extension point) ----------------------------------------------------


def _finance_view(request: Request, period: str | None) -> dict:
    with request.app.state.pool.connection() as conn:
        content = extensions.PROVIDERS.finance_page(conn, period or None, now())
    charts = []
    for t in content["tables"]:
        if t.get("chart"):
            c = t["chart"]
            charts.append(views.Chart(t["id"], t["title"], c["kind"], c["x"], [tuple(s) for s in c["series"]],
                                      t["rows"], note=t.get("note", ""), y_title=c.get("y_title", ""), x_title=c["x"],
                                      extra={"period": content["period"]}, x_type=c.get("x_type", "")))
    return {**content, "charts": charts}


@router.get("/admin/finance")
async def finance_page(request: Request) -> Response:
    viewer = await _admin_viewer(request, data=False)
    if isinstance(viewer, Response):
        return viewer
    if extensions.PROVIDERS.finance_page is None:
        return render(request, "finance.html", viewer=viewer, content=None)
    try:
        content = await run_in_threadpool(_finance_view, request, request.query_params.get("period"))
    except TimeInputError as exc:
        return _bad_input(request, viewer, False, str(exc))
    query = urllib.parse.urlencode({"period": content["period"]})
    charts = {c["chart"].id: c for c in _chart_context(content["charts"], "/admin/finance/data", query)}
    return render(request, "finance.html", viewer=viewer, content=content, charts=charts, query=query)


@router.get("/admin/finance/data/{name}")
async def finance_data(request: Request, name: str) -> Response:
    """One table of the finance page: `{table}.json` or `.csv`, `?period=YYYY-MM`."""
    table, _, fmt = name.partition(".")
    if fmt not in ("json", "csv") or extensions.PROVIDERS.finance_page is None:
        return JSONResponse({"error": {"message": "not found", "code": "not_found"}}, status_code=404)
    viewer = await _admin_viewer(request, data=True)
    if isinstance(viewer, Response):
        return viewer
    try:
        content = await run_in_threadpool(_finance_view, request, request.query_params.get("period"))
    except TimeInputError as exc:
        return _bad_input(request, viewer, True, str(exc))
    found = {t["id"]: t for t in content["tables"]}.get(table)
    if found is None:
        return _not_found(request, viewer, data=True)
    if fmt == "json":
        return _json({"table": table, "title": found["title"], "period": content["period"], "rows": found["rows"]})
    return _csv([{k: r.get(k) for k in found["columns"]} for r in found["rows"]], f"{table}-{content['period']}")


@router.get("/admin/finance/exports/{name}")
async def finance_export(request: Request, name: str, period: str | None = None) -> Response:
    """A finance export for the signed-in admin (`{kind}.{csv|parquet}?period=`): the same bytes as
    `infermeter export KIND` and GET /v1/billing/exports/KIND, which takes the admin bearer token."""
    kind, _, fmt = name.partition(".")
    if extensions.PROVIDERS.finance_export is None:
        return JSONResponse({"error": {"message": "not found", "code": "not_found"}}, status_code=404)
    viewer = await _admin_viewer(request, data=True)
    if isinstance(viewer, Response):
        return viewer

    if not period:
        return _bad_input(request, viewer, True, "period is required (YYYY-MM)")

    def build() -> tuple[bytes, str, str]:
        with request.app.state.pool.connection() as conn:
            return extensions.PROVIDERS.finance_export(conn, kind, period, fmt)

    try:
        data, file_name, media = await run_in_threadpool(build)
    except ValueError as exc:  # an unknown kind, format or period
        return _bad_input(request, viewer, True, str(exc))
    return Response(data, media_type=media, headers={"Content-Disposition": f'attachment; filename="{file_name}"',
                                                      "Cache-Control": "no-store"})


# --- metering's Prometheus metrics ---------------------------------------------------------------


@router.get("/metrics/metering", description="metering's Prometheus metrics (no credentials: a scrape target)",
            responses={200: {"description": "Prometheus text exposition format",
                             "content": {"text/plain": {"schema": {"type": "string"}}}}})
def metering_prometheus(request: Request) -> Response:
    state = request.app.state
    reg = getattr(state, "dashboards_metering_registry", None)
    if reg is None:
        reg = state.dashboards_metering_registry = metering_metrics.registry(state.pool)
    return Response(metering_metrics.render(reg), media_type=metering_metrics.CONTENT_TYPE)


# the data endpoints and the metrics are in the OpenAPI document (the router's pages are not)
for _route in router.routes:
    if getattr(_route, "endpoint", None) in (dashboard_data, pricing_data, ops_data, metering_prometheus):
        _route.include_in_schema = True


# --- a dashboards-only app ---------------------------------------------------------------------------


def create_dashboard_app(settings, database_url: str, keys) -> FastAPI:
    """The pages alone (no /v1 API): `infermeter serve dashboards`. `keys` is the key store."""
    from contextlib import asynccontextmanager

    from psycopg_pool import ConnectionPool

    from infermeter.stack import to_libpq_url

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
    app.add_exception_handler(psycopg.DataError, data_error_handler)  # e.g. a NUL in a filter: 400, as on the API app
    app.add_middleware(DataFastPath)

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/dashboard", status_code=303)

    app.include_router(router)
    return app
