"""Rating at its exact money boundaries: a tier's last unit and the next tier's first (`up_to` exactly,
and one smallest step either side), a package's last unit, a free allowance used up exactly, rounding
ties at exactly half a minor unit, and usage exactly at a book's minimum or at its credits.

Amounts in the comments are worked out by hand."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from pricing.book import PackagePrice, TieredGraduatedPrice, TieredVolumePrice, price_book_from_data
from pricing.money import Currency, exact_decimal, plain_decimal, precise
from pricing.rating import (
    rate,
    rate_package,
    rate_progressive,
    rate_tiered_graduated,
    rate_tiered_volume,
    rounded_total,
)
from pricing.usage import Usage, UsageKey
from tests.pricing.helpers import T0, T1, T2, book_with, usage_of
from tests.pricing.test_price_types import GRAD, GRAD3

D = Decimal
STEP = D("0.000000000001")  # the smallest quantity step (12 places, the project scale)
# GRAD: 0.10 up to 1000, then 0.07. GRAD3, per 1000 units: the first 10k free, then 1.00 per 1000 plus
# 5 once the tier is reached, then 0.50.
VOL = {
    "type": "tiered_volume",
    "tiers": [
        {"up_to": 1000, "amount": "0.10"},
        {"up_to": 5000, "amount": "0.07", "flat_amount": "2"},
        {"up_to": None, "amount": "0.05"},
    ],
}


def line_of(price: dict, quantity, **extra):
    (line,) = rate(book_with(price, **extra), usage_of(quantity)).lines
    return line


# ---------------------------------------------------------------- graduated tiers


@pytest.mark.parametrize(
    ("quantity", "precise_amount", "amount"),
    [
        ("999", "99.9", "99.90"),  # 999 x 0.10
        ("1000", "100", "100.00"),  # the first tier's last unit: still 0.10
        ("1001", "100.07", "100.07"),  # the second tier's first unit: 0.07
        ("1000.000000000001", "100.00000000000007", "100.00"),  # one step past up_to: priced by tier 2
        ("999.999999999999", "99.9999999999999", "100.00"),
        ("1000.5", "100.035", "100.04"),  # 100 + 0.5 x 0.07: a tie at half a cent, rounded up
    ],
)
def test_graduated_tier_edges(quantity, precise_amount, amount):
    price = TieredGraduatedPrice.model_validate(GRAD)
    assert rate_tiered_graduated(price, D(quantity)) == D(precise_amount)
    line = line_of(GRAD, quantity)
    assert line.precise_amount == precise(D(precise_amount)) and line.amount == D(amount)


@pytest.mark.parametrize(
    ("quantity", "amount"),
    [
        ("10000", "0"),  # the free tier's last unit: the flat amount of the next tier is not due yet
        ("10000.000000000001", "5.000000000000001"),  # the next tier's first step: its flat amount is due
        ("50000", "45"),  # 40 x 1.00 + 5
        ("51000", "45.5"),  # + 1 x 0.50 (the open tier has no flat amount)
    ],
)
def test_a_tiers_flat_amount_is_due_from_its_first_unit(quantity, amount):
    assert rate_tiered_graduated(TieredGraduatedPrice.model_validate(GRAD3), D(quantity)) == D(amount)


def test_graduated_of_nothing_is_nothing():
    price = TieredGraduatedPrice.model_validate(GRAD3 | {"tiers": [{"up_to": None, "amount": "1", "flat_amount": "5"}]})
    assert rate_tiered_graduated(price, D(0)) == 0
    assert rate_tiered_graduated(price, STEP) == D("5.000000000000001")


# ---------------------------------------------------------------- volume tiers


@pytest.mark.parametrize(
    ("quantity", "amount"),
    [
        ("1000", "100"),  # 1000 x 0.10: up_to is inclusive
        ("1000.000000000001", "72.00000000000007"),  # every unit at tier 2: 1000.000000000001 x 0.07 + 2
        ("5000", "352"),  # 5000 x 0.07 + 2
        ("5001", "250.05"),  # every unit at the open tier
        ("0", "0"),
        (STEP, "0.0000000000001"),
    ],
)
def test_volume_tier_edges(quantity, amount):
    assert rate_tiered_volume(TieredVolumePrice.model_validate(VOL), D(quantity)) == D(amount)


# ---------------------------------------------------------------- packages, flat and free allowances


@pytest.mark.parametrize(
    ("quantity", "packages"),
    [("0", 0), (STEP, 1), ("1", 1), ("1000", 1), ("1000.000000000001", 2), ("1999", 2), ("2000", 2), ("2001", 3)],
)
def test_a_started_package_costs_a_whole_one(quantity, packages):
    price = PackagePrice.model_validate({"type": "package", "amount": "2.50", "per": 1000})
    assert rate_package(price, D(quantity)) == packages * D("2.50")


def test_a_flat_price_is_due_for_the_smallest_usage():
    assert line_of({"type": "flat", "amount": "49.99"}, STEP).amount == D("49.99")


@pytest.mark.parametrize(
    ("quantity", "amount"),
    [("999", "0.00"), ("1000", "0.00"), ("1001", "0.10"), ("1000.05", "0.01"), ("1000.049", "0.00")],
)
def test_a_free_allowance_used_up_exactly_costs_nothing(quantity, amount):
    line = line_of({"type": "unit", "amount": "0.10", "per": 1}, quantity, free="1000")
    assert (line.quantity, line.amount) == (D(quantity), D(amount))


# ---------------------------------------------------------------- rounding ties: half-up, away from zero


@pytest.mark.parametrize(
    ("currency", "amount", "rounded"),
    [
        ("USD", "0.005", "0.01"),
        ("USD", "0.004999999999", "0.00"),
        ("USD", "0.015", "0.02"),
        ("USD", "0.025", "0.03"),  # banker's rounding would give 0.02
        ("USD", "2.675", "2.68"),
        ("USD", "-0.005", "-0.01"),  # a credit line: away from zero too
        ("USD", "-0.004999999999", "0.00"),
        ("JPY", "0.5", "1"),
        ("JPY", "2.5", "3"),  # banker's: 2
        ("JPY", "0.499999999999", "0"),
        ("BHD", "0.0005", "0.001"),
        ("BHD", "0.0025", "0.003"),
        ("BHD", "0.000499999999", "0.000"),
    ],
)
def test_the_one_rounding_is_half_up_at_exactly_half_a_minor_unit(currency, amount, rounded):
    money = Currency.of(currency)
    assert money.round(D(amount)) == D(rounded)
    assert money.round(D(amount)).as_tuple().exponent == -money.minor_units  # kept at the minor unit's places


@pytest.mark.parametrize(
    ("currency", "unit_amount", "quantity", "rounded"),
    [
        ("USD", "0.005", 1, "0.01"),
        ("USD", "0.005", 5, "0.03"),  # 0.025
        ("USD", "0.001", 5, "0.01"),  # 0.005
        ("USD", "0.001", 4, "0.00"),  # 0.004
        ("JPY", "0.5", 5, "3"),  # 2.5
        ("BHD", "0.0005", 5, "0.003"),  # 0.0025
    ],
)
def test_rating_rounds_each_line_half_up(currency, unit_amount, quantity, rounded):
    line = line_of({"type": "unit", "amount": unit_amount, "per": 1}, quantity, currency=currency)
    assert line.amount == D(rounded)


@pytest.mark.parametrize(
    ("amount", "kept"),
    [
        ("0.0000000000005", "0.000000000001"),  # half of the 12th place: up
        ("0.0000000000004999", "0.000000000000"),
        ("-0.0000000000005", "-0.000000000001"),
        ("1.000000000000", "1.000000000000"),
    ],
)
def test_precise_amounts_keep_twelve_places_half_up(amount, kept):
    assert precise(D(amount)) == D(kept)
    assert precise(D(amount)).as_tuple().exponent == -12


def test_exact_decimals_have_at_most_twelve_places():
    assert exact_decimal("0.000000000001") == STEP
    with pytest.raises(ValueError, match="more than 12 decimal places"):
        exact_decimal("0.0000000000001")
    assert exact_decimal("1E+3") == 1000  # a positive exponent is no decimal place


# ---------------------------------------------------------------- a book's minimum


def minimum_book(minimum: str, credits: str | None = None):
    data = {"id": "m", "currency": "USD", "minimum": minimum,
            "charges": [{"meter": "successful_tasks", "price": {"type": "unit", "amount": "0.01", "per": 1}}]}
    if credits is not None:
        data["credits"] = credits
    return price_book_from_data(data)


@pytest.mark.parametrize(
    ("tasks", "lines"),
    [
        (9999, [("usage", "99.99"), ("minimum", "0.01")]),  # one cent short: a one-cent top-up
        (10000, [("usage", "100.00")]),  # exactly at the minimum: no top-up line, not even of 0.00
        (10001, [("usage", "100.01")]),
        (0, [("minimum", "100.00")]),
    ],
)
def test_usage_exactly_at_the_minimum_makes_no_top_up_line(tasks, lines):
    rating = rate(minimum_book("100.00"), usage_of(tasks))
    assert [(line.kind, str(line.amount)) for line in rating.lines] == lines
    assert rating.total == max(D("100.00"), D(tasks) / 100)


def test_the_minimum_is_rounded_to_the_currency_before_it_is_compared():
    # a minimum of 100.005 is 100.01 (half-up): usage of exactly 100.01 needs no top-up
    assert [line.kind for line in rate(minimum_book("100.005"), usage_of(10001)).lines] == ["usage"]
    assert rate(minimum_book("100.005"), usage_of(10000)).lines[-1].amount == D("0.01")


def test_usage_exactly_at_the_minimum_in_the_last_progressive_part():
    book = minimum_book("100.00")
    prior = Usage.build("c1", T0, T1, [(UsageKey("successful_tasks"), D(6000))])
    window = Usage.build("c1", T1, T2, [(UsageKey("successful_tasks"), D(4000))])
    final = rate_progressive(book, prior, window, final=True)
    assert [line.kind for line in final.lines] == ["usage"]
    short = Usage.build("c1", T1, T2, [(UsageKey("successful_tasks"), D(3999))])
    assert [(line.kind, line.amount) for line in rate_progressive(book, prior, short, final=True).lines] == [
        ("usage", D("39.99")), ("minimum", D("0.01")),
    ]


@pytest.mark.parametrize(("tasks", "total"), [(9999, "100.00"), (10000, "100.00"), (10001, "100.01")])
def test_rounded_total_at_the_minimum(tasks, total):
    book = minimum_book("100.00")
    (slot,) = {(0, "")}
    assert rounded_total(book, {slot: D(tasks)}, commitments=True) == D(total)
    assert rounded_total(book, {slot: D(tasks)}, commitments=False) == D(tasks) / 100


# ---------------------------------------------------------------- a book's credits


@pytest.mark.parametrize(
    ("credits", "tasks", "credit_line"),
    [
        ("100.00", 10000, "-100.00"),  # credits exactly the running total: it goes to zero
        ("100.00", 9999, "-99.99"),  # never below zero
        ("100.00", 10001, "-100.00"),
        ("0", 10000, None),  # no credit line of 0.00
        ("0.004", 10000, None),  # rounds to 0.00: no line
        ("0.005", 10000, "-0.01"),  # rounds half-up to a cent
    ],
)
def test_credits_at_their_edges(credits, tasks, credit_line):
    data = {"id": "c", "currency": "USD", "credits": credits,
            "charges": [{"meter": "successful_tasks", "price": {"type": "unit", "amount": "0.01", "per": 1}}]}
    rating = rate(price_book_from_data(data), usage_of(tasks))
    credit = [line.amount for line in rating.lines if line.kind == "credit"]
    assert credit == ([] if credit_line is None else [D(credit_line)])
    assert rating.total >= 0


def test_credits_apply_after_the_minimum_top_up():
    rating = rate(minimum_book("100.00", credits="100.00"), usage_of(9999))
    assert [(line.kind, line.amount) for line in rating.lines] == [
        ("usage", D("99.99")), ("minimum", D("0.01")), ("credit", D("-100.00")),
    ]
    assert rating.total == 0


@pytest.mark.parametrize(
    ("text", "value"),
    [("50", Decimal("50")), (" 50.00 ", Decimal("50.00")), ("-0.5", Decimal("-0.5")), ("0", Decimal(0)),
     ("9" * 26 + "." + "9" * 12, Decimal("9" * 26 + "." + "9" * 12)),  # the largest NUMERIC(38, 12)
     ("000" + "9" * 26, Decimal("9" * 26))],  # leading zeros are no digits
)
def test_plain_decimals_that_fit_the_columns(text, value):
    assert plain_decimal(text) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [("1e3", "is not a decimal number"), ("1E+3", "is not a decimal number"), ("NaN", "is not a decimal number"),
     ("Infinity", "is not a decimal number"), ("-inf", "is not a decimal number"), ("", "is not a decimal number"),
     ("1_000", "is not a decimal number"), ("1,000.00", "is not a decimal number"), (".5", "is not a decimal number"),
     ("5.", "is not a decimal number"), ("+5", "is not a decimal number"), ("٥", "is not a decimal number"),
     ("1" + "0" * 26, "has 27 digits before the decimal point; at most 26 fit"),
     ("0." + "0" * 12 + "1", "has 13 decimal places; at most 12 fit")],
)
def test_plain_decimals_refuse_exponents_non_numbers_and_what_does_not_fit(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        plain_decimal(text, what="--amount")
