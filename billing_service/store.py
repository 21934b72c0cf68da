"""psycopg adapters for billing: customers, price-book snapshots, plans, the invoice store, the
credit ledger and gapless invoice numbers (the draft and finalization logic takes these, or the bulk
run's batch versions, through the protocols of `billing_service.drafts`).

Nothing here decides anything: the billing service's modules (`customers`, `run`, `invoices`,
`credits`) own the transactions and the clock; these functions read and write rows. Every write of
an invoice appends a history row (the invoice without its lines, as JSON; the database keeps a
draft's lines when they are replaced) so what was known at any moment can be reproduced
(`invoice_as_of`, `with_lines`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import ROUND_HALF_UP, Decimal

import psycopg
from psycopg.types.json import Jsonb

from billing._common import aware_utc
from billing.credit_notes import CreditNote, CreditNoteLine
from billing.credits import CreditGrant, LedgerEntry
from billing.errors import BillingError, InvoiceImmutable
from billing.invoice import Invoice, InvoiceLine, InvoiceStatus, StatusChange
from billing.numbering import format_number
from infermeter.times import utc_text
from pricing.book import PriceBook, parse_price_book, price_book_from_data, price_book_to_data
from pricing.money import QUANT, Currency


class BillingServiceError(BillingError):
    """A billing command that cannot be done as asked; the message says why and what to do."""


class UnknownCustomer(BillingServiceError):
    pass


class UnknownInvoice(BillingServiceError):
    pass


def checked_now(now: datetime) -> datetime:
    """The injected clock's `now`, as an aware UTC datetime (a naive one is refused)."""
    return aware_utc(now, "now", BillingServiceError)


_CUSTOMER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,255}")


def check_customer_id(customer_id: object) -> str:
    if not isinstance(customer_id, str) or not _CUSTOMER_ID.fullmatch(customer_id):
        raise BillingServiceError(
            f"customer id {customer_id!r} is not valid: use letters, digits and . _ : @ - (starting with a "
            "letter or digit, at most 256 characters)"
        )
    return customer_id


def lock_customer(conn: psycopg.Connection, customer_id: str) -> None:
    """Serialize every billing write of one customer (runs, voids, credit notes, grants, plans)."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('infermeter.billing'), hashtext(%s))", (customer_id,))


# ---------------------------------------------------------------- customers


@dataclass(frozen=True)
class Customer:
    customer_id: str
    name: str | None
    email: str | None
    timezone: str
    currency: str
    anchor_day: int

    def to_json(self) -> dict:
        return {"customer_id": self.customer_id, "name": self.name, "email": self.email, "timezone": self.timezone,
                "currency": self.currency, "anchor_day": self.anchor_day}


_CUSTOMER_COLS = "customer_id, name, email, timezone, currency, anchor_day"


def get_customer(conn: psycopg.Connection, customer_id: str) -> Customer | None:
    row = conn.execute(f"SELECT {_CUSTOMER_COLS} FROM billing_customers WHERE customer_id = %s", (customer_id,)).fetchone()
    return None if row is None else Customer(*row)


def require_customer(conn: psycopg.Connection, customer_id: str) -> Customer:
    found = get_customer(conn, customer_id)
    if found is None:
        raise UnknownCustomer(
            f"unknown customer {customer_id!r}: create it first with `infermeter customers set {customer_id}`"
        )
    return found


def all_customers(conn: psycopg.Connection) -> list[Customer]:
    return [Customer(*r) for r in conn.execute(f"SELECT {_CUSTOMER_COLS} FROM billing_customers ORDER BY customer_id")]


def save_customer(conn: psycopg.Connection, customer: Customer, now: datetime) -> None:
    conn.execute(
        f"INSERT INTO billing_customers ({_CUSTOMER_COLS}, created_at, updated_at) VALUES (%s,%s,%s,%s,%s,%s,%s,%s) "
        "ON CONFLICT (customer_id) DO UPDATE SET name = EXCLUDED.name, email = EXCLUDED.email, "
        "timezone = EXCLUDED.timezone, currency = EXCLUDED.currency, anchor_day = EXCLUDED.anchor_day, "
        "updated_at = EXCLUDED.updated_at",
        (customer.customer_id, customer.name, customer.email, customer.timezone, customer.currency,
         customer.anchor_day, now, now),
    )


def has_billing_history(conn: psycopg.Connection, customer_id: str) -> bool:
    """Has the customer any plan or invoice (then its schedule and currency are fixed)?"""
    return conn.execute(
        "SELECT EXISTS (SELECT 1 FROM billing_plans WHERE customer_id = %(c)s) "
        "OR EXISTS (SELECT 1 FROM billing_invoices WHERE customer_id = %(c)s)",
        {"c": customer_id},
    ).fetchone()[0]


# ---------------------------------------------------------------- price books and plans


@dataclass(frozen=True)
class StoredBook:
    sha256: str
    book: PriceBook
    source_name: str

    @property
    def version(self) -> str:
        """What invoices record as their price_book_version: the book id and its text's sha256."""
        return book_version(self.book.id, self.sha256)


