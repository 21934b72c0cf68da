"""Billing's tables (SQLAlchemy Core on the shared metadata). Migration 0006 creates exactly these,
plus the triggers that keep finalized invoices, history and the credit ledger unchangeable
(docs/billing.md, "What the database enforces").

Money and quantities are NUMERIC at the project scale (`Quantity`); ids and keys byte-ordered (`Key`).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Date,
    ForeignKey,
    Index,
    Integer,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB

from infermeter.db import Key, Quantity, metadata, timestamp_column

# A billed customer: its schedule (time zone, anchor day) and currency.
billing_customers = Table(
    "billing_customers",
    metadata,
    Column("customer_id", Key, nullable=False),
    Column("name", Text),
    Column("email", Text),
    Column("timezone", Text, nullable=False),
    Column("currency", Text, nullable=False),
    Column("anchor_day", Integer, nullable=False),
    timestamp_column("created_at", nullable=False, server_default=func.now()),
    timestamp_column("updated_at", nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("customer_id", name="billing_customers_pkey"),
)

# Price books as assigned to customers: immutable, addressed by the sha256 of their text.
billing_price_books = Table(
    "billing_price_books",
    metadata,
    Column("sha256", Key, nullable=False),
    Column("book_id", Key, nullable=False),
    Column("currency", Text, nullable=False),
    Column("document", JSONB, nullable=False),  # the validated book, amounts as decimal strings
    Column("source_text", Text, nullable=False),  # the YAML as given
    Column("source_name", Text, nullable=False),
    timestamp_column("stored_at", nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("sha256", name="billing_price_books_pkey"),
)

# Plan assignments, append-only: the plan of a period is the latest assignment (highest id) whose
# effective_at (a period boundary of the customer) is at or before the period's start.
billing_plans = Table(
    "billing_plans",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("customer_id", Key, ForeignKey("billing_customers.customer_id"), nullable=False),
    Column("from_date", Date, nullable=False),  # the local date asked for
    timestamp_column("effective_at", nullable=False),  # the period boundary it takes effect at
    Column("effective_period", Text, nullable=False),
    Column("book_sha256", Key, ForeignKey("billing_price_books.sha256"), nullable=False),
    timestamp_column("assigned_at", nullable=False),
)
Index("billing_plans_customer", billing_plans.c.customer_id, billing_plans.c.effective_at)

billing_invoices = Table(
    "billing_invoices",
    metadata,
    Column("id", Key, nullable=False),
    Column("customer_id", Key, ForeignKey("billing_customers.customer_id"), nullable=False),
    Column("period", Text, nullable=False),
    timestamp_column("period_start", nullable=False),
    timestamp_column("period_end", nullable=False),
    Column("sequence", Integer, nullable=False),
    Column("status", Text, nullable=False),
    Column("currency", Text, nullable=False),
    Column("subtotal", Quantity, nullable=False),
    Column("credits_applied", Quantity, nullable=False),
    Column("total", Quantity, nullable=False),
    Column("price_book_version", Text, nullable=False),
    Column("book_sha256", Key, ForeignKey("billing_price_books.sha256")),
    Column("number", Key),
    timestamp_column("issued_at"),
    timestamp_column("finalized_at"),
    Column("reissue_of", Key),
    Column("revision", Integer, nullable=False),
    timestamp_column("created_at", nullable=False),
    timestamp_column("updated_at", nullable=False),
    PrimaryKeyConstraint("id", name="billing_invoices_pkey"),
    UniqueConstraint("customer_id", "period", "sequence", name="billing_invoices_customer_period_seq"),
    UniqueConstraint("number", name="billing_invoices_number"),
)
Index("billing_invoices_period", billing_invoices.c.period, billing_invoices.c.status)

def _line_columns() -> list:
    """An invoice line's columns after its id and position (fresh Column objects for each table)."""
    return [
        Column("rated_line_id", Key, nullable=False),
        Column("kind", Text, nullable=False),
        Column("charge_key", Text, nullable=False),
        Column("meter", Text, nullable=False),
        Column("grp", Text, nullable=False),
        Column("quantity", Quantity, nullable=False),
        Column("unit_price", Quantity),
        Column("precise_amount", Quantity, nullable=False),
        Column("amount", Quantity, nullable=False),
        Column("period", Text, nullable=False),
        timestamp_column("service_period_start", nullable=False),
        timestamp_column("service_period_end", nullable=False),
        # the project of a line split by project (a book's `invoice: {group_by: project}`, migration 0021);
        # '' = no project, or a line not split
        Column("project", Key, nullable=False, server_default=""),
    ]


