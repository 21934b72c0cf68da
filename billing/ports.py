"""What the billing service needs from its adapters, as typing Protocols only (no implementation here).

The domain modules take plain values (a Rating, a Period, grants, ledger entries, `now`); these
protocols name where those values come from, so the service can be tested with fakes.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from billing.credits import CreditGrant, LedgerEntry
from billing.invoice import CreditNote, Invoice
from billing.periods import Period
from pricing.rating import Rating


class Clock(Protocol):
    """The injected clock: returns an aware UTC datetime."""

    def __call__(self) -> datetime: ...


class PeriodRater(Protocol):
    """Rates one customer's billing period with the book version in force at its start (pricing_service)."""

    def rate(self, customer_id: str, period: Period) -> tuple[Rating, str]:
        """(the rating, the price book version it used)."""
        ...


class InvoiceNumbers(Protocol):
    """Hands out invoice numbers without gaps (a counter row per prefix and year, in the finalizing transaction)."""

    def next_number(self, issuer_prefix: str, year: int) -> str: ...


class InvoiceStore(Protocol):
    def invoices(self, customer_id: str) -> Sequence[Invoice]: ...

    def save(self, invoice: Invoice) -> None:
        """Insert or replace a draft; insert a status change of a finalized invoice (never its lines)."""
        ...

    def credit_notes(self, invoice_id: str) -> Sequence[CreditNote]: ...

    def save_credit_note(self, note: CreditNote) -> None: ...


class CreditLedger(Protocol):
    def grants(self, customer_id: str) -> Sequence[CreditGrant]: ...

    def entries(self, customer_id: str) -> Sequence[LedgerEntry]: ...

    def append(self, entries: Sequence[LedgerEntry]) -> None:
        """Append entries; an id already present is skipped (entry ids are deterministic)."""
        ...
