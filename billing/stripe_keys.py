"""Stripe, pure: integer minor units and idempotency keys derived from billing ids.

A key names the operation and everything that makes it the same operation, so a retried or rerun
push sends the same key and Stripe does it once; a changed amount gives a new key (the adapter must
then treat the old invoice item as stale, never push both). Keys are at most 255 characters (Stripe's limit).
"""

from __future__ import annotations

from decimal import Decimal

from billing._common import check_minor_units, currency_of
from billing.errors import BillingError, MinorUnitError
from pricing.money import Currency

NAMESPACE = "infermeter"
MAX_KEY_LENGTH = 255


def to_minor_units(amount: Decimal, currency: str | Currency) -> int:
    """Integer minor units of an amount already rounded to its currency (USD 12.34 -> 1234, JPY 1234 -> 1234,
    BHD 1.234 -> 1234). An amount with more decimals than the currency allows is refused, not rounded:
    rounding happens once, in rating."""
    money = currency if isinstance(currency, Currency) else currency_of(currency, MinorUnitError)
    if not isinstance(amount, Decimal | int) or isinstance(amount, bool):
        raise MinorUnitError(f"amount must be a Decimal, got {type(amount).__name__}")
    amount = Decimal(amount)
    if not amount.is_finite():
        raise MinorUnitError(f"amount {amount} is not a finite number")
    check_minor_units(amount, money, "amount")
    return int(amount.scaleb(money.minor_units))


def from_minor_units(minor: int, currency: str | Currency) -> Decimal:
    money = currency if isinstance(currency, Currency) else currency_of(currency, MinorUnitError)
    if not isinstance(minor, int) or isinstance(minor, bool):
        raise MinorUnitError(f"minor units must be an int, got {type(minor).__name__}")
    return Decimal(minor).scaleb(-money.minor_units)


def idempotency_key(kind: str, *parts: str | int) -> str:
    """"infermeter:<kind>:<part>:..."; parts may not contain ':' (the key must split back unambiguously)."""
    texts = [kind, *(str(p) for p in parts)]
    for text in texts:
        if not text or ":" in text or any(c.isspace() for c in text):
            raise BillingError(f"idempotency key part {text!r} must be non-empty, without ':' or spaces")
    key = ":".join((NAMESPACE, *texts))
    if len(key) > MAX_KEY_LENGTH:
        raise BillingError(f"idempotency key is {len(key)} characters; Stripe allows {MAX_KEY_LENGTH}")
    return key


def customer_update_key(customer_id: str, push: int, version: str) -> str:
    """infermeter:customerupdate:<customer_id>:<push>:<version>: the customer's `push`-th update of its name
    and e-mail in Stripe (0: they were created with them), `version` naming those values."""
    return idempotency_key("customerupdate", customer_id, push, version)


def invoice_item_key(invoice_id: str, line_id: str, amount: Decimal, currency: str | Currency) -> str:
    """infermeter:invoiceitem:<invoice_id>:<line_id>:<amount_minor>"""
    return idempotency_key("invoiceitem", invoice_id, line_id, to_minor_units(amount, currency))


def invoice_key(invoice_id: str) -> str:
    """infermeter:invoice:<invoice_id> (creating the Stripe invoice)."""
    return idempotency_key("invoice", invoice_id)


def finalize_key(invoice_id: str, number: str) -> str:
    """infermeter:finalize:<invoice_id>:<number>"""
    return idempotency_key("finalize", invoice_id, number)


def void_key(invoice_id: str) -> str:
    return idempotency_key("void", invoice_id)


def credit_note_key(credit_note_id: str, amount: Decimal, currency: str | Currency) -> str:
    """infermeter:creditnote:<credit_note_id>:<amount_minor>: the Stripe credit note of a credit note, for
    `amount` (what it gives back of what the invoice charged in Stripe, `CreditNote.refund_amount`)."""
    return idempotency_key("creditnote", credit_note_id, to_minor_units(amount, currency))
