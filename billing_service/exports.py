"""Finance exports: invoices, invoice lines, revenue and usage of a billing period, as CSV or Parquet,
reproducible byte for byte as of any past moment.

`export(conn, kind, period, fmt, as_of=None) -> bytes`. What was known at `as_of`:
- invoices and their lines: each invoice's last history row (`billing_invoice_history`) recorded at or
  before `as_of` (the whole invoice as it was then, its lines those of that revision: `store.with_lines`);
  credit notes issued at or before it;
- usage: metering's raw events received at or before it (`metering.billing_reads.usage_as_of`), each billed
  customer (a customer record created by then) over its own period P, other customers over the UTC
  period P.
Without `as_of`: everything recorded so far, so an export taken at T equals `--as-of T` taken later.

Deterministic bytes: rows in a fixed order (below), columns in a fixed order with fixed types, nothing of
"now" in the file; CSV is UTF-8, comma-separated, `\\n` line ends, a header row, minimal quoting; Parquet is
written with fixed options (zstd, format 2.6, data page v1, no dictionary) whose only metadata is the
Arrow schema and pyarrow's `created_by` (its version, no time). Column names and types: docs/billing.md,
"Finance exports", and `COLUMNS` below.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

import psycopg

from billing.invoice import CHARGING
from billing.periods import UTC_SCHEDULE, billing_period, parse_label
from billing_service.store import BillingServiceError, with_lines
from infermeter.db import QUANTITY_SCALE
from infermeter.times import utc_text
from metering.billing_reads import usage_as_of
from pricing.meters import REQUEST_METERS
from pricing.money import Currency

KINDS = ("invoices", "lines", "revenue", "usage")
FORMATS = ("csv", "parquet")
MEDIA_TYPES = {"csv": "text/csv; charset=utf-8", "parquet": "application/vnd.apache.parquet"}
CHARGING_STATUSES = frozenset(str(s) for s in CHARGING)
ZERO = Decimal(0)


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # string | int | decimal | timestamp | bool
    doc: str


def _cols(*specs: tuple[str, str, str]) -> tuple[Column, ...]:
    return tuple(Column(*s) for s in specs)


COLUMNS: dict[str, tuple[Column, ...]] = {
    "invoices": _cols(
        ("invoice_id", "string", "stable invoice id"),
        ("number", "string", "INV-YYYY-NNNNNN; empty for a draft"),
        ("customer_id", "string", "customer"),
        ("period", "string", "billing period YYYY-MM of the invoice"),
        ("period_start", "timestamp", "period start (UTC)"),
        ("period_end", "timestamp", "period end, exclusive (UTC)"),
        ("sequence", "int", "1 = the regular invoice, 2.. reissues"),
        ("status", "string", "draft, open, paid, payment_failed or void (as of)"),
        ("status_since", "timestamp", "when the invoice took that status (history recorded_at)"),
        ("currency", "string", "ISO 4217"),
        ("subtotal", "decimal", "sum of the lines"),
        ("credits_applied", "decimal", "prepaid credits applied"),
        ("total", "decimal", "subtotal - credits_applied"),
        ("credit_notes_total", "decimal", "credit notes issued against it (as of)"),
        ("line_count", "int", "number of lines"),
        ("price_book_version", "string", "<book id>@sha256:<hex>"),
        ("issued_at", "timestamp", "date on the document; empty for a draft"),
        ("finalized_at", "timestamp", "finalization time; empty for a draft"),
        ("reissue_of", "string", "the void invoice this one replaces"),
        ("revision", "int", "history revision exported"),
        ("revision_recorded_at", "timestamp", "when that revision was recorded"),
    ),
    "lines": _cols(
        ("invoice_id", "string", "invoice"),
        ("invoice_number", "string", "its number; empty for a draft"),
        ("invoice_status", "string", "its status (as of)"),
        ("customer_id", "string", "customer"),
        ("currency", "string", "ISO 4217"),
        ("invoice_period", "string", "the invoice's period"),
        ("position", "int", "0-based position on the invoice"),
        ("line_id", "string", "stable line id"),
        ("rated_line_id", "string", "the rated line it copies or adjusts"),
        ("kind", "string", "usage, minimum or credit"),
        ("meter", "string", "meter (uncached_input_tokens, gpu_seconds, usage:<name>, ...)"),
        ("model", "string", "model for request meters, else empty"),
        ("group", "string", "model, GPU type or empty"),
        ("charge_key", "string", "the price book charge"),
        ("quantity", "decimal", "quantity"),
        ("unit_price", "decimal", "unit price; empty for tiered, package, flat, minimum, credit"),
        ("precise_amount", "decimal", "amount before rounding"),
        ("amount", "decimal", "amount at the currency's minor unit"),
        ("credited", "decimal", "credited on this line by credit notes (as of)"),
        ("period", "string", "service period the line belongs to (earlier for an adjustment)"),
        ("service_period_start", "timestamp", "service period start (UTC)"),
        ("service_period_end", "timestamp", "service period end, exclusive (UTC)"),
        ("adjustment", "bool", "an adjustment of an earlier period"),
        ("project", "string", "project of a line split by project (the book's invoice.group_by); empty: none"),
    ),
    "revenue": _cols(
        ("customer_id", "string", "customer"),
        ("currency", "string", "ISO 4217"),
        ("period", "string", "service period (the --period asked for)"),
        ("invoiced_in", "string", "period of the invoice carrying the lines (later for adjustments)"),
        ("meter", "string", "meter"),
        ("model", "string", "model for request meters, else empty"),
        ("group", "string", "model, GPU type or empty"),
        ("quantity", "decimal", "quantity invoiced"),
        ("amount", "decimal", "amount invoiced"),
        ("credited", "decimal", "credited back by credit notes (as of)"),
        ("net_amount", "decimal", "amount - credited"),
        ("lines", "int", "invoice lines summed"),
        ("invoices", "int", "invoices they are on"),
    ),
    "usage": _cols(
        ("customer_id", "string", "customer"),
        ("billed", "bool", "has a customer record (its own period window); false: the UTC period"),
        ("period", "string", "billing period YYYY-MM"),
        ("period_start", "timestamp", "window start (UTC)"),
        ("period_end", "timestamp", "window end, exclusive (UTC)"),
        ("meter", "string", "requests, token meters, usage:<name>, successful_tasks, failed_tasks, task_attempts"),
        ("model", "string", "model (request meters), else empty"),
        ("deployment_id", "string", "deployment (request meters), else empty"),
        ("quantity", "decimal", "metered quantity (as of)"),
        ("project", "string", "the API key's project (request meters); empty: none"),
    ),
}

ORDER = {
    "invoices": "customer_id, period_start, sequence, invoice_id",
    "lines": "customer_id, invoice period_start, invoice sequence, position",
    "revenue": "customer_id, currency, invoiced_in, meter, group",
    "usage": "customer_id, meter, model, deployment_id, project",
}


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise BillingServiceError(f"unknown export {kind!r}: one of {', '.join(KINDS)}")
    return kind


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise BillingServiceError(f"unknown format {fmt!r}: csv or parquet")
    return fmt


# ---------------------------------------------------------------- what was known


def _ts(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _dec(text: str | None) -> Decimal | None:
    return None if text is None else Decimal(text)


@dataclass
class _Known:
    document: dict
    revision: int
    recorded_at: datetime
    status_since: datetime


def _invoices_as_of(conn: psycopg.Connection, as_of: datetime | None, where: str, params: dict) -> list[_Known]:
    rows = conn.execute(
        "SELECT invoice_id, revision, recorded_at, status, document FROM billing_invoice_history "
        f"WHERE (%(as_of)s::timestamptz IS NULL OR recorded_at <= %(as_of)s) AND {where} "
        "ORDER BY invoice_id, revision",
        {"as_of": as_of, **params},
    ).fetchall()
    out: dict[str, _Known] = {}
    for invoice_id, revision, recorded_at, status, document in rows:
        known = out.get(invoice_id)
        since = known.status_since if known is not None and known.document["status"] == status else recorded_at
        out[invoice_id] = _Known(document, revision, recorded_at, since)
    for k, document in zip(out.values(), with_lines(conn, [(k.document, k.revision) for k in out.values()]), strict=True):
        k.document = document
    return sorted(out.values(), key=lambda k: (k.document["customer_id"], _ts(k.document["period_start"]),
                                               k.document["sequence"], k.document["id"]))


def _credited(conn: psycopg.Connection, as_of: datetime | None, invoice_ids: list[str]) -> dict[tuple[str, str], Decimal]:
    out: dict[tuple[str, str], Decimal] = {}
    for invoice_id, lines in conn.execute(
        "SELECT invoice_id, lines FROM billing_credit_notes WHERE invoice_id = ANY(%(ids)s) "
        "AND (%(as_of)s::timestamptz IS NULL OR issued_at <= %(as_of)s) ORDER BY invoice_id, sequence",
        {"ids": invoice_ids, "as_of": as_of},
    ):
        for line in lines:
            key = (invoice_id, line["invoice_line_id"])
            out[key] = out.get(key, ZERO) + Decimal(line["amount"])
    return out


def _money(value: Decimal, currency: str) -> Decimal:
    """An amount at its currency's minor unit (12.30, never 12.300000000000): amounts are already rounded."""
    return Currency.of(currency).round(value)


