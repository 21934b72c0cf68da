"""Fixtures: synthetic metering rollups written into the real test Postgres (`db_url`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from infermeter.stack.postgres import to_libpq_url

H0 = datetime(2026, 11, 2, 0, tzinfo=UTC)
H1 = H0 + timedelta(hours=1)
H2 = H0 + timedelta(hours=2)


@pytest.fixture
def pricing_db(db_url: str) -> str:
    """The migrated test database (price_book_versions comes from Alembic revision 0003)."""
    return db_url


def insert_synthetic(db_url: str) -> None:
    """Two hours, four customers, two models on a shared deployment; cust-1 also has a dedicated one.

    Hour 0: shared pool dep-pool (2 replicas x 1 H100 x 3600 s), dedicated dep-c1 (1 x H100).
    Hour 1: same, plus tasks finishing, and tool usage.
    """
    req = [
        # customer, model, deployment, hour, requests, ok, input, cached, output, project ('' = none)
        # cust-1's kimi-chat/dep-pool hour H0 (100, 98, 2M, 1.2M, 100k) comes in two projects: every
        # figure below is their sum (readers that do not ask for projects sum over them)
        ("cust-1", "kimi-chat", "dep-pool", H0, 70, 69, 1_500_000, 900_000, 70_000, "web"),
        ("cust-1", "kimi-chat", "dep-pool", H0, 30, 29, 500_000, 300_000, 30_000, ""),
        ("cust-1", "kimi-chat", "dep-c1", H0, 50, 50, 1_000_000, 500_000, 50_000, ""),
        ("cust-2", "kimi-chat", "dep-pool", H0, 40, 40, 800_000, 400_000, 40_000, ""),
        ("cust-2", "kimi-chat-lite", "dep-pool", H0, 30, 30, 300_000, 0, 30_000, ""),
        ("cust-3", "kimi-chat-lite", "dep-pool", H1, 20, 19, 400_000, 200_000, 20_000, ""),
        ("cust-4", "kimi-chat", "dep-pool", H1, 10, 10, 200_000, 100_000, 10_000, ""),
        ("cust-1", "kimi-chat", "dep-pool", H1, 60, 60, 1_200_000, 600_000, 60_000, ""),
    ]
    gpu = [
        ("", "dep-pool", "r1", "H100", H0, 3_600_000),
        ("", "dep-pool", "r2", "H100", H0, 3_600_000),
        ("cust-1", "dep-c1", "r9", "H100", H0, 3_600_000),
        ("", "dep-pool", "r1", "H100", H1, 3_600_000),
        ("", "dep-pool", "r2", "H100", H1, 1_800_000),
        ("cust-1", "dep-c1", "r9", "H100", H1, 3_600_000),  # idle dedicated hour
        ("", "dep-pool", "r1", "H100", H2, 3_600_000),  # outside the window [H0, H2)
    ]
    tasks = [
        # customer, task, outcome, finished_at, attempts [(attempt, input, cached, output)]
        ("cust-1", "t1", "succeeded", H0 + timedelta(minutes=50), [(1, 50_000, 0, 5_000), (2, 40_000, 20_000, 4_000)]),
        ("cust-1", "t2", "succeeded", H1 + timedelta(minutes=5), [(1, 30_000, 0, 3_000)]),
        ("cust-2", "t3", "failed", H1 + timedelta(minutes=10), [(1, 20_000, 0, 2_000), (2, 20_000, 0, 2_000), (3, 20_000, 10_000, 2_000)]),
        ("cust-3", "t4", "succeeded", H1 + timedelta(minutes=30), [(1, 10_000, 0, 1_000)]),
        ("cust-3", "t5", "succeeded", H2 + timedelta(minutes=1), [(1, 10_000, 0, 1_000)]),  # outside
    ]
    with psycopg.connect(to_libpq_url(db_url)) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO request_rollup_hourly (customer_id, model, deployment_id, hour, requests, requests_ok, "
            "input_tokens, cached_input_tokens, output_tokens, project) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
            req,
        )
        cur.executemany(
            "INSERT INTO gpu_ledger_hourly (customer_id, deployment_id, replica_id, gpu_type, hour, gpu_ms, busy_ms) "
            "VALUES (%s,%s,%s,%s,%s,%s,0)",
            gpu,
        )
        for customer, task, outcome, finished, attempts in tasks:
            cur.execute(
                "INSERT INTO task_outcomes (customer_id, task_id, outcome, finished_at, source, event_id) "
                "VALUES (%s,%s,%s,%s,'test',%s)",
                (customer, task, outcome, finished, f"{customer}-{task}"),
            )
            for attempt, inp, cached, out in attempts:
                cur.execute(
                    "INSERT INTO task_attempts (customer_id, task_id, attempt, requests, input_tokens, "
                    "cached_input_tokens, output_tokens, first_request_at, last_request_at) "
                    "VALUES (%s,%s,%s,1,%s,%s,%s,%s,%s)",
                    (customer, task, attempt, inp, cached, out, finished - timedelta(minutes=5), finished),
                )
        cur.execute(
            "INSERT INTO task_usage (customer_id, task_id, meter, quantity) VALUES ('cust-1','t1','tool_calls',30)"
        )
        cur.executemany(
            "INSERT INTO usage_rollup_hourly (customer_id, meter, hour, quantity, events) VALUES (%s,%s,%s,%s,1)",
            [("cust-1", "tool_calls", H0, 30), ("cust-2", "tool_calls", H1, 250)],
        )


@pytest.fixture
def synthetic_db(pricing_db: str) -> str:
    insert_synthetic(pricing_db)
    return pricing_db
