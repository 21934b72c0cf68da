"""Migration 0007 creates exactly the tables of billing_service/stripe/tables.py (no drift), and drops them.

Run on its own (its down revision 0006 is the billing migration, merged separately): the upgrade and
downgrade functions of 0007 are applied through Alembic's Operations to an empty database.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import MetaData, inspect

from billing_service.stripe.tables import TABLES
from infermeter.db import include_object

pytest_plugins = ["tests.billing_service.conftest_stripe"]

MIGRATION = Path(__file__).resolve().parents[2] / "migrations" / "versions" / "0007_stripe.py"


def _migration():
    spec = importlib.util.spec_from_file_location("migration_0007_stripe", MIGRATION)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_0007_matches_the_tables_and_downgrades(stripe_pg_engine):
    migration = _migration()
    assert (migration.revision, migration.down_revision) == ("0007", "0006")
    with stripe_pg_engine.begin() as conn:
        for table in TABLES:  # the fixture made them with create_all: start from nothing
            table.drop(conn)
        context = MigrationContext.configure(conn)
        with Operations.context(context):
            migration.upgrade()
    target = MetaData(naming_convention=TABLES[0].metadata.naming_convention)
    for table in TABLES:
        table.to_metadata(target)
    with stripe_pg_engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"include_object": include_object, "compare_type": True})
        assert compare_metadata(context, target) == []
    with stripe_pg_engine.begin() as conn:
        with Operations.context(MigrationContext.configure(conn)):
            migration.downgrade()
    assert not {t.name for t in TABLES} & set(inspect(stripe_pg_engine).get_table_names())
