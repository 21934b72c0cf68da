"""Invoices as documents: the preview of a customer's invoice (what a run would make now), listing
and showing invoices, voiding one (with its reissue draft), and the payment status the collector
reports (`record_payment_status`). Every function takes an open psycopg connection (and the
injected clock, `now`, where it writes); each write runs in its own transaction and writes nothing
when it raises.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

import psycopg

from billing._common import aware_utc
from billing.credits import apply_credits_to_invoice
from billing.errors import InvoiceStateError
from billing.invoice import CHARGING, Invoice, InvoiceLine, InvoiceStatus
from billing.invoice.drafts import empty_draft, lines_from_rating, replace_lines
from billing.invoice.states import mark_paid, mark_payment_failed, reissue, void
from billing.periods import billing_period, parse_label
from billing_service.credits import return_credits_of_void
from billing_service.drafts import draft_context, draft_lines
from billing_service.store import (
    BillingServiceError,
    Customer,
    PgCreditLedger,
    PgInvoiceStore,
    StoredInvoice,
    checked_now,
    load_book,
    lock_customer,
    money_text,
    number_text,
    parse_book_text,
    plan_at,
    require_customer,
)
from infermeter.times import utc_text
from pricing.cost import CostModel


def preview_invoice(
    conn: psycopg.Connection,
    customer_id: str,
    period: str,
    *,
    now: datetime,
    cost_model: CostModel | None = None,
    book: tuple[str, str] | None = None,
) -> dict:
    """What the customer's invoice for `period` would be now (period to date when it is not over): the
    draft a run would build, with the prepaid credits that would apply if it were finalized now.
    `book` = (YAML text, name) previews under another price book (same currency). Writes nothing."""
    now = checked_now(now)
    parse_label(period)
    customer = require_customer(conn, customer_id)
    target = billing_period(period, customer.timezone, customer.anchor_day)
    with conn.transaction():
        ctx = draft_context(conn, customer, now, cost_model)
        group = [s for s in ctx.stored if s.invoice.period == period]
        drafts = [s for s in group if s.invoice.status is InvoiceStatus.DRAFT]
        if group and not drafts and book is None:
            final = [s for s in group if s.invoice.status in CHARGING] or group
            return _preview_json(final[-1].invoice, customer, note="finalized")
        if book is not None:
            stored_book = parse_book_text(*book)
            if stored_book.book.currency != customer.currency:
                raise BillingServiceError(
                    f"price book {stored_book.book.id} is in {stored_book.book.currency} but customer {customer_id} "
                    f"is billed in {customer.currency}"
                )
        else:
            plan = plan_at(ctx.plans, target.start)
            if plan is None:
                raise BillingServiceError(
                    f"customer {customer_id} has no plan for period {period}: assign one first, or preview "
                    "with a price book of your own"
                )
            stored_book = load_book(conn, plan.book_sha256)
        existing = drafts[-1] if drafts else None
        seq = existing.invoice.sequence if existing else max((s.invoice.sequence for s in group), default=0) + 1
        base = existing.invoice if existing else empty_draft(customer_id, customer.currency, target,
                                                            price_book_version=stored_book.version, sequence=seq)
        base = replace(base, price_book_version=stored_book.version)
        if book is not None:  # what-if: the period's usage rated under that book, nothing else
            lines = lines_from_rating(ctx.rating(target, stored_book), target)
        else:
            lines = draft_lines(ctx, base.id, target, stored_book)
        draft = replace_lines(base, lines)
        ledger = PgCreditLedger(conn)
        if draft.total >= 0:
            draft, _ = apply_credits_to_invoice(draft, ledger.grants(customer_id), ledger.entries(customer_id), now)
        note = "period to date" if now < target.end else "period over"
        return _preview_json(draft, customer, note=note + (f"; what-if under {stored_book.book.id}" if book else ""))


def line_json(line: InvoiceLine, currency: str) -> dict:
    from pricing.meters import REQUEST_METERS

    return {"id": line.id, "meter": line.meter, "model": line.group if line.meter in REQUEST_METERS else "",
            "group": line.group, "kind": line.kind, "quantity": number_text(line.quantity),
            "unit_price": None if line.unit_price is None else number_text(line.unit_price),
            "amount": money_text(line.amount, currency), "period": line.period,
            "adjustment": line.is_adjustment, "project": line.project or None}


def _preview_json(inv: Invoice, customer: Customer, *, note: str) -> dict:
    return {"customer_id": customer.customer_id, "currency": inv.currency, "period": inv.period,
            "period_start": utc_text(inv.period_start), "period_end": utc_text(inv.period_end), "status": str(inv.status),
            "price_book_version": inv.price_book_version, "note": note,
            "lines": [line_json(line, inv.currency) for line in inv.lines],
            "subtotal": money_text(inv.subtotal, inv.currency),
            "credits_applied": money_text(inv.credits_applied, inv.currency),
            "total": money_text(inv.total, inv.currency)}


# ---------------------------------------------------------------- list, show, void, payment status


def invoice_summary(inv: Invoice) -> dict:
    return {"id": inv.id, "number": inv.number, "customer_id": inv.customer_id, "period": inv.period,
            "status": str(inv.status), "currency": inv.currency, "subtotal": money_text(inv.subtotal, inv.currency),
            "credits_applied": money_text(inv.credits_applied, inv.currency),
            "total": money_text(inv.total, inv.currency)}


def list_invoices(conn: psycopg.Connection, *, customer_id: str | None = None, period: str | None = None,
                  status: str | None = None, must_exist: bool = True) -> list[dict]:
    if period is not None:
        parse_label(period)
    if status is not None:
        try:
            InvoiceStatus(status)
        except ValueError:
            raise BillingServiceError(f"unknown status {status!r}: one of {', '.join(InvoiceStatus)}") from None
    if customer_id is not None and must_exist:
        require_customer(conn, customer_id)
    ids = [r[0] for r in conn.execute(
        "SELECT id FROM billing_invoices WHERE (%(c)s::text IS NULL OR customer_id = %(c)s) "
        "AND (%(p)s::text IS NULL OR period = %(p)s) AND (%(s)s::text IS NULL OR status = %(s)s) "
        "ORDER BY customer_id, period_start, sequence",
        {"c": customer_id, "p": period, "s": status},
    )]
    store = PgInvoiceStore(conn)
    return [invoice_summary(store.get(i).invoice) for i in ids]


def show_invoice(conn: psycopg.Connection, invoice_id: str) -> dict:
    from billing_service.store import history

    store = PgInvoiceStore(conn)
    stored = store.get(invoice_id)
    inv = stored.invoice
    numbers = store.credit_note_numbers(inv.id)
    out = invoice_summary(inv)
    out.update(
        period_start=utc_text(inv.period_start), period_end=utc_text(inv.period_end), sequence=inv.sequence,
        price_book_version=inv.price_book_version, issued_at=inv.issued_at and utc_text(inv.issued_at),
        finalized_at=inv.finalized_at and utc_text(inv.finalized_at), reissue_of=inv.reissue_of,
        lines=[line_json(line, inv.currency) for line in inv.lines],
        credit_notes=[{"id": n.id, "number": numbers.get(n.id), "total": money_text(n.total, n.currency),
                       "refund_amount": money_text(n.refund_amount, n.currency),
                       "credits_returned": money_text(n.credits_returned, n.currency), "reason": n.reason,
                       "issued_at": utc_text(n.issued_at),
                       "lines": [{"invoice_line_id": x.invoice_line_id, "amount": money_text(x.amount, n.currency)}
                                 for x in n.lines]} for n in store.credit_notes(inv.id)],
        history=history(conn, inv.id),
    )
    return out


def void_invoice(conn: psycopg.Connection, invoice_id: str, *, now: datetime) -> tuple[Invoice, Invoice]:
    """Void a finalized (open or payment_failed) invoice and create its reissue: a new draft of the
    same period (next sequence) that the next billing run refreshes from the usage and finalizes.
    Returns (the void invoice, the reissue draft)."""
    now = checked_now(now)
    store = PgInvoiceStore(conn)
    with conn.transaction():
        stored = store.get(invoice_id)
        lock_customer(conn, stored.invoice.customer_id)
        stored = store.get(stored.invoice.id)
        return _void_and_reissue(conn, store, stored, void(stored.invoice, at=now), now=now, change="voided")


def _void_and_reissue(conn: psycopg.Connection, store: PgInvoiceStore, stored: StoredInvoice, voided: Invoice, *,
                      now: datetime, change: str) -> tuple[Invoice, Invoice]:
    """Save the void invoice, create its reissue draft and give back the credits it used (caller's transaction)."""
    store.save(voided, book_sha256=stored.book_sha256, now=now, change=change, previous=stored)
    siblings = [s for s in store.stored(voided.customer_id) if s.invoice.period == voided.period]
    fresh = reissue(voided, sequence=max(s.invoice.sequence for s in siblings) + 1)
    store.save(fresh, book_sha256=stored.book_sha256, now=now, change="created (reissue of a void invoice)")
    return_credits_of_void(conn, voided, now)
    return voided, fresh


PAYMENT_STATUSES = (InvoiceStatus.PAID, InvoiceStatus.PAYMENT_FAILED, InvoiceStatus.VOID)


@dataclass(frozen=True)
class PaymentStatusOutcome:
    invoice: Invoice
    changed: bool  # False: the invoice already had this status (a repeat is a no-op)
    reissue: Invoice | None = None  # the new draft when the invoice was voided


def record_payment_status(
    conn: psycopg.Connection, invoice_id: str, status: InvoiceStatus | str, at: datetime, *, now: datetime
) -> PaymentStatusOutcome:
    """What the payment collector (Stripe's webhooks) reports about a finalized invoice: `paid`,
    `payment_failed` or `void`, as of `at` (the event's time), recorded at `now` (the clock).

    Goes through the domain's state machine (`billing.invoice.states.mark_paid` / `mark_payment_failed` / `void`)
    and the store (one history row, change "paid (reported <at>)" ...). The same status again is a no-op
    (nothing written); a change the state machine refuses (paid -> payment_failed, a draft paid, ...)
    raises `InvoiceStateError`, a BillingError. `void` does what `invoices void` does: the invoice becomes
    void, a reissue draft of its period is created (the next billing run refreshes and finalizes it, so
    the usage is still billed and reconcile still balances), and the prepaid credits it used come back.

    The transition is dated `at`, or the invoice's last change when `at` is earlier (the collector's clock
    and ours differ by a little: a payment reported a second "before" the invoice's last recorded change
    is still a payment, not an impossible change)."""
    now = checked_now(now)
    try:
        wanted = InvoiceStatus(status)
    except ValueError:
        raise InvoiceStateError(f"unknown invoice status {status!r}") from None
    if wanted not in PAYMENT_STATUSES:
        raise InvoiceStateError(
            f"a payment status is one of {', '.join(PAYMENT_STATUSES)}, not {wanted} (finalize through a billing run)"
        )
    at = aware_utc(at, "at", InvoiceStateError)
    store = PgInvoiceStore(conn)
    with conn.transaction():
        stored = store.get(invoice_id)
        lock_customer(conn, stored.invoice.customer_id)
        stored = store.get(stored.invoice.id)
        current = stored.invoice
        if current.status is wanted:
            return PaymentStatusOutcome(current, False)
        when = max(at, current.history[-1].at) if current.history else at
        moved = {InvoiceStatus.PAID: mark_paid, InvoiceStatus.PAYMENT_FAILED: mark_payment_failed,
                 InvoiceStatus.VOID: void}[wanted](current, at=when)
        change = f"{wanted} (reported {utc_text(at)})"
        if wanted is InvoiceStatus.VOID:
            voided, fresh = _void_and_reissue(conn, store, stored, moved, now=now, change=change)
            return PaymentStatusOutcome(voided, True, fresh)
        store.save(moved, book_sha256=stored.book_sha256, now=now, change=change, previous=stored)
        return PaymentStatusOutcome(moved, True)
