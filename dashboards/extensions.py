"""Extension points for billing (the roof, app/api.py, registers billing_service's functions; dashboards
never imports billing_service).

Until a provider is registered the customer page shows no "Invoices" and no "Current-period spend"
section, the finance page (/admin/finance) says billing is not wired yet, and spend is rated under
the baseline candidate book (the first of INFERMETER_PRICING_BOOKS; unset: pricing_books/per-token.yaml).

    from dashboards import extensions
    extensions.register_invoices(fn)              # fn(conn, customer_id) -> list[dict]: the customer's invoices with lines
    extensions.register_invoice(fn)               # fn(conn, customer_id, invoice_id) -> dict | None (None: not its own)
    extensions.register_current_period_spend(fn)  # fn(conn, customer_id, now, period=None) -> dict: the billing preview
    extensions.register_customer_price_book(fn)   # fn(conn, customer_id, at) -> PriceBook | None (the customer's own prices)
    extensions.register_finance_page(fn)          # fn(conn, period, now) -> dict: {"period", "periods", "tables", "exports"}
    extensions.register_finance_export(fn)        # fn(conn, kind, period, fmt) -> (bytes, file name, media type)

An invoice is a dict with id, number, period, period_start, period_end, status, status_label, currency,
subtotal, credits_applied, total, issued_at and lines (meter, model, group, kind, quantity, unit_price,
amount, period, adjustment). Current-period spend has `available` (False: `message` says why) and the
preview's fields (period, period_start, period_end, note, lines, subtotal, credits_applied, total,
currency), `credit_balance` and optionally `budget` ({monthly_cap, mode}). A finance table is
{"id", "title", "columns", "rows" (dicts), "note", "chart" (None or {"kind", "x", "series", "y_title"})}.

Every customer provider must return customer-facing amounts only: what the customer is invoiced, never
the platform's cost or margin (the customer page renders what it gets).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Providers:
    invoices: Callable[..., list[dict]] | None = None
    invoice: Callable[..., dict | None] | None = None
    current_period_spend: Callable[..., dict] | None = None
    customer_price_book: Callable[..., Any] | None = None
    finance_page: Callable[..., dict] | None = None
    finance_export: Callable[..., tuple[bytes, str, str]] | None = None


PROVIDERS = Providers()


def register_invoices(fn: Callable[..., list[dict]]) -> None:
    PROVIDERS.invoices = fn


def register_invoice(fn: Callable[..., dict | None]) -> None:
    PROVIDERS.invoice = fn


def register_current_period_spend(fn: Callable[..., dict]) -> None:
    PROVIDERS.current_period_spend = fn


def register_customer_price_book(fn: Callable[..., Any]) -> None:
    PROVIDERS.customer_price_book = fn


def register_finance_page(fn: Callable[..., dict]) -> None:
    PROVIDERS.finance_page = fn


def register_finance_export(fn: Callable[..., tuple[bytes, str, str]]) -> None:
    PROVIDERS.finance_export = fn


def reset() -> None:
    """Forget every provider (tests)."""
    PROVIDERS.__init__()
