"""The per-customer path reads a billing period from the period totals and any other window from the
hourly rollups (`billing_service.usage.period_usage`): for every customer's own period, the usage of
the `Period` (the totals, with GPU time and trusted-source tasks from the hourly reads) equals the usage
of the same `Window` (the hourly rollups with the edges from raw events), key by key, and rates the
same, line by line, to the cent. The customers, events and books of
tests/pricing_service/test_rate_from_totals.py (UTC, +05:30, +05:45, New York across the change to
daylight time, anchor day 31; late events, retries, projects, tasks, usage meters, GPU time)."""

from __future__ import annotations

import pytest

from billing.periods import billing_period
from billing_service.usage import by_project_of, kept_in_totals, meters_of, period_usage
from pricing.book import parse_price_book
from pricing.rating import rate
from tests.pricing_service.test_rate_from_totals import (
    BOOKS,
    COST,
    LABELS,
    SCHEDULES,
    _lines,
    month,  # noqa: F401 - the customers' events
)


@pytest.mark.parametrize("name", BOOKS)
def test_a_billing_period_from_the_totals_equals_its_window_from_the_rollups(month, name):  # noqa: F811
    conn, book = month, parse_price_book(BOOKS[name])
    read = 0
    for label in LABELS:
        for customer, schedule in SCHEDULES.items():
            period = billing_period(label, *schedule)
            assert kept_in_totals(conn, customer, period) == period, (label, customer)
            assert kept_in_totals(conn, customer, period.window) is None
            kw = {"meters": meters_of(book), "cost_model": COST, "task_outcomes": book.task_outcomes,
                  **by_project_of(book)}
            totals = period_usage(conn, customer, period, **kw)
            hourly = period_usage(conn, customer, period.window, **kw)
            where = (name, label, customer)
            assert totals == hourly, where
            assert _lines(rate(book, totals)) == _lines(rate(book, hourly)), where
            everything = period_usage(conn, customer, period, cost_model=COST)  # every meter, every project
            assert everything == period_usage(conn, customer, period.window, cost_model=COST), where
            read += bool(totals.quantities)
    assert read >= 3 * len(SCHEDULES)  # the periods compared carry usage
