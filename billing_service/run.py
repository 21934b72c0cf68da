"""The billing run: each customer's invoices up to a period, drafted, refreshed and finalized.

For period P, per customer, in the customer's time zone from its anchor day:
1. every period of the customer from its first plan up to P, oldest first, gets an invoice: a draft
   is created or refreshed from the usage rated under the period's plan (`billing_service.drafts`:
   late usage of periods already finalized lands on it as adjustment lines); once the grace window
   (INFERMETER_BILLING_GRACE_H after the period's end) is over the draft is finalized: numbered
   without gaps, prepaid credits applied, immutable from then on. A period with nothing to bill (its
   draft has no line: no usage, no minimum, no adjustment) gets no numbered invoice: past the grace
   window no draft is created for it (one made while it was open stays an unnumbered draft), and the
   run lists it in `nothing_to_bill`; usage that arrives for it later is billed on its own invoice;
2. usage of customers without a customer record or without a plan is reported as unbilled
   (`billing_service.usage.unbilled_usage`).

Every function takes an open psycopg connection and the injected clock (`now`, an aware datetime);
each customer (or batch of customers) is billed in its own transaction, which writes nothing when
it raises.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from functools import lru_cache

import psycopg

from billing.credits import apply_credits_to_invoice
from billing.invoice import CHARGING, InvoiceStatus
from billing.invoice.drafts import first_invoice
from billing.invoice.states import finalize, finalize_first
from billing.numbering import check_prefix
from billing.periods import Period, billing_period, grace_over, next_period, parse_label
from billing_service.batch import (
    BatchCreditLedger,
    BatchInvoiceNumbers,
    BatchInvoiceStore,
    load_stored,
    lock_customers,
)
from billing_service.drafts import DraftContext, UsageReader, build_draft, draft_context
from billing_service.store import (
    BillingServiceError,
    Customer,
    PgCreditLedger,
    PgInvoiceNumbers,
    Plan,
    StoredInvoice,
    all_customers,
    checked_now,
    load_book,
    lock_customer,
    money_text,
    plan_at,
    plans_of,
    require_customer,
)
from billing_service.usage import Unbilled, period_usage, unbilled_usage
from metering.period_usage import Periods, PeriodUsageError, label_periods
from pricing.cost import CostModel
from pricing.rating import Rating, rate
from pricing.usage import Usage
from pricing_service.rate_period import gc_paused, rate_billing_period

DEFAULT_GRACE_H = 24
# customers per transaction of the bulk billing run: each holds one advisory lock per customer (the
# lock table has room for max_locks_per_transaction x max_connections, 6,400 by default)
BULK_BATCH = 1000


@dataclass
class InvoiceOutcome:
    invoice_id: str
    customer_id: str
    period: str
    status: str
    action: str  # created | refreshed | unchanged | finalized | finalized_unchanged... see _ACTIONS
    number: str | None
    subtotal: Decimal
    credits_applied: Decimal
    total: Decimal
    currency: str
    note: str = ""

    def to_json(self) -> dict:
        return {"id": self.invoice_id, "customer_id": self.customer_id, "period": self.period, "status": self.status,
                "action": self.action, "number": self.number, "currency": self.currency,
                "subtotal": money_text(self.subtotal, self.currency),
                "credits_applied": money_text(self.credits_applied, self.currency),
                "total": money_text(self.total, self.currency), "note": self.note}


@dataclass(frozen=True)
class NothingToBill:
    """A period past its grace window whose draft would have no line: no invoice number is taken for it."""

    customer_id: str
    period: str

    def to_json(self) -> dict:
        return {"customer_id": self.customer_id, "period": self.period}


@dataclass
class RunResult:
    period: str
    invoices: list[InvoiceOutcome]
    unbilled: list[Unbilled]
    not_started: list[str]
    nothing_to_bill: list[NothingToBill] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"period": self.period, "invoices": [o.to_json() for o in self.invoices],
                "unbilled": [u.to_json() for u in self.unbilled], "not_started": self.not_started,
                "nothing_to_bill": [n.to_json() for n in self.nothing_to_bill]}


# the bulk path's way of billing a customer's first invoice straight from its rating (`first_invoice_outcome`);
# None: the case does not apply, the per-customer logic bills the customer
QuickPath = Callable[[psycopg.Connection, Customer, Period, list[StoredInvoice], list[Plan],
                      dict[tuple[str, str], Rating], BatchInvoiceStore, BatchCreditLedger, BatchInvoiceNumbers,
                      datetime, timedelta, str], InvoiceOutcome | None]


def billing_run(
    conn: psycopg.Connection,
    period: str,
    *,
    now: datetime,
    customer_id: str | None = None,
    grace_h: float = DEFAULT_GRACE_H,
    cost_model: CostModel | None = None,
    issuer_prefix: str = "INV",
    bulk: bool = True,
    batch_size: int = BULK_BATCH,
    read_usage: UsageReader = period_usage,
    quick_path: QuickPath | None = None,
) -> RunResult:
    """Create or refresh (and past the grace window, finalize) each customer's invoices up to `period`;
    the unbilled usage of the period is reported, not billed.

    With `customer_id` (or `bulk=False`) each customer gets its own transaction, its own reads and
    writes. Without, the bulk path: every customer's periods are rated up front, one
    `pricing_service.rate_period.rate_billing_period` pass per period label and book, from the period
    totals metering keeps (every customer's own period of the label, +05:30 zones included), then the
    customers are billed `batch_size` at a time, one transaction each: lock them, load their invoices,
    plans and credits in a few queries, run the same per-customer logic on those in memory, and write
    the result with COPY (`billing_service.batch`). Both paths give the same invoices, ids, lines,
    numbers and history (tests/billing_service/test_bulk_run.py). Call it on an autocommit connection
    (as the CLI and the API do): inside an open transaction the batches would be savepoints whose
    locks (one per customer) are all held until that transaction ends.

    Injected (the defaults are the product's; tests pass smaller batches and counting wrappers):
    `batch_size`, `read_usage` (a customer-period's usage when it was not rated up front) and
    `quick_path` (how the bulk path bills a customer's first invoice straight from its rating;
    default `first_invoice_outcome`)."""
    now = checked_now(now)
    parse_label(period)
    check_prefix(issuer_prefix)
    if grace_h < 0:
        raise BillingServiceError(f"the grace window must be zero or more hours, got {grace_h}")
    grace = timedelta(hours=grace_h)
    customers = [require_customer(conn, customer_id)] if customer_id is not None else all_customers(conn)
    result = RunResult(period, [], [], [])
    started: list[tuple[Customer, Period]] = []
    for customer in customers:
        target = billing_period(period, customer.timezone, customer.anchor_day)
        if target.start > now:
            result.not_started.append(customer.customer_id)
        else:
            started.append((customer, target))
    if bulk and customer_id is None:
        # the bulk run holds every customer's rating and builds ~10^5 invoice lines, all acyclic: the cyclic
        # collector's passes over that heap find nothing (a fifth of the run's process CPU at 10k customers)
        with gc_paused():
            result.invoices.extend(_bulk_run(conn, started, now, grace, cost_model, issuer_prefix, batch_size,
                                             read_usage, quick_path or first_invoice_outcome, result.nothing_to_bill))
    else:
        for customer, target in started:
            with conn.transaction():
                lock_customer(conn, customer.customer_id)
                ctx = draft_context(conn, customer, now, cost_model, read_usage)
                result.invoices.extend(_run_customer(ctx, target, grace, issuer_prefix, result.nothing_to_bill))
    result.unbilled = unbilled_usage(conn, period, customers=customers, only=customer_id, cost_model=cost_model)
    return result


def _periods_to_bill(ctx: DraftContext, target: Period) -> tuple[Period, ...]:
    return _periods_from_first_plan(ctx.customer, ctx.plans, target)


def _periods_from_first_plan(customer: Customer, assigned: list[Plan], target: Period) -> tuple[Period, ...]:
    if not assigned:
        return ()
    first = (assigned[0] if len(assigned) == 1 else min(assigned, key=lambda p: p.effective_at)).effective_period
    return _periods_between(first, customer.timezone, customer.anchor_day, target)


@lru_cache(maxsize=1024)
def _periods_between(first_label: str, timezone: str, anchor_day: int, target: Period) -> tuple[Period, ...]:
    """The periods of a schedule from the one labelled `first_label` through `target` (customers of a
    bulk run mostly share them: computed once, not once or twice per customer)."""
    out = []
    p = billing_period(first_label, timezone, anchor_day)
    while p.start <= target.start:
        out.append(p)
        p = next_period(p)
    return tuple(out)


def _run_customer(ctx: DraftContext, target: Period, grace: timedelta, prefix: str,
                  nothing_to_bill: list[NothingToBill]) -> list[InvoiceOutcome]:
    """The customer's invoices up to `target`; the periods with nothing to bill are appended to `nothing_to_bill`."""
    now = ctx.now
    outcomes = []
    for period in _periods_to_bill(ctx, target):
        plan = plan_at(ctx.plans, period.start)
        if plan is None:
            continue
        group = [s for s in ctx.stored if s.invoice.period == period.label]
        drafts = [s for s in group if s.invoice.status is InvoiceStatus.DRAFT]
        if group and not drafts:
            continue  # finalized: late usage of it lands on a later draft as adjustments
        existing = drafts[-1] if drafts else None
        sequence = existing.invoice.sequence if existing else max((s.invoice.sequence for s in group), default=0) + 1
        draft = build_draft(ctx, period, plan, existing, sequence)
        closed = grace_over(period, now, grace)
        if closed and not draft.lines and existing is None:  # never drafted, and nothing to bill
            nothing_to_bill.append(NothingToBill(ctx.customer.customer_id, period.label))
            continue
        changed = ctx.store.save(draft, book_sha256=plan.book_sha256, now=now,
                                 change="created" if existing is None else "refreshed", previous=existing)
        action = "created" if existing is None else ("refreshed" if changed else "unchanged")
        stored = _reload(ctx, draft.id)
        note = ""
        if closed and not draft.lines:  # drafted while the period was open: it stays a draft, unnumbered
            nothing_to_bill.append(NothingToBill(ctx.customer.customer_id, period.label))
            continue
        if closed:
            if draft.total < 0:
                note = (f"held as a draft: its total {draft.total} {draft.currency} is negative (usage was corrected "
                        "down); it is finalized once later usage covers it, or issue a credit note instead")
            else:
                stored = _finalize(ctx, stored, prefix)
                action = "finalized"
        inv = stored.invoice
        outcomes.append(InvoiceOutcome(inv.id, inv.customer_id, inv.period, str(inv.status), action, inv.number,
                                       inv.subtotal, inv.credits_applied, inv.total, inv.currency, note))
    return outcomes


def _bulk_run(conn: psycopg.Connection, started: list[tuple[Customer, Period]], now: datetime, grace: timedelta,
              cost_model: CostModel | None, prefix: str, batch_size: int, read_usage: UsageReader,
              quick_path: QuickPath, nothing_to_bill: list[NothingToBill]) -> list[InvoiceOutcome]:
    """The billing run of many customers: ratings up front, then `batch_size` customers a transaction."""
    ids = [c.customer_id for c, _ in started]
    ratings = _bulk_ratings(conn, started, plans_of(conn, ids), load_stored(conn, ids), cost_model)
    outcomes: list[InvoiceOutcome] = []
    for at in range(0, len(started), batch_size):
        batch = started[at:at + batch_size]
        cids = [c.customer_id for c, _ in batch]
        with conn.transaction():
            lock_customers(conn, cids)
            stored, assigned = load_stored(conn, cids), plans_of(conn, cids)  # as they are under the locks
            store = BatchInvoiceStore(conn, [s for c in cids for s in stored[c]])
            ledger, numbers = BatchCreditLedger(conn, cids), BatchInvoiceNumbers(conn)
            for customer, target in batch:
                cid = customer.customer_id
                quick = quick_path(conn, customer, target, stored[cid], assigned[cid], ratings.get(cid, {}), store,
                                   ledger, numbers, now, grace, prefix)
                if quick is not None:
                    outcomes.append(quick)
                    continue
                ctx = DraftContext(conn, customer, now, cost_model, store, stored[cid], assigned[cid],
                                   dict(ratings.get(cid, {})), ledger, numbers, read_usage)
                outcomes.extend(_run_customer(ctx, target, grace, prefix, nothing_to_bill))
            store.flush()
            ledger.flush()
            numbers.flush()
    return outcomes


def first_invoice_outcome(conn: psycopg.Connection, customer: Customer, target: Period, stored: list[StoredInvoice],
                          assigned: list[Plan], ratings: dict[tuple[str, str], Rating], store: BatchInvoiceStore,
                          ledger: BatchCreditLedger, numbers: BatchInvoiceNumbers, now: datetime, grace: timedelta,
                          prefix: str) -> InvoiceOutcome | None:
    """The common case of a bulk run, without `_run_customer`'s drafting, reloads and re-checked copies
    of the invoice: a customer with no invoice yet, no prepaid credit ever, and one period to bill (the
    target, its plan's first), rated up front. Its draft is `first_invoice` of that rating (the
    `Invoice` `draft_from_rating` makes), finalized past the grace window by `finalize_first` (the one
    `finalize` makes) with the next number; `store.add_first` writes what `save` would. None when the case does not apply (or the quick
    checks of `first_invoice` do not hold): then `_run_customer` bills the customer.
    tests/billing_service/test_bulk_run.py compares both, table by table, with the per-customer path."""
    if stored or ledger.grants(customer.customer_id) or ledger.entries(customer.customer_id):
        return None
    periods = _periods_from_first_plan(customer, assigned, target)
    if len(periods) != 1 or periods[0] != target:
        return None
    plan = plan_at(assigned, target.start)
    if plan is None:
        return None
    rating = ratings.get((target.label, plan.book_sha256))
    if rating is None:
        return None
    book = load_book(conn, plan.book_sha256)
    invoice = first_invoice(rating, target, currency=customer.currency, price_book_version=book.version)
    if invoice is None:
        return None
    action = "created"
    if grace_over(target, now, grace):
        if invoice.total < 0 or not invoice.lines:  # held as a draft, or nothing to bill: `_run_customer` says so
            return None
        invoice = finalize_first(invoice, number=numbers.next_number(prefix, now.year), at=now)
        action = "finalized"
    store.add_first(invoice, book_sha256=plan.book_sha256, now=now)
    return InvoiceOutcome(invoice.id, invoice.customer_id, invoice.period, str(invoice.status), action, invoice.number,
                          invoice.subtotal, invoice.credits_applied, invoice.total, invoice.currency)


def _bulk_ratings(conn: psycopg.Connection, started: list[tuple[Customer, Period]], assigned: dict[str, list[Plan]],
                  stored: dict[str, list[StoredInvoice]], cost_model: CostModel | None,
                  ) -> dict[str, dict[tuple[str, str], Rating]]:
    """The ratings `_run_customer` will ask for (`DraftContext.rating`: {customer: {(period label, book sha256):
    rating}}), from the invoices and plans as they are now: the period of each draft it will build
    under its plan's book, and the finalized periods before the last of those under the book of their
    invoice. One `rate_billing_period` pass per period label and book, from the period totals metering
    keeps per customer x billing period (every customer's own period of the label, +05:30 and +05:45
    ones included). A customer whose period in metering's calendar is not the one billing cuts (they
    agree: billing hands metering each customer's calendar), or a label the totals do not answer for,
    is left to `DraftContext.rating` (the hourly rollups, raw events at the edges). A rating asked for
    and not here (the invoices changed before the locks were taken) is made by `DraftContext.rating` too."""
    wanted: dict[tuple[str, str], list[tuple[str, Period]]] = {}
    for customer, target in started:
        cid = customer.customer_id
        plan_list = assigned.get(cid, [])
        built: list[tuple[Period, str]] = []
        closed: list[tuple[Period, str]] = []
        for period in _periods_from_first_plan(customer, plan_list, target):
            group = [s for s in stored.get(cid, ()) if s.invoice.period == period.label]
            if group and not any(s.invoice.status is InvoiceStatus.DRAFT for s in group):
                charging = [s for s in group if s.invoice.status in CHARGING]
                if charging and charging[-1].book_sha256 is not None:
                    closed.append((period, charging[-1].book_sha256))
                continue
            plan = plan_at(plan_list, period.start)
            if plan is not None:
                built.append((period, plan.book_sha256))
        if not built:
            continue
        last = max(p.start for p, _ in built)
        for period, sha in [*built, *[(p, sha) for p, sha in closed if p.start < last]]:
            wanted.setdefault((period.label, sha), []).append((cid, period))
    out: dict[str, dict[tuple[str, str], Rating]] = {}
    calendars: dict[str, Periods] = {}
    for (label, sha), who in wanted.items():
        try:
            periods = calendars.get(label) or calendars.setdefault(label, label_periods(conn, label))
        except PeriodUsageError:
            continue  # a label the totals do not answer for: each customer's period is read the hourly way
        book = load_book(conn, sha).book
        rated = rate_billing_period(conn, book, label, cost_model, periods=periods)
        for cid, period in who:
            if periods.of(cid) != (period.start, period.end):
                continue
            rating = rated.get(cid)
            if rating is None:  # no usage in the period: the book's minimum, if any
                rating = rate(book, Usage.build(cid, period.start, period.end, []))
            out.setdefault(cid, {})[(label, sha)] = rating
    return out


def _reload(ctx: DraftContext, invoice_id: str) -> StoredInvoice:
    fresh = ctx.store.get(invoice_id)
    ctx.stored = [s for s in ctx.stored if s.invoice.id != invoice_id] + [fresh]
    ctx.stored.sort(key=lambda s: (s.invoice.period_start, s.invoice.sequence))
    return fresh


def _finalize(ctx: DraftContext, stored: StoredInvoice, prefix: str) -> StoredInvoice:
    """Apply prepaid credits, take the next number (the counter row stays locked until commit) and
    open the invoice, in the caller's transaction."""
    ledger = ctx.ledger or PgCreditLedger(ctx.conn)
    cid = ctx.customer.customer_id
    grants, so_far = ledger.grants(cid), ledger.entries(cid)
    if grants or so_far or stored.invoice.credits_applied:
        with_credits, entries = apply_credits_to_invoice(stored.invoice, grants, so_far, ctx.now)
    else:  # no prepaid credit ever: nothing to apply
        with_credits, entries = stored.invoice, ()
    number = (ctx.numbers or PgInvoiceNumbers(ctx.conn)).next_number(prefix, ctx.now.year)
    final = finalize(with_credits, number=number, at=ctx.now)
    ctx.store.save(final, book_sha256=stored.book_sha256, now=ctx.now, change="finalized", previous=stored)
    ledger.append(entries, ctx.now)
    return _reload(ctx, final.id)
