"""What the dashboards need of billing: `BillingViews`, which the app factory puts on
`app.state.billing` (app.api.create_app wires billing_service.dashboard_views.DashboardViews), or
None when billing is not wired. dashboards never imports billing_service (an import contract): an
implementation has this shape without naming it.

Without billing (None) the customer page shows no "Invoices" and no "Current-period spend" section
and their endpoints answer 404, the finance page (/admin/finance) says billing is not wired yet, and
spend is rated under the baseline candidate book (the first of INFERMETER_PRICING_BOOKS; unset:
pricing_books/per-token.yaml).

Every customer view returns customer-facing amounts only: what the customer is invoiced, never the
platform's cost or margin (the customer page renders what it gets). Amounts are decimal strings.
"""

from datetime import datetime
from typing import Any, NamedTuple, Protocol, Required, TypedDict

import psycopg

from pricing.book import PriceBook


class InvoiceLine(TypedDict):
    id: str
    meter: str
    model: str  # the model of a request meter, else ""
    group: str  # the model, the GPU type, or ""
    kind: str
    quantity: str
    unit_price: str | None  # None for tiered, package, flat, minimum and credit lines
    amount: str
    period: str
    adjustment: bool
    project: str | None  # the project of a line split by project (the book's invoice.group_by), else None


class CreditNote(TypedDict):
    number: str | None
    total: str
    reason: str
    issued_at: str


class Invoice(TypedDict):
    """One of the customer's invoices (a document: final, paid, failed or void; never a draft)."""

    id: str
    number: str | None
    customer_id: str
    period: str
    period_start: str
    period_end: str
    sequence: int
    status: str  # open, paid, payment_failed, void
    status_label: str  # as finance names it: final, paid, failed, void
    currency: str
    subtotal: str
    credits_applied: str
    total: str
    issued_at: str | None
    finalized_at: str | None
    reissue_of: str | None
    price_book_version: str
    lines: list[InvoiceLine]
    credit_notes: list[CreditNote]


class Budget(TypedDict):
    monthly_cap: str
    mode: str
    used: float | None  # the share of the cap the subtotal is


class CurrentPeriodSpend(TypedDict, total=False):
    """The billing preview of a period with the prepaid credit balance; `available` False (with
    `message`, `customer_id` and `period` only) for a customer without a billing account or plan."""

    available: Required[bool]
    message: str
    customer_id: str
    period: str | None
    period_start: str
    period_end: str
    status: str
    price_book_version: str
    note: str
    lines: list[InvoiceLine]
    subtotal: str
    credits_applied: str
    total: str
    currency: str
    credit_balance: str
    budget: Budget  # when the customer has a monthly budget


class FinanceChart(TypedDict, total=False):
    kind: Required[str]  # bar | stacked | line
    x: Required[str]  # the column on the x axis
    series: Required[list[tuple[str, str]]]  # (label, column)
    y_title: str
    x_type: str  # "category" for labels such as a period


class FinanceTable(TypedDict):
    id: str
    title: str
    columns: list[str]
    rows: list[dict[str, Any]]
    note: str
    chart: FinanceChart | None


class FinanceExportLink(TypedDict):
    kind: str
    format: str
    api: str  # the admin API's URL of the same export


class FinancePage(TypedDict):
    period: str
    periods: list[str]  # every invoiced period
    currencies: list[str]
    tables: list[FinanceTable]
    exports: list[FinanceExportLink]
    invoices: int  # how many invoices the period has


class FinanceExport(NamedTuple):
    data: bytes
    file_name: str
    media_type: str


class BillingViews(Protocol):
    """Billing's parts of the pages. Each reads on `conn` (the pages' pooled connection) and writes
    nothing."""

    def invoices(self, conn: psycopg.Connection, customer_id: str) -> list[Invoice]:
        """The customer's invoices, newest period first, with their lines."""
        ...

    def invoice(self, conn: psycopg.Connection, customer_id: str, invoice_id: str) -> Invoice | None:
        """One of the customer's invoices; None for anything else (another customer's: the page answers 404)."""
        ...

    def current_period_spend(self, conn: psycopg.Connection, customer_id: str, now: datetime,
                             period: str | None = None) -> CurrentPeriodSpend:
        """The billing preview of the customer's period containing `now` (or of `period`, YYYY-MM; a
        bad label raises TimeInputError), with its credit balance and budget."""
        ...

    def customer_name(self, conn: psycopg.Connection, customer_id: str) -> str | None:
        """The customer's display name (its billing account's); None without one or without a name."""
        ...

    def customer_price_book(self, conn: psycopg.Connection, customer_id: str, at: datetime) -> PriceBook | None:
        """The book of the customer's plan for the period containing `at` (its spend per successful
        task is rated under it); None without one."""
        ...

    def finance_page(self, conn: psycopg.Connection, period: str | None, now: datetime) -> FinancePage:
        """The finance page's tables of `period` (YYYY-MM; None: the latest invoiced one)."""
        ...

    def finance_export(self, conn: psycopg.Connection, kind: str, period: str, fmt: str) -> FinanceExport:
        """A finance export's bytes, file name and media type (ValueError: an unknown kind, format or period)."""
        ...
