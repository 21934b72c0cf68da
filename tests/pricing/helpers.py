from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from pricing.book import price_book_from_data
from pricing.usage import Usage, UsageKey

T0 = datetime(2026, 11, 1, tzinfo=UTC)
T1 = datetime(2026, 11, 15, tzinfo=UTC)
T2 = datetime(2026, 12, 1, tzinfo=UTC)


def book_with(price: dict, meter: str = "successful_tasks", **extra) -> object:
    return price_book_from_data(
        {"id": "b", "currency": extra.pop("currency", "USD"), "charges": [{"meter": meter, "price": price, **extra}]}
    )


def usage_of(quantity, meter: str = "successful_tasks", model: str = "", start=T0, end=T2, customer="c1") -> Usage:
    return Usage.build(customer, start, end, [(UsageKey(meter, model=model), Decimal(quantity))])
