"""Pricing, pure: money, price books, rating, the cost model and pricing experiments.

No I/O library is imported anywhere in this package (tests/pricing/test_purity.py checks it);
loading usage, storing books and writing reports live in `pricing_service`.

- `pricing.money`: Currency (owns its minor unit), exact decimals, the one half-up rounding.
- `pricing.meters`: the meter vocabulary (the names of the meters), defined once for every package.
- `pricing.book`: the price-book model (a discriminated union of price types) and its YAML parser.
- `pricing.usage`, `pricing.records`: the aggregates rating and costing read.
- `pricing.rating`: one function per price type; `rate` and `rate_progressive` make lines.
- `pricing.split`: a rated line's amount shared over its projects by largest remainder (books that
  split invoice lines by project).
- `pricing.task_outcomes`: which task outcome a book bills (its trusted sources, timeout and rule).
- `pricing.cost`: GPU-second attribution, cost per customer/model/request/task.
- `pricing.experiments`: the same usage under several books, beside its cost.
- `pricing.bootstrap`: billing periods made of days drawn from metered days (seeded).
- `pricing.recommend`: the smallest scale of a book's prices that meets a target margin at a given risk.
"""

from pricing.book import PriceBook, PriceBookError, parse_price_book
from pricing.money import Currency
from pricing.rating import Line, Rating, rate, rate_progressive
from pricing.usage import Usage, UsageKey

__all__ = [
    "Currency",
    "Line",
    "PriceBook",
    "PriceBookError",
    "Rating",
    "Usage",
    "UsageKey",
    "parse_price_book",
    "rate",
    "rate_progressive",
]
