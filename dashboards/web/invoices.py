"""The customer's billing on the dashboard: its invoices and its current-period spend, from billing's
views on the app's state (dashboards.billing_views; without them these answer 404).

    GET  /dashboard/invoices.{json|csv}, /dashboard/invoice-lines.csv   the customer's invoices
    GET  /dashboard/invoices/{id}[.json|.csv] one of the customer's invoices (another's: 404)
    GET  /dashboard/current-period.{json|csv} current-period spend: the billing preview (?period=YYYY-MM)
"""

from __future__ import annotations

import urllib.parse
from decimal import Decimal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from dashboards.billing_views import BillingViews, CurrentPeriodSpend, Invoice
from dashboards.web.auth import SignInNeeded, Viewer, authenticate, customer_scope, sign_in_response
from dashboards.web.responses import bad_input, csv_response, error_json, json_response, not_found, render
from dashboards.web.state import billing_now, billing_views
from infermeter.times import TimeInputError

router = APIRouter(include_in_schema=False)

INVOICE_COLUMNS = ("number", "period", "period_start", "period_end", "status", "status_label", "currency", "subtotal",
                   "credits_applied", "total", "issued_at", "id")
LINE_COLUMNS = ("invoice_number", "invoice_period", "meter", "model", "group", "kind", "quantity", "unit_price",
                "amount", "period", "adjustment", "project")


def billing_query(view: dict, params: dict[str, str]) -> str:
    """The query the billing links carry: an admin's customer_id and the previewed period."""
    keep = {"customer_id": params.get("customer_id") if view.get("customer_id") else None,
            "period": params.get("period")}
    return urllib.parse.urlencode({k: v for k, v in keep.items() if v})


def _invoice_lines(invoices: list[Invoice]) -> list[dict]:
    return [{"invoice_number": i["number"], "invoice_period": i["period"], **line}
            for i in invoices for line in i["lines"]]


async def _billing_viewer(request: Request, data: bool) -> tuple[Viewer, str, BillingViews] | Response:
    """The viewer, the customer whose billing it may see (its own; an admin names one) and billing's
    views, or the response that refuses (sign in, 404 for another customer, 400 for an admin without
    customer_id, 404 while billing is not wired)."""
    try:
        viewer = await authenticate(request, admin=False)
    except SignInNeeded as exc:
        return sign_in_response(request, exc, data=data)
    requested = request.query_params.get("customer_id")
    billing = billing_views(request)
    if not customer_scope(viewer, requested) or billing is None:
        return not_found(request, viewer, data=data)
    customer = viewer.customer_id if not viewer.is_admin else requested
    if not customer:
        return bad_input(request, viewer, data, "customer_id is required for admin credentials")
    return viewer, customer, billing


async def _customer_invoices(request: Request, billing: BillingViews, customer: str) -> list[Invoice]:
    """The customer's invoices with their lines."""

    def load() -> list[Invoice]:
        with request.app.state.pool.connection() as conn:
            return billing.invoices(conn, customer)

    return await run_in_threadpool(load)


@router.get("/dashboard/invoices.{fmt}")
async def customer_invoices_data(request: Request, fmt: str) -> Response:
    """The customer's invoices (JSON: with their lines; CSV: one row per invoice; lines.csv below)."""
    if fmt not in ("json", "csv"):
        return error_json(404, "not found", "not_found")
    found = await _billing_viewer(request, data=True)
    if isinstance(found, Response):
        return found
    _, customer, billing = found

    invoices = await _customer_invoices(request, billing, customer)
    if fmt == "json":
        return json_response({"customer_id": customer, "invoices": invoices})
    return csv_response([{k: i.get(k) for k in INVOICE_COLUMNS} for i in invoices], "invoices")


@router.get("/dashboard/invoice-lines.csv")
async def customer_invoice_lines_csv(request: Request) -> Response:
    """Every line of the customer's invoices, one row each, with the invoice's number and period."""
    found = await _billing_viewer(request, data=True)
    if isinstance(found, Response):
        return found
    _, customer, billing = found

    lines = _invoice_lines(await _customer_invoices(request, billing, customer))
    return csv_response([{k: r.get(k) for k in LINE_COLUMNS} for r in lines], "invoice-lines")


@router.get("/dashboard/invoices/{name}")
async def customer_invoice(request: Request, name: str) -> Response:
    """One invoice of the signed-in customer: its page, `.json` or `.csv` (its lines). Another
    customer's invoice id answers 404, as an unknown one does."""
    invoice_id, _, fmt = name.partition(".")
    data = fmt != ""
    if fmt not in ("", "json", "csv"):
        return error_json(404, "not found", "not_found")
    found = await _billing_viewer(request, data=data)
    if isinstance(found, Response):
        return found
    viewer, customer, billing = found

    def load() -> tuple[Invoice | None, str | None]:
        with request.app.state.pool.connection() as conn:
            shown = billing.invoice(conn, customer, invoice_id)
            return shown, None if shown is None or data else billing.customer_name(conn, customer)

    invoice, customer_name = await run_in_threadpool(load)
    if invoice is None:
        return not_found(request, viewer, data=data)
    if fmt == "json":
        return json_response(invoice)
    if fmt == "csv":
        return csv_response([{k: r.get(k) for k in LINE_COLUMNS} for r in _invoice_lines([invoice])],
                            f"invoice-{invoice_id}")
    query = urllib.parse.urlencode({"customer_id": customer} if viewer.is_admin else {})
    credited = sum((Decimal(n["total"]) for n in invoice["credit_notes"]), Decimal(0))
    return render(request, "invoice.html", viewer=viewer, invoice=invoice, query=query, customer_name=customer_name,
                  credited=credited, net=Decimal(invoice["subtotal"]) - credited)


@router.get("/dashboard/current-period.{fmt}")
async def current_period_data(request: Request, fmt: str) -> Response:
    """Current-period spend (the billing preview, `infermeter invoice preview`) against the budget or the
    prepaid credit balance; `?period=YYYY-MM` previews another period. CSV: one row per line."""
    if fmt not in ("json", "csv"):
        return error_json(404, "not found", "not_found")
    found = await _billing_viewer(request, data=True)
    if isinstance(found, Response):
        return found
    viewer, customer, billing = found

    def load() -> CurrentPeriodSpend:
        with request.app.state.pool.connection() as conn:
            return billing.current_period_spend(conn, customer, billing_now(request),
                                                period=request.query_params.get("period") or None)

    try:
        spend = await run_in_threadpool(load)
    except TimeInputError as exc:
        return bad_input(request, viewer, True, str(exc))
    if fmt == "json":
        return json_response(spend)
    head = {k: spend.get(k) for k in ("customer_id", "period", "period_start", "period_end", "currency", "subtotal",
                                      "credits_applied", "total", "credit_balance")}
    return csv_response([{**head, **line} for line in spend.get("lines", [])] or [head], "current-period")
