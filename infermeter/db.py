"""Database wiring: the shared MetaData, the project-wide NUMERIC scale, engines and migrations."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from sqlalchemy import Column, DateTime, MetaData, Numeric, Text, create_engine
from sqlalchemy.engine import Engine

# One NUMERIC scale project-wide: 12 decimal places (per-token prices need them), 38 digits in all.
QUANTITY_SCALE = 12
Quantity = Numeric(38, QUANTITY_SCALE)
# Identifiers (customer, model, source, event id, ...): byte-order collation, so keys compare with
# memcmp whatever the database's locale (several times faster in the ingest upserts).
Key = Text(collation="C")


def timestamp_column(name: str, **kwargs) -> Column:
    """A timestamptz column (aware UTC datetimes everywhere)."""
    return Column(name, DateTime(timezone=True), **kwargs)

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(column_0_label)s",
        "fk": "%(table_name)s_%(column_0_name)s_fkey",
        "pk": "%(table_name)s_pkey",
    }
)

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


@lru_cache(maxsize=8)
def get_engine(url: str) -> Engine:
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5)


def include_object(obj, name, type_, reflected, compare_to) -> bool:
    """Alembic filter: monthly partitions of raw_events and event_keys are created at run time, not by migrations."""
    if type_ == "table" and reflected and compare_to is None and name and name.startswith(("raw_events_", "event_keys_")):
        return False
    return True


def alembic_config(url: str):
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "heads") -> None:
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def drift(url: str, target: MetaData) -> list:
    """What autogenerate would change for `target` (migrations.models.target_metadata()): [] when
    models and migrations agree."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"include_object": include_object, "compare_type": True}
            )
            return compare_metadata(context, target)
    finally:
        engine.dispose()
