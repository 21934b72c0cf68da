"""Money's refusals, word for word: each names the value (as `amount` unless the caller says what it
is) and why it was refused, so a person can fix the input; and the precise amount of the largest
whole amount the columns hold."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from pricing.money import MINOR_UNITS, Currency, UnknownCurrency, exact_decimal, plain_decimal, precise

D = Decimal


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, 'amount must be a decimal string such as "0.20", got a boolean'),
        (0.2, 'amount must be a decimal string such as "0.20" (a binary float cannot hold it exactly)'),
        ("abc", "amount 'abc' is not a decimal number"),
        ([1], "amount must be a decimal string, got list"),
        (None, "amount must be a decimal string, got NoneType"),
        ("NaN", "amount 'NaN' is not a finite number"),
        (D("-Infinity"), "amount Decimal('-Infinity') is not a finite number"),
        ("0.0000000000001", "amount '0.0000000000001' has more than 12 decimal places (the project-wide scale)"),
    ],
)
def test_exact_decimal_refusals_name_the_amount_and_the_reason(value, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        exact_decimal(value)


def test_exact_decimal_refusals_name_what_the_caller_says():
    with pytest.raises(ValueError, match=r"^quantity 'x' is not a decimal number$"):
        exact_decimal("x", what="quantity")


@pytest.mark.parametrize(("text", "value"), [("1_000", D(1000)), (" 0.000_001 ", D("0.000001")), ("2", D(2))])
def test_exact_decimal_reads_digit_separators_and_spaces(text, value):
    assert exact_decimal(text) == value


def test_plain_decimal_refusals_name_the_amount_by_default():
    with pytest.raises(ValueError, match=r"^amount '1e3' is not a decimal number such as 50\.00"):
        plain_decimal("1e3")
    with pytest.raises(ValueError, match=r"^amount 0\.0000000000001 has 13 decimal places; at most 12 fit$"):
        plain_decimal("0.0000000000001")


def test_an_unknown_currency_lists_the_known_codes():
    known = ", ".join(sorted(MINOR_UNITS))
    assert known.startswith("AED, AUD, BHD, ")
    message = f"unknown currency 'XYZ' (known: {known})"
    with pytest.raises(UnknownCurrency, match=f"^{re.escape(message)}$"):
        Currency.of("XYZ")


def test_the_precise_amount_of_the_largest_whole_amount_the_columns_hold():
    # 26 digits before the point and 12 after: 38, more than the default context's 28 digits.
    whole = D("9" * 26)
    assert precise(whole) == whole
    assert str(precise(D("9" * 26 + "." + "9" * 12 + "5"))) == "1" + "0" * 26 + "." + "0" * 12  # half-up
