"""Continuous shadow rating: each customer's running revenue in the current period under every
candidate price book.

It is live: it is computed when asked, through metering's period-usage read
(`pricing_service.rate_period.load_period_usages`): the running window [month start, end of now's
hour) is read from the period totals of the customers whose billing period it is (those kept by UTC
month, in the month's last hour) and summed from the hourly rollups for every other customer; metering
updates both in the same Postgres transaction that ingests each event batch. GPU time is attributed
per deployment-hour in SQL, so Python rates one small aggregate per customer. So the figures include
every event ingested up to the moment of the query (the current hour included), with no batch job in
between.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

import psycopg

from infermeter.times import utc_now, utc_text
from pricing.book import PriceBook
from pricing.cost import CostModel
from pricing.rating import rate
from pricing.usage import Usage
from pricing_service.rate_period import load_period_usages, needs_deployment, priced_meters, usages_for_book
from pricing_service.source import connect, current_period


@dataclass(frozen=True)
class ShadowLine:
    customer_id: str
    book_id: str
    currency: str
    revenue_to_date: Decimal  # sum of the usage lines so far
    total_with_commitments: Decimal  # with the minimum top-up and credits, as if the period ended now


@dataclass(frozen=True)
class ShadowReport:
    period_start: datetime
    period_end: datetime
    as_of: datetime
    lines: tuple[ShadowLine, ...]

    def to_json(self) -> dict:
        by_customer: dict[str, list[dict]] = {}
        for line in self.lines:
            by_customer.setdefault(line.customer_id, []).append(
                {
                    "id": line.book_id,
                    "currency": line.currency,
                    "revenue_to_date": str(line.revenue_to_date),
                    "total_with_commitments": str(line.total_with_commitments),
                }
            )
        return {
            "period": {"from": utc_text(self.period_start), "to": utc_text(self.period_end)},
            "as_of": utc_text(self.as_of),
            "live": True,
            "customers": [{"customer_id": c, "books": books} for c, books in sorted(by_customer.items())],
        }


def shadow_rating(
    database_url: str,
    books: list[PriceBook],
    cost_model: CostModel,
    *,
    now: datetime | None = None,
    customer_id: str | None = None,
    clock: Callable[[], datetime] = utc_now,
) -> ShadowReport:
    with connect(database_url) as conn:
        return shadow_rating_on(conn, books, cost_model, now=now, customer_id=customer_id, clock=clock)


def shadow_rating_on(
    conn: psycopg.Connection,
    books: list[PriceBook],
    cost_model: CostModel,
    *,
    now: datetime | None = None,
    customer_id: str | None = None,
    clock: Callable[[], datetime] = utc_now,
) -> ShadowReport:
    """The running period is the month of `now` (default: `clock()`), up to the end of now's hour."""
    now = now or clock()
    start, end = current_period(now)
    usages = load_period_usages(
        conn, start, end, cost_model, by_deployment=needs_deployment(*books), meters=priced_meters(*books),
        customer_id=customer_id,
    )
    # a book that trusts only some task outcome sources counts the task meters its own way
    per_book = [usages_for_book(conn, usages, book, start, end, customer_id) for book in books]
    customers = [customer_id] if customer_id is not None else sorted(set().union(*per_book))
    lines = []
    for c in customers:
        for book, book_usages in zip(books, per_book, strict=True):
            rating = rate(book, book_usages.get(c) or Usage(c, start, end, {}))
            lines.append(ShadowLine(c, book.id, book.currency, rating.usage_total, rating.total))
    return ShadowReport(start, end, now, tuple(lines))
