"""The finance page (admins): billing's tables of a period and its exports, from billing's views on
the app's state (dashboards.billing_views; without them the page says billing is not wired).

    GET  /admin/finance                       finance (?period=YYYY-MM)
    GET  /admin/finance/data/{table}.{json|csv}  revenue_month, revenue_customer, revenue_model, revenue_meter,
                                              invoice_status, credits
    GET  /admin/finance/exports/{kind}.{csv|parquet}?period=   the finance exports, for the signed-in admin
"""

from __future__ import annotations

import urllib.parse

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from dashboards import views
from dashboards.billing_views import BillingViews, FinanceExport
from dashboards.web.auth import admin_viewer
from dashboards.web.responses import (
    bad_input,
    chart_context,
    csv_response,
    error_json,
    json_response,
    not_found,
    render,
)
from dashboards.web.state import billing_views, now
from infermeter.times import TimeInputError

router = APIRouter(include_in_schema=False)


def _finance_view(request: Request, billing: BillingViews, period: str | None) -> dict:
    with request.app.state.pool.connection() as conn:
        content = billing.finance_page(conn, period or None, now(request))
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
    viewer = await admin_viewer(request, data=False)
    if isinstance(viewer, Response):
        return viewer
    billing = billing_views(request)
    if billing is None:
        return render(request, "finance.html", viewer=viewer, content=None)
    try:
        content = await run_in_threadpool(_finance_view, request, billing, request.query_params.get("period"))
    except TimeInputError as exc:
        return bad_input(request, viewer, False, str(exc))
    query = urllib.parse.urlencode({"period": content["period"]})
    charts = {c["chart"].id: c for c in chart_context(content["charts"], "/admin/finance/data", query)}
    return render(request, "finance.html", viewer=viewer, content=content, charts=charts, query=query)


@router.get("/admin/finance/data/{name}")
async def finance_data(request: Request, name: str) -> Response:
    """One table of the finance page: `{table}.json` or `.csv`, `?period=YYYY-MM`."""
    table, _, fmt = name.partition(".")
    billing = billing_views(request)
    if fmt not in ("json", "csv") or billing is None:
        return error_json(404, "not found", "not_found")
    viewer = await admin_viewer(request, data=True)
    if isinstance(viewer, Response):
        return viewer
    try:
        content = await run_in_threadpool(_finance_view, request, billing, request.query_params.get("period"))
    except TimeInputError as exc:
        return bad_input(request, viewer, True, str(exc))
    found = {t["id"]: t for t in content["tables"]}.get(table)
    if found is None:
        return not_found(request, viewer, data=True)
    if fmt == "json":
        return json_response({"table": table, "title": found["title"], "period": content["period"], "rows": found["rows"]})
    return csv_response([{k: r.get(k) for k in found["columns"]} for r in found["rows"]], f"{table}-{content['period']}")


@router.get("/admin/finance/exports/{name}")
async def finance_export(request: Request, name: str, period: str | None = None) -> Response:
    """A finance export for the signed-in admin (`{kind}.{csv|parquet}?period=`): the same bytes as
    `infermeter export KIND` and GET /v1/billing/exports/KIND, which takes the admin bearer token."""
    kind, _, fmt = name.partition(".")
    billing = billing_views(request)
    if billing is None:
        return error_json(404, "not found", "not_found")
    viewer = await admin_viewer(request, data=True)
    if isinstance(viewer, Response):
        return viewer

    if not period:
        return bad_input(request, viewer, True, "period is required (YYYY-MM)")

    def build() -> FinanceExport:
        with request.app.state.pool.connection() as conn:
            return billing.finance_export(conn, kind, period, fmt)

    try:
        data, file_name, media = await run_in_threadpool(build)
    except ValueError as exc:  # an unknown kind, format or period
        return bad_input(request, viewer, True, str(exc))
    return Response(data, media_type=media, headers={"Content-Disposition": f'attachment; filename="{file_name}"',
                                                      "Cache-Control": "no-store"})
