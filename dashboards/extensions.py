"""Extension points for billing (billing_service/ registers them; dashboards never imports it).

Until a provider is registered the customer page shows no "Invoices" and no "Current-period spend"
section, the finance page (/admin/finance) says billing is not wired yet, and spend is rated under
the baseline candidate book (the first of INFERMETER_PRICING_BOOKS; unset: pricing_books/per-token.yaml).

    from dashboards import extensions
    extensions.register_invoices(fn)              # fn(conn, customer_id) -> list[dict]: number, period, status, total, currency
    extensions.register_current_period_spend(fn)  # fn(conn, customer_id, now) -> dict: period_from, period_to, amount, currency
    extensions.register_customer_price_book(fn)   # fn(conn, customer_id, at) -> PriceBook | None (the customer's own prices)
    extensions.register_finance_page(fn)          # fn(conn, settings) -> dict: {"title", "sections": [{"title", "columns", "rows"}]}

Every provider must return customer-facing amounts only: what the customer is invoiced, never the
platform's cost or margin (the customer page renders what it gets).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Providers:
    invoices: Callable[..., list[dict]] | None = None
    current_period_spend: Callable[..., dict] | None = None
    customer_price_book: Callable[..., Any] | None = None
    finance_page: Callable[..., dict] | None = None


PROVIDERS = Providers()


def register_invoices(fn: Callable[..., list[dict]]) -> None:
    PROVIDERS.invoices = fn


def register_current_period_spend(fn: Callable[..., dict]) -> None:
    PROVIDERS.current_period_spend = fn


def register_customer_price_book(fn: Callable[..., Any]) -> None:
    PROVIDERS.customer_price_book = fn


def register_finance_page(fn: Callable[..., dict]) -> None:
    PROVIDERS.finance_page = fn


def reset() -> None:
    """Forget every provider (tests)."""
    PROVIDERS.__init__()
