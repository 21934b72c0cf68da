"""Stripe, end to end: which local invoices go to Stripe (`sync_invoices`), what is known about each
(`sync_status`), and the status port the webhook route calls (`status_port`).

- `sync_invoices` first pushes customer updates: each customer already in Stripe whose name or e-mail
  changed locally since it was created or last pushed (its `customer_version`) is updated there once
  (`StripeSync.update_customer`, under the customer's lock; a failure is reported and the others go on).

- `sync_invoices(conn, sync, ...)`: every finalized invoice (open, paid, payment_failed) not yet in sync,
  and every void invoice that reached Stripe before it was voided, pushed with `StripeSync.sync_invoice`,
  per customer oldest first (by finalization time, then number), one customer at a time (a session
  advisory lock per customer: two `stripe sync` never push one customer's invoices at once). A customer
  whose push fails is left there (its later invoices would meet its pending items); the others go on.
- In sync means: the `finalize` step is recorded for a finalized invoice; for a void invoice, the `void`
  step is recorded, or nothing of it ever reached Stripe (no invoice or item recorded: there is nothing
  to void there, and pushing it only to void it would finalize a Stripe invoice, which starts collection).
- Credit notes: after each invoice of a customer, its credit notes not in Stripe yet are pushed
  (`StripeSync.sync_credit_note`) once its Stripe invoice is finalized; until then they wait (outcome
  `waiting`). A note that gives back nothing charged in Stripe (all of it returns prepaid credits) and a
  note of a void invoice have nothing to push. A failed note is reported (exit 1) and the rest goes on:
  a credit note leaves no pending item that a later invoice would sweep in.
- `status_port(pool_or_connect, clock)`: `on_status(invoice_id, status, at)` for the webhook handler,
  running `billing_service.invoices.record_payment_status` on its own connection and transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime

import psycopg

from billing._common import stable_id
from billing.credit_notes import CreditNote
from billing.invoice import Invoice, InvoiceStatus
from billing.periods import parse_label
from billing_service.store import PgInvoiceStore, get_customer, money_text, require_customer
from billing_service.stripe.state import SyncState
from billing_service.stripe.sync import CustomerInfo, StripeSync, credit_note_amount_minor, item_specs
from infermeter.times import utc_text

PUSHED = (InvoiceStatus.OPEN, InvoiceStatus.PAID, InvoiceStatus.PAYMENT_FAILED, InvoiceStatus.VOID)


def _candidates(conn: psycopg.Connection, period: str | None, customer_id: str | None) -> list[Invoice]:
    if period is not None:
        parse_label(period)
    if customer_id is not None:
        require_customer(conn, customer_id)
    ids = [r[0] for r in conn.execute(
        "SELECT id FROM billing_invoices WHERE status = ANY(%(s)s) "
        "AND (%(c)s::text IS NULL OR customer_id = %(c)s) AND (%(p)s::text IS NULL OR period = %(p)s) "
        "ORDER BY customer_id, finalized_at, number",
        {"s": [str(s) for s in PUSHED], "c": customer_id, "p": period},
    )]
    store = PgInvoiceStore(conn)
    return [store.get(i).invoice for i in ids]


Recorded = Callable[[str, str], bool]  # (kind, local id) -> is it in stripe_objects?


def recorded_in(state: SyncState) -> Recorded:
    return lambda kind, local_id: state.get(kind, local_id) is not None


def _touched(recorded: Recorded, invoice: Invoice) -> bool:
    """Did any part of the invoice reach Stripe (its invoice or one of its items recorded)?"""
    return recorded("invoice", invoice.id) or any(
        recorded("invoiceitem", spec.local_id(invoice.id)) for spec in item_specs(invoice))


def in_sync(recorded: Recorded, invoice: Invoice) -> bool:
    if invoice.status is InvoiceStatus.VOID:
        return recorded("void", invoice.id) or not _touched(recorded, invoice)
    return recorded("finalize", invoice.id)


def credit_note_state(recorded: Recorded, invoice: Invoice, note: CreditNote) -> tuple[bool, bool, str]:
    """(in sync, to push now, why) of a credit note of `invoice`."""
    if recorded("creditnote", note.id):
        return True, False, "credited in Stripe"
    if credit_note_amount_minor(note, invoice) == 0:
        return True, False, "nothing to credit in Stripe: it returns prepaid credits only"
    if invoice.status is InvoiceStatus.VOID:
        return True, False, "invoice void: nothing to credit in Stripe"
    if recorded("finalize", invoice.id):
        return False, True, "not pushed yet"
    return False, False, "waits for its invoice to be finalized in Stripe"


@dataclass
class SyncedCreditNote:
    credit_note_id: str
    number: str | None
    invoice_id: str
    invoice_number: str | None
    customer_id: str
    total: str
    stripe_amount: str  # what is credited in Stripe (decimal text): the part that gives back what was charged
    outcome: str  # pushed | in_sync | waiting | failed
    stripe_credit_note: str | None = None
    note: str | None = None
    error: str | None = None

    def to_json(self) -> dict:
        return {"id": self.credit_note_id, "number": self.number, "invoice_id": self.invoice_id,
                "invoice_number": self.invoice_number, "customer_id": self.customer_id, "total": self.total,
                "stripe_amount": self.stripe_amount, "outcome": self.outcome,
                "stripe_credit_note": self.stripe_credit_note, "note": self.note, "error": self.error}


def _credit_notes(conn: psycopg.Connection, invoice: Invoice) -> list[tuple[CreditNote, str | None]]:
    store = PgInvoiceStore(conn)
    numbers = store.credit_note_numbers(invoice.id)
    return [(note, numbers.get(note.id)) for note in store.credit_notes(invoice.id)]


def sync_credit_notes(conn: psycopg.Connection, sync: StripeSync, invoice: Invoice) -> list[SyncedCreditNote]:
    """Push the credit notes of `invoice` that are due (see `credit_note_state`), oldest first."""
    out = []
    for note, number in _credit_notes(conn, invoice):
        row = SyncedCreditNote(note.id, number, invoice.id, invoice.number, invoice.customer_id,
                               money_text(note.total, note.currency), money_text(note.refund_amount, note.currency), "in_sync")
        out.append(row)
        synced, due, why = credit_note_state(recorded_in(sync.state), invoice, note)
        row.note = why
        if synced:
            record = sync.state.get("creditnote", note.id)
            row.stripe_credit_note = record.stripe_id if record else None
            continue
        if not due:
            row.outcome = "waiting"
            continue
        try:
            row.stripe_credit_note = sync.sync_credit_note(invoice, note, number or note.id)
        except Exception as exc:  # a Stripe error or a mismatch: report it, go on
            row.outcome, row.error = "failed", str(exc)
            continue
        row.outcome, row.note = "pushed", "credited in Stripe"
    return out


def customer_version(name: str, email: str | None) -> str:
    """A short digest of what Stripe holds of a customer (name, e-mail)."""
    return stable_id("customer_version", name, email or "")[:16]


def customer_info(conn: psycopg.Connection, customer_id: str, currency: str) -> CustomerInfo:
    customer = get_customer(conn, customer_id)
    if customer is None:  # an invoice always has a customer record (foreign key); defensive
        return CustomerInfo(customer_id, customer_id, None, currency)
    name = customer.name or customer_id
    return CustomerInfo(customer_id, name, customer.email, customer.currency, customer_version(name, customer.email))


def _last_pushes(records: list[tuple[str, str]]) -> dict[str, tuple[int, str]]:
    """customer id -> (number, version) of its last recorded push of name and e-mail to Stripe, from
    customer_update records (local id "<customer>@<number>", key ending with the version)."""
    out: dict[str, tuple[int, str]] = {}
    for local_id, key in records:
        owner, _, number = local_id.rpartition("@")
        if number.isdigit():
            push = (int(number), key.rsplit(":", 1)[1])
            out[owner] = max(out.get(owner, push), push)
    return out


@dataclass
class UpdatedCustomer:
    customer_id: str
    stripe_customer: str
    outcome: str  # updated | failed
    error: str | None = None

    def to_json(self) -> dict:
        return {"customer_id": self.customer_id, "stripe_customer": self.stripe_customer, "outcome": self.outcome,
                "error": self.error}


def sync_customers(conn: psycopg.Connection, sync: StripeSync, *, customer_id: str | None = None
                   ) -> list[UpdatedCustomer]:
    """Push the name and e-mail of each customer in Stripe whose name or e-mail differ from the last ones
    pushed (or created with); a customer in Stripe with no push recorded (created before pushes were
    recorded, or found by its e-mail after the state was lost) gets one."""
    rows = conn.execute(
        "SELECT c.customer_id, c.name, c.email, o.stripe_id FROM billing_customers c "
        "JOIN stripe_objects o ON o.kind = 'customer' AND o.local_id = c.customer_id "
        "WHERE %(c)s::text IS NULL OR c.customer_id = %(c)s ORDER BY c.customer_id",
        {"c": customer_id},
    ).fetchall()
    last = _last_pushes(conn.execute("SELECT local_id, idempotency_key FROM stripe_objects "
                                     "WHERE kind = 'customer_update'").fetchall())
    out = []
    for cid, name, email, stripe_id in rows:
        if cid in last and last[cid][1] == customer_version(name or cid, email):
            continue  # as pushed (the common case: no lock, no call)
        with _customer_lock(conn, cid):
            customer = get_customer(conn, cid)  # fresh, now that we hold the lock
            info = customer_info(conn, cid, customer.currency if customer else "USD")
            now_last = _last_pushes(conn.execute(
                "SELECT local_id, idempotency_key FROM stripe_objects WHERE kind = 'customer_update' "
                "AND starts_with(local_id, %s)", (cid + "@",)).fetchall()).get(cid)
            if now_last is not None and now_last[1] == info.version:
                continue
            try:
                if sync.update_customer(info, 1 if now_last is None else now_last[0] + 1):
                    out.append(UpdatedCustomer(cid, stripe_id, "updated"))
            except Exception as exc:  # a Stripe error: report it, go on with the other customers
                out.append(UpdatedCustomer(cid, stripe_id, "failed", str(exc)))
    return out


@dataclass
class SyncedInvoice:
    invoice_id: str
    number: str | None
    customer_id: str
    period: str
    status: str
    outcome: str  # pushed | in_sync | failed | skipped
    stripe_invoice: str | None = None
    stripe_status: str | None = None
    error: str | None = None

    def to_json(self) -> dict:
        return {"id": self.invoice_id, "number": self.number, "customer_id": self.customer_id, "period": self.period,
                "status": self.status, "outcome": self.outcome, "stripe_invoice": self.stripe_invoice,
                "stripe_status": self.stripe_status, "error": self.error}


@dataclass
class SyncReport:
    invoices: list[SyncedInvoice] = field(default_factory=list)
    customers: list[UpdatedCustomer] = field(default_factory=list)  # customer updates pushed (or failed)
    credit_notes: list[SyncedCreditNote] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (all(i.outcome != "failed" for i in self.invoices) and all(c.outcome != "failed" for c in self.customers)
                and all(n.outcome != "failed" for n in self.credit_notes))

    def count(self, outcome: str) -> int:
        return sum(1 for i in self.invoices if i.outcome == outcome)

    def to_json(self) -> dict:
        return {"ok": self.ok, "pushed": self.count("pushed"), "in_sync": self.count("in_sync"),
                "failed": self.count("failed"), "skipped": self.count("skipped"),
                "invoices": [i.to_json() for i in self.invoices],
                "customers_updated": sum(1 for c in self.customers if c.outcome == "updated"),
                "customers": [c.to_json() for c in self.customers],
                "credit_notes_pushed": sum(1 for n in self.credit_notes if n.outcome == "pushed"),
                "credit_notes": [n.to_json() for n in self.credit_notes]}


@contextmanager
def _customer_lock(conn: psycopg.Connection, customer_id: str) -> Iterator[None]:
    """A session advisory lock (not a transaction: Stripe calls are slow and a billing run must not wait)."""
    conn.execute("SELECT pg_advisory_lock(hashtext('infermeter.stripe'), hashtext(%s))", (customer_id,))
    try:
        yield
    finally:
        conn.execute("SELECT pg_advisory_unlock(hashtext('infermeter.stripe'), hashtext(%s))", (customer_id,))


def sync_invoices(
    conn: psycopg.Connection, sync: StripeSync, *, period: str | None = None, customer_id: str | None = None
) -> SyncReport:
    """Push what is not in sync yet (see the module docstring). `conn` is an autocommit connection."""
    if period is not None:
        parse_label(period)
    if customer_id is not None:
        require_customer(conn, customer_id)
    report = SyncReport(customers=sync_customers(conn, sync, customer_id=customer_id))
    by_customer: dict[str, list[Invoice]] = {}
    for invoice in _candidates(conn, period, customer_id):
        by_customer.setdefault(invoice.customer_id, []).append(invoice)
    store = PgInvoiceStore(conn)
    for cid, listed in by_customer.items():
        with _customer_lock(conn, cid):
            failed: str | None = None
            for listed_invoice in listed:
                invoice = store.get(listed_invoice.id).invoice  # fresh, now that we hold the lock
                row = SyncedInvoice(invoice.id, invoice.number, cid, invoice.period, str(invoice.status), "in_sync")
                report.invoices.append(row)
                if failed is not None:
                    row.outcome, row.error = "skipped", f"an earlier invoice of {cid} failed: {failed}"
                elif in_sync(recorded_in(sync.state), invoice):
                    record = sync.state.get("invoice", invoice.id)
                    row.stripe_invoice = record.stripe_id if record else None
                else:
                    try:
                        result = sync.sync_invoice(invoice, customer_info(conn, cid, invoice.currency))
                    except Exception as exc:  # a Stripe error or a mismatch: report it, go on with other customers
                        failed = f"{invoice.number or invoice.id}: {exc}"
                        row.outcome, row.error = "failed", str(exc)
                    else:
                        row.outcome, row.stripe_invoice, row.stripe_status = "pushed", result.invoice, result.status
                report.credit_notes.extend(sync_credit_notes(conn, sync, invoice))  # those due: waiting if not
    return report


def sync_status(conn: psycopg.Connection, *, period: str | None = None,
                customer_id: str | None = None) -> list[dict]:
    """Per finalized or void invoice: local status, the Stripe ids recorded, in sync or not (no Stripe call)."""
    invoices = _candidates(conn, period, customer_id)
    records: dict[tuple[str, str], str] = {
        (kind, local_id): stripe_id
        for kind, local_id, stripe_id in conn.execute("SELECT kind, local_id, stripe_id FROM stripe_objects")
    }

    out = []
    for inv in invoices:
        items = [records[("invoiceitem", s.local_id(inv.id))] for s in item_specs(inv)
                 if ("invoiceitem", s.local_id(inv.id)) in records]
        synced = in_sync(lambda kind, local_id: (kind, local_id) in records, inv)
        if inv.status is InvoiceStatus.VOID and synced and ("void", inv.id) not in records:
            note = "void before it reached Stripe: nothing to push"
        elif synced:
            note = "voided in Stripe" if inv.status is InvoiceStatus.VOID else "finalized in Stripe"
        else:
            note = "not pushed yet" if not items and ("invoice", inv.id) not in records else "push incomplete"
        out.append({
            "id": inv.id, "number": inv.number, "customer_id": inv.customer_id, "period": inv.period,
            "status": str(inv.status), "finalized_at": inv.finalized_at and utc_text(inv.finalized_at),
            "stripe_customer": records.get(("customer", inv.customer_id)),
            "stripe_invoice": records.get(("invoice", inv.id)), "stripe_items": len(items),
            "items_expected": len(item_specs(inv)), "finalized_in_stripe": ("finalize", inv.id) in records,
            "voided_in_stripe": ("void", inv.id) in records, "in_sync": synced, "note": note,
        })
    return out


def credit_note_status(conn: psycopg.Connection, *, period: str | None = None,
                       customer_id: str | None = None) -> list[dict]:
    """Per credit note of a finalized or void invoice: what Stripe has of it (no Stripe call)."""
    records: dict[tuple[str, str], str] = {
        (kind, local_id): stripe_id
        for kind, local_id, stripe_id in conn.execute("SELECT kind, local_id, stripe_id FROM stripe_objects")
    }
    out = []
    for inv in _candidates(conn, period, customer_id):
        for note, number in _credit_notes(conn, inv):
            synced, _, why = credit_note_state(lambda kind, local_id: (kind, local_id) in records, inv, note)
            out.append({
                "id": note.id, "number": number, "invoice_id": inv.id, "invoice_number": inv.number,
                "customer_id": inv.customer_id, "period": inv.period, "total": money_text(note.total, note.currency),
                "stripe_amount": money_text(note.refund_amount, note.currency),
                "stripe_credit_note": records.get(("creditnote", note.id)), "in_sync": synced, "note": why,
            })
    return out


def status_port(
    connect: Callable[[], AbstractContextManager[psycopg.Connection]], clock: Callable[[], datetime]
) -> Callable[[str, InvoiceStatus, datetime], None]:
    """`on_status(invoice_id, status, at)` for `WebhookHandler`: `record_payment_status` on a connection
    from `connect()` (autocommit; the service function owns its transaction), recorded at `clock()`."""
    from billing_service.invoices import record_payment_status

    def on_status(invoice_id: str, status: InvoiceStatus, at: datetime) -> None:
        with connect() as conn:
            conn.autocommit = True
            conn.execute("SET TIME ZONE 'UTC'")
            record_payment_status(conn, invoice_id, status, at, now=clock())

    return on_status