def book_version(book_id: str, sha256: str) -> str:
    return f"{book_id}@sha256:{sha256}"


def parse_book_text(text: str, source_name: str) -> StoredBook:
    book = parse_price_book(text, source_name)
    return StoredBook(hashlib.sha256(text.encode()).hexdigest(), book, source_name)


def store_book(conn: psycopg.Connection, text: str, source_name: str) -> StoredBook:
    """Keep an immutable snapshot of a book's text (content-addressed: the same text is stored once)."""
    stored = parse_book_text(text, source_name)
    conn.execute(
        "INSERT INTO billing_price_books (sha256, book_id, currency, document, source_text, source_name) "
        "VALUES (%s,%s,%s,%s,%s,%s) ON CONFLICT (sha256) DO NOTHING",
        (stored.sha256, stored.book.id, stored.book.currency, Jsonb(price_book_to_data(stored.book)), text, source_name),
    )
    return stored


_BOOKS: dict[str, StoredBook] = {}


def load_book(conn: psycopg.Connection, sha256: str) -> StoredBook:
    found = _BOOKS.get(sha256)
    if found is None:
        row = conn.execute("SELECT document, source_name FROM billing_price_books WHERE sha256 = %s", (sha256,)).fetchone()
        if row is None:
            raise BillingServiceError(f"price book snapshot {sha256} is missing")
        found = _BOOKS[sha256] = StoredBook(sha256, price_book_from_data(row[0], f"{row[1]} (snapshot {sha256[:12]})"), row[1])
    return found


@dataclass(frozen=True)
class Plan:
    id: int
    customer_id: str
    from_date: date
    effective_at: datetime
    effective_period: str
    book_sha256: str
    book_id: str
    assigned_at: datetime

    def to_json(self) -> dict:
        return {"id": self.id, "customer_id": self.customer_id, "from": self.from_date.isoformat(),
                "effective_at": utc_text(self.effective_at), "effective_period": self.effective_period,
                "price_book": self.book_id, "price_book_version": book_version(self.book_id, self.book_sha256),
                "assigned_at": utc_text(self.assigned_at)}


def plans(conn: psycopg.Connection, customer_id: str) -> list[Plan]:
    """The customer's plan assignments, in the order they were made."""
    rows = conn.execute(
        "SELECT p.id, p.customer_id, p.from_date, p.effective_at, p.effective_period, p.book_sha256, b.book_id, "
        "p.assigned_at FROM billing_plans p JOIN billing_price_books b ON b.sha256 = p.book_sha256 "
        "WHERE p.customer_id = %s ORDER BY p.id",
        (customer_id,),
    ).fetchall()
    return [Plan(*r) for r in rows]


