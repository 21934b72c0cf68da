"""The answers the pages and data endpoints build: a page from its template (with the security
headers and the forms' CSRF token), JSON, CSV, the charts a page embeds, and the refusals (403, 404,
400) as a page or as JSON in the API's {"error": {"message", "code"}} shape."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import orjson
from fastapi import Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from dashboards import views
from dashboards.sessions import CSRF_COOKIE, CSRF_FIELD
from dashboards.web.cookies import csrf_nonce, set_cookie, signer
from pricing.meters import FAILED_TASKS, GPU_METER, REQUESTS, SUCCESSFUL_TASKS, TASK_ATTEMPTS, TOKEN_METERS

if TYPE_CHECKING:
    from dashboards.web.auth import Viewer

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"

_templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined
)
_templates.filters["num"] = lambda v: "-" if v is None else (f"{v:,}" if isinstance(v, int) else str(v))
_templates.filters["pct"] = lambda v: "-" if v is None else f"{float(v) * 100:.1f}%"
_templates.filters["duration"] = lambda s: views.duration_text(s)

# what one unit of a meter is, as a unit price is shown: (shown per how many units, the words)
TOKENS_PER_PRICE = (Decimal(1_000_000), "per 1M tokens")
PRICE_UNITS = {**dict.fromkeys(TOKEN_METERS, TOKENS_PER_PRICE), GPU_METER: (Decimal(3600), "per GPU-hour"),
               REQUESTS: (Decimal(1), "per request"), SUCCESSFUL_TASKS: (Decimal(1), "per successful task"),
               FAILED_TASKS: (Decimal(1), "per failed task"), TASK_ATTEMPTS: (Decimal(1), "per task attempt")}


def quantity_text(value: str | None) -> str:
    """A quantity with thousands separators, its decimals as given ("1234567.5" -> "1,234,567.5")."""
    return "-" if value is None or value == "" else format(Decimal(value), ",f")


def unit_price_text(unit_price: str | None, meter: str, currency: str) -> str:
    """A unit price (billing's, per single unit) with its currency and unit: tokens per 1M, GPU
    time per GPU-hour ("0.00000155", "output_tokens", "USD" -> "1.55 USD per 1M tokens")."""
    if unit_price is None:
        return "-"
    per, words = PRICE_UNITS.get(meter, (Decimal(1), f"per unit of {meter}"))
    shown = Decimal(unit_price) * per
    shown = shown.quantize(Decimal(1)) if shown == shown.to_integral() else shown.normalize()
    return f"{format(shown, ',f')} {currency} {words}"


def moment_text(value: str | datetime | None) -> str:
    """An instant to the second, in UTC ("2026-12-03T01:02:03.456+00:00" -> "2026-12-03 01:02:03 UTC")."""
    if value is None or value == "":
        return "-"
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


_templates.filters["qty"] = quantity_text
_templates.filters["picker"] = lambda text: text[:16]  # a UTC time as a datetime-local picker shows it (minutes)
_templates.filters["moment"] = moment_text
_templates.globals["unit_price"] = unit_price_text

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; object-src 'none'; "
    "frame-ancestors 'none'; base-uri 'self'; form-action 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def render(request: Request, template: str, status: int = 200, *, viewer: Viewer | None = None,
           nonce: str | None = None, **context: Any) -> HTMLResponse:
    fresh = False
    if nonce is None:
        nonce, fresh = csrf_nonce(request)
    body = _templates.get_template(template).render(
        viewer=viewer, csrf_field=CSRF_FIELD, csrf=signer(request).csrf_token(nonce), path=request.url.path,
        **context,
    )
    response = HTMLResponse(body, status_code=status, headers=SECURITY_HEADERS)
    if fresh or nonce != request.cookies.get(CSRF_COOKIE):
        set_cookie(response, request, CSRF_COOKIE, nonce, None)
    return response


def plain_page(template: str, status: int, headers: dict[str, str], **context: Any) -> HTMLResponse:
    """A page answered without the request's session or forms (no viewer, no CSRF token): a refusal
    made before the app runs (dashboards.web.backoff)."""
    body = _templates.get_template(template).render(viewer=None, csrf_field=CSRF_FIELD, csrf="", path="", **context)
    return HTMLResponse(body, status_code=status, headers={**SECURITY_HEADERS, **headers})


def error_json(status: int, message: str, code: str) -> JSONResponse:
    """An error in the API's shape: {"error": {"message", "code"}}."""
    return JSONResponse({"error": {"message": message, "code": code}}, status_code=status)


def forbidden(request: Request, viewer: Viewer, data: bool) -> Response:
    message = "This page is for administrators. Sign in with the admin token at /admin/signin."
    if data:
        return error_json(403, message, "forbidden")
    return render(request, "message.html", 403, viewer=viewer, title="Administrators only", message=message)


def not_found(request: Request, viewer: Viewer, data: bool) -> Response:
    if data:
        return error_json(404, "not found", "not_found")
    return render(request, "message.html", 404, viewer=viewer, title="Not found", message="There is nothing here.")


def bad_input(request: Request, viewer: Viewer, data: bool, message: str) -> Response:
    if data:
        return error_json(400, message, "invalid_query")
    return render(request, "message.html", 400, viewer=viewer, title="Check the filters", message=message)


def csv_response(rows: list[dict], name: str) -> Response:
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


def json_response(payload: Any) -> Response:
    """JSON as JSONResponse writes it (compact, UTF-8), encoded by orjson."""
    return Response(orjson.dumps(payload), media_type="application/json", headers={"Cache-Control": "no-store"})


def chart_context(charts: list[views.Chart], base: str, query: str) -> list[dict]:
    """What a page's template needs of each chart: the chart, its plotly spec (JSON safe inside a
    script element) and the URLs of its JSON and CSV."""
    suffix = f"?{query}" if query else ""
    return [{"chart": c, "spec": json.dumps(c.spec(), default=str).replace("<", "\\u003c").replace("&", "\\u0026"),
             "json_url": f"{base}/{c.id}.json{suffix}", "csv_url": f"{base}/{c.id}.csv{suffix}"} for c in charts]
