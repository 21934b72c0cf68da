"""Billing over HTTP: the admin API (customers, plans, runs, invoices, credit notes, credits) and the
invoice preview a customer can ask for with its own API key.

    GET  /v1/invoices/preview?period=YYYY-MM[&customer_id=]     admin, or a customer for itself
    PUT  /v1/billing/customers/{customer_id}                     admin: create or update
    GET  /v1/billing/customers/{customer_id}                     admin
    POST /v1/billing/customers/{customer_id}/plans               admin: {price_book (YAML text), from}
    POST /v1/billing/runs                                        admin: {period, customer_id?}
    GET  /v1/billing/invoices?customer_id&period&status          admin, or a customer for itself
    GET  /v1/billing/invoices/{id}                               admin, or the invoice's customer
    POST /v1/billing/invoices/{id}/void                          admin
    POST /v1/billing/invoices/{id}/credit-notes                  admin: {reason, line_ids?}
    POST /v1/billing/customers/{customer_id}/credits             admin: {amount, expires?, reason?}
    GET  /v1/billing/customers/{customer_id}/credits             admin, or the customer itself
    GET  /v1/billing/exports/{kind}?period&format&as_of          admin: invoices|lines|revenue|usage, csv|parquet

Bad input answers 400 (404 for an unknown customer or invoice) with the service's message and
writes nothing. Mount with `app.include_router(billing_service.api.router)`; it reads
`request.app.state.pool` and `request.app.state.settings`. The clock is the `now` dependency
(the current time; tests override it: `app.dependency_overrides[now]`).
"""

from __future__ import annotations

from typing import Any

import psycopg
from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from billing.invoice import InvoiceStatus
from billing_service.exports import FORMATS, KINDS
from billing_service.store import UnknownCustomer, UnknownInvoice
from infermeter.http import (
    DATE,
    DATE_TIME,
    PERIOD,
    AdminDep,
    CredentialsFirst,
    Now,
    PrincipalDep,
    error,
    error_responses,
    scope,
)
from pricing.money import MINOR_UNITS

router = APIRouter(tags=["billing"], responses=error_responses(400, 401, 403, 404), route_class=CredentialsFirst)


def _cost_model(request: Request):
    from pricing_service.books import read_cost_model

    return read_cost_model(request.app.state.settings.pricing_cost_model)


async def _call(request: Request, work) -> Any:
    """Run `work(conn)` on an autocommit connection of the pool; service errors become 4xx."""

    def run() -> Any:
        with request.app.state.pool.connection() as conn:
            conn.autocommit = True
            conn.execute("SET TIME ZONE 'UTC'")
            try:
                return work(conn)
            except (UnknownCustomer, UnknownInvoice) as exc:
                raise error(404, str(exc), "not_found") from None
            except ValueError as exc:  # BillingError, PeriodError, PriceBookError, ...
                raise error(400, str(exc), "invalid_request") from None

    return await run_in_threadpool(run)


# ---------------------------------------------------------------- preview (customers too)


@router.get("/v1/invoices/preview")
async def get_preview(
    request: Request,
    principal: PrincipalDep,
    at: Now,
    period: str = Query(description="billing period YYYY-MM", examples=["2026-11"], json_schema_extra=PERIOD),
    customer_id: str | None = Query(default=None, description="required with the admin token; a customer key "
                                                              "previews its own customer"),
) -> dict[str, Any]:
    from billing_service.invoices import preview_invoice

    customer = scope(principal, customer_id)
    if customer is None:
        raise error(400, "customer_id is required", "invalid_request")
    cost_model = _cost_model(request)
    return await _call(request, lambda conn: preview_invoice(conn, customer, period, now=at, cost_model=cost_model))


# ---------------------------------------------------------------- customers and plans


