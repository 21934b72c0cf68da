"""Models and migrations do not drift: autogenerate against a migrated database finds nothing."""

import json
import re
from pathlib import Path

import psycopg
import pytest

from infermeter.db import drift, upgrade
from infermeter.stack.postgres import to_libpq_url
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


# --- downgrade, then upgrade again -----------------------------------------------------------------

SCHEMA_SNAPSHOT = {
    "relations": """
        SELECT c.relname, c.relkind, coalesce(pg_get_partkeydef(c.oid), '')
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'S', 'v', 'm') AND NOT c.relispartition
          AND c.relname <> 'alembic_version'""",
    "columns": """
        SELECT table_name, column_name, data_type, is_nullable, coalesce(column_default, ''),
               coalesce(collation_name, ''), coalesce(numeric_precision, 0), coalesce(numeric_scale, 0)
        FROM information_schema.columns
        WHERE table_schema = 'public' AND table_name <> 'alembic_version' AND table_name NOT LIKE 'raw\\_events\\_%'
          AND table_name NOT LIKE 'event\\_keys\\_%'""",
    "constraints": """
        SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid)
        FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
        WHERE n.nspname = 'public' AND c.conrelid::regclass::text NOT IN ('alembic_version')
          AND c.conrelid::regclass::text NOT LIKE 'raw\\_events\\_%'
          AND c.conrelid::regclass::text NOT LIKE 'event\\_keys\\_%'""",
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes
        WHERE schemaname = 'public' AND tablename <> 'alembic_version' AND tablename NOT LIKE 'raw\\_events\\_%'
          AND tablename NOT LIKE 'event\\_keys\\_%'""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid)
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'""",
    "types": """
        SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = 'public' AND t.typtype IN ('e', 'd', 'r')""",
}


def _schema(url: str) -> dict[str, list[tuple]]:
    """The public schema as the catalog sees it (runtime partitions of raw_events and event_keys left out)."""
    with psycopg.connect(to_libpq_url(url)) as conn:
        return {part: sorted(conn.execute(sql).fetchall()) for part, sql in SCHEMA_SNAPSHOT.items()}


def _tables(url: str) -> list[str]:
    with psycopg.connect(to_libpq_url(url)) as conn:
        rows = conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'S', 'v', 'm') ORDER BY 1"
        ).fetchall()
    return [name for (name,) in rows]


