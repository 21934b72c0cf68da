"""Building a customer's drafts: the lines of a period on its draft, from the period's rating now and
the lines already invoiced for it (used by the billing run and the invoice preview).

The one rule: the lines of a period on a draft = the period's rating now minus the lines of that
period on every other invoice that charges (open, paid, payment_failed) or is a draft. With nothing
else invoiced for the period these are the rating's own lines (same ids); otherwise
`billing.invoice.adjustments.adjustment_lines`. A draft also carries, for each earlier period whose invoice is
already finalized, the adjustment lines that bring what was invoiced for that period up to its
rating now (usage that arrived late). So after a run, for every period, the lines of all charging
invoices and drafts add up to its rating exactly, and a rerun with no new usage changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Protocol

import psycopg

from billing.credits import CreditGrant, LedgerEntry
from billing.invoice import CHARGING, Invoice, InvoiceLine, InvoiceStatus
from billing.invoice.adjustments import adjustment_lines
from billing.invoice.drafts import empty_draft, lines_from_rating, replace_lines
from billing.periods import Period, billing_period
from billing_service.store import (
    BillingServiceError,
    Customer,
    PgInvoiceStore,
    Plan,
    StoredBook,
    StoredInvoice,
    load_book,
    plans,
)
from billing_service.usage import by_project_of, meters_of, period_usage
from pricing.cost import CostModel
from pricing.rating import Rating, rate
from pricing.usage import Usage

# `billing_service.usage.period_usage`'s signature: (conn, customer id, period, *, meters, cost_model,
# task_outcomes[, by_project]) -> the customer-period's Usage
UsageReader = Callable[..., Usage]


class InvoiceStore(Protocol):
    """Where drafting and finalizing read and save a customer's invoices: `store.PgInvoiceStore`, or
    the bulk run's `batch.BatchInvoiceStore` (in memory until its batch is written)."""

    def get(self, invoice_id: str) -> StoredInvoice: ...

    def save(self, invoice: Invoice, *, book_sha256: str | None = None, change: str = "saved",
             now: datetime | None = None, previous: StoredInvoice | None = None) -> bool: ...


class CreditLedger(Protocol):
    """Prepaid credits at finalization: `store.PgCreditLedger` or `batch.BatchCreditLedger`."""

    def grants(self, customer_id: str) -> Sequence[CreditGrant]: ...

    def entries(self, customer_id: str) -> Sequence[LedgerEntry]: ...

    def append(self, entries: Sequence[LedgerEntry], now: datetime | None = None) -> None: ...


class InvoiceNumbers(Protocol):
    """Gapless invoice numbers: `store.PgInvoiceNumbers` or `batch.BatchInvoiceNumbers`."""

    def next_number(self, issuer_prefix: str, year: int) -> str: ...


@dataclass
class DraftContext:
    """One customer's invoices, plans and ratings while its drafts are built (in the caller's
    transaction); `ratings` caches each (period label, book sha256) rating."""

    conn: psycopg.Connection
    customer: Customer
    now: datetime
    cost_model: CostModel | None
    store: InvoiceStore
    stored: list[StoredInvoice]
    plans: list[Plan]
    ratings: dict[tuple[str, str], Rating] = field(default_factory=dict)
    ledger: CreditLedger | None = None  # None: PgCreditLedger(conn); the bulk run passes its batch's
    numbers: InvoiceNumbers | None = None  # None: PgInvoiceNumbers(conn); likewise
    read_usage: UsageReader = period_usage  # a customer-period's usage (a rating not made up front)

    def rating(self, period: Period, book: StoredBook) -> Rating:
        key = (period.label, book.sha256)
        if key not in self.ratings:
            usage = self.read_usage(self.conn, self.customer.customer_id, period, meters=meters_of(book.book),
                                    cost_model=self.cost_model, task_outcomes=book.book.task_outcomes,
                                    **by_project_of(book.book))
            self.ratings[key] = rate(book.book, usage)
        return self.ratings[key]

    def period(self, label: str) -> Period:
        return billing_period(label, self.customer.timezone, self.customer.anchor_day)

    def book_of(self, stored: StoredInvoice) -> StoredBook:
        if stored.book_sha256 is None:
            raise BillingServiceError(f"invoice {stored.invoice.id} has no price book snapshot")
        return load_book(self.conn, stored.book_sha256)


def draft_context(conn: psycopg.Connection, customer: Customer, now: datetime, cost_model: CostModel | None,
                  read_usage: UsageReader = period_usage) -> DraftContext:
    """The customer's context as its invoices and plans are stored now."""
    store = PgInvoiceStore(conn)
    return DraftContext(conn, customer, now, cost_model, store, store.stored(customer.customer_id),
                        plans(conn, customer.customer_id), read_usage=read_usage)


def _other_lines(ctx: DraftContext, label: str, draft_id: str) -> list[InvoiceLine]:
    """The lines of period `label` on every charging invoice and every other draft of the customer."""
    out: list[InvoiceLine] = []
    for s in ctx.stored:
        inv = s.invoice
        if inv.id == draft_id or not (inv.status in CHARGING or inv.status is InvoiceStatus.DRAFT):
            continue
        out.extend(line for line in inv.lines if line.period == label)
    return out


def _closed_periods(ctx: DraftContext, before: Period) -> list[tuple[Period, StoredBook]]:
    """Earlier periods whose invoice is finalized and that have no draft of their own, with the book
    their finalized invoice was rated with (late usage of these becomes adjustment lines)."""
    by_label: dict[str, list[StoredInvoice]] = {}
    for s in ctx.stored:
        by_label.setdefault(s.invoice.period, []).append(s)
    out = []
    for label, group in by_label.items():
        charging = [s for s in group if s.invoice.status in CHARGING]
        if not charging or any(s.invoice.status is InvoiceStatus.DRAFT for s in group):
            continue
        period = ctx.period(label)
        if period.start < before.start:
            out.append((period, ctx.book_of(charging[-1])))
    return sorted(out, key=lambda pb: pb[0].start)


def draft_lines(ctx: DraftContext, draft_id: str, period: Period, book: StoredBook) -> tuple[InvoiceLine, ...]:
    rating = ctx.rating(period, book)
    others = _other_lines(ctx, period.label, draft_id)
    own = lines_from_rating(rating, period) if not others else adjustment_lines(
        rating, others, period=period, target_invoice_id=draft_id)
    adjustments: list[InvoiceLine] = []
    for earlier, earlier_book in _closed_periods(ctx, period):
        adjustments.extend(adjustment_lines(ctx.rating(earlier, earlier_book), _other_lines(ctx, earlier.label, draft_id),
                                            period=earlier, target_invoice_id=draft_id))
    return (*own, *adjustments)


def build_draft(ctx: DraftContext, period: Period, plan: Plan, existing: StoredInvoice | None, sequence: int) -> Invoice:
    book = load_book(ctx.conn, plan.book_sha256)
    if existing is None:
        base = empty_draft(ctx.customer.customer_id, ctx.customer.currency, period, price_book_version=book.version,
                           sequence=sequence)
    else:
        base = replace(existing.invoice, price_book_version=book.version, period_start=period.start,
                       period_end=period.end)
    return replace_lines(base, draft_lines(ctx, base.id, period, book))
