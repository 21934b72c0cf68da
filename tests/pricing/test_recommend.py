"""The price recommendation, pure: scaling a book, the two conditions, and the search for the smallest
scale, each checked against rating done here independently (`pricing.rating.rate` on summed usage)."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from pricing.book import parse_price_book
from pricing.bootstrap import day_draws
from pricing.rating import rate
from pricing.recommend import (
    GRID,
    Chunk,
    History,
    RecommendError,
    book_precision,
    check_risk,
    check_target,
    period_template,
    price_changes,
    recommend,
    scale_book,
)
from pricing.usage import Usage, UsageKey

START = datetime(2026, 11, 2, tzinfo=UTC)  # a Monday
DAY = timedelta(days=1)
OUT = UsageKey("output_tokens", "m")
REQ = UsageKey("requests", "m")
TASKS = UsageKey("successful_tasks")

UNIT = parse_price_book("""
id: unit
currency: USD
charges:
  - meter: output_tokens
    price: {type: unit, amount: "10.00", per: 1000000}
""")
MIXED = parse_price_book("""
id: mixed
currency: USD
charges:
  - meter: output_tokens
    free: 100000
    price: {type: unit, amount: "7.00", per: 1000000}
  - meter: requests
    price: {type: tiered_graduated, tiers: [{up_to: 100, amount: "0.010"}, {up_to: null, amount: "0.005", flat_amount: "0.50"}]}
  - meter: successful_tasks
    price: {type: package, amount: "1.25", per: 10}
minimum: "2.00"
credits: "0.75"
""")


@pytest.mark.parametrize(("value", "ok"), [
    ("0.25", True), ("-0.99", True), ("0", True), ("0.9999", True),
    ("1", False), ("-1", False), ("1.5", False), ("-3", False), ("abc", False), ("NaN", False), ("", False),
])
def test_target_margin_lies_strictly_between_minus_one_and_one(value, ok):
    if ok:
        assert check_target(value) == Decimal(value)
    else:
        with pytest.raises(RecommendError, match="--target-margin"):
            check_target(value)


@pytest.mark.parametrize(("value", "ok"), [
    ("0.05", True), ("0.0001", True), ("0.9999", True),
    ("0", False), ("1", False), ("-0.1", False), ("1.01", False), ("x", False), ("Infinity", False),
])
def test_risk_lies_strictly_between_zero_and_one(value, ok):
    if ok:
        assert check_risk(value) == Decimal(value)
    else:
        with pytest.raises(RecommendError, match="--risk"):
            check_risk(value)


def test_scaling_rounds_prices_up_to_the_books_precision_and_credits_down():
    assert book_precision(UNIT) == 2 and book_precision(MIXED) == 3
    assert scale_book(MIXED, Decimal(1)) == MIXED
    scaled = scale_book(MIXED, Decimal("1.2345"))
    assert scaled.charges[0].price.amount == Decimal("8.642")  # 8.6415 rounded up
    assert scaled.charges[0].free == Decimal(100000) and scaled.charges[0].price.per == Decimal(1000000)
    tiers = scaled.charges[1].price.tiers
    assert [(t.up_to, t.amount, t.flat_amount) for t in tiers] == [
        (Decimal(100), Decimal("0.013"), Decimal("0.000")), (None, Decimal("0.007"), Decimal("0.618"))]
    assert scaled.charges[2].price.amount == Decimal("1.544") and scaled.charges[2].price.per == Decimal(10)
    assert scaled.minimum == Decimal("2.469") and scaled.credits == Decimal("0.925")  # credits rounded down
    assert scale_book(UNIT, Decimal("0.3333")).charges[0].price.amount == Decimal("3.34")
    changes = price_changes(MIXED, scaled)
    assert [(c.where, c.charge) for c in changes] == [
        ("charges[0].price.amount", "output_tokens"), ("charges[1].price.tiers[0].amount", "requests"),
        ("charges[1].price.tiers[1].amount", "requests"), ("charges[1].price.tiers[1].flat_amount", "requests"),
        ("charges[2].price.amount", "successful_tasks"), ("minimum", ""), ("credits", "")]
    assert changes[0].before == Decimal("7.00") and changes[0].after == Decimal("8.642")


def history(days: list[dict[str, dict]], costs: list[Decimal], *, customers=None, rest=None) -> History:
    chunks = []
    for k, (usage, cost) in enumerate(zip(days, costs, strict=True)):
        a = START + k * DAY
        chunks.append(Chunk(a, a + DAY, {c: Usage(c, a, a + DAY, q) for c, q in usage.items()}, cost))
    end = START + len(days) * DAY + (rest.end - rest.start if rest else timedelta(0))
    names = customers or sorted({c for d in days for c in d})
    return History(START, end, "USD", chunks, rest, names)


def margins_by_rating(book, h: History, scale: Decimal, *, draws: int, period_days: int, seed: int):
    """The window's margin and each bootstrapped period's, rated here with `rate` on summed usage."""
    scaled = scale_book(book, scale) if scale != 1 else book
    money = book.money

    def revenue(chunks_and_times) -> Decimal:
        total = Decimal(0)
        for c in h.customers:
            summed: dict = {}
            for chunk, times in chunks_and_times:
                for key, q in chunk.usage[c].quantities.items() if c in chunk.usage else ():
                    summed[key] = summed.get(key, 0) + q * times
            total += rate(scaled, Usage.build(c, h.start, h.end, summed.items())).total
        return total

    window = revenue([(c, 1) for c in h.chunks]) - money.round(sum((c.cost for c in h.chunks), Decimal(0)))
    periods = []
    for pick in day_draws([d.start for d in h.days], period_template(h.start, period_days), draws=draws,
                          seed=f"recommend/{seed}"):
        counts = Counter(i for i, _ in pick)
        cost = money.round(sum((h.days[i].cost * m for i, m in counts.items()), Decimal(0)))
        periods.append(revenue([(h.days[i], m) for i, m in counts.items()]) - cost)
    return window, revenue([(c, 1) for c in h.chunks]), periods


def steady(n_days: int = 14) -> History:
    """Two customers using the same every day; the cost of a day is 25.00."""
    day = {"a": {OUT: 2_000_000}, "b": {OUT: 500_000}}
    return history([day] * n_days, [Decimal("25.00")] * n_days)


def test_a_steady_history_gets_exactly_the_smallest_scale_that_reaches_the_target():
    r = recommend(UNIT, steady(), target="0.25", risk="0.05", draws=50, period_days=30)
    # at scale 1 revenue is 25.00 a day, the cost 25.00: margin 0. A 25% margin needs 0.75 x revenue >= 350.00
    # over the 14 days: 35M output tokens at 13.34 (466.90), not at 13.33 (466.55)
    assert (r.before.revenue, r.before.cost, r.before.margin) == (Decimal("350.00"), Decimal("350.00"), 0)
    assert r.scaled.charges[0].price.amount == Decimal("13.34") and r.after.revenue == Decimal("466.90")
    # the smallest scale whose price, rounded up to 2 decimals, is 13.34: 10 x 1.3331 = 13.331
    assert r.scale == Decimal("1.3331")
    assert scale_book(UNIT, r.scale - GRID).charges[0].price.amount == Decimal("13.33")
    window, revenue, _ = margins_by_rating(UNIT, steady(), r.scale, draws=50, period_days=30, seed=1)
    assert (r.after.revenue, r.after.margin) == (revenue, window) and r.after.margin_share >= Decimal("0.25")
    assert r.after.losses == 0 and r.binding == "target"


def test_the_smallest_grid_scale_is_found_when_rounding_does_not_hide_it():
    # a price with 6 decimals: every grid step changes it, so the answer is the exact break-even step
    book = parse_price_book("""
