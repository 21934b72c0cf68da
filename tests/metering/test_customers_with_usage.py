"""metering.customers_with_usage: the customers with any usage in a window (requests, usage
meters, task outcomes, dedicated GPU time), whether each rollup table is walked by its key (a loose
index scan) or read by hour, and for given customers only (`among`). Usage written through metering's
real write path (BatchWriter) into a real PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from infermeter.stack.postgres import to_libpq_url
from infermeter.times import Window
from metering.customers_with_usage import _ROLLUPS, customers_with_usage, customers_with_usage_sql
from tests.billing_service.conftest import Metering

NOV = Window(datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC))
ALL_TABLES = [t for t, _ in _ROLLUPS]


@pytest.fixture
def conn(db_url: str):
    m = Metering(db_url)
    inside, before, after = datetime(2026, 11, 10, 5, tzinfo=UTC), datetime(2026, 10, 20, tzinfo=UTC), NOV.end
    m.request("a-requests", inside)
    m.request("a-requests", before, model="m2")
    m.request("b-outside", before)  # rows before and after the window only: the walk steps over them
    m.request("b-outside", after, model="big")
    m.request("b-outside", after + timedelta(hours=5))
    m.usage("c-meters", "tool_calls", "3", inside)
    m.usage("c2-meters-outside", "tool_calls", "3", before)
    m.task("d-tasks", "t1", "succeeded", inside)
    m.task("d2-tasks-outside", "t2", "succeeded", after)
    m.replica("e-dedicated", inside, inside + timedelta(minutes=10))
    m.replica(None, inside, inside + timedelta(minutes=10), deployment="shared", replica="pool-1")  # the pool: ''
    m.replica("e2-dedicated-outside", before, before + timedelta(minutes=10), replica="rep-2")
    m.request("f-edge", NOV.start - timedelta(minutes=1))  # in the hour before the window: not in it
    m.request("g-edge", datetime(2026, 11, 1, 0, 30, tzinfo=UTC))
    m.close()
    with psycopg.connect(to_libpq_url(db_url), autocommit=True) as c:
        c.execute("SET TIME ZONE 'UTC'")
        c.execute("ANALYZE")
        yield c


EXPECTED = ["a-requests", "c-meters", "d-tasks", "e-dedicated", "g-edge"]


@pytest.mark.parametrize("walked", [[], ALL_TABLES, ALL_TABLES[:1]], ids=["read", "walked", "requests-walked"])
def test_walking_the_keys_or_reading_the_window_finds_the_same_customers(conn, walked):
    params = {"s": NOV.start, "e": NOV.end}
    found = [r[0] for r in conn.execute(customers_with_usage_sql(walked), params).fetchall()]
    assert found == EXPECTED


def test_customers_with_usage(conn):
    assert customers_with_usage(conn, NOV) == EXPECTED
    # a window starting inside an hour counts that whole hour (a superset at the edges)
    assert customers_with_usage(conn, Window(datetime(2026, 11, 1, 0, 45, tzinfo=UTC), NOV.end)) == EXPECTED
    assert customers_with_usage(conn, Window(datetime(2026, 11, 1, 1, tzinfo=UTC), NOV.end)) == EXPECTED[:-1]
    assert customers_with_usage(conn, Window(datetime(2027, 1, 1, tzinfo=UTC), datetime(2027, 2, 1, tzinfo=UTC))) == []


def test_among_given_customers_only(conn):
    everyone = ["g-edge", "b-outside", "a-requests", "c-meters", "d-tasks", "e-dedicated", "f-edge", "nobody",
                "c2-meters-outside", "d2-tasks-outside", "e2-dedicated-outside", ""]
    assert customers_with_usage(conn, NOV, among=everyone) == EXPECTED
    assert customers_with_usage(conn, NOV, among=["b-outside", "d-tasks", "d-tasks"]) == ["d-tasks"]
    assert customers_with_usage(conn, NOV, among=[]) == []
