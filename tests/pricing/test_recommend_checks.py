"""`pricing.recommend.recommend`'s refusals with their exact messages (draws and period days exactly 1
and 0, a book in another currency, a window without a whole day or without usage, a book that can
never reach a margin), and every field of a recommendation, on a history worked by hand."""

from __future__ import annotations

from decimal import Decimal

import pytest

from pricing.book import parse_price_book
from pricing.recommend import PriceChange, RecommendError, check_risk, check_target, recommend
from tests.pricing.test_recommend import OUT, REQ, UNIT, history, steady

D = Decimal


def refused(book, h, **kwargs) -> str:
    with pytest.raises(RecommendError) as raised:
        recommend(book, h, **{"target": "0.25", "risk": "0.05", "draws": 5, **kwargs})
    return str(raised.value)


@pytest.mark.parametrize(("draws", "period_days"), [(0, 1), (1, 0), (0, 0), (-1, 30)])
def test_draws_and_period_days_of_at_least_one(draws, period_days):
    assert refused(UNIT, steady(7), draws=draws, period_days=period_days) == (
        "--draws and --period-days must be at least 1")


def test_one_draw_of_one_day_periods_is_enough():
    r = recommend(UNIT, steady(7), target="0.25", risk="0.05", draws=1, period_days=1)
    assert (r.scale, r.draws, r.period_days, len(r.after.period_margins)) == (D("1.3331"), 1, 1, 1)


def test_the_currency_message_names_both():
    eur = parse_price_book("id: e\ncurrency: EUR\ncharges: [{meter: output_tokens, price: {type: unit, amount: '1', "
                           "per: 1}}]")
    assert refused(eur, steady(7)) == "the book e is in EUR and the cost model in USD: they must share one currency"


@pytest.mark.parametrize(("make", "message"), [
    (lambda: history([], []),
     "the window [2026-11-02T00:00:00Z, 2026-11-02T00:00:00Z) holds no whole day to draw billing periods from: "
     "give a window of at least one day"),
    (lambda: history([{}] * 3, [D(0)] * 3),
     "no metered usage in [2026-11-02T00:00:00Z, 2026-11-05T00:00:00Z): check --from/--to against `infermeter usage`"),
    (lambda: history([{"a": {REQ: 3}}] * 3, [D(5)] * 3),
     "unit bills nothing in this window while serving it cost 15.00: no scale of its prices can reach a margin"),
])
def test_no_recommendation_without_days_usage_or_revenue(make, message):
    assert refused(UNIT, make()) == message


def test_periods_that_bill_nothing_are_counted_with_the_risk_named():
    # usage on one day of ten, a cost every day: 20 of the 50 drawn 30-day periods miss the one day
    h = history([{"a": {OUT: 1_000_000}}] + [{}] * 9, [D(5)] * 10)
    assert refused(UNIT, h, draws=50, risk="0.05") == (
        "unit bills nothing in 20 of 50 bootstrapped periods that cost money: no scale of its prices keeps the "
        "loss risk at or below 0.05")


def test_every_field_of_a_recommendation_that_no_step_below_would_pass():
    # nothing costs anything: the smallest grid step, 0.0001, passes (10.00 x 0.0001 rounded up to 0.01 a
    # million tokens), and the only scale below it is 0, which passes neither condition: "both" bind
    h = history([{"a": {OUT: 2_500_000}}] * 3, [D("0")] * 3)
    r = recommend(UNIT, h, target="0.25", risk="0.05", draws=5)
    assert (r.book, r.places, r.target, r.risk, r.draws, r.period_days, r.seed) == (
        UNIT, 2, D("0.25"), D("0.05"), 5, 30, 1)
    assert (r.scale, r.binding, r.scaled.charges[0].price.amount) == (D("0.0001"), "both", D("0.01"))
    assert (r.before.scale, r.before.revenue, r.after.revenue) == (D(1), D("75.00"), D("0.08"))  # 7.5M tokens
    assert r.changes == [PriceChange("charges[0].price.amount", "output_tokens", D("10.00"), D("0.01"))]


def test_the_default_seed_is_one():
    h = history([{"a": {OUT: 2_000_000}}, {}, {"a": {OUT: 500_000}}] * 3, [D("10.00")] * 9)
    default = recommend(UNIT, h, target="0.25", risk="0.3", draws=20, period_days=7)
    assert default.seed == 1
    assert default.before.period_margins == recommend(UNIT, h, target="0.25", risk="0.3", draws=20, period_days=7,
                                                      seed=1).before.period_margins
    assert default.before.period_margins != recommend(UNIT, h, target="0.25", risk="0.3", draws=20, period_days=7,
                                                      seed=2).before.period_margins


@pytest.mark.parametrize(("check", "value", "message"), [
    (check_target, "abc", "--target-margin must be a decimal number such as 0.25, got 'abc'"),
    (check_target, "1", "--target-margin must be greater than -1 and less than 1 (a share of revenue, 0.25 for 25%), "
                        "got 1"),
    (check_risk, "x", "--risk must be a decimal number such as 0.25, got 'x'"),
    (check_risk, "0", "--risk must be greater than 0 and less than 1 (a probability, 0.05 for 5%), got 0"),
])
def test_the_target_and_risk_refusals_name_their_option(check, value, message):
    with pytest.raises(RecommendError) as raised:
        check(value)
    assert str(raised.value) == message