id: fine
currency: USD
charges:
  - meter: output_tokens
    price: {type: unit, amount: "10.000000", per: 1000000}
""")
    h = steady()
    r = recommend(book, h, target="0.25", risk="0.05", draws=50)
    for scale, passes in ((r.scale, True), (r.scale - GRID, False)):
        window, revenue, periods = margins_by_rating(book, h, scale, draws=50, period_days=30, seed=1)
        assert (window >= Decimal("0.25") * revenue) is passes, scale
    assert r.binding == "target"


@pytest.fixture(scope="module")
def volatile() -> History:
    """Ten customers whose usage swings from day to day (a quiet weekend), a fixed cost per day: the
    periods' margins spread, so the risk condition can bind."""
    rng = random.Random(3)
    days, costs = [], []
    for k in range(28):
        weekend = (START + k * DAY).weekday() >= 5
        days.append({f"c{i}": {OUT: rng.randrange(0, 3_000_000 if not weekend else 600_000), REQ: rng.randrange(1, 90),
                               TASKS: rng.randrange(0, 25)}
                     for i in range(10) if rng.random() < 0.8})
        costs.append(Decimal(rng.randrange(9000, 16000)) / 100)
    return history(days, costs, customers=[f"c{i}" for i in range(11)])  # c10: no usage, pays the minimum


