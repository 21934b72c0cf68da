from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from billing.periods import billing_period
from pricing.book import price_book_from_data
from pricing.rating import rate
from pricing.usage import Usage, UsageKey

PERIOD = billing_period("2026-02", "Europe/Berlin", 7)
NEXT = billing_period("2026-03", "Europe/Berlin", 7)
BOOK = price_book_from_data(
    {
        "id": "tokens-2026-02",
        "currency": "USD",
        "charges": [
            {"meter": "uncached_input_tokens", "price": {"type": "unit", "amount": "0.20", "per": 1000000}},
            {"meter": "output_tokens", "price": {"type": "unit", "amount": "0.80", "per": 1000000}},
            {"meter": "output_tokens", "model": "big", "price": {"type": "unit", "amount": "2.40", "per": 1000000}},
            {"meter": "successful_tasks", "price": {"type": "tiered_graduated",
                                                    "tiers": [{"up_to": 1000, "amount": "0.10"},
                                                              {"up_to": None, "amount": "0.07"}]}},
        ],
    }
)
T_FINAL = datetime(2026, 3, 8, 9, tzinfo=UTC)


def usage(rows, period=PERIOD, customer="c1") -> Usage:
    return Usage.build(customer, period.start, period.end, [(UsageKey(*k), Decimal(q)) for k, q in rows])


def rating(rows, period=PERIOD, book=BOOK, customer="c1"):
    return rate(book, usage(rows, period, customer))


ROWS = [
    (("uncached_input_tokens", "small"), 12_345_678),
    (("output_tokens", "small"), 3_000_001),
    (("output_tokens", "big"), 1_234_567),
    (("successful_tasks",), 1500),
]
