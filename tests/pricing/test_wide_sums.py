"""Sums of money wider than Python's default decimal context (28 digits).

A NUMERIC(38, 12) amount has up to 26 digits before the point: rounded to Bahraini fils (3 places) that
is 29 significant digits, so `sum()` or `+` in the default context rounds it. Every total in pricing/
adds in the 80-digit context (`pricing.money.exact_sum`). Pure: no database."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Context, Decimal, localcontext

from pricing.book import price_book_from_data
from pricing.cost import Attribution, CostKey
from pricing.money import exact_sum
from pricing.rating import line_quantities, rate, rate_progressive, rounded_total
from pricing.usage import Usage, UsageKey
from tests.pricing.helpers import T0, T1, T2

D = Decimal
FILS = D("0.001")
WIDEST = D("99999999999999999999999999.123456789012")  # 38 digits: the widest precise amount stored
WIDEST_FILS = D("99999999999999999999999999.123")  # WIDEST rounded to fils: 29 significant digits
TOP = D("99999999999999999999999999.999")  # the largest fils amount with 26 whole digits


def book(**extra):
    return price_book_from_data({
        "id": "wide", "currency": "BHD",
        "charges": [{"meter": "successful_tasks", "price": {"type": "unit", "amount": "1", "per": 1}},
                    {"meter": "requests", "price": {"type": "unit", "amount": "1", "per": 1}}],
        **extra,
    })


def usage(tasks, requests="0", start=T0, end=T2) -> Usage:
    return Usage.build("c1", start, end, [(UsageKey("successful_tasks"), D(tasks)),
                                          (UsageKey("requests", model="m"), D(requests))])


def test_the_default_context_rounds_29_digits_and_exact_sum_does_not():
    with localcontext(Context(prec=28)):
        assert sum((WIDEST_FILS,), D(0)) == D("99999999999999999999999999.12")  # the defect: a fils lost
        assert exact_sum([WIDEST_FILS]) == WIDEST_FILS
        assert exact_sum([WIDEST_FILS, FILS]) == D("99999999999999999999999999.124")
        assert exact_sum([TOP, TOP]) == D("199999999999999999999999999.998")
        minus_widest = D("-99999999999999999999999999.123456789012")
        assert exact_sum([WIDEST, minus_widest, D("0.000000000001")]) == D("0.000000000001")
        assert exact_sum([], TOP) == TOP and exact_sum([]) == 0


def test_a_rating_of_29_digit_lines_totals_exactly():
    rating = rate(book(), usage(WIDEST, "0.001"))
    assert [line.amount for line in rating.lines] == [WIDEST_FILS, FILS]
    assert rating.total == rating.usage_total == D("99999999999999999999999999.124")
    assert rating.amount_by("successful_tasks") == WIDEST_FILS
    assert rating.amount_by() == D("99999999999999999999999999.124")


def test_rounded_total_agrees_with_the_rating_beyond_28_digits():
    for b in (book(), book(minimum=str(TOP)), book(credits=str(TOP))):
        u = usage(WIDEST, "0.001")
        assert rounded_total(b, line_quantities(b, u), commitments=True) == rate(b, u).total
        assert rounded_total(b, line_quantities(b, u), commitments=False) == D("99999999999999999999999999.124")


def test_a_minimum_of_29_digits_is_topped_up_to_the_fils():
    rating = rate(book(minimum=str(TOP)), usage("0.001"))
    top_up = rating.lines[-1]
    assert (top_up.kind, top_up.amount) == ("minimum", D("99999999999999999999999999.998"))
    assert rating.total == TOP


def test_credits_of_29_digits_bring_the_total_to_exactly_zero():
    rating = rate(book(credits=str(TOP)), usage(WIDEST, "0.001"))
    assert rating.lines[-1].amount == D("-99999999999999999999999999.124")
    assert rating.total == 0


def test_progressive_parts_of_29_digits_add_up_to_the_whole_period():
    b = book(minimum=str(TOP))
    first, second = usage(WIDEST, start=T0, end=T1), usage("0", "0.002", start=T1, end=T2)
    part1 = rate_progressive(b, first.empty_before(), first, final=False)
    part2 = rate_progressive(b, first, second, final=True)
    whole = rate(b, first.then(second))
    assert part1.total == WIDEST_FILS
    assert part2.lines[-1].amount == D("0.874")  # TOP - (WIDEST_FILS + 0.002)
    assert exact_sum([part1.total, part2.total]) == whole.total == TOP


def test_attributed_costs_of_29_digits_sum_exactly():
    hour = datetime(2026, 11, 1, tzinfo=UTC)
    attribution = Attribution(cost={CostKey("c1", "m", "d", "g", hour): WIDEST_FILS,
                                    CostKey("c2", "m", "d", "g", hour): FILS})
    assert attribution.total_cost == D("99999999999999999999999999.124")
    assert attribution.cost_by(model="m") == D("99999999999999999999999999.124")
