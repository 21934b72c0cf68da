"""Alembic environment: one transaction per migration, a lock timeout, and an advisory lock
so that concurrent `db upgrade` runs (several processes starting at once) take turns."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool, text

from infermeter.db import include_object
from migrations.models import target_metadata as all_tables

config = context.config
target_metadata = all_tables()

MIGRATION_LOCK_ID = 0x1AFE_4E7E  # pg_advisory_lock key of infermeter migrations


def run_migrations_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True, include_object=include_object)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(config.get_main_option("sqlalchemy.url"), poolclass=pool.NullPool)
    with engine.connect() as connection:
        connection.execute(text("SET lock_timeout = '20s'"))
        connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_ID})
        connection.commit()
        try:
            context.configure(connection=connection, target_metadata=target_metadata,
                              transaction_per_migration=True, include_object=include_object,
                              compare_type=True)
            with context.begin_transaction():
                context.run_migrations()
            connection.commit()
        finally:
            connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK_ID})
            connection.commit()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
