"""The pricing experiments page (admins): candidate books compared over a window, the live shadow
rating, and the upload of a price book version.

    GET  /admin/pricing                       pricing experiments (?from=&to=&book=...), live shadow rating
    GET  /admin/pricing/data/{chart}.{json|csv}  overview, customers, caching, retries, shadow, comparison (json)
    POST /admin/pricing/books                 store an uploaded price book version (YAML)
"""

from __future__ import annotations

import tempfile
import urllib.parse
from datetime import timedelta
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from dashboards import views
from dashboards.web.auth import admin_viewer, csrf_refused, form
from dashboards.web.openapi import WINDOW_QUERY, chart_names, data_route, name_param
from dashboards.web.responses import bad_input, chart_context, csv_response, error_json, json_response, render
from dashboards.web.state import database_url, now
from infermeter.times import TimeInputError, parse_time, utc_text

router = APIRouter()

PRICING_CHARTS = ("overview", "customers", "caching", "retries", "shadow", "comparison")


def _pricing_view(request: Request, params: list[tuple[str, str]]) -> dict:
    single = dict(params)
    window = views.page_window(single.get("from"), single.get("to"), now=now(request), default=timedelta(hours=24))
    specs = [v for k, v in params if k == "book" and v] or views.default_book_specs()
    settings = request.app.state.settings
    with request.app.state.pool.connection() as conn:
        choices = views.book_choices(conn, settings)
        shadow = views.live_shadow(conn, settings, now(request))
        from pricing_service.books import list_versions

        versions = list_versions(conn)
    report = views.pricing_comparison(database_url(request.app.state), window, specs, settings.pricing_cost_model)
    return {"window": window, "specs": specs, "choices": choices, "report": report, "shadow": shadow,
            "versions": versions, "charts": views.pricing_charts(report, shadow)}


PRICING_ERRORS: tuple[type[Exception], ...] = (TimeInputError, ValueError)


@router.get("/admin/pricing", include_in_schema=False)
async def pricing_page(request: Request, uploaded: str | None = None) -> Response:
    viewer = await admin_viewer(request, data=False)
    if isinstance(viewer, Response):
        return viewer
    params = views.picked_times(request.query_params.multi_items(), ("from", "to"))
    try:
        view = await run_in_threadpool(_pricing_view, request, params)
    except PRICING_ERRORS as exc:
        return bad_input(request, viewer, False, str(exc))
    query = urllib.parse.urlencode([(k, v) for k, v in params if k in ("from", "to", "book") and v])
    return render(request, "pricing.html", viewer=viewer, view=view, uploaded=uploaded,
                  window=views.window_json(view["window"]), query=query,
                  charts=chart_context(view["charts"], "/admin/pricing/data", query),
                  default_effective=utc_text(view["window"].start))


PRICING_DATA = chart_names(PRICING_CHARTS, no_csv=("comparison",))


@router.get("/admin/pricing/data/{name}", **data_route(PRICING_DATA, WINDOW_QUERY + [
    {"name": "book", "in": "query", "required": False, "schema": {"type": "array", "items": {"type": "string"}},
     "style": "form", "explode": True,
     "description": "books to compare (paths of book files, or stored:<id>); the first is the baseline"}],
    admin=True))
async def pricing_data(request: Request, name: Annotated[str, name_param(PRICING_DATA)]) -> Response:
    chart, _, fmt = name.partition(".")
    if chart not in PRICING_CHARTS or fmt not in ("json", "csv") or (chart == "comparison" and fmt == "csv"):
        return error_json(404, "not found", "not_found")
    viewer = await admin_viewer(request, data=True)
    if isinstance(viewer, Response):
        return viewer
    try:
        view = await run_in_threadpool(_pricing_view, request, list(request.query_params.multi_items()))
    except PRICING_ERRORS as exc:
        return bad_input(request, viewer, True, str(exc))
    if chart == "comparison":
        return json_response(view["report"])
    found = {c.id: c for c in view["charts"]}[chart]
    return json_response(found.to_json()) if fmt == "json" else csv_response(found.rows, chart)


@router.post("/admin/pricing/books", include_in_schema=False)
async def upload_book(request: Request) -> Response:
    viewer = await admin_viewer(request, data=False)
    if isinstance(viewer, Response):
        return viewer
    fields = await form(request)
    if (refused := csrf_refused(request, fields)) is not None:
        return refused
    text = fields.get("yaml", "")
    if not text.strip():
        return bad_input(request, viewer, False, "Paste a price book (YAML) or choose a file.")

    def store() -> str:
        from pricing_service.books import import_book

        at = parse_time(views.picked_time(fields.get("effective_from")) or "", "effective from")
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / (Path(fields.get("filename") or "uploaded.yaml").name or "uploaded.yaml")
            path.write_text(text, encoding="utf-8")
            with request.app.state.pool.connection() as conn:
                book, _ = import_book(conn, path, at)
        return book.id

    try:
        book_id = await run_in_threadpool(store)
    except (ValueError, OSError) as exc:
        return bad_input(request, viewer, False, f"The price book was not stored: {exc}")
    query = urllib.parse.urlencode({"uploaded": book_id})
    return RedirectResponse(f"/admin/pricing?{query}", status_code=303)
