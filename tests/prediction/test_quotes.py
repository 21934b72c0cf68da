"""Quotes: list-price rating, the request's interval, the successful task's simulation."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from prediction.quotes import (
    QuoteError,
    cost_per_successful_task,
    draw_output,
    list_price_book,
    not_quoted,
    request_cost,
)
from prediction.request import RequestPrediction
from prediction.tasks import EMPTY, TaskCell, TaskSample
from pricing.book import parse_price_book

PERIOD = (datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC))
BOOK = parse_price_book("""
id: q
currency: USD
minimum: "100.00"
charges:
  - meter: uncached_input_tokens
    free: "1000000"
    price: {type: unit, amount: "2.00", per: 1000000}
  - meter: cached_input_tokens
    price: {type: unit, amount: "1.00", per: 1000000}
  - meter: output_tokens
    price: {type: unit, amount: "10.00", per: 1000000}
  - meter: successful_tasks
    price: {type: unit, amount: "0.05", per: 1}
  - meter: gpu_seconds
    price: {type: unit, amount: "1", per: 3600}
""")
PREDICTION = RequestPrediction(100, 200, 400, 800, 250.0, 0.25, 0.01, "global", 1000)


def test_list_price_drops_free_allowance_minimum_and_credits():
    book = list_price_book(BOOK)
    assert book.minimum is None and book.credits is None and all(c.free == 0 for c in book.charges)
    assert not_quoted(BOOK) == ["gpu_seconds"]


def test_request_cost_is_exact_at_the_mean_and_the_interval_quantiles():
    cost = request_cost(list_price_book(BOOK), "c", "m", 1000, PREDICTION, PERIOD)
    per_in, per_cached, per_out = Decimal("0.000002"), Decimal("0.000001"), Decimal("0.00001")
    base = 750 * per_in + 250 * per_cached
    assert cost.mean == base + 250 * per_out
    assert (cost.p10, cost.p50, cost.p90) == (base + 100 * per_out, base + 200 * per_out, base + 400 * per_out)


def test_draw_output_follows_the_quantiles():
    assert [draw_output(PREDICTION, u) for u in (0.0, 0.1, 0.5, 0.9, 0.99, 1.0)] == [0, 100, 200, 400, 800, 1200]
    assert draw_output(PREDICTION, 0.7) == pytest.approx(300)


def test_a_task_without_history_succeeds_at_once_and_costs_its_steps():
    book = list_price_book(BOOK)
    one = request_cost(book, "c", "m", 1000, PREDICTION, PERIOD)
    task = cost_per_successful_task(book, "c", "m", 1000, 3, PREDICTION, EMPTY, PERIOD)
    assert task.mean == pytest.approx(3 * one.mean + Decimal("0.05"), rel=Decimal("0.05"))
    assert task.p10 < task.p50 < task.p90
    again = cost_per_successful_task(book, "c", "m", 1000, 3, PREDICTION, EMPTY, PERIOD)
    assert again == task  # seeded


def test_failures_and_retries_make_a_successful_task_dearer():
    book = list_price_book(BOOK)
    clean = TaskCell(10, {"succeeded": 10}, {1: 10}, {3: 10}, (TaskSample("succeeded", 1, 3, 3, 0, 0, 0),))
    rough = TaskCell(10, {"succeeded": 5, "failed": 5}, {2: 5}, {3: 10},
                     (TaskSample("succeeded", 2, 6, 3, 0, 0, 0), TaskSample("failed", 2, 6, 3, 0, 0, 0)))
    a = cost_per_successful_task(book, "c", "m", 1000, 3, PREDICTION, clean, PERIOD)
    b = cost_per_successful_task(book, "c", "m", 1000, 3, PREDICTION, rough, PERIOD)
    fee = Decimal("0.05")  # one successful task, whatever it took
    # twice the requests per task, two tasks per success: four times the tokens
    assert b.mean - fee == pytest.approx(4 * (a.mean - fee), rel=Decimal("0.15"))


def test_bad_task_quotes_are_refused():
    book = list_price_book(BOOK)
    with pytest.raises(QuoteError, match="at least 1"):
        cost_per_successful_task(book, "c", "m", 1000, 0, PREDICTION, EMPTY, PERIOD)
    hopeless = TaskCell(5, {"failed": 5}, {}, {1: 5}, (TaskSample("failed", 1, 1, 1, 0, 0, 0),))
    with pytest.raises(QuoteError, match="succeeded"):
        cost_per_successful_task(book, "c", "m", 1000, 1, PREDICTION, hopeless, PERIOD)