def _model(meter: str, group: str) -> str:
    return group if meter in REQUEST_METERS else ""


def invoice_rows(conn: psycopg.Connection, period: str, as_of: datetime | None) -> list[dict]:
    known = _invoices_as_of(conn, as_of, "document->>'period' = %(period)s", {"period": period})
    credited = _credited(conn, as_of, [k.document["id"] for k in known])
    rows = []
    for k in known:
        d = k.document
        notes = sum((v for (inv, _), v in credited.items() if inv == d["id"]), ZERO)
        rows.append({
            "invoice_id": d["id"], "number": d["number"], "customer_id": d["customer_id"], "period": d["period"],
            "period_start": _ts(d["period_start"]), "period_end": _ts(d["period_end"]), "sequence": d["sequence"],
            "status": d["status"], "status_since": k.status_since, "currency": d["currency"],
            "subtotal": _dec(d["subtotal"]), "credits_applied": _dec(d["credits_applied"]), "total": _dec(d["total"]),
            "credit_notes_total": _money(notes, d["currency"]), "line_count": len(d["lines"]), "price_book_version": d["price_book_version"],
            "issued_at": _ts(d["issued_at"]), "finalized_at": _ts(d["finalized_at"]), "reissue_of": d["reissue_of"],
            "revision": k.revision, "revision_recorded_at": k.recorded_at,
        })
    return rows


