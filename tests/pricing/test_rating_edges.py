"""Rating's edges worked by hand: which charge prices a usage key, the fields of the minimum and
credit lines, zero quantities of flat and volume prices, amounts wider than 28 digits (the default
decimal context would round them), line ids of periods that share one edge, and the rating's own
fields when lines are split by project."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from pricing.book import price_book_from_data
from pricing.money import EXACT, Currency, precise
from pricing.rating import (
    Line,
    line_id,
    line_quantities,
    match_charge,
    price_quantity,
    rate,
    rate_package,
    rate_progressive,
    rate_tiered_graduated,
    rate_tiered_volume,
)
from pricing.usage import Usage, UsageKey
from tests.pricing.helpers import T0, T1, T2, book_with, usage_of

D = Decimal
FLAT = {"type": "flat", "amount": "5"}


def book(*charges: dict, **extra) -> object:
    return price_book_from_data({"id": "b", "currency": extra.pop("currency", "USD"), "charges": list(charges), **extra})


# ---------------------------------------------------------------- which charge prices a key


def test_a_charge_of_another_meter_before_the_match_is_passed_over():
    b = book({"meter": "requests", "price": FLAT}, {"meter": "output_tokens", "price": FLAT})
    assert match_charge(b, UsageKey("output_tokens", model="m"))[0] == 1


def test_charges_of_other_models_deployments_and_gpu_types_before_the_match_are_passed_over():
    m = book({"meter": "output_tokens", "model": "a", "price": FLAT},
             {"meter": "output_tokens", "model": "b", "price": FLAT})
    assert match_charge(m, UsageKey("output_tokens", model="b"))[0] == 1
    b = book({"meter": "output_tokens", "deployment": "d1", "price": FLAT},
             {"meter": "output_tokens", "deployment": "d2", "price": FLAT})
    assert match_charge(b, UsageKey("output_tokens", model="m", deployment="d2"))[0] == 1
    assert match_charge(b, UsageKey("output_tokens", model="m", deployment="d1"))[0] == 0
    assert match_charge(b, UsageKey("output_tokens", model="m", deployment="d3")) is None
    g = book({"meter": "gpu_seconds", "gpu_type": "a100", "price": FLAT},
             {"meter": "gpu_seconds", "gpu_type": "h100", "price": FLAT})
    assert match_charge(g, UsageKey("gpu_seconds", gpu_type="h100"))[0] == 1


def test_of_two_equally_specific_charges_the_earlier_one_prices_the_key():
    b = book({"meter": "output_tokens", "model": "m", "price": FLAT},
             {"meter": "output_tokens", "deployment": "d", "price": FLAT})
    assert match_charge(b, UsageKey("output_tokens", model="m", deployment="d"))[0] == 0


def test_keys_of_one_line_add_up():
    # by model: two deployments of one model are one line
    b = book({"meter": "output_tokens", "price": {"type": "unit", "amount": "1", "per": 1}})
    u = Usage.build("c1", T0, T2, [(UsageKey("output_tokens", model="m", deployment="d1"), D(2)),
                                   (UsageKey("output_tokens", model="m", deployment="d2"), D(3))])
    assert line_quantities(b, u) == {(0, "m"): D(5)}
    assert rate(b, u).total == D("5.00")


# ---------------------------------------------------------------- minimum and credit lines


def test_the_minimum_and_credit_lines_field_by_field():
    b = book({"meter": "successful_tasks", "price": {"type": "unit", "amount": "1", "per": 1}},
             minimum="10.00", credits="4.00")
    rating = rate(b, usage_of(3))
    assert rating.lines[1:] == (
        Line(line_id(b, "c1", "minimum", "", T0, T2), "minimum", "c1", "minimum", "minimum", "", D(1), None,
             D("7.000000000000"), D("7.00")),
        Line(line_id(b, "c1", "credits", "", T0, T2), "credit", "c1", "credits", "credits", "", D(1), None,
             D("-4.000000000000"), D("-4.00")),
    )
    assert str(rating.lines[2].quantity) == "1"
    assert rating.total == D("6.00")


# ---------------------------------------------------------------- zero quantities


def test_a_flat_or_volume_price_of_no_usage_is_nothing():
    assert rate_tiered_volume(book_with({"type": "tiered_volume", "tiers": [
        {"up_to": None, "amount": "1", "flat_amount": "2"}]}).charges[0].price, D(0)) == 0
    flat = book_with(FLAT).charges[0]
    assert price_quantity(flat, D(0)) == 0


def test_the_first_window_of_a_flat_or_volume_price_bills_the_whole_fee():
    for price, fee in [(FLAT, D("5.00")),
                       ({"type": "tiered_volume", "tiers": [{"up_to": None, "amount": "1", "flat_amount": "2"}]},
                        D("3.00"))]:
        b = book_with(price)
        window = usage_of(1, start=T0, end=T1)
        rating = rate_progressive(b, window.empty_before(), window, final=True)
        assert [line.amount for line in rating.lines] == [fee]


def test_a_window_that_moves_one_line_of_several_keeps_the_later_lines():
    b = book({"meter": "output_tokens", "price": {"type": "unit", "amount": "1", "per": 1}})
    prior = Usage.build("c1", T0, T1, [(UsageKey("output_tokens", model="a"), D(1)),
                                       (UsageKey("output_tokens", model="b"), D(1))])
    window = Usage.build("c1", T1, T2, [(UsageKey("output_tokens", model="b"), D(2))])
    rating = rate_progressive(b, prior, window, final=False)
    assert [(line.group, line.quantity, line.amount) for line in rating.lines] == [("b", D(2), D("2.00"))]


# ---------------------------------------------------------------- more digits than the default context's 28

BIG = D("12345678901234567890123456")  # 26 digits
PRICE = D("0.123456789012")  # 12 significant digits: products of 37 digits


def test_tier_and_package_amounts_wider_than_28_digits_are_exact():
    graduated = book_with({"type": "tiered_graduated", "tiers": [{"up_to": None, "amount": str(PRICE)}]})
    volume = book_with({"type": "tiered_volume", "tiers": [{"up_to": None, "amount": str(PRICE)}]})
    package = book_with({"type": "package", "amount": str(PRICE), "per": 1})
    exact = EXACT.multiply(BIG, PRICE)
    assert len(exact.as_tuple().digits) == 37
    assert rate_tiered_graduated(graduated.charges[0].price, BIG) == exact
    assert rate_tiered_volume(volume.charges[0].price, BIG) == exact
    assert rate_package(package.charges[0].price, BIG) == exact


def test_a_line_of_26_whole_digits_keeps_its_twelve_places_and_three_minor_places():
    # 26 digits before the point: 38 at the project scale, 29 in Bahraini fils
    b = book({"meter": "successful_tasks", "price": {"type": "unit", "amount": "1", "per": 1}}, currency="BHD")
    q = D("99999999999999999999999999.123456789012")
    line = rate(b, usage_of(q)).lines[0]
    assert (line.precise_amount, line.amount) == (q, D("99999999999999999999999999.123"))
    assert precise(q) == q and Currency.of("BHD").round(q) == line.amount


# ---------------------------------------------------------------- line ids and the rating's fields


def test_periods_that_share_one_edge_have_their_own_line_ids():
    b = book({"meter": "successful_tasks", "price": {"type": "unit", "amount": "1", "per": 1}})
    key = b.charges[0].stable_key
    first_half = datetime(2026, 11, 16, tzinfo=UTC)
    for start, end in [(T0, T2), (T1, T2), (T0, T1), (T0, first_half)]:
        rating = rate(b, usage_of(1, start=start, end=end))
        assert rating.lines[0].line_id == line_id(b, "c1", key, "", start, end)
        assert rating.book_id == "b"


def test_a_rating_split_by_project_keeps_the_ratings_fields():
    b = book({"meter": "output_tokens", "price": {"type": "unit", "amount": "1", "per": 1}},
             invoice={"group_by": "project"})
    u = Usage.build("c1", T0, T2, [
        (UsageKey("output_tokens", model="m", deployment="d1", project="p"), D(2)),
        (UsageKey("output_tokens", model="m", deployment="d2", project="p"), D(3)),
        (UsageKey("output_tokens", model="m", project="q"), D(1)),
    ])
    rating = rate(b, u)
    assert (rating.book_id, rating.currency, rating.customer_id, rating.period_start, rating.period_end) == (
        "b", "USD", "c1", T0, T2)
    assert [(line.project, line.quantity, line.amount) for line in rating.lines] == [
        ("p", D(5), D("5.00")), ("q", D(1), D("1.00"))]
