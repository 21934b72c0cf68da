"""Revision 0003 creates exactly the price-book table of pricing_service/tables.py (no drift)."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from infermeter.db import include_object
from migrations.models import target_metadata


def test_price_book_table_matches_its_migration(db_url):
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True, "include_object": include_object})
            diff = compare_metadata(context, target_metadata())
    finally:
        engine.dispose()
    assert [d for d in diff if "price_book_versions" in repr(d)] == []
    assert "price_book_versions" in target_metadata().tables
