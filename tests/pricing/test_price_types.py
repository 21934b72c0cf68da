"""Table-driven: each price type, expected amounts worked out by hand in the comments."""

from __future__ import annotations

from decimal import Decimal

import pytest

from pricing.rating import rate
from tests.pricing.helpers import book_with, usage_of

GRAD = {"type": "tiered_graduated", "tiers": [{"up_to": 1000, "amount": "0.10"}, {"up_to": None, "amount": "0.07"}]}
GRAD3 = {
    "type": "tiered_graduated",
    "per": 1000,
    "tiers": [
        {"up_to": 10000, "amount": "0"},
        {"up_to": 50000, "amount": "1.00", "flat_amount": "5"},
        {"up_to": None, "amount": "0.50"},
    ],
}
VOL = {"type": "tiered_volume", "tiers": [{"up_to": 1000, "amount": "0.10"}, {"up_to": None, "amount": "0.07"}]}

CASES = [
    # unit: amount per `per` units, in proportion
    ("unit 1M tokens at 0.20/M", {"type": "unit", "amount": "0.20", "per": 1000000}, 1_000_000, "0.20", "0.20"),
    # 1234567 x 0.20 / 1e6 = 0.2469134
    ("unit partial", {"type": "unit", "amount": "0.20", "per": 1000000}, 1_234_567, "0.246913400000", "0.25"),
    # 1 token at 0.20/M = 0.0000002 -> rounds to 0.00
    ("unit one token", {"type": "unit", "amount": "0.20", "per": 1000000}, 1, "0.000000200000", "0.00"),
    # 5400 GPU-s at 3.50 / 3600 s = 1.5 h x 3.50 = 5.25
    ("unit gpu hour", {"type": "unit", "amount": "3.50", "per": 3600}, 5400, "5.250000000000", "5.25"),
    # 1 GPU-s at 3.50/3600 = 0.000972222222222... -> precise 0.000972222222, rounded 0.00
    ("unit gpu second", {"type": "unit", "amount": "3.50", "per": 3600}, 1, "0.000972222222", "0.00"),
    # 0.005 exactly -> half-up -> 0.01
    ("unit half up", {"type": "unit", "amount": "0.005", "per": 1}, 1, "0.005000000000", "0.01"),
    # graduated: 1000 x 0.10 = 100
    ("graduated first tier full", GRAD, 1000, "100.000000000000", "100.00"),
    # 1000 x 0.10 + 500 x 0.07 = 100 + 35 = 135
    ("graduated second tier", GRAD, 1500, "135.000000000000", "135.00"),
    # 999 x 0.10 = 99.9
    ("graduated below boundary", GRAD, 999, "99.900000000000", "99.90"),
    # free 10k, then 40k/1000 x 1.00 + flat 5 = 45, then 20k/1000 x 0.50 = 10 -> 55
    ("graduated per 1000 with flat", GRAD3, 70000, "55.000000000000", "55.00"),
    # 10000 units: only the free tier -> 0
    ("graduated free tier", GRAD3, 10000, "0.000000000000", "0.00"),
    # 10001: 1/1000 x 1.00 + 5 = 5.001 -> 5.00
    ("graduated enters flat tier", GRAD3, 10001, "5.001000000000", "5.00"),
    # volume: all 1000 at 0.10 = 100
    ("volume at boundary", VOL, 1000, "100.000000000000", "100.00"),
    # volume: all 1500 at 0.07 = 105
    ("volume above boundary", VOL, 1500, "105.000000000000", "105.00"),
    # package: 2.50 per started 1000: 2001 -> 3 packages = 7.50
    ("package partial", {"type": "package", "amount": "2.50", "per": 1000}, 2001, "7.500000000000", "7.50"),
    ("package exact", {"type": "package", "amount": "2.50", "per": 1000}, 2000, "5.000000000000", "5.00"),
    # flat: once per period with usage
    ("flat", {"type": "flat", "amount": "49.99"}, 7, "49.990000000000", "49.99"),
]


@pytest.mark.parametrize(("name", "price", "quantity", "precise", "rounded"), CASES, ids=[c[0] for c in CASES])
def test_price_type(name, price, quantity, precise, rounded):
    rating = rate(book_with(price), usage_of(quantity))
    (line,) = rating.lines
    assert line.quantity == Decimal(quantity)
    assert line.precise_amount == Decimal(precise)
    assert line.amount == Decimal(rounded)
    assert rating.total == Decimal(rounded)


def test_zero_quantity_gives_no_line():
    assert rate(book_with({"type": "flat", "amount": "10"}), usage_of(0)).lines == ()


def test_jpy_rounds_to_whole_yen_and_bhd_to_fils():
    price = {"type": "unit", "amount": "1.5", "per": 1}
    assert rate(book_with(price, currency="JPY"), usage_of(3)).total == Decimal("5")  # 4.5 -> 5
    price = {"type": "unit", "amount": "0.0005", "per": 1}
    assert rate(book_with(price, currency="BHD"), usage_of(3)).total == Decimal("0.002")  # 0.0015 -> 0.002


def test_free_allowance_comes_off_first():
    # 1500 tasks, 1000 free, 500 x 0.10 = 50
    book = book_with({"type": "unit", "amount": "0.10", "per": 1}, free="1000")
    (line,) = rate(book, usage_of(1500)).lines
    assert (line.quantity, line.amount) == (Decimal(1500), Decimal("50.00"))


def test_volume_pricing_is_not_monotone():
    # The one price type that may fall as usage grows: crossing a tier re-prices every unit.
    assert rate(book_with(VOL), usage_of(1001)).total < rate(book_with(VOL), usage_of(1000)).total