# How a query of many keys at once (`= ANY(%s)` of an array) is sent: never as a prepared statement.
# psycopg prepares a query run 5 times; PostgreSQL then plans it once for any array (a generic plan).
# A billing run of 100k customers queries 100 batches of 1,000 this way while billing_invoices grows
# under it: planned for the table as it was, with the array's length unknown and its values not hashed
# (a sequential scan compares each row with each key), the batches would cost more and more. Planned
# each time with the array itself, a query costs what its batch holds.
MANY = False


def plans_of(conn: psycopg.Connection, customer_ids: Sequence[str]) -> dict[str, list[Plan]]:
    """`plans` of many customers in one query (a customer without plans maps to []). Never a prepared
    statement (see `MANY`)."""
    out: dict[str, list[Plan]] = {c: [] for c in customer_ids}
    for r in conn.execute(
        "SELECT p.id, p.customer_id, p.from_date, p.effective_at, p.effective_period, p.book_sha256, b.book_id, "
        "p.assigned_at FROM billing_plans p JOIN billing_price_books b ON b.sha256 = p.book_sha256 "
        "WHERE p.customer_id = ANY(%s) ORDER BY p.customer_id, p.id",
        (list(customer_ids),), prepare=MANY,
    ):
        out[r[1]].append(Plan(*r))
    return out


def plan_at(all_plans: Sequence[Plan], period_start: datetime) -> Plan | None:
    """The plan of the period starting at `period_start`: of the assignments effective at or before it,
    the one effective latest (the last assigned among those effective at the same boundary)."""
    if len(all_plans) == 1:  # most customers of a billing run: no list, no key function
        lone = all_plans[0]
        return lone if lone.effective_at <= period_start else None
    found = [p for p in all_plans if p.effective_at <= period_start]
    return max(found, key=lambda p: (p.effective_at, p.id)) if found else None


def add_plan(conn: psycopg.Connection, customer_id: str, from_date: date, effective_at: datetime,
             effective_period: str, book_sha256: str, now: datetime) -> int:
    return conn.execute(
        "INSERT INTO billing_plans (customer_id, from_date, effective_at, effective_period, book_sha256, assigned_at) "
        "VALUES (%s,%s,%s,%s,%s,%s) RETURNING id",
        (customer_id, from_date, effective_at, effective_period, book_sha256, now),
    ).fetchone()[0]


# ---------------------------------------------------------------- invoices


def _dec(value: Decimal | None) -> str | None:
    return None if value is None else format(value, "f")


def money_text(amount: Decimal, currency: str) -> str:
    """An amount at its currency's minor unit ("12.30"; amounts are already rounded by rating)."""
    return format(Currency.of(currency).round(amount), "f")


