"""Rating every customer's billing period from the period totals kept at ingest
(`pricing_service.rate_period.rate_billing_period`) equals rating each customer's period the hourly way
(`billing_service.usage.period_usage`: whole hours from the rollups, the edges from raw events; and
`rate_period(from_totals=False)` for the periods on whole UTC hours), line by line, to the cent.

A real PostgreSQL and metering's own writer. Customers at UTC (no calendar), Asia/Kolkata (+05:30),
Asia/Kathmandu (+05:45), America/New_York across the change to daylight time, and anchor day 31; the
events of `tests.metering.test_period_totals.scenario` around each customer's 2026-03 period start
(late events, retries, cached tokens, failed, abandoned and replaced task outcomes, usage events,
projects, dedicated and shared-pool GPU time), plus requests on the shared pool that several customers
share in one deployment-hour. Books: per token with lines by project, tasks, usage meters and GPU;
prices by deployment; trusted task outcomes (those two rest on the hourly path for GPU time and tasks).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from billing.periods import billing_period
from billing_service.usage import by_project_of, meters_of, period_usage
from infermeter.stack.postgres import to_libpq_url
from pricing.book import parse_price_book
from pricing.rating import rate
from pricing.usage import Usage
from pricing_service.books import read_cost_model
from pricing_service.rate_period import rate_billing_period, rate_period
from tests.metering.period_checks import Events, give_calendar
from tests.metering.test_period_totals import scenario, writer_for

COST = read_cost_model(None)
MIN = timedelta(minutes=1)
SCHEDULES = {
    "utc": ("UTC", 1),  # no calendar: UTC calendar months
    "kol": ("Asia/Kolkata", 1),  # +05:30: periods start at 18:30 UTC
    "ktm": ("Asia/Kathmandu", 15),  # +05:45: at 18:15 UTC
    "nyc": ("America/New_York", 1),  # the 2026-03 period holds the change to daylight time (743 h)
    "a31": ("America/New_York", 31),  # anchor 31: 2026-02 starts on Feb 28 local, 2026-03 on Mar 31
}
LABELS = ("2026-01", "2026-02", "2026-03", "2026-04")
SHARED_HOUR = datetime(2026, 3, 1, 0, 10, tzinfo=UTC)  # every customer's requests on the shared pool

BOOKS = {
    "projects": """
id: totals-projects
currency: USD
invoice: {group_by: project}
minimum: "0.50"
charges:
  - {meter: uncached_input_tokens, price: {type: unit, amount: "1.55", per: 1000000}}
  - {meter: cached_input_tokens, price: {type: unit, amount: "0.78", per: 1000000}}
  - {meter: output_tokens, price: {type: unit, amount: "7.00", per: 1000000}}
  - {meter: output_tokens, model: m2, price: {type: unit, amount: "9.10", per: 1000000}}
  - {meter: requests, price: {type: unit, amount: "0.0003", per: 1}}
  - meter: successful_tasks
    price: {type: tiered_graduated, tiers: [{up_to: 1, amount: "0.20"}, {up_to: null, amount: "0.16"}]}
  - {meter: failed_tasks, price: {type: unit, amount: "0.05", per: 1}}
  - {meter: task_attempts, price: {type: unit, amount: "0.01", per: 1}}
  - {meter: "usage:tool_calls", price: {type: unit, amount: "0.001", per: 1}}
  - {meter: "usage:verifier_s", free: "5", price: {type: unit, amount: "0.0002", per: 1}}
  - {meter: gpu_seconds, gpu_type: H100, price: {type: unit, amount: "4.00", per: 3600}}
""",
    "deployments": """
id: totals-deployments
currency: USD
charges:
  - {meter: uncached_input_tokens, price: {type: unit, amount: "2.00", per: 1000000}}
  - {meter: uncached_input_tokens, deployment: d2, price: {type: unit, amount: "3.10", per: 1000000}}
  - {meter: output_tokens, deployment: pool-1, price: {type: unit, amount: "8.00", per: 1000000}}
  - {meter: requests, price: {type: unit, amount: "0.001", per: 1}}
  - {meter: gpu_seconds, price: {type: unit, amount: "3.00", per: 3600}}
""",
    "trusted": """
