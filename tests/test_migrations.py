"""Models and migrations do not drift: autogenerate against a migrated database finds nothing."""

import re
from pathlib import Path

import psycopg

from infermeter.db import drift, upgrade
from infermeter.stack import to_libpq_url
from migrations.models import target_metadata


def test_models_and_migrations_agree(db_url):
    assert drift(db_url, target_metadata()) == []


def test_the_covering_rollup_key_can_be_built_online_before_0005(pg_server_url):
    """The operator path in migration 0005's docstring (its SQL, run as written): build the covering
    index concurrently, swap it in as the key, then upgrade: 0005 only records itself."""
    from tests.conftest import _with_database

    name = "t_online_0005"
    admin = to_libpq_url(pg_server_url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    url = _with_database(pg_server_url, name)
    upgrade(url, "0004")
    doc = (Path(__file__).parent.parent / "migrations/versions/0005_rollup_covering_key.py").read_text()
    create, alter = re.findall(r"^    (CREATE UNIQUE INDEX CONCURRENTLY .*?;|ALTER TABLE .*?;)$", doc, re.M | re.S)
    with psycopg.connect(to_libpq_url(url), autocommit=True) as conn:
        conn.execute("INSERT INTO request_rollup_hourly (customer_id, model, deployment_id, hour) "
                     "VALUES ('c', 'm', 'd', '2026-11-01T00:00:00Z')")
        conn.execute(" ".join(create.split()))
        conn.execute(" ".join(alter.split()))
    upgrade(url, "heads")
    with psycopg.connect(to_libpq_url(url)) as conn:
        key = conn.execute("SELECT pg_get_indexdef('request_rollup_hourly_pkey'::regclass)").fetchone()[0]
        assert conn.execute("SELECT count(*) FROM request_rollup_hourly").fetchone() == (1,)
    assert "INCLUDE (requests, input_tokens, cached_input_tokens, output_tokens)" in key
    assert drift(url, target_metadata()) == []
