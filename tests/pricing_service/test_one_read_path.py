"""One period-usage read (`metering.period_usage.period_usages`): a window in, typed rows out, and
metering decides per customer where they come from. A window that is a customer's billing period (as
metering's calendar knows it) is read from that customer's period totals; any other window, and the
customers whose period it is not, from the hourly rollups (edges from raw events, tasks at outcome
time). Both give the same rows.

Shown by taking the hourly rollups and task outcomes away after ingest: the answer of a window equal to
the UTC customer's period is unchanged, while a different window (or the same window for a customer
kept in another time zone) loses what the rollups held. For the read itself, and for shadow rating, an
arbitrary-window reader (`pricing_service.shadow`, through `pricing_service.rate_period.load_period_usages`).
The customers and events of tests/pricing_service/test_rate_from_totals.py."""

from __future__ import annotations

from datetime import UTC, datetime

from billing.periods import billing_period
from metering.period_usage import period_usages, totals_answer
from pricing.book import parse_price_book
from pricing_service.shadow import shadow_rating_on
from tests.pricing_service.test_rate_from_totals import (
    COST,
    LABELS,
    SCHEDULES,
    month,  # noqa: F401 - the customers' events
)

MARCH = (datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC))  # the UTC customer's 2026-03
FIRST_HALF = (datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 3, 15, tzinfo=UTC))
BOOK = parse_price_book("""
id: shadow-no-gpu
currency: USD
charges:
  - {meter: uncached_input_tokens, price: {type: unit, amount: "1.55", per: 1000000}}
  - {meter: cached_input_tokens, price: {type: unit, amount: "0.78", per: 1000000}}
  - {meter: output_tokens, price: {type: unit, amount: "7.00", per: 1000000}}
  - {meter: requests, price: {type: unit, amount: "0.0003", per: 1}}
  - {meter: successful_tasks, price: {type: unit, amount: "0.20", per: 1}}
  - {meter: task_attempts, price: {type: unit, amount: "0.01", per: 1}}
  - {meter: "usage:tool_calls", price: {type: unit, amount: "0.001", per: 1}}
""")


def forget_the_hours(conn) -> None:
    """Only the period totals and the raw events remain: the hourly rollups and task outcomes are gone."""
    for table in ("request_rollup_hourly", "usage_rollup_hourly", "task_outcomes", "gpu_ledger_hourly"):
        conn.execute(f"DELETE FROM {table}")


def by_customer(**kw) -> dict:
    return {u.customer_id: u for u in period_usages(**kw)}


def test_a_window_is_read_from_the_totals_of_the_customers_whose_period_it_is(month):  # noqa: F811
    conn = month
    # every customer's own period, read as a window: its totals, and the same rows as its hourly sums
    read = 0
    for label in LABELS:
        for customer, schedule in SCHEDULES.items():
            period = billing_period(label, *schedule)
            window = (period.start, period.end)
            assert totals_answer(conn, customer, *window), (label, customer)
            totals = list(period_usages(conn, label, customer_id=customer))
            assert list(period_usages(conn, window=window, customer_id=customer)) == totals, (label, customer)
            hourly = list(period_usages(conn, window=window, customer_id=customer, from_totals=False))
            assert hourly == totals, (label, customer)
            read += bool(totals)
    assert read >= 3 * len(SCHEDULES)
    assert not totals_answer(conn, "utc", *FIRST_HALF)
    assert not totals_answer(conn, "kol", *MARCH)  # the UTC month is not Kolkata's period

    # every customer at once: the UTC month is the UTC customer's period only
    march = by_customer(conn=conn, window=MARCH, chunk_rows=2, chunks_ahead=1)
    assert list(march) == sorted(march) and set(march) == set(SCHEDULES)
    assert march == by_customer(conn=conn, window=MARCH, from_totals=False)
    half = by_customer(conn=conn, window=FIRST_HALF)
    assert half["utc"].requests

    forget_the_hours(conn)
    after = by_customer(conn=conn, window=MARCH, chunk_rows=2, chunks_ahead=1)
    assert after["utc"] == march["utc"]  # from its totals
    for customer in set(SCHEDULES) - {"utc"}:  # hourly: only their raw edge hours are left
        assert after.get(customer) != march[customer], customer
    assert by_customer(conn=conn, window=FIRST_HALF).get("utc") != half["utc"]  # hourly
    kolkata = billing_period("2026-03", *SCHEDULES["kol"])
    assert by_customer(conn=conn, window=(kolkata.start, kolkata.end))["kol"] == \
        next(period_usages(conn, "2026-03", customer_id="kol"))  # Kolkata's own period: its totals


def test_shadow_rating_reads_the_utc_customers_period_from_its_totals(month):  # noqa: F811
    conn = month
    end_of_march = datetime(2026, 3, 31, 23, 30, tzinfo=UTC)  # the running period: the whole UTC month
    mid_march = datetime(2026, 3, 14, 23, 30, tzinfo=UTC)  # the running period: Mar 1 to Mar 15

    def revenue(now: datetime) -> dict:
        report = shadow_rating_on(conn, [BOOK], COST, now=now)
        return {x.customer_id: x.revenue_to_date for x in report.lines}

    whole, half = revenue(end_of_march), revenue(mid_march)
    assert whole["utc"] > 0 and half["utc"] > 0
    forget_the_hours(conn)
    after = revenue(end_of_march)
    assert after["utc"] == whole["utc"]  # the window is its billing period: its totals
    assert set(whole) == set(SCHEDULES) and set(after) == {"utc"}  # the others' windows: hourly, now empty
    assert revenue(mid_march).get("utc", 0) != half["utc"]  # not a billing period: hourly
    alone = shadow_rating_on(conn, [BOOK], COST, now=end_of_march, customer_id="utc")
    assert [x.revenue_to_date for x in alone.lines] == [whole["utc"]]