def number_text(value: Decimal | None) -> str | None:
    """A quantity or unit price without trailing zeros and never in exponent form."""
    if value is None:
        return None
    text = format(value, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text or "0"


def precise_text(value: Decimal) -> str:
    return format(value.quantize(QUANT, rounding=ROUND_HALF_UP), "f")


def line_to_json(line: InvoiceLine, currency: str) -> dict:
    return {"id": line.id, "rated_line_id": line.rated_line_id, "kind": line.kind, "charge_key": line.charge_key,
            "meter": line.meter, "group": line.group, "quantity": number_text(line.quantity),
            "unit_price": number_text(line.unit_price), "precise_amount": precise_text(line.precise_amount),
            "amount": money_text(line.amount, currency), "period": line.period,
            "service_period_start": utc_text(line.service_period_start),
            "service_period_end": utc_text(line.service_period_end), "project": line.project or None}


def lines_to_json(lines: Sequence[InvoiceLine], currency: str) -> list[dict]:
    """`line_to_json` of each line (the currency looked up once, each service period written once)."""
    money = Currency.of(currency)
    texts: dict[datetime, str] = {}

    def when(moment: datetime) -> str:
        found = texts.get(moment)
        if found is None:
            found = texts[moment] = utc_text(moment)
        return found

    return [{"id": line.id, "rated_line_id": line.rated_line_id, "kind": line.kind, "charge_key": line.charge_key,
             "meter": line.meter, "group": line.group, "quantity": number_text(line.quantity),
             "unit_price": number_text(line.unit_price), "precise_amount": precise_text(line.precise_amount),
             "amount": format(money.round(line.amount), "f"), "period": line.period,
             "service_period_start": when(line.service_period_start),
             "service_period_end": when(line.service_period_end), "project": line.project or None} for line in lines]


def invoice_document(invoice: Invoice, book_sha256: str | None) -> dict:
    """The whole invoice as JSON (`invoice_document_head` with its "lines")."""
    return {**invoice_document_head(invoice, book_sha256), "lines": lines_to_json(invoice.lines, invoice.currency)}


def revision_lines(conn: psycopg.Connection, revisions: Sequence[tuple[str, int]]) -> dict[tuple[str, int], list[InvoiceLine]]:
    """The lines of each (invoice id, revision): those replaced under the smallest revision >= it
    (billing_invoice_lines_replaced keeps a draft's lines when they are replaced), else the invoice's
    current lines. In two queries, whatever the number of invoices: the current lines first, so that a
    refresh committed between the two (on an autocommit connection) is still read right, its replaced
    lines being the ones read as current."""
    ids = sorted({i for i, _ in revisions})
    current: dict[str, list[InvoiceLine]] = {i: [] for i in ids}
    for r in conn.execute(f"SELECT invoice_id, {_LINE_COLS} FROM billing_invoice_lines WHERE invoice_id = ANY(%s) "
                          "ORDER BY invoice_id, position", (ids,)):
        current[r[0]].append(InvoiceLine(*r[1:]))
    replaced: dict[str, dict[int, list[InvoiceLine]]] = {}
    for r in conn.execute(f"SELECT invoice_id, revision, {_LINE_COLS} FROM billing_invoice_lines_replaced "
                          "WHERE invoice_id = ANY(%s) ORDER BY invoice_id, revision, position", (ids,)):
        replaced.setdefault(r[0], {}).setdefault(r[1], []).append(InvoiceLine(*r[2:]))
    out = {}
    for invoice_id, revision in revisions:
        later = [rev for rev in replaced.get(invoice_id, {}) if rev >= revision]
        out[(invoice_id, revision)] = replaced[invoice_id][min(later)] if later else current[invoice_id]
    return out


def with_lines(conn: psycopg.Connection, documents: Sequence[tuple[dict, int]]) -> list[dict]:
    """History documents (with their revision) with their "lines": a document written since migration
    0012 has none, its lines are `revision_lines`'."""
    missing = [(d["id"], revision) for d, revision in documents if "lines" not in d]
    found = revision_lines(conn, missing) if missing else {}
    return [d if "lines" in d else {**d, "lines": lines_to_json(found[(d["id"], revision)], d["currency"])}
            for d, revision in documents]


def invoice_document_head(invoice: Invoice, book_sha256: str | None) -> dict:
    """The invoice without its lines: what a history row keeps (`with_lines` adds them back)."""
    return {
        "id": invoice.id, "customer_id": invoice.customer_id, "currency": invoice.currency, "period": invoice.period,
        "period_start": utc_text(invoice.period_start), "period_end": utc_text(invoice.period_end),
        "sequence": invoice.sequence, "status": str(invoice.status), "number": invoice.number,
        "subtotal": money_text(invoice.subtotal, invoice.currency),
        "credits_applied": money_text(invoice.credits_applied, invoice.currency),
        "total": money_text(invoice.total, invoice.currency), "price_book_version": invoice.price_book_version, "book_sha256": book_sha256,
        "issued_at": invoice.issued_at and utc_text(invoice.issued_at),
        "finalized_at": invoice.finalized_at and utc_text(invoice.finalized_at),
        "reissue_of": invoice.reissue_of,
    }


_INVOICE_COLS = ("id, customer_id, currency, period, period_start, period_end, sequence, status, subtotal, "
                 "credits_applied, total, price_book_version, number, issued_at, finalized_at, reissue_of, book_sha256")
_LINE_COLS = ("id, rated_line_id, kind, charge_key, meter, grp, quantity, unit_price, precise_amount, amount, period, "
              "service_period_start, service_period_end, project")


@dataclass(frozen=True)
class StoredInvoice:
    invoice: Invoice
    book_sha256: str | None
    revision: int


class PgInvoiceStore:
    """A customer's invoices and credit notes on PostgreSQL (the caller owns the transaction)."""

    def __init__(self, conn: psycopg.Connection):
        self.conn = conn

    def _load(self, where: str, params: tuple, *, prepare: bool | None = None) -> list[StoredInvoice]:
        """The invoices `where` says, with their lines and status history; `prepare`: psycopg's (`MANY`
        for a batch of customers)."""
        rows = self.conn.execute(
            f"SELECT {_INVOICE_COLS}, revision FROM billing_invoices WHERE {where} ORDER BY period_start, sequence",
            params, prepare=prepare,
        ).fetchall()
        if not rows:
            return []
        ids = [r[0] for r in rows]
        lines: dict[str, list[InvoiceLine]] = {i: [] for i in ids}
        for r in self.conn.execute(
            f"SELECT invoice_id, {_LINE_COLS} FROM billing_invoice_lines WHERE invoice_id = ANY(%s) "
            "ORDER BY invoice_id, position", (ids,), prepare=prepare,
        ):
            lines[r[0]].append(InvoiceLine(*r[1:]))
        changes: dict[str, list[StatusChange]] = {i: [] for i in ids}
        last: dict[str, str] = {}
        for invoice_id, status, at in self.conn.execute(
            "SELECT invoice_id, status, recorded_at FROM billing_invoice_history WHERE invoice_id = ANY(%s) "
            "ORDER BY invoice_id, revision", (ids,), prepare=prepare,
        ):
            before = last.get(invoice_id)
            if before is not None and before != status:
                changes[invoice_id].append(StatusChange(InvoiceStatus(before), InvoiceStatus(status), at))
            last[invoice_id] = status
        out = []
        for r in rows:
            (iid, customer, currency, period, start, end, seq, status, subtotal, credits, total, version, number,
             issued, finalized, reissue_of, sha, revision) = r
            invoice = Invoice(
                id=iid, customer_id=customer, currency=currency, period=period, period_start=start, period_end=end,
                sequence=seq, status=InvoiceStatus(status), lines=tuple(lines[iid]), subtotal=subtotal,
                credits_applied=credits, total=total, price_book_version=version, number=number, issued_at=issued,
                finalized_at=finalized, history=tuple(changes[iid]), reissue_of=reissue_of,
            )
            out.append(StoredInvoice(invoice, sha, revision))
        return out

    def stored(self, customer_id: str) -> list[StoredInvoice]:
        return self._load("customer_id = %s", (customer_id,))

    def get(self, invoice_id: str) -> StoredInvoice:
        found = self._load("id = %s", (invoice_id,))
        if not found:
            found = self._load("number = %s", (invoice_id,))
        if not found:
            raise UnknownInvoice(f"unknown invoice {invoice_id!r} (give an invoice id or number; see `infermeter invoices list`)")
        return found[0]

    def save(self, invoice: Invoice, *, book_sha256: str | None = None, change: str = "saved",
             now: datetime | None = None, previous: StoredInvoice | None = None) -> bool:
        """Insert or update an invoice and append a history row; False (nothing written) when the stored
        invoice is already exactly this one. A finalized invoice's lines are never rewritten."""
        if now is None:
            raise BillingServiceError("save needs the injected clock's `now`")
        if previous is not None and previous.invoice == invoice and previous.book_sha256 == book_sha256:
            return False
        try:
            revision = self._write(invoice, book_sha256, now, previous)
        except psycopg.errors.CheckViolation as exc:
            raise InvoiceImmutable(str(exc.diag.message_primary or exc)) from None
        self.conn.execute(
            "INSERT INTO billing_invoice_history (invoice_id, revision, recorded_at, change, status, document) "
            "VALUES (%s,%s,%s,%s,%s,%s)",
            (invoice.id, revision, now, change, str(invoice.status), Jsonb(invoice_document_head(invoice, book_sha256))),
        )
        return True

    def _write(self, invoice: Invoice, sha: str | None, now: datetime, previous: StoredInvoice | None) -> int:
        conn = self.conn
        values = (invoice.customer_id, invoice.currency, invoice.period, invoice.period_start, invoice.period_end,
                  invoice.sequence, str(invoice.status), invoice.subtotal, invoice.credits_applied, invoice.total,
                  invoice.price_book_version, invoice.number, invoice.issued_at, invoice.finalized_at,
                  invoice.reissue_of, sha)
        if previous is None:
            revision = 1
            conn.execute(
                f"INSERT INTO billing_invoices ({_INVOICE_COLS}, revision, created_at, updated_at) "
                "VALUES (%s,%s,%s,%s,%s,%s,%s,'draft',%s,%s,%s,%s,NULL,NULL,NULL,%s,%s,%s,%s,%s)",
                (invoice.id, *values[:6], *values[7:11], values[14], sha, revision, now, now),
            )
            lines_changed = True
        else:
            revision = previous.revision + 1
            lines_changed = previous.invoice.lines != invoice.lines
        if lines_changed:  # only while the row is still a draft (the database refuses otherwise)
            conn.execute("DELETE FROM billing_invoice_lines WHERE invoice_id = %s", (invoice.id,))
            with conn.cursor() as cur:
                cur.executemany(
                    f"INSERT INTO billing_invoice_lines (invoice_id, position, {_LINE_COLS}) "
                    "VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                    [(invoice.id, i, line.id, line.rated_line_id, line.kind, line.charge_key, line.meter, line.group,
                      line.quantity, line.unit_price, line.precise_amount, line.amount, line.period,
                      line.service_period_start, line.service_period_end, line.project)
                     for i, line in enumerate(invoice.lines)],
                )
        conn.execute(
            "UPDATE billing_invoices SET customer_id = %s, currency = %s, period = %s, period_start = %s, "
            "period_end = %s, sequence = %s, status = %s, subtotal = %s, credits_applied = %s, total = %s, "
            "price_book_version = %s, number = %s, issued_at = %s, finalized_at = %s, reissue_of = %s, "
            "book_sha256 = %s, revision = %s, updated_at = %s WHERE id = %s",
            (*values, revision, now, invoice.id),
        )
        return revision

    def credit_notes(self, invoice_id: str) -> Sequence[CreditNote]:
        rows = self.conn.execute(
            "SELECT id, invoice_id, customer_id, currency, sequence, lines, total, refund_amount, credits_returned, "
            "reason, issued_at FROM billing_credit_notes WHERE invoice_id = %s ORDER BY sequence",
            (invoice_id,),
        ).fetchall()
        return [
            CreditNote(id=r[0], invoice_id=r[1], customer_id=r[2], currency=r[3], sequence=r[4],
                       lines=tuple(CreditNoteLine(x["invoice_line_id"], Decimal(x["amount"])) for x in r[5]),
                       total=r[6], refund_amount=r[7], credits_returned=r[8], reason=r[9], issued_at=r[10])
            for r in rows
        ]

    def credit_note_numbers(self, invoice_id: str) -> dict[str, str]:
        return dict(self.conn.execute("SELECT id, number FROM billing_credit_notes WHERE invoice_id = %s", (invoice_id,)))

    def save_credit_note(self, note: CreditNote, number: str | None = None) -> None:
        if number is None:
            raise BillingServiceError("a credit note is stored with its number")
        self.conn.execute(
            "INSERT INTO billing_credit_notes (id, number, invoice_id, customer_id, currency, sequence, total, "
            "refund_amount, credits_returned, reason, issued_at, lines) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
            (note.id, number, note.invoice_id, note.customer_id, note.currency, note.sequence, note.total,
             note.refund_amount, note.credits_returned, note.reason, note.issued_at,
             Jsonb([{"invoice_line_id": x.invoice_line_id, "amount": _dec(x.amount)} for x in note.lines])),
        )


