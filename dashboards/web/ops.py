"""The operations page (admins) and metering's Prometheus metrics.

    GET  /admin/ops                           operations (?from=&to= for deployments and the predictions'
                                              evaluation; ?reconcile_from=&reconcile_to=)
    GET  /admin/ops/data/{chart}.{json|csv}   ingest, deployments, dead_letters, consumers, gateways, reconcile
    GET  /metrics/metering                    metering's Prometheus metrics (dashboards.metering_metrics)
"""

from __future__ import annotations

import urllib.parse
from datetime import timedelta
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from dashboards import gateway_metrics, metering_metrics, views
from dashboards.web.auth import admin_viewer
from dashboards.web.openapi import WINDOW_QUERY, chart_names, data_route, name_param
from dashboards.web.responses import bad_input, chart_context, csv_response, error_json, json_response, render
from dashboards.web.state import now, prediction_views
from infermeter.times import TimeInputError, Window, parse_time, utc_text

router = APIRouter()

OPS_CHARTS = ("ingest", "deployments", "dead_letters", "consumers", "gateways", "reconcile")


def _reconcile(request: Request, from_text: str, to_text: str) -> dict:
    from metering.reconcile import reconcile

    window = Window(parse_time(from_text, "reconcile from"), parse_time(to_text, "reconcile to"))
    with request.app.state.pool.connection() as conn:
        result = reconcile(conn, window)
    record = {"ran_at": utc_text(now(request)), "window": views.window_json(window), "ok": result.ok,
              "checked": result.checked,
              "differences": [{"customer_id": d.customer_id, "meter": d.meter, "raw": str(d.raw),
                               "rollup": str(d.rollup)} for d in result.differences[:50]],
              "difference_count": len(result.differences)}
    request.app.state.dashboards_last_reconcile = record
    return record


def _evaluation_rows(evaluation: dict) -> list[dict]:
    """The predictions' table by model (and all models): each model's scores as predicted at admission
    (scored at ingest) and the backtest's, with the online median baseline (None where there are none)."""
    admission = {m["model"]: m for m in evaluation["admission"]["models"]}
    backtest = {m["model"]: m for m in evaluation["models"]}
    rows = [{"model": m, "admission": admission.get(m), "backtest": backtest.get(m)}
            for m in sorted(admission.keys() | backtest.keys())]
    rows.append({"model": None, "admission": evaluation["admission"]["all"], "backtest": evaluation["all"]})
    return rows


def _ops_view(request: Request, params: dict[str, str], *, evaluation: bool = False) -> dict:
    """The page's data; with `evaluation`, the predictions' scores over the window too (a replay of it:
    the page only, not the data endpoints)."""
    at = now(request)
    window = views.page_window(params.get("from"), params.get("to"), now=at, default=timedelta(hours=24))
    settings = request.app.state.settings
    predictions = prediction_views(request) if evaluation else None
    with request.app.state.pool.connection() as conn:
        ingest = views.ops_ingest(conn, at)
        dead = views.ops_dead_letters(conn)
        deployments = views.ops_deployments(conn, window)
        scores = predictions.evaluation(conn, window.start, window.end) if predictions is not None else None
    urls = gateway_metrics.configured_urls(settings.gateway_metrics_urls)
    return {"window": window, "ingest": ingest, "dead_letters": dead, "deployments": deployments,
            "gateway_urls": urls, "gateways": gateway_metrics.scrape(urls) if urls else [],
            "reconcile": getattr(request.app.state, "dashboards_last_reconcile", None),
            "predictions_wired": predictions is not None, "evaluation": scores,
            "evaluation_rows": _evaluation_rows(scores) if scores is not None else [],
            "charts": views.ops_charts(ingest, deployments, dead)}


@router.get("/admin/ops", include_in_schema=False)
async def ops_page(request: Request) -> Response:
    viewer = await admin_viewer(request, data=False)
    if isinstance(viewer, Response):
        return viewer
    params = dict(views.picked_times(request.query_params.multi_items(), ("from", "to", "reconcile_from", "reconcile_to")))
    try:
        if params.get("reconcile_from") and params.get("reconcile_to"):
            await run_in_threadpool(_reconcile, request, params["reconcile_from"], params["reconcile_to"])
        view = await run_in_threadpool(partial(_ops_view, request, params, evaluation=True))
    except TimeInputError as exc:
        return bad_input(request, viewer, False, str(exc))
    query = urllib.parse.urlencode({k: v for k, v in params.items() if k in ("from", "to") and v})
    end = views.floor_hour(now(request))
    return render(request, "ops.html", viewer=viewer, view=view, window=views.window_json(view["window"]),
                  query=query, charts=chart_context(view["charts"], "/admin/ops/data", query),
                  reconcile_default={"from": utc_text(end - timedelta(hours=24)), "to": utc_text(end)})


OPS_DATA = chart_names(OPS_CHARTS)


@router.get("/admin/ops/data/{name}", **data_route(OPS_DATA, WINDOW_QUERY, admin=True))
async def ops_data(request: Request, name: Annotated[str, name_param(OPS_DATA)]) -> Response:
    chart, _, fmt = name.partition(".")
    if chart not in OPS_CHARTS or fmt not in ("json", "csv"):
        return error_json(404, "not found", "not_found")
    viewer = await admin_viewer(request, data=True)
    if isinstance(viewer, Response):
        return viewer
    try:
        view = await run_in_threadpool(_ops_view, request, dict(request.query_params))
    except TimeInputError as exc:
        return bad_input(request, viewer, True, str(exc))
    tables = {
        "consumers": {"rows": view["ingest"]["consumers"], "delay": view["ingest"]["delay"]},
        "gateways": {"configured": view["gateway_urls"], "rows": view["gateways"]},
        "reconcile": {"recorded": view["reconcile"] is not None, "rows": [view["reconcile"]] if view["reconcile"] else []},
        "dead_letters": {"rows": view["dead_letters"]},
    }
    if chart in tables:
        payload = {"chart": chart, **tables[chart]}
        if fmt == "json":
            return json_response(payload)
        rows = payload["rows"]
        if chart == "gateways":
            rows = [{"url": g["url"], "ok": g["ok"], **s} for g in rows for s in (g["spools"] or [{}])]
        return csv_response(rows, chart)
    found = {c.id: c for c in view["charts"]}[chart]
    return json_response(found.to_json()) if fmt == "json" else csv_response(found.rows, chart)


@router.get("/metrics/metering", description="metering's Prometheus metrics (no credentials: a scrape target)",
            responses={200: {"description": "Prometheus text exposition format",
                             "content": {"text/plain": {"schema": {"type": "string"}}}}})
def metering_prometheus(request: Request) -> Response:
    state = request.app.state
    reg = getattr(state, "dashboards_metering_registry", None)
    if reg is None:
        reg = state.dashboards_metering_registry = metering_metrics.registry(state.pool)
    return Response(metering_metrics.render(reg), media_type=metering_metrics.CONTENT_TYPE)
