"""Prepaid credits and credit notes: grants (usable until an expiry in the customer's time zone),
the ledger view with the balance usable now, credits given back when an invoice that used them is
voided or credited, and credit notes against finalized invoices (numbered CN-YYYY-NNNNNN without
gaps). Every function takes an open psycopg connection and the injected clock (`now`); each command
runs in its own transaction and writes nothing when it raises.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from uuid import uuid4

import psycopg

from billing._common import ZERO, check_minor_units
from billing.credit_notes import CreditNote, credit_note
from billing.credits import CreditGrant, balance, grant_entry
from billing.errors import CreditError
from billing.invoice import Invoice
from billing_service.customers import local_midnight, parse_local_date
from billing_service.store import (
    PgCreditLedger,
    PgInvoiceNumbers,
    PgInvoiceStore,
    checked_now,
    lock_customer,
    money_text,
    require_customer,
)
from infermeter.times import utc_text
from pricing.money import Currency, plain_decimal

CREDIT_NOTE_PREFIX = "CN"


# ---------------------------------------------------------------- grants


def _grant(ledger: PgCreditLedger, customer_id: str, currency: str, amount: Decimal, now: datetime,
           expires_at: datetime | None, reason: str) -> CreditGrant:
    grant = CreditGrant("grt_" + uuid4().hex[:20], customer_id, currency, amount, now, expires_at, reason)
    ledger.add_grant(grant)
    ledger.append([grant_entry(grant)], now)
    return grant


def grant_credits(
    conn: psycopg.Connection, customer_id: str, amount: str, *, now: datetime, expires: str | None = None,
    reason: str | None = None,
) -> CreditGrant:
    """Grant prepaid credit in the customer's currency. `expires` (YYYY-MM-DD) is a local date: the
    grant is usable until 00:00 of that day in the customer's time zone."""
    now = checked_now(now)
    customer = require_customer(conn, customer_id)
    money = Currency.of(customer.currency)
    if not isinstance(amount, str):
        raise CreditError(f"amount must be a decimal string such as \"50.00\", got {type(amount).__name__}")
    try:
        value = plain_decimal(amount, what="amount")
    except ValueError as exc:
        raise CreditError(str(exc)) from None
    if value <= 0:
        raise CreditError(f"amount {amount} must be greater than zero")
    check_minor_units(value, money, "credit amount", CreditError)
    expires_at = None
    if expires is not None:
        expires_at = local_midnight(parse_local_date(expires, "expires"), customer.timezone)
        if expires_at <= now:
            raise CreditError(f"expires {expires} is not in the future (the grant would expire before it starts)")
    text = (reason or "prepaid credit").strip()
    with conn.transaction():
        lock_customer(conn, customer_id)
        return _grant(PgCreditLedger(conn), customer_id, customer.currency, value, now, expires_at, text)


def credits_view(conn: psycopg.Connection, customer_id: str, *, now: datetime) -> dict:
    """Every grant, the ledger (grant, use, expiry; expiries not yet recorded by a finalization are
    shown as they will be), and the balance usable now."""
    now = checked_now(now)
    customer = require_customer(conn, customer_id)
    ledger = PgCreditLedger(conn)
    grants = list(ledger.grants(customer_id))
    entries = list(ledger.entries(customer_id))
    expired_ids = {e.grant_id for e in entries if e.kind == "expiry"}
    pending = []
    for g in grants:
        if g.expired(now) and g.id not in expired_ids:
            left = g.amount + sum((e.amount for e in entries if e.grant_id == g.id and e.kind != "grant"), ZERO)
            if left > 0:
                pending.append({"kind": "expiry", "grant_id": g.id, "amount": money_text(-left, g.currency),
                                "at": utc_text(g.expires_at), "invoice_id": None, "recorded": False})
    rows = [{"kind": e.kind, "grant_id": e.grant_id, "amount": money_text(e.amount, e.currency), "at": utc_text(e.at),
             "invoice_id": e.invoice_id, "recorded": True} for e in entries] + pending
    rows.sort(key=lambda r: (r["at"], r["kind"] != "grant"))
    return {
        "customer_id": customer_id, "currency": customer.currency,
        "balance": money_text(balance(entries, now, currency=customer.currency), customer.currency),
        "grants": [{"id": g.id, "amount": money_text(g.amount, g.currency), "granted_at": utc_text(g.granted_at),
                    "expires_at": g.expires_at and utc_text(g.expires_at), "reason": g.reason} for g in grants],
        "ledger": rows,
    }


# ---------------------------------------------------------------- credits given back, credit notes


def return_credits_of_void(conn: psycopg.Connection, voided: Invoice, now: datetime) -> None:
    """Prepaid credits a void invoice used go back as a new grant (they paid nothing now)."""
    if voided.credits_applied <= 0:
        return
    ledger = PgCreditLedger(conn)
    _grant(ledger, voided.customer_id, voided.currency, voided.credits_applied, now, None,
           f"credits returned by void invoice {voided.number}")


def issue_credit_note(
    conn: psycopg.Connection, invoice_id: str, *, reason: str, now: datetime, line_ids: list[str] | None = None
) -> tuple[CreditNote, str]:
    """A credit note (the whole invoice, or what is left on some lines) against a finalized invoice,
    numbered CN-YYYY-NNNNNN without gaps. Credits the invoice had used go back as a new grant."""
    now = checked_now(now)
    store = PgInvoiceStore(conn)
    with conn.transaction():
        stored = store.get(invoice_id)
        lock_customer(conn, stored.invoice.customer_id)
        inv = store.get(stored.invoice.id).invoice
        note = credit_note(inv, reason=reason, at=now, line_ids=line_ids or None, previous=store.credit_notes(inv.id))
        number = PgInvoiceNumbers(conn).next_number(CREDIT_NOTE_PREFIX, now.year)
        store.save_credit_note(note, number)
        if note.credits_returned > 0:
            _grant(PgCreditLedger(conn), inv.customer_id, inv.currency, note.credits_returned, now, None,
                   f"credits returned by credit note {number}")
    return note, number