def line_rows(conn: psycopg.Connection, period: str, as_of: datetime | None) -> list[dict]:
    known = _invoices_as_of(conn, as_of, "document->>'period' = %(period)s", {"period": period})
    credited = _credited(conn, as_of, [k.document["id"] for k in known])
    rows = []
    for k in known:
        d = k.document
        for position, line in enumerate(d["lines"]):
            rows.append({
                "invoice_id": d["id"], "invoice_number": d["number"], "invoice_status": d["status"],
                "customer_id": d["customer_id"], "currency": d["currency"], "invoice_period": d["period"],
                "position": position, "line_id": line["id"], "rated_line_id": line["rated_line_id"],
                "kind": line["kind"], "meter": line["meter"], "model": _model(line["meter"], line["group"]),
                "group": line["group"], "charge_key": line["charge_key"], "quantity": _dec(line["quantity"]),
                "unit_price": _dec(line["unit_price"]), "precise_amount": _dec(line["precise_amount"]),
                "amount": _dec(line["amount"]), "credited": _money(credited.get((d["id"], line["id"]), ZERO), d["currency"]),
                "period": line["period"], "service_period_start": _ts(line["service_period_start"]),
                "service_period_end": _ts(line["service_period_end"]),
                "adjustment": line["id"] != line["rated_line_id"], "project": line.get("project") or None,
            })
    return rows


def revenue_rows(conn: psycopg.Connection, period: str, as_of: datetime | None) -> list[dict]:
    """What charging invoices (open, paid, payment_failed, as of) carry for service period `period`,
    wherever the lines landed, by customer, currency, invoice period, meter and model/group."""
    known = [k for k in _invoices_as_of(conn, as_of, "document->>'period' >= %(period)s", {"period": period})
             if k.document["status"] in CHARGING_STATUSES]
    credited = _credited(conn, as_of, [k.document["id"] for k in known])
    groups: dict[tuple, dict] = {}
    for k in known:
        d = k.document
        for line in d["lines"]:
            if line["period"] != period:
                continue
            key = (d["customer_id"], d["currency"], d["period"], line["meter"], line["group"])
            row = groups.setdefault(key, {
                "customer_id": d["customer_id"], "currency": d["currency"], "period": period, "invoiced_in": d["period"],
                "meter": line["meter"], "model": _model(line["meter"], line["group"]), "group": line["group"],
                "quantity": ZERO, "amount": ZERO, "credited": ZERO, "net_amount": ZERO, "lines": 0, "invoices": set(),
            })
            amount = Decimal(line["amount"])
            credit = credited.get((d["id"], line["id"]), ZERO)
            row["quantity"] += Decimal(line["quantity"])
            row["amount"] += amount
            row["credited"] += credit
            row["net_amount"] += amount - credit
            row["lines"] += 1
            row["invoices"].add(d["id"])
    rows = [groups[key] for key in sorted(groups)]
    for row in rows:
        row["invoices"] = len(row["invoices"])
        for name in ("amount", "credited", "net_amount"):
            row[name] = _money(row[name], row["currency"])
    return rows


