"""Minor units and idempotency keys for the Stripe adapter."""

from __future__ import annotations

from decimal import Decimal

import pytest

from billing.errors import BillingError, MinorUnitError
from billing.stripe_keys import (
    credit_note_key,
    finalize_key,
    from_minor_units,
    idempotency_key,
    invoice_item_key,
    invoice_key,
    to_minor_units,
)
from pricing.money import Currency

D = Decimal


@pytest.mark.parametrize(
    ("amount", "currency", "minor"),
    [
        ("12.34", "USD", 1234), ("0.01", "USD", 1), ("12", "USD", 1200), ("-5.00", "USD", -500),
        ("1234", "JPY", 1234), ("0", "JPY", 0),
        ("1.234", "BHD", 1234), ("0.001", "BHD", 1), ("10.5", "BHD", 10500),
        ("99999999999.99", "EUR", 9999999999999),
    ],
)
def test_to_minor_units(amount, currency, minor):
    assert to_minor_units(D(amount), currency) == minor
    assert to_minor_units(D(amount), Currency.of(currency)) == minor
    assert from_minor_units(minor, currency) == D(amount)


@pytest.mark.parametrize(
    ("amount", "currency", "message"),
    [
        (D("12.345"), "USD", "more decimals than USD allows"),
        (D("5.5"), "JPY", "JPY allows \\(no decimals\\)"),
        (D("1.2345"), "BHD", "at most 3 decimal places"),
        (D("1"), "XYZ", "unknown currency"),
        (1.5, "USD", "must be a Decimal"),
        (D("NaN"), "USD", "not a finite number"),
    ],
)
def test_unrounded_or_unknown_is_refused_not_rounded(amount, currency, message):
    with pytest.raises(MinorUnitError, match=message):
        to_minor_units(amount, currency)


def test_keys():
    assert invoice_item_key("inv_abc", "0f1daefb8a9482372e390b72", D("2.47"), "USD") == (
        "infermeter:invoiceitem:inv_abc:0f1daefb8a9482372e390b72:247"
    )
    assert invoice_item_key("inv_abc", "l1", D("2.48"), "USD") != invoice_item_key("inv_abc", "l1", D("2.47"), "USD")
    assert invoice_item_key("inv_abc", "l1", D("250"), "JPY").endswith(":250")
    assert invoice_key("inv_abc") == "infermeter:invoice:inv_abc"
    assert finalize_key("inv_abc", "INV-2026-000123") == "infermeter:finalize:inv_abc:INV-2026-000123"
    assert credit_note_key("cn_1", D("1.234"), "BHD") == "infermeter:creditnote:cn_1:1234"
    with pytest.raises(BillingError, match="without ':'"):
        idempotency_key("x", "a:b")
    with pytest.raises(BillingError, match="Stripe allows 255"):
        idempotency_key("x", "a" * 300)
