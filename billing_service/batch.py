"""The bulk billing run's adapters: the invoice store, credit ledger and invoice numbers of
`billing_service.store`, kept in memory for a batch of customers and written at the end in a few
statements instead of ~15 round trips per customer: COPY of the new invoices (as drafts, as
`PgInvoiceStore` inserts them), of their lines and of the history rows (the first invoices', the lines'
and the history's COPY text written here by hand, escaped: psycopg's row writer costs several times
more), then the rows' final state (first invoices: one UPDATE with their ids and numbers as arrays;
the others: UPDATE ... FROM a temporary table).

The billing run's logic (`billing_service.run`, per customer) does not change: it saves, reloads
and finalizes through these objects exactly as through `PgInvoiceStore`, `PgCreditLedger` and
`PgInvoiceNumbers`, and `flush` then writes what those would have written: the same invoice rows
(revision, created_at / updated_at = the run's clock), the same lines in the same positions (a draft's
lines that are replaced are kept by the database, under the revision they belonged to), one history
row per save with the same revision, change and document (the invoice without its lines), the same
ledger entries, and the same gapless numbers. The caller owns the transaction and holds the customers' locks
(`lock_customers`) before it loads them, so nothing else writes their invoices meanwhile.

Numbers: the first number a batch takes locks the counter row of (prefix, year) (an upsert that
changes nothing but returns the last number); numbers are handed out from it in order and `flush`
stores the new last number. The row stays locked until the batch's transaction ends, as with
`PgInvoiceNumbers`, so a rolled-back batch gives every number back and two runs never share one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from operator import attrgetter

import psycopg

from billing.credits import CreditGrant, LedgerEntry
from billing.errors import InvoiceImmutable
from billing.invoice import Invoice, InvoiceStatus, StatusChange
from billing.numbering import format_number
from billing_service.store import (
    _INVOICE_COLS,
    _LINE_COLS,
    MANY,
    BillingServiceError,
    PgInvoiceStore,
    StoredInvoice,
    UnknownInvoice,
    invoice_document_head,
)

_INVOICE_FIELDS = [c.strip() for c in _INVOICE_COLS.split(",")]
# COPY's text format: in a field, backslash, tab, newline and carriage return are escaped; \N is NULL
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


_NULL = "\\N"


def _copy_text(value: str) -> str:
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:  # nothing to escape, the common case: no translate
        return value.translate(_COPY_ESCAPES)
    return value


class _LineRows:
    """billing_invoice_lines rows (invoice_id, position, _LINE_COLS) in COPY's text format, written by
    hand instead of by psycopg's row writer, which dumps each value through its type's dumper (the
    comparison: docs/benchmarks.md, "Billing a month"). Numbers go as `str(Decimal)` (exact; PostgreSQL
    reads its exponent form too), times as ISO 8601 with their offset, text fields escaped
    (`_copy_text`)."""

    def __init__(self) -> None:
        # (kind, charge key, meter, group) and (period, service period) repeat: escaped and joined once
        self._middles: dict[tuple[str, str, str, str], str] = {}
        self._tails: dict[tuple[str, datetime, datetime], str] = {}
        self.parts: list[str] = []

    def _middle(self, *fields: str) -> str:
        """(kind, charge key, meter, group) escaped and joined, kept for the lines that repeat them."""
        middle = self._middles[fields] = "\t".join(_copy_text(v) for v in fields)
        return middle

    def add_rated(self, invoice_id: str, label: str, start: datetime, end: datetime, rated: Iterable[tuple]) -> None:
        """Lines copied from a rating (each its own rated line, all of the invoice's period), in the
        order of `pricing.rating.Line`'s fields (the third, the customer, is not written), without a
        tuple made per line for `add`: a first invoice's lines (`_AS_RATED`)."""
        head, middles, parts = _copy_text(invoice_id), self._middles, self.parts
        tail = f"{_copy_text(label)}\t{start.isoformat()}\t{end.isoformat()}\t"
        for position, (line_id, kind, _, charge_key, meter, group, quantity, unit_price, precise_amount,
                       amount, project) in enumerate(rated):
            middle = middles.get((kind, charge_key, meter, group)) or self._middle(kind, charge_key, meter, group)
            line_id = _copy_text(line_id)
            price = _NULL if unit_price is None else str(unit_price)
            parts.append(f"{head}\t{position}\t{line_id}\t{line_id}\t{middle}\t{str(quantity)}\t{price}\t"
                         f"{str(precise_amount)}\t{str(amount)}\t{tail}{_copy_text(project) if project else ''}\n")

    def add(self, invoice_id: str, lines: Iterable[tuple]) -> None:
        """The lines of one invoice, in position order, each (id, rated_line_id, kind, charge_key, meter,
        group, quantity, unit_price, precise_amount, amount, period, service_period_start,
        service_period_end, project)."""
        head, middles, tails, parts = _copy_text(invoice_id), self._middles, self._tails, self.parts
        for position, (line_id, rated_id, kind, charge_key, meter, group, quantity, unit_price, precise_amount,
                       amount, label, start, end, project) in enumerate(lines):
            middle = middles.get((kind, charge_key, meter, group)) or self._middle(kind, charge_key, meter, group)
            tail = tails.get((label, start, end))
            if tail is None:
                tail = tails[(label, start, end)] = f"{_copy_text(label)}\t{start.isoformat()}\t{end.isoformat()}\t"
            line_id = _copy_text(line_id)
            rated_id = line_id if rated_id == line_id else _copy_text(rated_id)
            price = _NULL if unit_price is None else str(unit_price)
            parts.append(f"{head}\t{position}\t{line_id}\t{rated_id}\t{middle}\t{str(quantity)}\t{price}\t"
                         f"{str(precise_amount)}\t{str(amount)}\t{tail}{_copy_text(project) if project else ''}\n")


# a first invoice's line (`billing.invoice.drafts.first_invoice`: copied from a rated line, whose id it keeps)
# in the order `_LineRows.add_rated` reads, `pricing.rating.Line`'s; the third field is not written
_AS_RATED = attrgetter("id", "kind", "rated_line_id", "charge_key", "meter", "group", "quantity", "unit_price",
                       "precise_amount", "amount", "project")


def _first_invoice_copy_row(first: Invoice, sha: str, now: datetime) -> str:
    """`_invoice_row(first, sha, as_draft=True)` + (revision 1, created_at, updated_at = now) as a line
    of COPY text, written as `_LineRows` writes lines."""
    at = now.isoformat()
    reissue_of = _NULL if first.reissue_of is None else _copy_text(first.reissue_of)
    return (f"{_copy_text(first.id)}\t{_copy_text(first.customer_id)}\t{_copy_text(first.currency)}\t"
            f"{_copy_text(first.period)}\t{first.period_start.isoformat()}\t{first.period_end.isoformat()}\t"
            f"{first.sequence}\tdraft\t{str(first.subtotal)}\t{str(first.credits_applied)}\t{str(first.total)}\t"
            f"{_copy_text(first.price_book_version)}\t{_NULL}\t{_NULL}\t{_NULL}\t{reissue_of}\t{_copy_text(sha)}\t1\t"
            f"{at}\t{at}\n")


def _invoice_row(inv: Invoice, sha: str | None, *, as_draft: bool = False) -> tuple:
    """`_INVOICE_COLS` of an invoice (`as_draft`: as `PgInvoiceStore` inserts it, a draft without its
    number and times)."""
    if as_draft:
        status, number, issued_at, finalized_at = "draft", None, None, None
    else:
        status, number, issued_at, finalized_at = str(inv.status), inv.number, inv.issued_at, inv.finalized_at
    return (inv.id, inv.customer_id, inv.currency, inv.period, inv.period_start, inv.period_end, inv.sequence, status,
            inv.subtotal, inv.credits_applied, inv.total, inv.price_book_version, number, issued_at, finalized_at,
            inv.reissue_of, sha)


def lock_customers(conn: psycopg.Connection, customer_ids: Sequence[str]) -> None:
    """`store.lock_customer` for many customers at once, in customer order (two batches that share
    customers take their locks in the same order, so they never deadlock)."""
    conn.execute(
        "SELECT pg_advisory_xact_lock(hashtext('infermeter.billing'), hashtext(c)) "
        "FROM unnest(%s::text[]) WITH ORDINALITY AS u(c, n) ORDER BY n",
        (sorted(customer_ids),),
    )


def load_stored(conn: psycopg.Connection, customer_ids: Sequence[str]) -> dict[str, list[StoredInvoice]]:
    """Each customer's stored invoices (ordered as `PgInvoiceStore.stored`), in three queries."""
    out: dict[str, list[StoredInvoice]] = {c: [] for c in customer_ids}
    for s in PgInvoiceStore(conn)._load("customer_id = ANY(%s)", (list(customer_ids),), prepare=MANY):
        out[s.invoice.customer_id].append(s)
    return out


class BatchInvoiceStore:
    """`PgInvoiceStore.get` / `save` for a batch of customers, in memory until `flush`."""

    def __init__(self, conn: psycopg.Connection, stored: Iterable[StoredInvoice]):
        self.conn = conn
        self._current: dict[str, StoredInvoice] = {}
        for s in stored:
            self._current[s.invoice.id] = s
        self._in_db: dict[str, StoredInvoice] = dict(self._current)  # what the tables hold
        self._created_at: dict[str, datetime] = {}
        self._written: dict[str, tuple[Invoice, str | None, int, datetime]] = {}  # id -> last save
        self._history: list[tuple[str, int, datetime, str, str, str]] = []
        self._first: list[tuple[Invoice, str, datetime]] = []  # `add_first`, not in _current

    def get(self, invoice_id: str) -> StoredInvoice:
        found = self._current.get(invoice_id)
        if found is None:
            raise UnknownInvoice(f"unknown invoice {invoice_id!r} in this billing batch")
        return found

    def save(self, invoice: Invoice, *, book_sha256: str | None = None, change: str = "saved",
             now: datetime | None = None, previous: StoredInvoice | None = None) -> bool:
        """As `PgInvoiceStore.save`: False when the stored invoice is already exactly this one."""
        if now is None:
            raise BillingServiceError("save needs the injected clock's `now`")
        if previous is not None and previous.invoice == invoice and previous.book_sha256 == book_sha256:
            return False
        before = self._current.get(invoice.id)
        if previous is None:
            if before is not None:
                raise BillingServiceError(f"invoice {invoice.id} exists already")
            revision = 1
            self._created_at[invoice.id] = now
            history: tuple[StatusChange, ...] = ()
        else:
            revision = previous.revision + 1
            if before is None:
                raise UnknownInvoice(f"unknown invoice {invoice.id!r} in this billing batch")
            if before.invoice.status.finalized and before.invoice.lines != invoice.lines:
                raise InvoiceImmutable(f"invoice {invoice.id} is {before.invoice.status}: the lines of a finalized "
                                       "invoice cannot change")
            history = before.invoice.history
            if before.invoice.status is not invoice.status:
                history = (*history, StatusChange(before.invoice.status, invoice.status, now))
        earlier = self._written.get(invoice.id)
        if earlier is not None and earlier[0].lines != invoice.lines:
            # the history keeps a revision's lines in the lines table, or in the replaced lines when they
            # are replaced in the database: lines that changed twice before `flush` would lose the first
            raise BillingServiceError(f"invoice {invoice.id}: its lines changed twice in one billing batch")
        self._written[invoice.id] = (invoice, book_sha256, revision, now)
        document = json.dumps(invoice_document_head(invoice, book_sha256))
        self._history.append((invoice.id, revision, now, change, str(invoice.status), document))
        # what PgInvoiceStore.get would load now: the status history comes from the history rows
        loaded = invoice if invoice.history == history else replace(invoice, history=history)
        self._current[invoice.id] = StoredInvoice(loaded, book_sha256, revision)
        return True

    def add_first(self, invoice: Invoice, *, book_sha256: str, now: datetime) -> None:
        """Write a customer's first invoice of a period as `save` writes it when `_run_customer` creates
        it (and finalizes it: `invoice` open, made by `finalize_first` from the draft): the row, the
        rating's lines, history revision 1 (created, the draft) and 2 (finalized). The caller checked
        that the customer has no invoice, so nothing in this batch reads it back."""
        if invoice.id in self._current or invoice.id in self._written:
            raise BillingServiceError(f"invoice {invoice.id} exists already")
        head = invoice_document_head(invoice, book_sha256)
        finalized = None if invoice.status is InvoiceStatus.DRAFT else json.dumps(head)
        # the draft it was: the same document but for these (finalize_first changes nothing else)
        head.update(status="draft", number=None, issued_at=None, finalized_at=None)
        self._history.append((invoice.id, 1, now, "created", "draft", json.dumps(head)))
        if finalized is not None:
            self._history.append((invoice.id, 2, now, "finalized", str(invoice.status), finalized))
        self._first.append((invoice, book_sha256, now))

    def flush(self) -> int:
        """Write every save since the start: new invoices (inserted as drafts, as `PgInvoiceStore`
        does), their changed lines, then each row's final state, then the history rows. Returns the
        number of invoices written."""
        if not self._written and not self._first:
            return 0
        conn = self.conn
        new = [i for i in self._written if i not in self._in_db]
        try:
            with conn.cursor() as cur:
                if new or self._first:
                    with cur.copy(f"COPY billing_invoices ({_INVOICE_COLS}, revision, created_at, updated_at) "
                                  "FROM STDIN") as copy:
                        if self._first:
                            copy.write("".join(_first_invoice_copy_row(first, sha, now) for first, sha, now in self._first))
                        for i in new:
                            inv, sha, revision, now = self._written[i]
                            draft = inv.status is InvoiceStatus.DRAFT
                            copy.write_row((*_invoice_row(inv, sha, as_draft=True), revision if draft else 1,
                                            self._created_at[i], now if draft else self._created_at[i]))
                changed = [i for i in self._written if i in self._in_db
                           and self._in_db[i].invoice.lines != self._written[i][0].lines]
                if changed:
                    cur.execute("DELETE FROM billing_invoice_lines WHERE invoice_id = ANY(%s)", (changed,), prepare=MANY)
                rows = _LineRows()
                for first, _, _ in self._first:
                    rows.add_rated(first.id, first.period, first.period_start, first.period_end, map(_AS_RATED, first.lines))
                for i in (*new, *changed):
                    rows.add(i, ((line.id, line.rated_line_id, line.kind, line.charge_key, line.meter, line.group,
                                  line.quantity, line.unit_price, line.precise_amount, line.amount, line.period,
                                  line.service_period_start, line.service_period_end, line.project)
                                 for line in self._written[i][0].lines))
                if rows.parts:
                    with cur.copy(f"COPY billing_invoice_lines (invoice_id, position, {_LINE_COLS}) FROM STDIN") as copy:
                        copy.write("".join(rows.parts))
                # the final state of every row that is not already as inserted
                final = [i for i in self._written if i in self._in_db or self._written[i][0].status is not InvoiceStatus.DRAFT]
                if final:
                    cur.execute("DROP TABLE IF EXISTS pg_temp.billing_batch_invoices")
                    cur.execute("CREATE TEMP TABLE billing_batch_invoices ON COMMIT DROP AS "
                                f"SELECT {_INVOICE_COLS}, revision, updated_at FROM billing_invoices WITH NO DATA")
                    with cur.copy(f"COPY billing_batch_invoices ({_INVOICE_COLS}, revision, updated_at) FROM STDIN") as copy:
                        for i in final:
                            inv, sha, revision, now = self._written[i]
                            copy.write_row((*_invoice_row(inv, sha), revision, now))
                    sets = ", ".join(f"{c} = b.{c}" for c in [*_INVOICE_FIELDS[1:], "revision", "updated_at"])
                    cur.execute(f"UPDATE billing_invoices i SET {sets} FROM billing_batch_invoices b WHERE i.id = b.id")
                    cur.execute("DROP TABLE pg_temp.billing_batch_invoices")
                # first invoices finalized (`finalize_first`): inserted as drafts, only these columns move
                # (revision 2). Ids and numbers as arrays, the times (the run's clock: one group) as values:
                # no temporary table made, copied and dropped, no per-row time dumped
                opened: dict[tuple[str, datetime | None, datetime | None, datetime], list[Invoice]] = {}
                for f, _, now in self._first:
                    if f.status is not InvoiceStatus.DRAFT:
                        opened.setdefault((str(f.status), f.issued_at, f.finalized_at, now), []).append(f)
                # (`i.id = ANY(...)` repeats the join's ids so that the rows are found by the key, a batch's
                # worth, where a hash join would scan the whole table once a batch)
                for (status, issued_at, finalized_at, now), group in opened.items():
                    ids = [f.id for f in group]
                    cur.execute(
                        "UPDATE billing_invoices i SET status = %s, number = u.number, issued_at = %s, finalized_at = %s, "
                        "revision = 2, updated_at = %s FROM unnest(%s::text[], %s::text[]) AS u(id, number) "
                        "WHERE i.id = u.id AND i.id = ANY(%s)",
                        (status, issued_at, finalized_at, now, ids, [f.number for f in group], ids), prepare=MANY,
                    )
                with cur.copy("COPY billing_invoice_history (invoice_id, revision, recorded_at, change, status, document) "
                              "FROM STDIN") as copy:
                    copy.write("".join(
                        f"{_copy_text(invoice_id)}\t{revision}\t{at.isoformat()}\t{_copy_text(change)}\t"
                        f"{_copy_text(status)}\t{_copy_text(document)}\n"
                        for invoice_id, revision, at, change, status, document in self._history))
        except psycopg.errors.CheckViolation as exc:
            raise InvoiceImmutable(str(exc.diag.message_primary or exc)) from None
        written = len(self._written) + len(self._first)
        self._in_db.update({i: self._current[i] for i in self._written})
        self._written.clear()
        self._first.clear()
        self._history.clear()
        self._created_at.clear()
        return written


class BatchCreditLedger:
    """`PgCreditLedger.grants` / `entries` / `append` for a batch of customers (loaded in two queries,
    appended in memory, written by `flush`)."""

    def __init__(self, conn: psycopg.Connection, customer_ids: Sequence[str]):
        self.conn = conn
        ids = list(customer_ids)
        self._grants: dict[str, list[CreditGrant]] = {}
        for r in conn.execute(
            "SELECT id, customer_id, currency, amount, granted_at, expires_at, reason FROM billing_credit_grants "
            "WHERE customer_id = ANY(%s) ORDER BY granted_at, id", (ids,), prepare=MANY
        ):
            self._grants.setdefault(r[1], []).append(CreditGrant(*r))
        # (at, recorded_at, id, entry): PgCreditLedger.entries' order
        self._entries: dict[str, list[tuple[datetime, datetime, str, LedgerEntry]]] = {}
        for r in conn.execute(
            "SELECT id, kind, grant_id, customer_id, currency, amount, at, invoice_id, expires_at, recorded_at "
            "FROM billing_credit_ledger WHERE customer_id = ANY(%s)", (ids,), prepare=MANY
        ):
            self._entries.setdefault(r[3], []).append((r[6], r[9], r[0], LedgerEntry(*r[:9])))
        self._ids = {e[2] for entries in self._entries.values() for e in entries}
        self._new: list[tuple[LedgerEntry, datetime | None]] = []

    def grants(self, customer_id: str) -> Sequence[CreditGrant]:
        return list(self._grants.get(customer_id, ()))

    def entries(self, customer_id: str) -> Sequence[LedgerEntry]:
        return [e[3] for e in sorted(self._entries.get(customer_id, ()), key=lambda e: e[:3])]

    def append(self, entries: Sequence[LedgerEntry], now: datetime | None = None) -> None:
        if now is None:
            raise BillingServiceError("the batch ledger appends with the injected clock's `now`")
        for e in entries:
            if e.id in self._ids:  # ON CONFLICT (id) DO NOTHING
                continue
            self._ids.add(e.id)
            self._entries.setdefault(e.customer_id, []).append((e.at, now, e.id, e))
            self._new.append((e, now))

    def flush(self) -> None:
        if self._new:
            with self.conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO billing_credit_ledger (id, kind, grant_id, customer_id, currency, amount, at, "
                    "invoice_id, expires_at, recorded_at) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                    [(e.id, e.kind, e.grant_id, e.customer_id, e.currency, e.amount, e.at, e.invoice_id, e.expires_at,
                      now) for e, now in self._new],
                )
            self._new.clear()