billing_invoice_lines = Table(
    "billing_invoice_lines",
    metadata,
    # no foreign key: migration 0012 checks each statement's lines against their invoices instead
    Column("invoice_id", Key, nullable=False),
    Column("id", Key, nullable=False),
    Column("position", Integer, nullable=False),
    *_line_columns(),
    PrimaryKeyConstraint("invoice_id", "id", name="billing_invoice_lines_pkey"),
)

# Append-only: a draft's lines as they were before they were replaced, under the last invoice revision
# they belonged to (copied by a trigger on every DELETE from billing_invoice_lines, migration 0012).
billing_invoice_lines_replaced = Table(
    "billing_invoice_lines_replaced",
    metadata,
    Column("invoice_id", Key, nullable=False),
    Column("revision", Integer, nullable=False),
    Column("position", Integer, nullable=False),
    Column("id", Key, nullable=False),
    *_line_columns(),
    PrimaryKeyConstraint("invoice_id", "revision", "id", name="billing_invoice_lines_replaced_pkey"),
)

# Append-only: one row per change of an invoice, with the invoice as it was after the change, without
# its lines (rows written before migration 0012 have them too): the lines of revision r are those
# replaced under the smallest revision >= r, else the invoice's current lines (`store.revision_lines`).
# `what was known at T` = the last row per invoice with recorded_at <= T.
billing_invoice_history = Table(
    "billing_invoice_history",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("invoice_id", Key, nullable=False),
    Column("revision", Integer, nullable=False),
    timestamp_column("recorded_at", nullable=False),
    Column("change", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("document", JSONB, nullable=False),
    UniqueConstraint("invoice_id", "revision", name="billing_invoice_history_revision"),
)

# Gapless numbers: one counter row per issuer prefix and year, locked by the finalizing transaction.
billing_number_counters = Table(
    "billing_number_counters",
    metadata,
    Column("prefix", Key, nullable=False),
    Column("year", Integer, nullable=False),
    Column("last_seq", BigInteger, nullable=False),
    PrimaryKeyConstraint("prefix", "year", name="billing_number_counters_pkey"),
)

billing_credit_grants = Table(
    "billing_credit_grants",
    metadata,
    Column("id", Key, nullable=False),
    Column("customer_id", Key, ForeignKey("billing_customers.customer_id"), nullable=False),
    Column("currency", Text, nullable=False),
    Column("amount", Quantity, nullable=False),
    timestamp_column("granted_at", nullable=False),
    timestamp_column("expires_at"),
    Column("reason", Text, nullable=False),
    PrimaryKeyConstraint("id", name="billing_credit_grants_pkey"),
)
Index("billing_credit_grants_customer", billing_credit_grants.c.customer_id)

# Append-only ledger of prepaid credits: grant (+), use (-, names the invoice), expiry (-).
billing_credit_ledger = Table(
    "billing_credit_ledger",
    metadata,
    Column("id", Key, nullable=False),
    Column("kind", Text, nullable=False),
    Column("grant_id", Key, ForeignKey("billing_credit_grants.id"), nullable=False),
    Column("customer_id", Key, nullable=False),
    Column("currency", Text, nullable=False),
    Column("amount", Quantity, nullable=False),
    timestamp_column("at", nullable=False),
    Column("invoice_id", Key),
    timestamp_column("expires_at"),
    timestamp_column("recorded_at", nullable=False),
    PrimaryKeyConstraint("id", name="billing_credit_ledger_pkey"),
)
Index("billing_credit_ledger_customer", billing_credit_ledger.c.customer_id)

billing_credit_notes = Table(
    "billing_credit_notes",
    metadata,
    Column("id", Key, nullable=False),
    Column("number", Key, nullable=False),
    Column("invoice_id", Key, ForeignKey("billing_invoices.id"), nullable=False),
    Column("customer_id", Key, nullable=False),
    Column("currency", Text, nullable=False),
    Column("sequence", Integer, nullable=False),
    Column("total", Quantity, nullable=False),
    Column("refund_amount", Quantity, nullable=False),
    Column("credits_returned", Quantity, nullable=False),
    Column("reason", Text, nullable=False),
    timestamp_column("issued_at", nullable=False),
    Column("lines", JSONB, nullable=False),  # [{"invoice_line_id", "amount"}]
    PrimaryKeyConstraint("id", name="billing_credit_notes_pkey"),
    UniqueConstraint("invoice_id", "sequence", name="billing_credit_notes_invoice_seq"),
    UniqueConstraint("number", name="billing_credit_notes_number"),
)

BILLING_TABLES = (
    billing_customers, billing_price_books, billing_plans, billing_invoices, billing_invoice_lines,
    billing_invoice_lines_replaced, billing_invoice_history, billing_number_counters, billing_credit_grants, billing_credit_ledger,
    billing_credit_notes,
)
