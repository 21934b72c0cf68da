"""The billing service: customers and plans, the billing run, preview, void and reissue, credit
notes, prepaid credits and `reconcile_money`. Every function takes an open psycopg connection and
the injected clock (`now`, an aware datetime); each command runs in its own transaction(s) and writes
nothing when it raises.

The billing run for period P (per customer, in the customer's time zone from its anchor day):
1. every period of the customer from its first plan up to P, oldest first, gets an invoice: a draft
   is created or refreshed from the usage rated under the period's plan; once the grace window
   (INFERMETER_BILLING_GRACE_H after the period's end) is over the draft is finalized: numbered
   without gaps, prepaid credits applied, immutable from then on;
2. a draft carries, for each earlier period whose invoice is already finalized, the adjustment lines
   that bring what was invoiced for that period up to its rating now (usage that arrived late);
3. usage of customers without a customer record or without a plan is reported as unbilled.

The one rule behind steps 1-2: the lines of a period on a draft = the period's rating now minus the
lines of that period on every other invoice that charges (open, paid, payment_failed) or is a draft.
With nothing else invoiced for the period these are the rating's own lines (same ids); otherwise
`billing.invoice.adjustment_lines`. So after a run, for every period, the lines of all charging
invoices and drafts add up to its rating exactly, and a rerun with no new usage changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from functools import lru_cache
from uuid import uuid4

import psycopg

from billing._common import aware_utc, check_minor_units
from billing.credits import CreditGrant, apply_credits_to_invoice, balance, grant_entry
from billing.errors import CreditError, InvoiceStateError, PeriodError
from billing.invoice import (
    CHARGING,
    CreditNote,
    Invoice,
    InvoiceLine,
    InvoiceStatus,
    adjustment_lines,
    credit_note,
    empty_draft,
    finalize,
    finalize_first,
    first_invoice,
    lines_from_rating,
    mark_paid,
    mark_payment_failed,
    reissue,
    replace_lines,
    void,
)
from billing.numbering import check_prefix, gaps
from billing.periods import (
    Period,
    billing_period,
    check_anchor_day,
    next_period,
    parse_label,
    period_containing,
    zone,
)
from billing_service.batch import (
    BatchCreditLedger,
    BatchInvoiceNumbers,
    BatchInvoiceStore,
    load_stored,
    lock_customers,
)
from billing_service.store import (
    BillingServiceError,
    Customer,
    PgCreditLedger,
    PgInvoiceNumbers,
    PgInvoiceStore,
    Plan,
    StoredBook,
    StoredInvoice,
    add_plan,
    all_customers,
    check_customer_id,
    get_customer,
    has_billing_history,
    load_book,
    lock_customer,
    money_text,
    number_text,
    plan_at,
    plans,
    plans_of,
    require_customer,
    save_customer,
    store_book,
)
from billing_service.usage import meters_of, period_usage, unbilled_summary
from infermeter.times import floor_hour
from metering.customers_with_usage import customers_with_usage
from pricing.cost import CostModel
from pricing.money import Currency, UnknownCurrency
from pricing.rating import Rating, rate
from pricing.usage import Usage
from pricing_service.rate_period import rate_period

ZERO = Decimal(0)
CREDIT_NOTE_PREFIX = "CN"
DEFAULT_GRACE_H = 24
UTC_SCHEDULE = ("UTC", 1)
# customers per transaction of the bulk billing run: each holds one advisory lock per customer (the
# lock table has room for max_locks_per_transaction x max_connections, 6,400 by default)
BULK_BATCH = 1000  # the periods unbilled usage of a customer without a record is reported in


def _now(now: datetime) -> datetime:
    return aware_utc(now, "now", BillingServiceError)


# ---------------------------------------------------------------- customers and plans


def set_customer(
    conn: psycopg.Connection,
    customer_id: str,
    *,
    now: datetime,
    name: str | None = None,
    email: str | None = None,
    timezone: str | None = None,
    currency: str | None = None,
    anchor_day: int | None = None,
) -> tuple[Customer, bool]:
    """Create a customer (defaults UTC, USD, anchor day 1) or update the fields given. The time zone,
    anchor day and currency are fixed once the customer has a plan or an invoice (its periods and
    plans were cut from them). Returns (the customer, whether anything changed)."""
    now = _now(now)
    check_customer_id(customer_id)
    if timezone is not None:
        zone(timezone)
    if anchor_day is not None:
        check_anchor_day(anchor_day)
    if currency is not None:
        try:
            Currency.of(currency)
        except UnknownCurrency as exc:
            raise BillingServiceError(str(exc)) from None
    if email is not None and (email.count("@") != 1 or " " in email or email.startswith("@") or email.endswith("@")):
        raise BillingServiceError(f"email {email!r} is not an e-mail address (name@example.com)")
    with conn.transaction():
        lock_customer(conn, customer_id)
        old = get_customer(conn, customer_id)
        new = Customer(
            customer_id,
            name if name is not None else (old.name if old else None),
            email if email is not None else (old.email if old else None),
            timezone if timezone is not None else (old.timezone if old else "UTC"),
            currency if currency is not None else (old.currency if old else "USD"),
            anchor_day if anchor_day is not None else (old.anchor_day if old else 1),
        )
        if old == new:
            return new, False
        if old is not None and (old.timezone, old.anchor_day, old.currency) != (new.timezone, new.anchor_day, new.currency):
            if has_billing_history(conn, customer_id):
                raise BillingServiceError(
                    f"customer {customer_id} already has plans or invoices: its time zone ({old.timezone}), anchor "
                    f"day ({old.anchor_day}) and currency ({old.currency}) cut its periods and are fixed; "
                    "bill under a new customer id instead"
                )
        save_customer(conn, new, now)
    return new, True


def parse_local_date(text: str, what: str) -> date:
    try:
        if len(text) != 10:
            raise ValueError
        return date.fromisoformat(text)
    except (TypeError, ValueError):
        raise BillingServiceError(f"{what} {text!r} is not a date of the form YYYY-MM-DD (e.g. 2026-03-01)") from None


def local_midnight(day: date, timezone: str) -> datetime:
    """00:00 of a local date in a time zone, in UTC (fold=0, as billing.periods cuts periods)."""
    return datetime(day.year, day.month, day.day, tzinfo=zone(timezone)).astimezone(UTC)


def effective_boundary(customer: Customer, day: date) -> Period:
    """The first period of the customer starting at or after 00:00 local on `day`: a plan assigned
    from inside a period takes effect at the next period boundary."""
    at = local_midnight(day, customer.timezone)
    period = period_containing(at, customer.timezone, customer.anchor_day)
    return period if period.start == at else next_period(period)


@dataclass(frozen=True)
class PlanAssignment:
    plan: Plan | None
    created: bool
    effective: Period
    book: StoredBook


def assign_plan(
    conn: psycopg.Connection, customer_id: str, book_text: str, source_name: str, from_date: str, *, now: datetime
) -> PlanAssignment:
    """Give the customer a price book from a local date (in force from the first period boundary at
    or after it). Refused for a book in another currency, and when a finalized invoice exists for a
    period it would reach (a plan change never rewrites an issued invoice)."""
    now = _now(now)
    day = parse_local_date(from_date, "--from")
    customer = require_customer(conn, customer_id)
    stored_preview = _parse_book(book_text, source_name)
    if stored_preview.book.currency != customer.currency:
        raise BillingServiceError(
            f"price book {stored_preview.book.id} is in {stored_preview.book.currency} but customer {customer_id} "
            f"is billed in {customer.currency}: use a {customer.currency} book"
        )
    effective = effective_boundary(customer, day)
    with conn.transaction():
        lock_customer(conn, customer_id)
        assigned = plans(conn, customer_id)
        finalized = conn.execute(
            "SELECT period, number, period_start FROM billing_invoices WHERE customer_id = %s AND status = ANY(%s) "
            "AND period_start >= %s ORDER BY period_start",
            (customer_id, [str(s) for s in CHARGING], effective.start),
        ).fetchall()
        newest = max((p.id for p in assigned), default=0) + 1
        candidate = Plan(newest, customer_id, day, effective.start, effective.label, stored_preview.sha256,
                         stored_preview.book.id, now)
        for period_label, number, start in finalized:  # would the new plan be the one in force there?
            if plan_at([*assigned, candidate], start) is candidate:
                raise BillingServiceError(
                    f"customer {customer_id} has a finalized invoice for period {period_label} ({number}): a plan "
                    f"change cannot reach a finalized period; assign it from a later date, or void that invoice first"
                )
        stored = store_book(conn, book_text, source_name)
        current = plan_at(assigned, effective.start)
        if current is not None and current.effective_at == effective.start and current.book_sha256 == stored.sha256:
            return PlanAssignment(current, False, effective, stored)
        add_plan(conn, customer_id, day, effective.start, effective.label, stored.sha256, now)
        plan = plan_at(plans(conn, customer_id), effective.start)
    return PlanAssignment(plan, True, effective, stored)


def _parse_book(text: str, source_name: str) -> StoredBook:
    from billing_service.store import parse_book_text

    return parse_book_text(text, source_name)


# ---------------------------------------------------------------- building drafts


@dataclass
class _Ctx:
    conn: psycopg.Connection
    customer: Customer
    now: datetime
    cost_model: CostModel | None
    store: PgInvoiceStore
    stored: list[StoredInvoice]
    plans: list[Plan]
    ratings: dict[tuple[str, str], Rating] = field(default_factory=dict)
    ledger: PgCreditLedger | None = None  # None: PgCreditLedger(conn); the bulk run passes its batch
    numbers: PgInvoiceNumbers | None = None  # None: PgInvoiceNumbers(conn); likewise

    def rating(self, period: Period, book: StoredBook) -> Rating:
        key = (period.label, book.sha256)
        if key not in self.ratings:
            usage = period_usage(self.conn, self.customer.customer_id, period, meters=meters_of(book.book),
                                 cost_model=self.cost_model, task_outcomes=book.book.task_outcomes)
            self.ratings[key] = rate(book.book, usage)
        return self.ratings[key]

    def period(self, label: str) -> Period:
        return billing_period(label, self.customer.timezone, self.customer.anchor_day)

    def invoices(self) -> list[Invoice]:
        return [s.invoice for s in self.stored]

    def book_of(self, stored: StoredInvoice) -> StoredBook:
        if stored.book_sha256 is None:
            raise BillingServiceError(f"invoice {stored.invoice.id} has no price book snapshot")
        return load_book(self.conn, stored.book_sha256)


def _other_lines(ctx: _Ctx, label: str, draft_id: str) -> list[InvoiceLine]:
    """The lines of period `label` on every charging invoice and every other draft of the customer."""
    out: list[InvoiceLine] = []
    for s in ctx.stored:
        inv = s.invoice
        if inv.id == draft_id or not (inv.status in CHARGING or inv.status is InvoiceStatus.DRAFT):
            continue
        out.extend(line for line in inv.lines if line.period == label)
    return out


def _closed_periods(ctx: _Ctx, before: Period) -> list[tuple[Period, StoredBook]]:
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


def _draft_lines(ctx: _Ctx, draft_id: str, period: Period, book: StoredBook) -> tuple[InvoiceLine, ...]:
    rating = ctx.rating(period, book)
    others = _other_lines(ctx, period.label, draft_id)
    own = lines_from_rating(rating, period) if not others else adjustment_lines(
        rating, others, period=period, target_invoice_id=draft_id)
    adjustments: list[InvoiceLine] = []
    for earlier, earlier_book in _closed_periods(ctx, period):
        adjustments.extend(adjustment_lines(ctx.rating(earlier, earlier_book), _other_lines(ctx, earlier.label, draft_id),
                                            period=earlier, target_invoice_id=draft_id))
    return (*own, *adjustments)


def _build_draft(ctx: _Ctx, period: Period, plan: Plan, existing: StoredInvoice | None, sequence: int) -> Invoice:
    book = load_book(ctx.conn, plan.book_sha256)
    if existing is None:
        base = empty_draft(ctx.customer.customer_id, ctx.customer.currency, period, price_book_version=book.version,
                           sequence=sequence)
    else:
        base = replace(existing.invoice, price_book_version=book.version, period_start=period.start,
                       period_end=period.end)
    return replace_lines(base, _draft_lines(ctx, base.id, period, book))


# ---------------------------------------------------------------- the billing run


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


@dataclass
class Unbilled:
    customer_id: str
    period: str
    period_start: datetime
    period_end: datetime
    reason: str
    quantities: dict[str, str]

    def to_json(self) -> dict:
        return {"customer_id": self.customer_id, "period": self.period, "period_start": _iso(self.period_start),
                "period_end": _iso(self.period_end), "reason": self.reason, "quantities": self.quantities}


@dataclass
class RunResult:
    period: str
    invoices: list[InvoiceOutcome]
    unbilled: list[Unbilled]
    not_started: list[str]

    def to_json(self) -> dict:
        return {"period": self.period, "invoices": [o.to_json() for o in self.invoices],
                "unbilled": [u.to_json() for u in self.unbilled], "not_started": self.not_started}


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


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
) -> RunResult:
    """Create or refresh (and past the grace window, finalize) each customer's invoices up to `period`;
    the unbilled usage of the period is reported, not billed.

    With `customer_id` (or `bulk=False`) each customer gets its own transaction, its own reads and
    writes. Without, the bulk path: every customer's periods are rated up front, one
    `pricing_service.rate_period` pass per period window and book (a customer whose window does not
    start and end on whole UTC hours, in a +05:30 zone say, is rated on its own as before), then the
    customers are billed BULK_BATCH at a time, one transaction each: lock them, load their invoices,
    plans and credits in a few queries, run the same per-customer logic on those in memory, and write
    the result with COPY (`billing_service.batch`). Both paths give the same invoices, ids, lines,
    numbers and history (tests/billing_service/test_bulk_run.py). Call it on an autocommit connection
    (as the CLI and the API do): inside an open transaction the batches would be savepoints whose
    locks (one per customer) are all held until that transaction ends."""
    now = _now(now)
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
        result.invoices.extend(_bulk_run(conn, started, now, grace, cost_model, issuer_prefix))
    else:
        for customer, target in started:
            with conn.transaction():
                lock_customer(conn, customer.customer_id)
                ctx = _context(conn, customer, now, cost_model)
                result.invoices.extend(_run_customer(ctx, target, grace, issuer_prefix))
    result.unbilled = unbilled_usage(conn, period, customers=customers, only=customer_id, cost_model=cost_model)
    return result


def _context(conn: psycopg.Connection, customer: Customer, now: datetime, cost_model: CostModel | None) -> _Ctx:
    store = PgInvoiceStore(conn)
    return _Ctx(conn, customer, now, cost_model, store, store.stored(customer.customer_id),
                plans(conn, customer.customer_id))


def _periods_to_bill(ctx: _Ctx, target: Period) -> list[Period]:
    return _periods_from_first_plan(ctx.customer, ctx.plans, target)


def _periods_from_first_plan(customer: Customer, assigned: list[Plan], target: Period) -> list[Period]:
    if not assigned:
        return []
    first = min(assigned, key=lambda p: p.effective_at).effective_period
    return list(_periods_between(first, customer.timezone, customer.anchor_day, target))


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


def _run_customer(ctx: _Ctx, target: Period, grace: timedelta, prefix: str) -> list[InvoiceOutcome]:
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
        draft = _build_draft(ctx, period, plan, existing, sequence)
        changed = ctx.store.save(draft, book_sha256=plan.book_sha256, now=now,
                                 change="created" if existing is None else "refreshed", previous=existing)
        action = "created" if existing is None else ("refreshed" if changed else "unchanged")
        stored = _reload(ctx, draft.id)
        note = ""
        if now >= period.end + grace:
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
              cost_model: CostModel | None, prefix: str) -> list[InvoiceOutcome]:
    """The billing run of many customers: ratings up front, then BULK_BATCH customers a transaction."""
    ids = [c.customer_id for c, _ in started]
    ratings = _bulk_ratings(conn, started, plans_of(conn, ids), load_stored(conn, ids), cost_model)
    outcomes: list[InvoiceOutcome] = []
    for at in range(0, len(started), BULK_BATCH):
        batch = started[at:at + BULK_BATCH]
        cids = [c.customer_id for c, _ in batch]
        with conn.transaction():
            lock_customers(conn, cids)
            stored, assigned = load_stored(conn, cids), plans_of(conn, cids)  # as they are under the locks
            store = BatchInvoiceStore(conn, [s for c in cids for s in stored[c]])
            ledger, numbers = BatchCreditLedger(conn, cids), BatchInvoiceNumbers(conn)
            for customer, target in batch:
                cid = customer.customer_id
                quick = _first_invoice_outcome(conn, customer, target, stored[cid], assigned[cid], ratings.get(cid, {}),
                                               store, ledger, numbers, now, grace, prefix)
                if quick is not None:
                    outcomes.append(quick)
                    continue
                ctx = _Ctx(conn, customer, now, cost_model, store, stored[cid], assigned[cid],  # type: ignore[arg-type]
                           dict(ratings.get(cid, {})), ledger, numbers)  # type: ignore[arg-type]
                outcomes.extend(_run_customer(ctx, target, grace, prefix))
            store.flush()
            ledger.flush()
            numbers.flush()
    return outcomes


def _first_invoice_outcome(conn: psycopg.Connection, customer: Customer, target: Period, stored: list[StoredInvoice],
                           assigned: list[Plan], ratings: dict[tuple[str, str], Rating], store: BatchInvoiceStore,
                           ledger: BatchCreditLedger, numbers: BatchInvoiceNumbers, now: datetime, grace: timedelta,
                           prefix: str) -> InvoiceOutcome | None:
    """The common case of a bulk run, without `_run_customer`'s copies of `Invoice` values: a customer
    with no invoice yet, no prepaid credit ever, and one period to bill (the target, its plan's first),
    rated up front. Its draft is `first_invoice` of that rating (what `draft_from_rating` makes),
    finalized past the grace window by `finalize_first` (what `finalize` makes) with the next number;
    `store.add_first` writes what `save` would. None when the case does not apply (or the quick
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
    if now >= target.end + grace:
        if invoice.total < 0:
            return None  # held as a draft, with its note: `_run_customer` says so
        invoice = finalize_first(invoice, number=numbers.next_number(prefix, now.year), at=now)
        action = "finalized"
    store.add_first(invoice, book_sha256=plan.book_sha256, now=now)
    return InvoiceOutcome(invoice.id, invoice.customer_id, invoice.period, str(invoice.status), action, invoice.number,
                          invoice.subtotal, invoice.credits_applied, invoice.total, invoice.currency)


def _bulk_ratings(conn: psycopg.Connection, started: list[tuple[Customer, Period]], assigned: dict[str, list[Plan]],
                  stored: dict[str, list[StoredInvoice]], cost_model: CostModel | None,
                  ) -> dict[str, dict[tuple[str, str], Rating]]:
    """The ratings `_run_customer` will ask for (`_Ctx.rating`: {customer: {(period label, book sha256):
    rating}}), from the invoices and plans as they are now: the period of each draft it will build
    under its plan's book, and the finalized periods before the last of those under the book of their
    invoice. One `rate_period` pass per period window and book; windows that are not whole UTC hours
    are left to `_Ctx.rating` (raw events at the edges). A rating asked for and not here (the
    invoices changed before the locks were taken) is made by `_Ctx.rating` too."""
    wanted: dict[tuple[datetime, datetime, str], list[tuple[str, str]]] = {}
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
            if floor_hour(period.start) == period.start and floor_hour(period.end) == period.end:
                wanted.setdefault((period.start, period.end, sha), []).append((cid, period.label))
    out: dict[str, dict[tuple[str, str], Rating]] = {}
    for (start, end, sha), who in wanted.items():
        book = load_book(conn, sha).book
        rated = rate_period(conn, book, start, end, cost_model)
        for cid, label in who:
            rating = rated.get(cid)
            if rating is None:  # no usage in the window: the book's minimum, if any
                rating = rate(book, Usage.build(cid, start, end, []))
            out.setdefault(cid, {})[(label, sha)] = rating
    return out


def _reload(ctx: _Ctx, invoice_id: str) -> StoredInvoice:
    fresh = ctx.store.get(invoice_id)
    ctx.stored = [s for s in ctx.stored if s.invoice.id != invoice_id] + [fresh]
    ctx.stored.sort(key=lambda s: (s.invoice.period_start, s.invoice.sequence))
    return fresh


def _finalize(ctx: _Ctx, stored: StoredInvoice, prefix: str) -> StoredInvoice:
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


# ---------------------------------------------------------------- unbilled usage


def unbilled_usage(
    conn: psycopg.Connection,
    period: str,
    *,
    customers: list[Customer] | None = None,
    only: str | None = None,
    cost_model: CostModel | None = None,
) -> list[Unbilled]:
    """Usage in `period` that no invoice will carry: customers without a record (in the UTC period of
    that label) and customers whose period has no plan."""
    known = {c.customer_id: c for c in (customers if customers is not None else all_customers(conn))}
    out: list[Unbilled] = []
    utc = billing_period(period, *UTC_SCHEDULE)
    candidates = [only] if only is not None else sorted(set(customers_with_usage(conn, utc.window)) | set(known))
    assigned = plans_of(conn, [c for c in candidates if c in known])  # one query, not one per customer
    found: list[tuple[str, Period, str, bool]] = []  # (customer, its window, reason, has a record)
    for cid in candidates:
        customer = known.get(cid) or (get_customer(conn, cid) if only is None else None)
        if customer is None:
            found.append((cid, utc, "no customer record (`infermeter customers set`)", False))
            continue
        window = billing_period(period, customer.timezone, customer.anchor_day)
        if plan_at(assigned[cid] if cid in assigned else plans(conn, cid), window.start) is None:
            found.append((cid, window, "no plan for this period (`infermeter plans assign`)", True))
    # customers with a record but no plan: usage in their own window? (one query per window, not per customer)
    windows: dict[Period, list[str]] = {}
    for cid, window, _, recorded in found:
        if recorded:
            windows.setdefault(window, []).append(cid)
    with_usage = {(cid, w) for w, ids in windows.items() for cid in customers_with_usage(conn, w.window, among=ids)}
    for cid, window, reason, recorded in found:
        if recorded and (cid, window) not in with_usage:
            continue
        summary = unbilled_summary(conn, cid, window, cost_model)  # tasks: every source, labelled
        if summary:
            out.append(Unbilled(cid, period, window.start, window.end, reason, summary))
    return out


# ---------------------------------------------------------------- preview


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
    now = _now(now)
    parse_label(period)
    customer = require_customer(conn, customer_id)
    target = billing_period(period, customer.timezone, customer.anchor_day)
    with conn.transaction():
        ctx = _context(conn, customer, now, cost_model)
        group = [s for s in ctx.stored if s.invoice.period == period]
        drafts = [s for s in group if s.invoice.status is InvoiceStatus.DRAFT]
        if group and not drafts and book is None:
            final = [s for s in group if s.invoice.status in CHARGING] or group
            return _preview_json(final[-1].invoice, customer, note="finalized")
        if book is not None:
            stored_book = _parse_book(*book)
            if stored_book.book.currency != customer.currency:
                raise BillingServiceError(
                    f"price book {stored_book.book.id} is in {stored_book.book.currency} but customer {customer_id} "
                    f"is billed in {customer.currency}"
                )
        else:
            plan = plan_at(ctx.plans, target.start)
            if plan is None:
                raise BillingServiceError(
                    f"customer {customer_id} has no plan for period {period}: assign one with "
                    f"`infermeter plans assign --customer {customer_id} --price-book FILE --from DATE`, "
                    "or preview with --price-book FILE"
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
            lines = _draft_lines(ctx, base.id, target, stored_book)
        draft = replace_lines(base, lines)
        ledger = PgCreditLedger(conn)
        if draft.total >= 0:
            draft, _ = apply_credits_to_invoice(draft, ledger.grants(customer_id), ledger.entries(customer_id), now)
        note = "period to date" if now < target.end else "period over"
        return _preview_json(draft, customer, note=note + (f"; what-if under {stored_book.book.id}" if book else ""))


def line_json(line: InvoiceLine, currency: str) -> dict:
    from pricing.book import REQUEST_METERS

    return {"id": line.id, "meter": line.meter, "model": line.group if line.meter in REQUEST_METERS else "",
            "group": line.group, "kind": line.kind, "quantity": number_text(line.quantity),
            "unit_price": None if line.unit_price is None else number_text(line.unit_price),
            "amount": money_text(line.amount, currency), "period": line.period,
            "adjustment": line.is_adjustment}


def _preview_json(inv: Invoice, customer: Customer, *, note: str) -> dict:
    return {"customer_id": customer.customer_id, "currency": inv.currency, "period": inv.period,
            "period_start": _iso(inv.period_start), "period_end": _iso(inv.period_end), "status": str(inv.status),
            "price_book_version": inv.price_book_version, "note": note,
            "lines": [line_json(line, inv.currency) for line in inv.lines],
            "subtotal": money_text(inv.subtotal, inv.currency),
            "credits_applied": money_text(inv.credits_applied, inv.currency),
            "total": money_text(inv.total, inv.currency)}


# ---------------------------------------------------------------- invoices: list, show, void, credit notes


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
        period_start=_iso(inv.period_start), period_end=_iso(inv.period_end), sequence=inv.sequence,
        price_book_version=inv.price_book_version, issued_at=inv.issued_at and _iso(inv.issued_at),
        finalized_at=inv.finalized_at and _iso(inv.finalized_at), reissue_of=inv.reissue_of,
        lines=[line_json(line, inv.currency) for line in inv.lines],
        credit_notes=[{"id": n.id, "number": numbers.get(n.id), "total": money_text(n.total, n.currency),
                       "refund_amount": money_text(n.refund_amount, n.currency),
                       "credits_returned": money_text(n.credits_returned, n.currency), "reason": n.reason,
                       "issued_at": _iso(n.issued_at),
                       "lines": [{"invoice_line_id": x.invoice_line_id, "amount": money_text(x.amount, n.currency)}
                                 for x in n.lines]} for n in store.credit_notes(inv.id)],
        history=history(conn, inv.id),
    )
    return out


def void_invoice(conn: psycopg.Connection, invoice_id: str, *, now: datetime) -> tuple[Invoice, Invoice]:
    """Void a finalized (open or payment_failed) invoice and create its reissue: a new draft of the
    same period (next sequence) that the next billing run refreshes from the usage and finalizes.
    Returns (the void invoice, the reissue draft)."""
    now = _now(now)
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
    _return_credits_of_void(conn, voided, now)
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

    Goes through the domain's state machine (`billing.invoice.mark_paid` / `mark_payment_failed` / `void`)
    and the store (one history row, change "paid (reported <at>)" ...). The same status again is a no-op
    (nothing written); a change the state machine refuses (paid -> payment_failed, a draft paid, ...)
    raises `InvoiceStateError`, a BillingError. `void` does what `invoices void` does: the invoice becomes
    void, a reissue draft of its period is created (the next billing run refreshes and finalizes it, so
    the usage is still billed and reconcile still balances), and the prepaid credits it used come back.

    The transition is dated `at`, or the invoice's last change when `at` is earlier (the collector's clock
    and ours differ by a little: a payment reported a second "before" the invoice's last recorded change
    is still a payment, not an impossible change)."""
    now = _now(now)
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
        change = f"{wanted} (reported {_iso(at)})"
        if wanted is InvoiceStatus.VOID:
            voided, fresh = _void_and_reissue(conn, store, stored, moved, now=now, change=change)
            return PaymentStatusOutcome(voided, True, fresh)
        store.save(moved, book_sha256=stored.book_sha256, now=now, change=change, previous=stored)
        return PaymentStatusOutcome(moved, True)


def _return_credits_of_void(conn: psycopg.Connection, voided: Invoice, now: datetime) -> None:
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
    now = _now(now)
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


# ---------------------------------------------------------------- prepaid credits


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
    now = _now(now)
    customer = require_customer(conn, customer_id)
    money = Currency.of(customer.currency)
    try:
        value = Decimal(amount.strip()) if isinstance(amount, str) else None
    except ArithmeticError:
        value = None
    if value is None or not value.is_finite():
        raise CreditError(f"amount {amount!r} is not a decimal number such as 50.00")
    if value <= 0:
        raise CreditError(f"amount {amount} must be greater than zero")
    check_minor_units(value, money, "credit amount", CreditError)
    expires_at = None
    if expires is not None:
        expires_at = local_midnight(parse_local_date(expires, "--expires"), customer.timezone)
        if expires_at <= now:
            raise CreditError(f"--expires {expires} is not in the future (the grant would expire before it starts)")
    text = (reason or "prepaid credit").strip()
    with conn.transaction():
        lock_customer(conn, customer_id)
        return _grant(PgCreditLedger(conn), customer_id, customer.currency, value, now, expires_at, text)


def credits_view(conn: psycopg.Connection, customer_id: str, *, now: datetime) -> dict:
    """Every grant, the ledger (grant, use, expiry; expiries not yet recorded by a finalization are
    shown as they will be), and the balance usable now."""
    now = _now(now)
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
                                "at": _iso(g.expires_at), "invoice_id": None, "recorded": False})
    rows = [{"kind": e.kind, "grant_id": e.grant_id, "amount": money_text(e.amount, e.currency), "at": _iso(e.at),
             "invoice_id": e.invoice_id, "recorded": True} for e in entries] + pending
    rows.sort(key=lambda r: (r["at"], r["kind"] != "grant"))
    return {
        "customer_id": customer_id, "currency": customer.currency,
        "balance": money_text(balance(entries, now, currency=customer.currency), customer.currency),
        "grants": [{"id": g.id, "amount": money_text(g.amount, g.currency), "granted_at": _iso(g.granted_at),
                    "expires_at": g.expires_at and _iso(g.expires_at), "reason": g.reason} for g in grants],
        "ledger": rows,
    }


# ---------------------------------------------------------------- reconcile


@dataclass
class MoneyDifference:
    customer_id: str
    period: str
    what: str
    expected: str
    found: str

    def to_json(self) -> dict:
        return self.__dict__.copy()


@dataclass
class ReconcileReport:
    period: str
    checked: list[dict]
    differences: list[MoneyDifference]
    unbilled: list[Unbilled]
    number_gaps: list[str]

    @property
    def ok(self) -> bool:
        return not self.differences and not self.number_gaps

    def to_json(self) -> dict:
        return {"period": self.period, "ok": self.ok, "checked": self.checked,
                "differences": [d.to_json() for d in self.differences],
                "unbilled": [u.to_json() for u in self.unbilled], "number_gaps": self.number_gaps}


def reconcile_money(conn: psycopg.Connection, period: str, *, cost_model: CostModel | None = None) -> ReconcileReport:
    """For each customer with invoices for `period`: the quantities on its invoices (charging ones and
    drafts, wherever the lines landed) equal the period's usage read from metering now, line by line,
    and their amounts equal the period's rating now (finalized invoices + adjustments = rated current
    usage). Also: invoice and credit note numbers have no gaps. Unbilled usage is listed."""
    parse_label(period)
    report = ReconcileReport(period, [], [], [], [])
    store = PgInvoiceStore(conn)
    with conn.transaction():
        for customer in all_customers(conn):
            stored = store.stored(customer.customer_id)
            mine = [s for s in stored if s.invoice.period == period]
            if not mine:
                continue
            target = billing_period(period, customer.timezone, customer.anchor_day)
            counted = [s for s in stored if s.invoice.status in CHARGING or s.invoice.status is InvoiceStatus.DRAFT]
            lines = [line for s in counted for line in s.invoice.lines if line.period == period]
            charging = [s for s in mine if s.invoice.status in CHARGING] or [s for s in mine if s.invoice.status is InvoiceStatus.DRAFT]
            if not charging:
                report.differences.append(MoneyDifference(customer.customer_id, period, "no charging invoice or draft",
                                                          "an invoice", "only void invoices"))
                continue
            book = load_book(conn, charging[-1].book_sha256)
            used = period_usage(conn, customer.customer_id, target, meters=meters_of(book.book), cost_model=cost_model,
                                task_outcomes=book.book.task_outcomes)
            rating = rate(book.book, used)
            expected = {line.line_id: line for line in rating.lines}
            found: dict[str, tuple[Decimal, Decimal]] = {}
            for line in lines:
                q, a = found.get(line.rated_line_id, (ZERO, ZERO))
                found[line.rated_line_id] = (q + line.quantity, a + line.amount)
            for lid in sorted(set(expected) | set(found)):
                e = expected.get(lid)
                eq, ea = (e.quantity, e.amount) if e else (ZERO, ZERO)
                fq, fa = found.get(lid, (ZERO, ZERO))
                name = f"{e.meter}/{e.group}" if e else lid
                if eq != fq:
                    report.differences.append(MoneyDifference(customer.customer_id, period, f"quantity {name}",
                                                              number_text(eq), number_text(fq)))
                if ea != fa:
                    report.differences.append(MoneyDifference(customer.customer_id, period, f"amount {name}",
                                                              money_text(ea, book.book.currency),
                                                              money_text(fa, book.book.currency)))
            invoiced = sum((line.amount for line in lines), ZERO)
            report.checked.append({"customer_id": customer.customer_id, "period": period,
                                   "rated": money_text(rating.total, rating.currency),
                                   "invoiced": money_text(invoiced, rating.currency),
                                   "finalized": money_text(sum((line.amount for s in stored if s.invoice.status in CHARGING
                                                                for line in s.invoice.lines if line.period == period), ZERO),
                                                           rating.currency)})
        numbers = [r[0] for r in conn.execute("SELECT number FROM billing_invoices WHERE number IS NOT NULL "
                                              "UNION ALL SELECT number FROM billing_credit_notes")]
        report.number_gaps = [f"{p}-{y}-{s:06d}" for p, y, s in gaps(numbers)]
        report.unbilled = unbilled_usage(conn, period, cost_model=cost_model)
    return report


__all__ = [
    "assign_plan", "billing_run", "credits_view", "grant_credits", "issue_credit_note", "list_invoices",
    "preview_invoice", "reconcile_money", "record_payment_status", "set_customer", "show_invoice", "unbilled_usage", "void_invoice",
    "BillingServiceError", "InvoiceStateError", "PeriodError",
]
