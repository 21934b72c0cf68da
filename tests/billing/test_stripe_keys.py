"""Minor units and idempotency keys for the Stripe adapter."""

from __future__ import annotations

from decimal import Decimal

import pytest

from billing.errors import BillingError, MinorUnitError
from billing.stripe_keys import (
    credit_note_key,
    customer_update_key,
    finalize_key,
    from_minor_units,
    idempotency_key,
    invoice_item_key,
    invoice_key,
    to_minor_units,
    void_key,
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
        (D("12.345"), "USD", "^amount 12.345 USD has more decimals than USD allows"),
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


def test_a_key_of_exactly_255_characters_is_stripes_limit():
    head = "infermeter:x:"
    assert len(idempotency_key("x", "a" * (255 - len(head)))) == 255
    with pytest.raises(BillingError, match="idempotency key is 256 characters; Stripe allows 255"):
        idempotency_key("x", "a" * (256 - len(head)))


@pytest.mark.parametrize("part", ["", "a b", "a\tb", "a:b"])
def test_key_parts_are_non_empty_without_colons_or_spaces(part):
    with pytest.raises(BillingError, match="must be non-empty, without ':' or spaces"):
        idempotency_key("x", part)
    with pytest.raises(BillingError, match="must be non-empty"):
        idempotency_key(part or " ", "ok")


def test_customer_update_and_void_keys():
    assert customer_update_key("acme", 0, "v1") == "infermeter:customerupdate:acme:0:v1"
    assert customer_update_key("acme", 3, "9f2c") == "infermeter:customerupdate:acme:3:9f2c"
    assert void_key("inv_abc") == "infermeter:void:inv_abc"


def test_minor_units_refuse_what_is_not_an_amount():
    with pytest.raises(MinorUnitError, match="must be a Decimal, got bool"):
        to_minor_units(True, "USD")
    assert to_minor_units(7, "USD") == 700  # an int is a whole amount
    with pytest.raises(MinorUnitError, match="minor units must be an int, got Decimal"):
        from_minor_units(D("1"), "USD")
    with pytest.raises(MinorUnitError, match="minor units must be an int, got bool"):
        from_minor_units(True, "USD")
    with pytest.raises(MinorUnitError, match="unknown currency 'XYZ'"):
        from_minor_units(1, "XYZ")
    assert from_minor_units(1234, Currency.of("BHD")) == D("1.234")
