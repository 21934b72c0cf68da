"""Budgets' prices: `list_price` of one request (INFERMETER_LIST_PRICE_* or the list price book) and
`metered_cost` of a customer's metered tokens over its billing period (the book's rating when
INFERMETER_LIST_PRICE_BOOK is set). serving/budgets.py reserves and settles with them; the rules
are in its docstring ("How spend is priced")."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache

from infermeter.settings import Settings, get_settings
from infermeter.times import Window
from pricing.meters import CACHED_INPUT_TOKENS, OUTPUT_TOKENS, TOKEN_METERS, UNCACHED_INPUT_TOKENS

_MTOK = Decimal(1_000_000)
_ZERO = Decimal(0)


@dataclass(frozen=True)
class ListPrice:
    """Per-token list prices (currency units per token)."""

    uncached_input: Decimal
    cached_input: Decimal
    output: Decimal

    def cost(self, *, uncached_input_tokens: int, cached_input_tokens: int, output_tokens: int) -> Decimal:
        return (
            self.uncached_input * uncached_input_tokens
            + self.cached_input * cached_input_tokens
            + self.output * output_tokens
        )


def _setting_prices(settings: Settings) -> dict[str, Decimal]:
    """INFERMETER_LIST_PRICE_*_PER_MTOK per token (decimal strings per 1M tokens, every model)."""
    return {
        UNCACHED_INPUT_TOKENS: Decimal(settings.list_price_input_per_mtok) / _MTOK,
        CACHED_INPUT_TOKENS: Decimal(settings.list_price_cached_input_per_mtok) / _MTOK,
        OUTPUT_TOKENS: Decimal(settings.list_price_output_per_mtok) / _MTOK,
    }


def list_price(model: str, settings: Settings | None = None) -> ListPrice:
    """The per-token price of one request of `model`: its reservation (worst case) and its settled
    cost until metering has it.

    From the price book INFERMETER_LIST_PRICE_BOOK when set: its `unit` price on
    uncached_input_tokens / cached_input_tokens / output_tokens that best matches the model
    (pricing.rating.match_charge), per token (pricing.rating.rate_unit), with no free allowance
    left: the allowance is the period's, and `metered_cost` applies it. Any meter the book does not
    price per unit falls back to INFERMETER_LIST_PRICE_*_PER_MTOK."""
    settings = settings or get_settings()
    fallback = _setting_prices(settings)
    if settings.list_price_book:
        fallback.update(_book_unit_prices(str(settings.list_price_book), model))
    return ListPrice(
        uncached_input=fallback[UNCACHED_INPUT_TOKENS],
        cached_input=fallback[CACHED_INPUT_TOKENS],
        output=fallback[OUTPUT_TOKENS],
    )


@lru_cache(maxsize=64)
def _price_book(path: str):
    from pricing.book import parse_price_book

    with open(path, encoding="utf-8") as handle:
        return parse_price_book(handle.read(), source=path)


@lru_cache(maxsize=1024)
def _book_unit_prices(path: str, model: str) -> dict[str, Decimal]:
    from pricing.book import UnitPrice
    from pricing.rating import match_charge, rate_unit
    from pricing.usage import UsageKey

    book = _price_book(path)
    prices = {}
    for meter in TOKEN_METERS:
        matched = match_charge(book, UsageKey(meter=meter, model=model))
        if matched is not None and isinstance(matched[1].price, UnitPrice):
            prices[meter] = rate_unit(matched[1].price, Decimal(1))  # amount / per, exact
    return prices


def metered_cost(
    customer_id: str,
    window: Window,
    sums: dict[tuple[str, str], tuple[int, int, int]],
    settings: Settings | None = None,
) -> Decimal:
    """The cost of a customer's metered tokens over `window`, priced as the invoice prices them.

    `sums`: {(model, deployment): (uncached input, cached input, output)} (metering.budget_reads.
    period_tokens: the customer's billing period's). With INFERMETER_LIST_PRICE_BOOK set, the tokens the book has a charge for
    make one Usage of the window, rated by pricing.rating.rate (free allowances, tiers, one rounding
    per line: the invoice's usage total to the cent); tokens of a meter the book does not charge
    for, and all tokens when no book is set, cost INFERMETER_LIST_PRICE_*_PER_MTOK, exactly."""
    from pricing.rating import match_charge, rate
    from pricing.usage import Usage, UsageKey

    settings = settings or get_settings()
    per_token = _setting_prices(settings)
    book = _price_book(str(settings.list_price_book)) if settings.list_price_book else None
    priced: list[tuple[UsageKey, int]] = []
    unpriced = _ZERO
    for (model, deployment), quantities in sums.items():
        for meter, quantity in zip(TOKEN_METERS, quantities, strict=True):
            key = UsageKey(meter, model, deployment)
            if book is not None and match_charge(book, key) is not None:
                priced.append((key, quantity))
            else:
                unpriced += per_token[meter] * quantity
    if book is None or not priced:
        return unpriced
    return rate(book, Usage.build(customer_id, window.start, window.end, priced)).usage_total + unpriced