def _fresh_database(pg_server_url: str, name: str) -> str:
    from tests.conftest import _with_database

    with psycopg.connect(to_libpq_url(pg_server_url), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    return _with_database(pg_server_url, name)


def _downgrade(url: str, revision: str) -> None:
    from alembic import command

    from infermeter.db import alembic_config

    command.downgrade(alembic_config(url), revision)


# Points of the history every downgrade passes through, head first (0002 and 0003 are branches
# merged by 0004).
STEPS = ("0022", "0021", "0020", "0019", "0018", "0017", "0016", "0015", "0014", "0013", "0012", "0011", "0010", "0009", "0008", "0007", "0006", "0005", "0004", "0001")


@pytest.mark.slow
def test_downgrade_to_base_undoes_every_migration_then_upgrade_again_has_no_drift(pg_server_url):
    """Each downgrade leaves exactly the schema a fresh upgrade to that revision builds; at base
    nothing is left (the monthly partitions of raw_events created at run time go with their table);
    upgrading again to head gives the models' schema."""
    names = [f"t_mig_at_{revision}" for revision in STEPS] + ["t_mig_round_trip"]
    try:
        expected = {}
        for revision in STEPS:
            url = _fresh_database(pg_server_url, f"t_mig_at_{revision}")
            upgrade(url, revision)
            expected[revision] = _schema(url)
        from alembic.script import ScriptDirectory

        from infermeter.db import alembic_config

        assert ScriptDirectory.from_config(alembic_config(pg_server_url)).get_heads() == [STEPS[0]]
        assert all(expected[a] != expected[b] for a, b in zip(STEPS, STEPS[1:], strict=False))

        url = _fresh_database(pg_server_url, "t_mig_round_trip")
        upgrade(url, "heads")
        head = _schema(url)
        assert head == expected[STEPS[0]]
        with psycopg.connect(to_libpq_url(url)) as conn:  # data, and a partition made at run time
            conn.execute("CREATE TABLE raw_events_2026_11 PARTITION OF raw_events "
                         "FOR VALUES FROM ('2026-11-01T00:00:00Z') TO ('2026-12-01T00:00:00Z')")
            conn.execute("INSERT INTO raw_events (occurred_at, source, event_id, type, customer_id, payload) "
                         "VALUES ('2026-11-02T00:00:00Z', 's', 'e', 't', 'c', '{}')")
            conn.execute("CREATE TABLE event_keys_2026_11 PARTITION OF event_keys (PRIMARY KEY (source, event_id)) "
                         "FOR VALUES FROM ('2026-11-01T00:00:00Z') TO ('2026-12-01T00:00:00Z')")
            conn.execute("INSERT INTO event_keys VALUES ('s', 'e', '2026-11-02T00:00:00Z')")
            conn.execute("INSERT INTO request_rollup_hourly (customer_id, model, deployment_id, hour) "
                         "VALUES ('c', 'm', 'd', '2026-11-01T00:00:00Z')")
            conn.execute("INSERT INTO api_keys (key_id, customer_id, secret_sha256, display_prefix) "
                         "VALUES ('k', 'c', '\\x00', 'p')")

        for revision in STEPS[1:]:
            _downgrade(url, revision)
            assert _schema(url) == expected[revision], revision
        _downgrade(url, "base")
        assert _tables(url) == ["alembic_version"]
        with psycopg.connect(to_libpq_url(url)) as conn:
            assert conn.execute("SELECT count(*) FROM alembic_version").fetchone() == (0,)

        upgrade(url, "heads")
        assert _schema(url) == head
        assert drift(url, target_metadata()) == []
    finally:
        with psycopg.connect(to_libpq_url(pg_server_url), autocommit=True) as conn:
            for name in names:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_0009_keeps_every_task_outcome_already_stored_with_its_source(pg_server_url):
    """Upgrading to 0009 fills task_outcome_reports from the task events in raw_events: every report,
    not only the latest per task that task_outcomes kept."""
    name = "t_mig_0009_reports"
    try:
        url = _fresh_database(pg_server_url, name)
        upgrade(url, "0008")
        with psycopg.connect(to_libpq_url(url)) as conn:
            conn.execute("CREATE TABLE raw_events_2026_11 PARTITION OF raw_events "
                         "FOR VALUES FROM ('2026-11-01T00:00:00Z') TO ('2026-12-01T00:00:00Z')")
            for source, event_id, outcome, finished in (("//verifier/v", "e1", "succeeded", "10:00"),
                                                        ("//customer/c", "e2", "failed", "11:00")):
                payload = json.dumps({"data": {"task_id": "t1", "customer_id": "c", "outcome": outcome,
                                               "finished_at": f"2026-11-02T{finished}:00Z"}})
                conn.execute("INSERT INTO raw_events (occurred_at, source, event_id, type, customer_id, payload) "
                             "VALUES (%s, %s, %s, 'infermeter.task.v1', 'c', %s)",
                             (f"2026-11-02T{finished}:00Z", source, event_id, payload))
        upgrade(url, "0009")
        with psycopg.connect(to_libpq_url(url)) as conn:
            rows = conn.execute("SELECT task_id, source, event_id, outcome, to_char(finished_at AT TIME ZONE 'UTC', "
                                "'HH24:MI') FROM task_outcome_reports ORDER BY source").fetchall()
        assert rows == [("t1", "//customer/c", "e2", "failed", "11:00"), ("t1", "//verifier/v", "e1", "succeeded", "10:00")]
    finally:
        with psycopg.connect(to_libpq_url(pg_server_url), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_0019_gives_existing_rollups_no_project_and_its_downgrade_keeps_the_sums_over_projects(pg_server_url):
    """Up: rows stored before 0020 get project '' (no event carried one). Down: each hour's project rows
    are added into its no-project row, so every sum over projects is what it was."""
    name = "t_mig_0020_project"
    counts = "requests, requests_ok, input_tokens, cached_input_tokens, output_tokens, retry_requests"
    try:
        url = _fresh_database(pg_server_url, name)
        upgrade(url, "0019")
        with psycopg.connect(to_libpq_url(url)) as conn:
            conn.execute(f"INSERT INTO request_rollup_hourly (customer_id, model, deployment_id, hour, {counts}) "
                         "VALUES ('c', 'm', 'd', '2026-11-01T00:00:00Z', 3, 3, 30, 10, 6, 1)")
        upgrade(url, "0020")
        with psycopg.connect(to_libpq_url(url)) as conn:
            assert conn.execute("SELECT project, requests FROM request_rollup_hourly").fetchall() == [("", 3)]
            conn.execute(f"INSERT INTO request_rollup_hourly (customer_id, model, deployment_id, hour, project, "
                         f"{counts}) VALUES ('c', 'm', 'd', '2026-11-01T00:00:00Z', 'web', 2, 1, 20, 5, 4, 0), "
                         "('c', 'm', 'd', '2026-11-01T01:00:00Z', 'web', 1, 1, 7, 0, 1, 1)")
        _downgrade(url, "0019")
        with psycopg.connect(to_libpq_url(url)) as conn:
            rows = conn.execute(f"SELECT to_char(hour AT TIME ZONE 'UTC', 'HH24'), {counts} "
                                "FROM request_rollup_hourly ORDER BY hour").fetchall()
        assert rows == [("00", 5, 4, 50, 15, 10, 1), ("01", 1, 1, 7, 0, 1, 1)]
    finally:
        with psycopg.connect(to_libpq_url(pg_server_url), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_0018_fills_calendars_and_period_totals_as_ingest_keeps_them(pg_server_url):
    """Events written at head (billed customers' calendars handed to metering, totals kept at ingest),
    then down to 0017 and up again: 0018 seeds the calendars from billing_customers and fills the
    totals and each task's counted share exactly as ingest had kept them."""
    from datetime import UTC, datetime, timedelta

    from metering.writer import BatchWriter
    from tests.metering.period_checks import Events, give_calendar, totals_snapshot

    name = "t_mig_0018_totals"
    try:
        url = _fresh_database(pg_server_url, name)
        upgrade(url, "heads")
        schedules = {"kol": ("Asia/Kolkata", 1), "ktm": ("Asia/Kathmandu", 15), "ber": ("Europe/Berlin", 31)}
        with psycopg.connect(to_libpq_url(url)) as conn:
            for customer, (timezone, anchor_day) in schedules.items():
                conn.execute("INSERT INTO billing_customers (customer_id, timezone, currency, anchor_day) "
                             "VALUES (%s, %s, 'USD', %s)", (customer, timezone, anchor_day))
                give_calendar(conn, customer, timezone, anchor_day)
        ev = Events("m")
        base = datetime(2026, 2, 27, 12, tzinfo=UTC)
        lines = []
        for i in range(0, 60 * 30, 7):  # every 7 minutes for 30 hours, over the period starts of kol and ber
            at = base + timedelta(minutes=i)
            for customer in (*schedules, "plain"):
                lines.append(ev.request(customer, at, input_tokens=i, cached=i // 2, output=i % 9,
                                        task_id=f"{customer}-t{i % 5}", attempt=1 + i % 3))
                if i % 35 == 0:
                    lines.append(ev.usage(customer, "tool_calls", f"{i}.5", at))
                    lines.append(ev.task(customer, f"{customer}-t{i % 5}", ("succeeded", "failed", "abandoned")[i % 3], at))
            if i % 140 == 0:
                lines.append(ev.replica("kol", at, at + timedelta(minutes=50)))
        writer = BatchWriter(to_libpq_url(url), group_id="m", max_bytes=65536, future_tolerance_s=300)
        for start in range(0, len(lines), 500):
            writer.write(ev.messages(lines[start:start + 500]))
        writer.close()
        with psycopg.connect(to_libpq_url(url)) as conn:
            kept = totals_snapshot(conn)
            calendars = conn.execute("SELECT customer_id, timezone, anchor_day FROM customer_calendars ORDER BY 1").fetchall()
            periods = conn.execute("SELECT * FROM calendar_periods ORDER BY 1, 2, 3").fetchall()
        assert all(kept[t] for t in ("request_period_totals", "usage_period_totals", "task_period_totals",
                                     "gpu_period_totals"))
        _downgrade(url, "0017")
        upgrade(url, "0018")
        with psycopg.connect(to_libpq_url(url)) as conn:
            assert totals_snapshot(conn) == kept
            assert conn.execute("SELECT customer_id, timezone, anchor_day FROM customer_calendars "
                                "ORDER BY 1").fetchall() == calendars
            assert conn.execute("SELECT * FROM calendar_periods ORDER BY 1, 2, 3").fetchall() == periods
    finally:
        with psycopg.connect(to_libpq_url(pg_server_url), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