def test_the_risk_binds_when_the_target_is_loose_and_the_scale_is_the_smallest_that_meets_it(volatile):
    r = recommend(MIXED, volatile, target="-0.5", risk="0.05", draws=120, period_days=7, seed=4)
    assert r.binding == "risk"
    assert r.after.losses <= Decimal("0.05") * 120 < r.before.losses
    window, revenue, periods = margins_by_rating(MIXED, volatile, r.scale, draws=120, period_days=7, seed=4)
    assert (window, revenue) == (r.after.margin, r.after.revenue)  # c10 included: the minimum, less credits
    assert list(periods) == list(r.after.period_margins)
    _, _, below = margins_by_rating(MIXED, volatile, r.scale - GRID, draws=120, period_days=7, seed=4)
    assert sum(1 for m in below if m < 0) > 6  # one grid step less breaks the risk


def test_a_risk_allowing_one_and_a_half_periods_allows_one(volatile):
    # 0.05 x 30 draws = 1.5 periods: at most one may lose
    r = recommend(MIXED, volatile, target="-0.5", risk="0.05", draws=30, period_days=7, seed=4)
    assert (r.scale, r.binding, r.after.losses) == (Decimal("2.0306"), "risk", 1)
    assert r.after.meets(Decimal("-0.5"), Decimal("0.05")) == (True, True)


def test_the_target_binds_when_the_risk_is_loose(volatile):
    r = recommend(MIXED, volatile, target="0.4", risk="0.5", draws=120, period_days=7, seed=4)
    assert r.binding == "target" and r.after.margin_share >= Decimal("0.4")
    window, revenue, _ = margins_by_rating(MIXED, volatile, r.scale - GRID, draws=120, period_days=7, seed=4)
    assert window < Decimal("0.4") * revenue


def test_the_same_seed_gives_the_same_recommendation_and_the_before_is_the_book_as_it_is(volatile):
    one = recommend(MIXED, volatile, target="0.25", risk="0.05", draws=100, period_days=30, seed=9)
    two = recommend(MIXED, volatile, target="0.25", risk="0.05", draws=100, period_days=30, seed=9)
    assert (one.scale, one.after, one.before, one.changes) == (two.scale, two.after, two.before, two.changes)
    window, revenue, periods = margins_by_rating(MIXED, volatile, Decimal(1), draws=100, period_days=30, seed=9)
    assert (one.before.scale, one.before.margin, one.before.revenue) == (Decimal(1), window, revenue)
    assert list(one.before.period_margins) == periods
    assert recommend(MIXED, volatile, target="0.25", risk="0.05", draws=100, period_days=30,
                     seed=10).before.period_margins != one.before.period_margins


def test_a_book_already_above_the_target_is_scaled_down_to_it():
    r = recommend(UNIT, history([{"a": {OUT: 10_000_000}}] * 7, [Decimal("40.00")] * 7), target="0.2", risk="0.1",
                  draws=40)
    assert r.before.margin_share == Decimal("0.6") and r.scale < 1
    assert r.after.margin_share >= Decimal("0.2") and r.scaled.charges[0].price.amount == Decimal("5.00")


def test_the_part_of_the_window_after_its_last_whole_day_counts_for_the_window_only():
    h = steady(7)
    a = h.end
    rest = Chunk(a, a + timedelta(hours=12), {"a": Usage("a", a, a + timedelta(hours=12), {OUT: 4_000_000})},
                 Decimal("30.00"))
    with_rest = history([{"a": {OUT: 2_000_000}, "b": {OUT: 500_000}}] * 7, [Decimal("25.00")] * 7, rest=rest)
    r0, r1 = (recommend(UNIT, x, target="0.25", risk="0.05", draws=30) for x in (h, with_rest))
    assert r1.before.revenue == r0.before.revenue + Decimal("40.00") and r1.before.cost == r0.before.cost + 30
    assert r1.before.period_margins == r0.before.period_margins


@pytest.mark.parametrize(("make", "message"), [
    (lambda: history([], []), "holds no whole day"),
    (lambda: history([{}] * 3, [Decimal(0)] * 3), "no metered usage"),
    (lambda: history([{"a": {OUT: 1_000_000}}] + [{}] * 9, [Decimal(5)] * 10), "bootstrapped periods that cost"),
    (lambda: history([{"a": {REQ: 3}}] * 3, [Decimal(5)] * 3), "bills nothing in this window"),
])
def test_no_recommendation_is_made_without_history_or_when_no_scale_can_work(make, message):
    with pytest.raises(RecommendError, match=message):
        recommend(UNIT, make(), target="0.25", risk="0.05", draws=50)


def test_the_book_and_the_cost_model_share_one_currency():
    eur = parse_price_book("id: e\ncurrency: EUR\ncharges: [{meter: output_tokens, price: {type: unit, amount: '1', "
                           "per: 1}}]")
    with pytest.raises(RecommendError, match="one currency"):
        recommend(eur, steady(), target="0.25", risk="0.05")