class CustomerBody(BaseModel):
    name: str | None = None
    email: str | None = None
    timezone: str | None = None
    currency: str | None = Field(default=None, json_schema_extra={"enum": sorted(MINOR_UNITS)})
    anchor_day: int | None = Field(default=None, json_schema_extra={"minimum": 1, "maximum": 31},
                                   description="the day of the month periods start on (1..31; the last day of "
                                               "shorter months)")


@router.put("/v1/billing/customers/{customer_id}")
async def put_customer(request: Request, _admin: AdminDep, at: Now, customer_id: str, body: CustomerBody) -> dict:
    from billing_service.customers import set_customer

    def work(conn: psycopg.Connection) -> dict:
        customer, changed = set_customer(conn, customer_id, now=at, **body.model_dump())
        return {**customer.to_json(), "changed": changed}

    return await _call(request, work)


@router.get("/v1/billing/customers/{customer_id}")
async def get_customer(request: Request, _admin: AdminDep, customer_id: str) -> dict:
    from billing_service.store import plans, require_customer

    return await _call(request, lambda conn: {**require_customer(conn, customer_id).to_json(),
                                              "plans": [p.to_json() for p in plans(conn, customer_id)]})


class PlanBody(BaseModel):
    price_book: str = Field(description="the price book YAML text")
    from_: str = Field(alias="from", description="local date YYYY-MM-DD", json_schema_extra=DATE)
    backdate: bool = Field(default=False, description="allow `from` before the customer's first plan "
                           "(the periods in between are billed too)")
    source_name: str = "api"


@router.post("/v1/billing/customers/{customer_id}/plans")
async def post_plan(request: Request, _admin: AdminDep, at: Now, customer_id: str, body: PlanBody) -> dict:
    from billing_service.customers import assign_plan

    def work(conn: psycopg.Connection) -> dict:
        result = assign_plan(conn, customer_id, body.price_book, body.source_name, body.from_, now=at,
                             backdate=body.backdate, backdate_hint='send "backdate": true')
        return {"customer_id": customer_id, "price_book": result.book.book.id,
                "price_book_version": result.book.version, "effective_period": result.effective.label,
                "created": result.created}

    return await _call(request, work)


# ---------------------------------------------------------------- runs and invoices


class RunBody(BaseModel):
    period: str = Field(description="billing period YYYY-MM", json_schema_extra=PERIOD)
    customer_id: str | None = None


@router.post("/v1/billing/runs")
async def post_run(request: Request, _admin: AdminDep, at: Now, body: RunBody) -> dict:
    from billing_service.run import billing_run

    settings = request.app.state.settings
    cost_model = _cost_model(request)
    return await _call(request, lambda conn: billing_run(
        conn, body.period, now=at, customer_id=body.customer_id, grace_h=settings.billing_grace_h,
        cost_model=cost_model, issuer_prefix=settings.billing_issuer_prefix).to_json())


@router.get("/v1/billing/invoices")
async def get_invoices(
    request: Request,
    principal: PrincipalDep,
    customer_id: str | None = None,
    period: str | None = Query(default=None, description="billing period YYYY-MM", json_schema_extra=PERIOD),
    status: str | None = Query(default=None, json_schema_extra={"enum": [str(s) for s in InvoiceStatus]}),
) -> dict:
    from billing_service.invoices import list_invoices

    customer = scope(principal, customer_id)
    return await _call(request, lambda conn: {"invoices": list_invoices(
        conn, customer_id=customer, period=period, status=status, must_exist=principal.is_admin)})


@router.get("/v1/billing/invoices/{invoice_id}")
async def get_invoice(request: Request, principal: PrincipalDep, invoice_id: str) -> dict:
    from billing_service.invoices import show_invoice

    shown = await _call(request, lambda conn: show_invoice(conn, invoice_id))
    scope(principal, shown["customer_id"])  # 404 for another customer's invoice, 403 for producers
    return shown