def invoice_as_of(conn: psycopg.Connection, invoice_id: str, at: datetime) -> dict | None:
    """The invoice document as it was known at `at` (the last history row recorded at or before it),
    with its lines."""
    row = conn.execute(
        "SELECT document, revision FROM billing_invoice_history WHERE invoice_id = %s AND recorded_at <= %s "
        "ORDER BY revision DESC LIMIT 1",
        (invoice_id, at),
    ).fetchone()
    return None if row is None else with_lines(conn, [(row[0], row[1])])[0]


def history(conn: psycopg.Connection, invoice_id: str) -> list[dict]:
    rows = conn.execute(
        "SELECT revision, recorded_at, change, status, document FROM billing_invoice_history WHERE invoice_id = %s "
        "ORDER BY revision", (invoice_id,)
    ).fetchall()
    return [{"revision": r[0], "recorded_at": utc_text(r[1]), "change": r[2], "status": r[3], "total": r[4]["total"]}
            for r in rows]


# ---------------------------------------------------------------- numbers


class PgInvoiceNumbers:
    """Gapless numbers: the counter row of (prefix, year) is locked by the UPDATE until the finalizing
    transaction ends, so a rolled-back finalization gives its number back and two runs never share one."""

    def __init__(self, conn: psycopg.Connection):
        self.conn = conn

    def next_number(self, issuer_prefix: str, year: int) -> str:
        format_number(year, 1, issuer_prefix)  # validates prefix and year before touching the counter
        seq = self.conn.execute(
            "INSERT INTO billing_number_counters AS c (prefix, year, last_seq) VALUES (%s, %s, 1) "
            "ON CONFLICT (prefix, year) DO UPDATE SET last_seq = c.last_seq + 1 RETURNING last_seq",
            (issuer_prefix, year),
        ).fetchone()[0]
        return format_number(year, seq, issuer_prefix)


