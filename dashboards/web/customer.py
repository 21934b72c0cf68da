"""The customer dashboard and its chart data endpoints.

    GET  /dashboard                           the customer dashboard (?from=&to=&model=&project=; admins add &customer_id=)
    GET  /dashboard/data/{chart}.{json|csv}   tokens, requests, cache_hit, gpu, tasks, summary
"""

from __future__ import annotations

import urllib.parse
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from dashboards import views
from dashboards.web.auth import SignInNeeded, authenticate, customer_scope, sign_in_response
from dashboards.web.customer_data import CUSTOMER_CHARTS, DataRefused, chart_data, customer_view
from dashboards.web.invoices import billing_query
from dashboards.web.openapi import WINDOW_QUERY, chart_names, data_route, name_param
from dashboards.web.responses import (
    bad_input,
    chart_context,
    csv_response,
    error_json,
    json_response,
    not_found,
    render,
)
from infermeter.times import TimeInputError

router = APIRouter()


@router.get("/dashboard", include_in_schema=False)
async def dashboard(request: Request) -> Response:
    params = dict(views.picked_times(request.query_params.multi_items(), ("from", "to")))
    try:
        viewer = await authenticate(request, admin=False)
    except SignInNeeded as exc:
        return sign_in_response(request, exc, data=False)
    if not customer_scope(viewer, params.get("customer_id")):
        return not_found(request, viewer, data=False)
    try:
        view = await run_in_threadpool(customer_view, request, viewer, params, spend=True, with_billing=True)
    except TimeInputError as exc:
        return bad_input(request, viewer, False, str(exc))
    query = urllib.parse.urlencode({k: v for k, v in params.items()
                                    if k in ("from", "to", "model", "project", "customer_id", "period") and v})
    charts = []
    if view["customer_id"] is not None:
        charts = chart_context(views.customer_charts(view["usage"], view["gpu"], view["tasks"]), "/dashboard/data", query)
    return render(request, "customer.html", viewer=viewer, view=view, charts=charts, query=query,
                  window=views.window_json(view["window"]), summary_json=f"/dashboard/data/summary.json?{query}",
                  summary_csv=f"/dashboard/data/summary.csv?{query}", billing_query=billing_query(view, params), request_params=params)


CUSTOMER_DATA = chart_names(CUSTOMER_CHARTS)


@router.get("/dashboard/data/{name}", **data_route(CUSTOMER_DATA, WINDOW_QUERY + [
    {"name": "model", "in": "query", "required": False, "schema": {"type": "string"}},
    {"name": "project", "in": "query", "required": False, "schema": {"type": "string"},
     "description": "one project's requests and tokens (the API key's project); GPU time and tasks are not per project"},
    {"name": "customer_id", "in": "query", "required": False, "schema": {"type": "string"},
     "description": "admins: required; customers: their own id or nothing"}], admin=False))
async def dashboard_data(request: Request, name: Annotated[str, name_param(CUSTOMER_DATA)]) -> Response:
    chart, _, fmt = name.partition(".")
    if chart not in CUSTOMER_CHARTS or fmt not in ("json", "csv"):
        return error_json(404, "not found", "not_found")
    try:
        data = await chart_data(request, chart)
    except DataRefused as refused:
        return refused.response()
    return json_response(data.payload()) if fmt == "json" else csv_response(data.csv_rows(), chart)