class BatchInvoiceNumbers:
    """Gapless numbers for a batch: the counter row is locked at the first number and stored by `flush`."""

    def __init__(self, conn: psycopg.Connection):
        self.conn = conn
        self._last: dict[tuple[str, int], int] = {}
        self._stored: dict[tuple[str, int], int] = {}

    def next_number(self, issuer_prefix: str, year: int) -> str:
        key = (issuer_prefix, year)
        if key not in self._last:
            format_number(year, 1, issuer_prefix)  # validates prefix and year before touching the counter
            last = self.conn.execute(
                "INSERT INTO billing_number_counters AS c (prefix, year, last_seq) VALUES (%s, %s, 0) "
                "ON CONFLICT (prefix, year) DO UPDATE SET last_seq = c.last_seq RETURNING last_seq",
                key,
            ).fetchone()[0]
            self._last[key] = self._stored[key] = last
        self._last[key] += 1
        return format_number(year, self._last[key], issuer_prefix)

    def flush(self) -> None:
        for (prefix, year), last in self._last.items():
            if last != self._stored[(prefix, year)]:
                self.conn.execute("UPDATE billing_number_counters SET last_seq = %s WHERE prefix = %s AND year = %s",
                                  (last, prefix, year))
                self._stored[(prefix, year)] = last