# ---------------------------------------------------------------- credits


class PgCreditLedger:
    def __init__(self, conn: psycopg.Connection):
        self.conn = conn

    def grants(self, customer_id: str) -> Sequence[CreditGrant]:
        rows = self.conn.execute(
            "SELECT id, customer_id, currency, amount, granted_at, expires_at, reason FROM billing_credit_grants "
            "WHERE customer_id = %s ORDER BY granted_at, id", (customer_id,)
        ).fetchall()
        return [CreditGrant(*r) for r in rows]

    def entries(self, customer_id: str) -> Sequence[LedgerEntry]:
        rows = self.conn.execute(
            "SELECT id, kind, grant_id, customer_id, currency, amount, at, invoice_id, expires_at "
            "FROM billing_credit_ledger WHERE customer_id = %s ORDER BY at, recorded_at, id", (customer_id,)
        ).fetchall()
        return [LedgerEntry(*r) for r in rows]

    def add_grant(self, grant: CreditGrant) -> None:
        self.conn.execute(
            "INSERT INTO billing_credit_grants (id, customer_id, currency, amount, granted_at, expires_at, reason) "
            "VALUES (%s,%s,%s,%s,%s,%s,%s)",
            (grant.id, grant.customer_id, grant.currency, grant.amount, grant.granted_at, grant.expires_at, grant.reason),
        )

    def append(self, entries: Sequence[LedgerEntry], now: datetime | None = None) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO billing_credit_ledger (id, kind, grant_id, customer_id, currency, amount, at, invoice_id, "
                "expires_at, recorded_at) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,coalesce(%s, now())) "
                "ON CONFLICT (id) DO NOTHING",
                [(e.id, e.kind, e.grant_id, e.customer_id, e.currency, e.amount, e.at, e.invoice_id, e.expires_at, now)
                 for e in entries],
            )


def dumps(payload: object) -> str:
    return json.dumps(payload, indent=2, default=str)