def usage_rows(conn: psycopg.Connection, period: str, as_of: datetime | None) -> list[dict]:
    customers = conn.execute(
        "SELECT customer_id, timezone, anchor_day FROM billing_customers "
        "WHERE (%(as_of)s::timestamptz IS NULL OR created_at <= %(as_of)s) ORDER BY customer_id",
        {"as_of": as_of},
    ).fetchall()
    rows: list[dict] = []

    def add(found: Iterable[dict], billed: bool, window) -> None:
        rows.extend({"customer_id": r["customer_id"], "billed": billed, "period": period,
                     "period_start": window.start, "period_end": window.end, "meter": r["meter"],
                     "model": r["model"], "deployment_id": r["deployment_id"], "quantity": r["quantity"],
                     "project": r["project"] or None}
                    for r in found)

    for customer_id, timezone, anchor_day in customers:
        window = billing_period(period, timezone, anchor_day)
        add(usage_as_of(conn, window.window, as_of=as_of, customer_id=customer_id), True, window)
    utc = billing_period(period, *UTC_SCHEDULE)
    billed = {c[0] for c in customers}
    add((r for r in usage_as_of(conn, utc.window, as_of=as_of) if r["customer_id"] not in billed), False, utc)
    rows.sort(key=lambda r: (r["customer_id"], r["meter"], r["model"], r["deployment_id"], r["project"] or ""))
    return rows


ROWS = {"invoices": invoice_rows, "lines": line_rows, "revenue": revenue_rows, "usage": usage_rows}


# ---------------------------------------------------------------- files


def _text(value: object, type_: str) -> str:
    if value is None:
        return ""
    if type_ == "decimal":
        return format(value, "f")
    if type_ == "timestamp":
        return utc_text(value)
    if type_ == "bool":
        return "true" if value else "false"
    return str(value)


def to_csv(kind: str, rows: list[dict]) -> bytes:
    columns = COLUMNS[kind]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([c.name for c in columns])
    for row in rows:
        writer.writerow([_text(row[c.name], c.type) for c in columns])
    return buf.getvalue().encode("utf-8")


def arrow_schema(kind: str):
    import pyarrow as pa

    types = {"string": pa.string(), "int": pa.int64(), "decimal": pa.decimal128(38, QUANTITY_SCALE),
             "timestamp": pa.timestamp("us", tz="UTC"), "bool": pa.bool_()}
    return pa.schema([pa.field(c.name, types[c.type]) for c in COLUMNS[kind]])


def to_parquet(kind: str, rows: list[dict]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = arrow_schema(kind)
    scale = Decimal(1).scaleb(-QUANTITY_SCALE)

    def value(row: dict, column: Column):
        v = row[column.name]
        if v is not None and column.type == "decimal":
            return v.quantize(scale)
        return v

    arrays = [pa.array([value(r, c) for r in rows], type=schema.field(c.name).type) for c in COLUMNS[kind]]
    table = pa.Table.from_arrays(arrays, schema=schema)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", compression_level=3, version="2.6", data_page_version="1.0",
                   use_dictionary=False, write_statistics=True, store_schema=True)
    return sink.getvalue().to_pybytes()


def export(conn: psycopg.Connection, kind: str, period: str, fmt: str, as_of: datetime | None = None) -> bytes:
    """The `kind` export of `period` as known at `as_of` (None: everything recorded so far), in `fmt`."""
    check_kind(kind)
    check_format(fmt)
    parse_label(period)
    with conn.transaction():  # one snapshot for every read
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        rows = ROWS[kind](conn, period, as_of)
    return to_csv(kind, rows) if fmt == "csv" else to_parquet(kind, rows)


def file_name(kind: str, period: str, fmt: str, as_of: datetime | None) -> str:
    stamp = "" if as_of is None else "-asof-" + utc_text(as_of).replace(":", "").replace("-", "")
    return f"{kind}-{period}{stamp}.{fmt}"