@router.post("/v1/billing/invoices/{invoice_id}/void")
async def post_void(request: Request, _admin: AdminDep, at: Now, invoice_id: str) -> dict:
    from billing_service.invoices import invoice_summary, void_invoice

    def work(conn: psycopg.Connection) -> dict:
        voided, fresh = void_invoice(conn, invoice_id, now=at)
        return {"voided": invoice_summary(voided), "reissue": invoice_summary(fresh)}

    return await _call(request, work)


class CreditNoteBody(BaseModel):
    reason: str
    line_ids: list[str] | None = None


@router.post("/v1/billing/invoices/{invoice_id}/credit-notes")
async def post_credit_note(request: Request, _admin: AdminDep, at: Now, invoice_id: str, body: CreditNoteBody) -> dict:
    from billing_service.credits import issue_credit_note
    from billing_service.store import money_text

    def work(conn: psycopg.Connection) -> dict:
        note, number = issue_credit_note(conn, invoice_id, reason=body.reason, now=at, line_ids=body.line_ids)
        return {"id": note.id, "number": number, "invoice_id": note.invoice_id,
                "total": money_text(note.total, note.currency), "currency": note.currency}

    return await _call(request, work)


# ---------------------------------------------------------------- credits


class GrantBody(BaseModel):
    amount: str = Field(description="a positive decimal in the customer's currency, at most its minor unit's places, e.g. 50.00",
                        json_schema_extra={"pattern": "^[0-9]{1,26}([.][0-9]{1,12})?$"})
    expires: str | None = Field(default=None, description="local date YYYY-MM-DD", json_schema_extra=DATE)
    reason: str | None = None


@router.post("/v1/billing/customers/{customer_id}/credits")
async def post_grant(request: Request, _admin: AdminDep, at: Now, customer_id: str, body: GrantBody) -> dict:
    from billing_service.credits import grant_credits
    from billing_service.store import money_text

    def work(conn: psycopg.Connection) -> dict:
        grant = grant_credits(conn, customer_id, body.amount, now=at, expires=body.expires, reason=body.reason)
        return {"id": grant.id, "customer_id": customer_id, "amount": money_text(grant.amount, grant.currency),
                "currency": grant.currency}

    return await _call(request, work)


@router.get("/v1/billing/customers/{customer_id}/credits")
async def get_credits(request: Request, principal: PrincipalDep, at: Now, customer_id: str) -> dict:
    from billing_service.credits import credits_view

    customer = scope(principal, customer_id)
    return await _call(request, lambda conn: credits_view(conn, customer, now=at))


# ---------------------------------------------------------------- finance exports


@router.get("/v1/billing/exports/{kind}", response_class=Response, responses={200: {
    "description": "the export file", "content": {"text/csv": {"schema": {"type": "string"}},
                                                  "application/vnd.apache.parquet": {"schema": {"type": "string",
                                                                                                "format": "binary"}}}}})
async def get_export(
    request: Request,
    _admin: AdminDep,
    kind: str = Path(description="invoices, lines, revenue or usage", examples=["invoices"],
                     json_schema_extra={"enum": list(KINDS)}),
    period: str = Query(description="billing period YYYY-MM", examples=["2026-11"], json_schema_extra=PERIOD),
    format: str = Query(default="csv", description="csv or parquet", json_schema_extra={"enum": list(FORMATS)}),
    as_of: str | None = Query(default=None, description="what was known at this time (RFC 3339)",
                              json_schema_extra=DATE_TIME),
) -> Response:
    """A finance export as a download (the same bytes as `infermeter export KIND`)."""
    from billing_service.exports import MEDIA_TYPES, check_format, check_kind, export, file_name
    from infermeter.times import parse_time

    def work(conn: psycopg.Connection) -> tuple[bytes, str]:
        check_kind(kind)
        check_format(format)
        at = parse_time(as_of, "as_of") if as_of is not None else None
        return export(conn, kind, period, format, at), file_name(kind, period, format, at)

    data, name = await _call(request, work)
    return Response(content=data, media_type=MEDIA_TYPES[format],
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})
