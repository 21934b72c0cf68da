"""Rating a whole book: charge matching, lines, minimum, credits, line ids."""

from __future__ import annotations

import hashlib
from decimal import Decimal

from pricing.book import parse_price_book
from pricing.rating import line_id, rate, rate_progressive
from pricing.usage import Usage, UsageKey
from tests.pricing.helpers import T0, T2

ISSUE_BOOK = """
id: tokens-2026-11
currency: USD
charges:
  - meter: uncached_input_tokens
    price: {type: unit, amount: "0.20", per: 1000000}
  - meter: cached_input_tokens
    price: {type: unit, amount: "0.05", per: 1000000}
  - meter: output_tokens
    price: {type: unit, amount: "0.80", per: 1000000}
  - meter: output_tokens
    model: big-model            # a charge naming a model applies to that model only;
    price: {type: unit, amount: "2.40", per: 1000000}   # the unnamed charge covers every other model
  - meter: gpu_seconds
    gpu_type: H100
    price: {type: unit, amount: "3.50", per: 3600}
  - meter: successful_tasks
    price: {type: tiered_graduated, tiers: [{up_to: 1000, amount: "0.10"}, {up_to: null, amount: "0.07"}]}
minimum: "100.00"               # optional per-period commitment
"""


def usage(rows, customer="c1"):
    return Usage.build(customer, T0, T2, [(UsageKey(*k), Decimal(q)) for k, q in rows])


def test_issue_book_rates_by_hand():
    book = parse_price_book(ISSUE_BOOK, "issue.yaml")
    u = usage(
        [
            (("uncached_input_tokens", "small"), 100_000_000),  # 100M x 0.20/M = 20.00
            (("uncached_input_tokens", "big-model"), 50_000_000),  # 10.00
            (("cached_input_tokens", "small"), 200_000_000),  # 10.00
            (("output_tokens", "small"), 30_000_000),  # 30M x 0.80/M = 24.00
            (("output_tokens", "big-model", "dep-a"), 10_000_000),  # 10M x 2.40/M = 24.00
            (("output_tokens", "big-model", "dep-b"), 5_000_000),  # same line: 15M x 2.40/M = 36.00
            (("gpu_seconds", "", "dep-a", "H100"), 7200),  # 2 h x 3.50 = 7.00
            (("gpu_seconds", "", "dep-a", "A10"), 7200),  # no charge for A10: no line
            (("successful_tasks",), 1200),  # 1000 x .10 + 200 x .07 = 114.00
            (("requests", "small"), 99),  # not charged by this book
        ]
    )
    rating = rate(book, u)
    got = {(line.charge_key, line.group): line.amount for line in rating.lines}
    assert got == {
        ("uncached_input_tokens", "small"): Decimal("20.00"),
        ("uncached_input_tokens", "big-model"): Decimal("10.00"),
        ("cached_input_tokens", "small"): Decimal("10.00"),
        ("output_tokens", "small"): Decimal("24.00"),
        ("output_tokens;model=big-model", "big-model"): Decimal("36.00"),
        ("gpu_seconds;gpu_type=H100", "H100"): Decimal("7.00"),
        ("successful_tasks", ""): Decimal("114.00"),
    }
    assert rating.total == Decimal("221.00")  # above the minimum: no top-up


def test_minimum_tops_up_and_credits_come_off():
    book = parse_price_book(ISSUE_BOOK, "issue.yaml")
    rating = rate(book, usage([(("successful_tasks",), 10)]))  # 1.00
    assert [(line.kind, line.amount) for line in rating.lines] == [
        ("usage", Decimal("1.00")),
        ("minimum", Decimal("99.00")),
    ]
    assert rating.total == Decimal("100.00")
    with_credits = book.model_copy(update={"credits": Decimal("30")})
    assert rate(with_credits, usage([(("successful_tasks",), 10)])).total == Decimal("70.00")
    assert rate(with_credits, usage([])).total == Decimal("70.00")  # minimum applies to no usage too


def test_credits_never_make_total_negative():
    book = parse_price_book(ISSUE_BOOK.replace('minimum: "100.00"', 'credits: "500"'), "x.yaml")
    rating = rate(book, usage([(("successful_tasks",), 10)]))
    assert rating.total == Decimal("0.00")


def test_line_ids_are_stable_and_distinct():
    book = parse_price_book(ISSUE_BOOK, "issue.yaml")
    u = usage([(("output_tokens", "small"), 5), (("output_tokens", "other"), 5)])
    a, b = rate(book, u), rate(book, u)
    assert [x.line_id for x in a.lines] == [x.line_id for x in b.lines]
    assert len({x.line_id for x in a.lines}) == len(a.lines)
    other_customer = rate(book, usage([(("output_tokens", "small"), 5)], customer="c2"))
    assert other_customer.lines[0].line_id not in {x.line_id for x in a.lines}


def test_rate_makes_the_line_ids_line_id_makes():
    """`rate` hashes line ids inline (prefix once per customer, tail per line slot); `line_id` is
    the one definition: sha256 of "book|customer|charge key|group|start|end", 24 hex characters."""
    book = parse_price_book(ISSUE_BOOK, "issue.yaml")
    u = usage([(("output_tokens", "small"), 5), (("output_tokens", "big-model"), 7), (("successful_tasks",), 3)])
    rating = rate(book, u)
    assert len(rating.lines) == 4  # three usage lines and the minimum top-up
    for x in rating.lines:
        assert x.line_id == line_id(book, "c1", x.charge_key, x.group, T0, T2)
        text = "|".join((book.id, "c1", x.charge_key, x.group, T0.isoformat(), T2.isoformat()))
        assert x.line_id == hashlib.sha256(text.encode()).hexdigest()[:24]
    progressive = rate_progressive(book, u.empty_before(), u, final=True)
    assert [x.line_id for x in progressive.lines] == [x.line_id for x in rating.lines]


def test_deployment_specific_charge_beats_generic():
    book = parse_price_book(
        """
id: d
currency: EUR
charges:
  - meter: requests
    price: {type: unit, amount: "1", per: 1}
  - meter: requests
    deployment: dep-gold
    price: {type: unit, amount: "3", per: 1}
""",
        "d.yaml",
    )
    rating = rate(book, usage([(("requests", "m", "dep-gold"), 2), (("requests", "m", "dep-std"), 2)]))
    assert sorted(line.amount for line in rating.lines) == [Decimal("2.00"), Decimal("6.00")]


def test_usage_meter_charge():
    book = parse_price_book(
        'id: u\ncurrency: USD\ncharges:\n  - meter: "usage:tool_calls"\n    price: {type: unit, amount: "0.01", per: 1}\n',
        "u.yaml",
    )
    assert rate(book, usage([(("usage:tool_calls",), 250)])).total == Decimal("2.50")


def test_unit_price_products_wider_than_80_digits_fall_back_to_the_exact_division():
    from pricing.money import EXACT, precise

    per = 2**100  # amount / per is a finite decimal of ~70 digits: a product past 80 digits is inexact
    book = parse_price_book(f'id: w\ncurrency: USD\ncharges:\n  - meter: requests\n    price: {{type: unit, amount: "7", per: {per}}}\n', "w.yaml")
    quantity = Decimal(10**37 + 12345)
    line = rate(book, usage([(("requests", "m"), quantity)])).lines[0]
    expected = EXACT.divide(EXACT.multiply(quantity, Decimal(7)), Decimal(per))
    assert line.precise_amount == precise(expected)
    assert line.amount == book.money.round(expected)
