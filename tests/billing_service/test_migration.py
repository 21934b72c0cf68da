"""Migration 0006 goes down and up again cleanly (tables, triggers and functions)."""

from __future__ import annotations

import psycopg

from infermeter.db import drift, upgrade
from infermeter.stack.postgres import to_libpq_url
from migrations.models import target_metadata


def test_0006_downgrades_and_upgrades(db_url):
    from alembic import command

    from infermeter.db import alembic_config

    command.downgrade(alembic_config(db_url), "0005")
    with psycopg.connect(to_libpq_url(db_url)) as conn:
        left = conn.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'billing_%'").fetchone()[0]
        functions = conn.execute("SELECT count(*) FROM pg_proc WHERE proname LIKE 'billing_%'").fetchone()[0]
    assert (left, functions) == (0, 0)
    upgrade(db_url)
    assert drift(db_url, target_metadata()) == []