id: totals-trusted
currency: USD
charges:
  - {meter: successful_tasks, price: {type: unit, amount: "0.50", per: 1}}
  - {meter: failed_tasks, price: {type: unit, amount: "0.10", per: 1}}
  - {meter: task_attempts, price: {type: unit, amount: "0.02", per: 1}}
  - {meter: output_tokens, price: {type: unit, amount: "7.00", per: 1000000}}
  - {meter: "usage:tool_calls", price: {type: unit, amount: "0.001", per: 1}}
task_outcomes:
  trusted_sources: ["//test/verifier"]
  task_timeout: 24h
  untrusted_outcome: bill_as_success
""",
}


@pytest.fixture
def month(db_url):
    """The customers' calendars and events, written by metering's writer (first batch, then the late one)."""
    with psycopg.connect(to_libpq_url(db_url)) as conn:
        for customer, schedule in SCHEDULES.items():
            if customer != "utc":
                give_calendar(conn, customer, *schedule)
        ev = Events("r")
        first, late = [], []
        for customer, schedule in SCHEDULES.items():
            f, lt = scenario(ev, customer, billing_period("2026-03", *schedule).start)
            first += f
            late += lt
            first.append(ev.request(customer, SHARED_HOUR, deployment="pool-1", input_tokens=2000 + len(customer),
                                    cached=100, output=300, project="web"))
        first.append(ev.replica(None, SHARED_HOUR - 10 * MIN, SHARED_HOUR + 20 * MIN, deployment="pool-1", gpus=4))
        writer = writer_for(db_url, "totals")
        assert writer.write(ev.messages(first)).accepted == len(first)
        assert writer.write(ev.messages(late)).accepted == len(late)
        writer.close()
        yield conn


def _lines(rating) -> list[tuple]:
    return [(x.line_id, x.kind, x.charge_key, x.meter, x.group, x.project, x.quantity, x.unit_price,
             x.precise_amount, x.amount) for x in rating.lines]


def _same(got, expected, where) -> None:
    assert (got.period_start, got.period_end) == (expected.period_start, expected.period_end), where
    assert _lines(got) == _lines(expected), where
    assert got.total == expected.total, where


@pytest.mark.parametrize("name", BOOKS)
def test_rating_from_the_totals_equals_the_hourly_path_line_by_line(month, name):
    conn, book = month, parse_price_book(BOOKS[name])
    billed = 0
    for label in LABELS:
        from_totals = rate_billing_period(conn, book, label, COST)
        assert set(from_totals) <= set(SCHEDULES), label
        for customer, schedule in SCHEDULES.items():
            period = billing_period(label, *schedule)
            usage = period_usage(conn, customer, period, meters=meters_of(book), cost_model=COST,
                                 task_outcomes=book.task_outcomes, **by_project_of(book))
            expected = rate(book, usage)
            got = from_totals.get(customer) or rate(book, Usage.build(customer, period.start, period.end, []))
            _same(got, expected, (name, label, customer))
            alone = rate_billing_period(conn, book, label, COST, customer_id=customer)
            assert list(alone) in ([customer], []), (name, label, customer)
            _same(alone.get(customer, got), expected, (name, label, customer, "alone"))
            if period.start.minute == 0 and period.end.minute == 0:  # whole UTC hours: rate_period, hourly, too
                hourly = rate_period(conn, book, period.start, period.end, COST, from_totals=False).get(customer)
                empty = rate(book, Usage.build(customer, period.start, period.end, []))
                _same(got, hourly or empty, (name, label, customer, "rate_period"))
            billed += bool(usage.quantities)
    assert billed >= 3 * len(SCHEDULES)  # the periods compared carry usage


def test_the_shared_pool_and_trusted_tasks_are_read_the_hourly_way_and_counted(month):
    """The figures the totals cannot give are there: each customer's share of the shared pool's hour
    and the tasks the book's trusted source reported."""
    book = parse_price_book(BOOKS["deployments"])
    utc = rate_billing_period(month, book, "2026-03", COST)["utc"]
    assert any(x.meter == "gpu_seconds" for x in utc.lines)
    trusted = parse_price_book(BOOKS["trusted"])
    march = rate_billing_period(month, trusted, "2026-03", COST)
    # no outcome from the trusted source before its deadline: each customer's t1 is billed as a success
    # at its deadline (first request + 24 h), in its 2026-03 period
    assert set(march) == set(SCHEDULES)
    assert all(any(x.meter == "successful_tasks" and x.quantity >= 1 for x in r.lines) for r in march.values())
