"""Price books stored in the database with effective dates.

A version of a book (by its `id`) is in force from `effective_from` until the next version's
`effective_from`; rating a period uses the version in force at the period start.
"""

from __future__ import annotations

from sqlalchemy import Column, DateTime, PrimaryKeyConstraint, Table, Text, func
from sqlalchemy.dialects.postgresql import JSONB

from infermeter.db import metadata

price_book_versions = Table(
    "price_book_versions",
    metadata,
    Column("book_id", Text, nullable=False),
    Column("effective_from", DateTime(timezone=True), nullable=False),
    Column("document", JSONB, nullable=False),  # the validated book, amounts as decimal strings
    Column("source_text", Text, nullable=False),  # the YAML as imported
    Column("source_name", Text, nullable=False),
    Column("sha256", Text, nullable=False),
    Column("imported_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("book_id", "effective_from", name="price_book_versions_pkey"),
)
