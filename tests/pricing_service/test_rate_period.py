"""The SQL period path (invoices, shadow rating, experiments) agrees with the Python oracle
(tests/pricing/usage_oracle.py: usage attributed in Python from the hourly records)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from metering.period_reads import read_ahead
from metering.period_usage import period_usages
from pricing.cost import attribute
from pricing.experiments import compare
from pricing.money import precise
from pricing.rating import rate
from pricing_service.books import read_cost_model, read_price_book
from pricing_service.compare import experiment_usages
from pricing_service.rate_period import load_period_usages, rate_period
from pricing_service.source import connect, load_dataset
from tests.pricing.usage_oracle import customer_usages, oracle_usages
from tests.pricing_service.conftest import H0, H2

BOOKS = Path(__file__).parent / "books"


def _gpu(usage):
    return {(k.deployment, k.gpu_type): precise(q) for k, q in usage.quantities.items() if k.meter == "gpu_seconds"}


def test_sql_attribution_and_rating_match_the_pure_path(synthetic_db):
    cost_model = read_cost_model(BOOKS / "cost-model.yaml")
    with connect(synthetic_db) as conn:
        dataset = load_dataset(conn, H0, H2)
        pure = customer_usages(dataset, attribute(dataset, cost_model), H0, H2)
        sql = load_period_usages(conn, H0, H2, cost_model)
        one = load_period_usages(conn, H0, H2, cost_model, customer_id="cust-3")
        assert set(sql) == set(pure)
        for customer in pure:
            assert _gpu(sql[customer]) == _gpu(pure[customer]), customer
        assert _gpu(one["cust-3"]) == _gpu(pure["cust-3"])
        assert list(one) == ["cust-3"]
        for name in ("per-token.yaml", "gpu-hour.yaml", "per-task.yaml"):
            book = read_price_book(BOOKS / name)
            by_sql = rate_period(conn, book, H0, H2, cost_model)
            for customer, usage in pure.items():
                expected = rate(book, usage)
                got = by_sql.get(customer)
                assert (got.total if got else 0) == expected.total, (name, customer)
                if got:
                    assert [(x.line_id, x.amount) for x in got.lines] == [(x.line_id, x.amount) for x in expected.lines]


def _nonzero(usages):
    return {c: {k: q for k, q in u.quantities.items() if q} for c, u in usages.items()}


def test_experiment_usages_from_sql_match_the_oracle_and_give_the_same_comparison(synthetic_db):
    """The experiment rates usage loaded the invoice way (SQL): window, hourly buckets and caching
    off per model equal the Python oracle's, key by key, and so does the whole comparison."""
    cost_model = read_cost_model(BOOKS / "cost-model.yaml")
    books = [read_price_book(BOOKS / n) for n in ("per-token.yaml", "gpu-hour.yaml", "per-task.yaml")]
    with connect(synthetic_db) as conn:
        dataset = load_dataset(conn, H0, H2)
        sql = experiment_usages(conn, dataset, cost_model)
    oracle = oracle_usages(dataset, cost_model)
    assert _nonzero(sql.window) == _nonzero(oracle.window)
    assert len(sql.buckets) == len(oracle.buckets) == 2
    for got, expected in zip(sql.buckets, oracle.buckets, strict=True):
        assert _nonzero(got) == _nonzero(expected)
    assert set(sql.caching_off) == set(oracle.caching_off) == {"kimi-chat", "kimi-chat-lite"}
    for model, expected in oracle.caching_off.items():
        assert _nonzero(sql.caching_off[model]) == _nonzero(expected), model
        assert _nonzero(expected) != _nonzero(oracle.window)  # caching off changes something
    by_sql, by_oracle = compare(dataset, books, cost_model, sql), compare(dataset, books, cost_model, oracle)
    assert by_sql == by_oracle


def test_the_hourly_sums_stream_in_customer_order_and_leave_the_connection_as_found(synthetic_db):
    settings = "SELECT current_setting('random_page_cost'), current_setting('max_parallel_workers_per_gather')"

    def hourly(conn, **chunks):
        return period_usages(conn, window=(H0, H2), from_totals=False, usage_meters=(), tasks=False, gpu=False,
                             **chunks)

    with connect(synthetic_db) as conn:
        before = conn.execute(settings).fetchone()
        customers = [u.customer_id for u in hourly(conn)]
        assert len(customers) > 3
        assert customers == sorted(customers) and len(set(customers)) == len(customers)
        assert conn.execute(settings).fetchone() == before  # the query's SET LOCALs are put back

        # the caller stops after one customer while the reader waits on a full queue: it ends, and
        # the connection answers the next query
        stream = hourly(conn, chunk_rows=1, chunks_ahead=1)
        assert next(stream).customer_id == customers[0]
        stream.close()
        assert conn.execute(settings).fetchone() == before
        assert [u.customer_id for u in hourly(conn)] == customers

        # an error in the reading thread is raised in the caller's
        with pytest.raises(psycopg.errors.DivisionByZero):
            list(read_ahead(conn, "SELECT 1 / 0 WHERE %(start)s < %(end)s", {"start": H0, "end": H2},
                            chunk_rows=1, chunks_ahead=1))
        conn.rollback()
        assert conn.execute("SELECT 1").fetchone() == (1,)
