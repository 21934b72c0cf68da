"""Billing errors. Every one is a `ValueError` (via `BillingError`) whose message says what was wrong
and what to do instead, so an API adapter can answer 4xx with it as it is."""

from __future__ import annotations

from infermeter.times import TimeInputError


class BillingError(ValueError):
    """Base of every billing domain error."""


class PeriodError(BillingError, TimeInputError):
    """A billing period or window that cannot be built: bad label, unknown time zone, anchor day out of
    range, an edge without a time zone or an end not after its start (infermeter.times.Window)."""


class InvoiceError(BillingError):
    """An invoice, invoice line or adjustment that is inconsistent with its inputs."""


class InvoiceStateError(InvoiceError):
    """A status change the invoice state machine does not allow."""


class InvoiceImmutable(InvoiceStateError):
    """An attempt to change the lines or amounts of a finalized (open, paid, payment_failed, void) invoice."""


class CreditNoteError(InvoiceError):
    """A credit note that cannot be issued (unknown line, more than is left to credit, ...)."""


class CreditError(BillingError):
    """A prepaid credit grant or credit application that is not valid."""


class NumberingError(BillingError):
    """An invoice number that cannot be formatted or parsed."""


class MinorUnitError(BillingError):
    """An amount with more decimals than its currency's minor unit."""
