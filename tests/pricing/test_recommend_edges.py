"""The recommendation at its edges, worked by hand: the two conditions exactly on their bounds, the
weekday pattern of a bootstrapped period, a book's precision and a scale's places, windows that cost
nothing or bill less than one currency unit, and the count of periods that bill nothing (a risk whose
allowance is not a whole number of periods: `test_recommend.py`)."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import pytest

from pricing.book import PriceBookError, parse_price_book
from pricing.recommend import (
    GRID,
    MAX_SCALE,
    Outcome,
    RecommendError,
    book_precision,
    period_template,
    recommend,
    scale_book,
)
from tests.pricing.test_recommend import OUT, REQ, START, UNIT, history

D = Decimal


def outcome(revenue: str, cost: str, margins: list[int]) -> Outcome:
    return Outcome(D(1), D(revenue), D(cost), tuple(D(100 + m) for m in margins), tuple(D(100) for _ in margins))


@pytest.mark.parametrize(
    ("revenue", "cost", "target", "reached"),
    [("100", "80", "0.2", True),  # (1 - 0.2) x 100 = 80: exactly the target
     ("100", "80.01", "0.2", False),
     ("100", "90", "0.2", False),
     ("100", "120", "-0.2", True), ("100", "120.01", "-0.2", False)],
)
def test_the_target_is_met_exactly_at_its_bound(revenue, cost, target, reached):
    assert outcome(revenue, cost, [0]).meets(D(target), D("0.5"))[0] is reached


@pytest.mark.parametrize(("losing", "within"), [(1, True), (2, True), (3, False)])
def test_the_risk_is_met_exactly_at_its_bound(losing, within):
    # 10 periods at a risk of 0.2: at most 2 may lose
    o = outcome("100", "0", [-1] * losing + [0] * (10 - losing))
    assert o.losses == losing
    assert o.meets(D("0.2"), D("0.2"))[1] is within


def test_a_bootstrapped_period_follows_the_weekdays_from_its_start():
    # 2026-11-02 is a Monday: five weekdays, Saturday, Sunday, then Monday and Tuesday again
    assert [weekend for weekend, _ in period_template(START, 9)] == [False] * 5 + [True, True] + [False] * 2
    assert all(weight == 1 for _, weight in period_template(START, 9))


def test_a_books_precision_is_its_most_decimal_places_and_none_for_whole_yen():
    yen = parse_price_book("id: y\ncurrency: JPY\ncharges: [{meter: output_tokens, price: {type: unit, amount: '12', "
                           "per: 1000}}]")
    assert book_precision(yen) == 0
    assert scale_book(yen, D("1.01")).charges[0].price.amount == D(13)  # 12.12 rounded up to whole yen
    half = parse_price_book("id: y\ncurrency: JPY\ncharges: [{meter: output_tokens, price: {type: unit, amount: "
                            "'12.5', per: 1000}}]")
    assert book_precision(half) == 1


def test_a_scale_rounds_prices_up_to_the_places_asked_for():
    assert str(scale_book(UNIT, D("1.00005"), 4).charges[0].price.amount) == "10.0005"
    assert str(scale_book(UNIT, D("1.00005")).charges[0].price.amount) == "10.01"  # the book's 2 places


def test_a_scaled_book_that_is_no_book_is_named_after_the_book_and_the_scale():
    with pytest.raises(PriceBookError) as raised:
        scale_book(UNIT, D(-1))
    assert str(raised.value).startswith("unit x -1: charges[0].price.amount: ")


def test_a_window_that_costs_nothing_and_bills_nothing_gets_the_smallest_step():
    # the book prices none of the usage and nothing costs: every scale above 0 meets both conditions
    r = recommend(UNIT, history([{"a": {REQ: 3}}] * 3, [D(0)] * 3), target="0.25", risk="0.05", draws=5)
    assert (r.scale, r.binding, r.before.revenue, r.before.cost, r.before.losses) == (GRID, "both", 0, 0, 0)


def test_a_window_that_costs_less_than_one_unit_and_bills_nothing_is_infeasible():
    with pytest.raises(RecommendError, match=r"^unit bills nothing in this window while serving it cost 0\.50: no "
                                             r"scale of its prices can reach a margin$"):
        # one-day periods: none costs more than 0.50 either
        recommend(UNIT, history([{"a": {REQ: 3}}, {}, {}], [D("0.50"), D(0), D(0)]), target="0.25", risk="0.05",
                  draws=5, period_days=1)


def test_a_window_that_bills_less_than_one_unit_can_be_priced():
    # 50,000 tokens at 10.00 a million: 0.50 over the window, against 0.10 of cost
    r = recommend(UNIT, history([{"a": {OUT: 25_000}}] * 2, [D("0.05")] * 2), target="0.25", risk="0.05", draws=5)
    assert (r.before.revenue, r.scale, r.binding) == (D("0.50"), D("0.2691"), "target")
    assert r.after.meets(D("0.25"), D("0.05")) == (True, True)


def test_only_periods_that_bill_nothing_and_cost_something_are_counted_as_infeasible():
    # one-day periods drawn from ten days: day 0 bills 0.50 and costs 5 (a loss, but a price can fix it),
    # day 1 bills nothing and costs 5 (no price can), days 2..9 bill and cost nothing (no loss)
    h = history([{"a": {OUT: 50_000}}] + [{}] * 9, [D(5), D(5)] + [D(0)] * 8)
    with pytest.raises(RecommendError, match=r"^unit bills nothing in 12 of 50 bootstrapped periods that cost money: "
                                             r"no scale of its prices keeps the loss risk at or below 0\.05$"):
        recommend(UNIT, h, target="0.25", risk="0.05", draws=50, period_days=1)



def test_a_risk_that_allows_one_period_of_two_to_lose_allows_one_that_bills_nothing():
    # one-day periods of two days: day 0 bills 10.00 and costs 5, day 1 bills nothing and costs 5; seed 1
    # draws day 1 then day 0, and a risk of 0.5 lets the first lose: the second sets the scale
    h = history([{"a": {OUT: 1_000_000}}, {}], [D(5), D(5)])
    r = recommend(UNIT, h, target="0.25", risk="0.5", draws=2, period_days=1, seed=1)
    assert r.before.period_margins == (D("-5.00"), D("5.00"))
    assert (r.scale, r.binding, r.after.period_margins) == (D("1.3331"), "target", (D("-5.00"), D("8.34")))


def test_a_scale_above_the_proportional_estimate_is_found_by_widening_the_search():
    # 500 tokens a day at 10.00 a million: 0.005, billed 0.01 (half-up), against 0.015 of cost (0.02).
    # Were revenue proportional, scale 2 would do; but at 20.00 the line is 0.01 again. The line reaches
    # 0.02 once 500 x price >= 15000 (0.015 rounds half-up): a price of 30.00, the ceiling of 10 x 2.9991
    # (10 x 2.9990 = 29.99 gives 0.014995, billed 0.01: neither condition holds)
    h = history([{"a": {OUT: 500}}], [D("0.015")])
    r = recommend(UNIT, h, target="0", risk="0.05", draws=5, period_days=1)
    assert (r.before.revenue, r.before.cost) == (D("0.01"), D("0.02"))
    assert (r.scale, r.binding, r.scaled.charges[0].price.amount, r.after.revenue) == (
        D("2.9991"), "both", D("30.00"), D("0.02"))
    assert scale_book(UNIT, r.scale - GRID).charges[0].price.amount == D("29.99")


def test_below_scale_one_periods_that_profit_at_one_can_still_lose():
    # 5M tokens and 40.00 of cost a day: at 10.00 a million every period profits (a margin of 20%); a loose
    # target (-50%) lets the price fall until the periods break even: 8.00, the ceiling of 10 x 0.7991
    h = history([{"a": {OUT: 5_000_000}}] * 7, [D("40.00")] * 7)
    r = recommend(UNIT, h, target="-0.5", risk="0.05", draws=20)
    assert (r.before.margin_share, r.before.losses) == (D("0.2"), 0)
    assert (r.scale, r.binding, r.scaled.charges[0].price.amount, r.after.losses) == (D("0.7991"), "risk", D("8.00"), 0)
    assert set(r.after.period_margins) == {D(0)}


def test_a_scale_far_below_the_proportional_estimate_is_found_by_narrowing_the_search():
    # 100 tokens a day at 12 yen each, 550 yen of cost a day: proportional revenue would need 550 / 1200 =
    # 0.4583 of the price (5.5 yen), but prices are whole yen, rounded up: 6 yen, which every scale above
    # 5/12 gives (12 x 0.4167 = 5.0004); 12 x 0.4166 = 4.9992 is 5 yen, 500 a day: neither condition holds
    yen = parse_price_book("id: y\ncurrency: JPY\ncharges: [{meter: output_tokens, price: {type: unit, amount: '12', "
                           "per: 1}}]")
    h = replace(history([{"a": {OUT: 100}}] * 7, [D(550)] * 7), currency="JPY")
    r = recommend(yen, h, target="0", risk="0.05", draws=20)
    assert (r.before.revenue, r.before.cost) == (D(8400), D(3850))
    assert (r.scale, r.binding, r.scaled.charges[0].price.amount, r.after.revenue) == (D("0.4167"), "both", D(6),
                                                                                      D(4200))
    assert scale_book(yen, r.scale - GRID).charges[0].price.amount == D(5)


def test_no_scale_up_to_the_limit_is_refused_when_widening_reaches_it():
    # 500 tokens billed 0.01 at 10.00 a million (0.005, half-up) against 6.00 of cost: proportional
    # revenue would need 600x, but the line is worth 0.005 a scale step: 1200x, past the 1000x limit
    h = history([{"a": {OUT: 500}}], [D("6.00")])
    with pytest.raises(RecommendError, match=r"^no scale up to 1000x makes unit meet the target margin 0 with a loss "
                                             r"risk of at most 0\.05$"):
        recommend(UNIT, h, target="0", risk="0.05", draws=5, period_days=1)


# 100M tokens a day at 1.2345 a million (4 places, so the price moves 0.0001 every grid step): 123.45 billed
# a day at scale 1, 123450.00 at the 1000x limit, 123449.99 one grid step below it, 123450.02 one above
FINE = parse_price_book("id: fine4\ncurrency: USD\ncharges: [{meter: output_tokens, price: {type: unit, "
                        "amount: '1.2345', per: 1000000}}]")


def hundred_million_a_day(daily_cost: str):
    return history([{"a": {OUT: 100_000_000}}] * 7, [D(daily_cost)] * 7)


def test_a_scale_of_exactly_the_limit_is_found():
    # the estimate is 1000x, the limit: it passes, and 999.9999x (123449.99 a day) does not
    r = recommend(FINE, hundred_million_a_day("123450.00"), target="0", risk="0.05", draws=5, period_days=1)
    assert (r.scale, r.scaled.charges[0].price.amount) == (MAX_SCALE, D("1234.5"))
    assert (r.after.revenue, r.after.cost) == (D("864150.00"), D("864150.00"))
    assert scale_book(FINE, MAX_SCALE - GRID).charges[0].price.amount == D("1234.4999")


@pytest.mark.parametrize("daily_cost", ["123450.01", "822917.70"])
def test_a_first_guess_above_the_limit_is_refused_even_when_it_passes(daily_cost):
    # 123450.01 a day needs 1000.0001x (123450.02 billed), one grid step past the limit; 822917.70 needs
    # 6666x. The estimate passes in both: it used to be returned, past the limit
    assert scale_book(FINE, MAX_SCALE + GRID).charges[0].price.amount == D("1234.5002")
    with pytest.raises(RecommendError, match=r"^no scale up to 1000x makes fine4 meet the target margin 0 with a "
                                             r"loss risk of at most 0\.05$"):
        recommend(FINE, hundred_million_a_day(daily_cost), target="0", risk="0.05", draws=5, period_days=1)


def test_a_scale_of_exactly_two_is_found():
    # 100M tokens a day at 12.3456789 a million, 2469.135 of cost a day: at scale 2 (24.6913578) the window
    # bills 17283.95 against 17283.95 of cost (17283.945, half-up); at 1.9999 (24.6901233, rounded up) 17283.09
    fine = parse_price_book("id: fine\ncurrency: USD\ncharges: [{meter: output_tokens, price: {type: unit, "
                            "amount: '12.3456789', per: 1000000}}]")
    r = recommend(fine, history([{"a": {OUT: 100_000_000}}] * 7, [D("2469.135")] * 7), target="0", risk="0.05",
                  draws=20)
    assert (r.scale, r.binding, r.scaled.charges[0].price.amount) == (D(2), "both", D("24.6913578"))
    assert (r.after.revenue, r.after.cost) == (D("17283.95"), D("17283.95"))
    assert scale_book(fine, r.scale - GRID).charges[0].price.amount == D("24.6901233")
