"""The recommendation's result helpers, pure and table-driven with hand-worked values: a scale's
period-margin quantiles (`Outcome.quantiles`, nearest-rank `_pick`), and `percent`, which rounds a
share towards zero to 0.01%."""

from __future__ import annotations

from decimal import Decimal

import pytest

from pricing.money import Currency
from pricing.recommend import Outcome, _pick, percent

D = Decimal
USD = Currency.of("USD")
JPY = Currency.of("JPY")


# ---------------------------------------------------------------- _pick: nearest rank, ceil(q n) - 1


@pytest.mark.parametrize(
    ("n", "q", "index"),
    [
        (1, 0.0, 0), (1, 0.5, 0), (1, 1.0, 0),
        (10, 0.0, 0),  # ceil(0) - 1 = -1: clamped to the first
        (10, -0.5, 0),
        (10, 0.1, 0),  # exactly on the first rank's edge: q n = 1
        (10, 0.11, 1),  # just past it: ceil(1.1) = 2
        (10, 0.5, 4), (10, 0.51, 5),
        (10, 0.9, 8), (10, 0.99, 9),
        (10, 1.0, 9), (10, 1.5, 9),  # past the end: clamped to the last
        (4, 0.25, 0), (4, 0.26, 1), (4, 0.75, 2), (4, 0.76, 3),
    ],
)
def test_pick_is_the_nearest_rank(n, q, index):
    ordered = [D(i) * 10 for i in range(n)]  # value = 10 x rank, so the index reads off the value
    assert _pick(ordered, q) == D(index) * 10


# ---------------------------------------------------------------- quantiles


def outcome(margins: list[str], revenue: str = "100") -> Outcome:
    """Period revenues = `revenue` each, costs chosen so that the period margins are `margins`."""
    return Outcome(scale=D(1), revenue=D(0), cost=D(0), period_revenues=tuple(D(revenue) for _ in margins),
                   period_costs=tuple(D(revenue) - D(m) for m in margins))


def test_no_periods_no_quantiles():
    assert outcome([]).quantiles(USD) == {}


def test_one_period_is_every_quantile():
    assert outcome(["-3.25"]).quantiles(USD) == {
        "mean": D("-3.25"), "min": D("-3.25"), "p5": D("-3.25"), "p10": D("-3.25"), "p50": D("-3.25"),
        "p90": D("-3.25"), "p95": D("-3.25"), "max": D("-3.25")}


def test_twenty_periods_hand_worked():
    # margins 1..20 (given shuffled): p5 = rank ceil(1) = 1, p10 = rank 2, p50 = rank 10, p90 = rank 18,
    # p95 = rank 19; mean = 210 / 20 = 10.5
    margins = [str(m) for m in (7, 20, 1, 13, 2, 19, 3, 18, 4, 17, 5, 16, 6, 15, 8, 14, 9, 12, 10, 11)]
    got = outcome(margins).quantiles(USD)
    assert list(got) == ["mean", "min", "p5", "p10", "p50", "p90", "p95", "max"]
    assert got == {"mean": D("10.50"), "min": D(1), "p5": D(1), "p10": D(2), "p50": D(10), "p90": D(18),
                   "p95": D(19), "max": D(20)}


def test_two_hundred_periods_tell_every_quantile_apart():
    # margins 1..200: p5 = rank 10, p10 = rank 20, p50 = rank 100, p90 = rank 180, p95 = rank 190
    got = outcome([str(m) for m in range(200, 0, -1)]).quantiles(USD)
    assert got == {"mean": D("100.50"), "min": D(1), "p5": D(10), "p10": D(20), "p50": D(100), "p90": D(180),
                   "p95": D(190), "max": D(200)}


def test_2020_periods_keep_the_fraction_exact():
    # p5 = ceil(0.05 x 2020) = rank 101 (not 100, as q / 101 would give)
    got = outcome([str(m) for m in range(1, 2021)]).quantiles(USD)
    assert (got["p5"], got["p10"], got["p50"], got["p90"], got["p95"]) == (D(101), D(202), D(1010), D(1818), D(1919))


@pytest.mark.parametrize(
    ("margins", "money", "mean"),
    [
        (["0.01", "0.00"], USD, D("0.01")),  # 0.005: a tie, half-up
        (["-0.01", "0.00"], USD, D("-0.01")),  # -0.005: half away from zero
        (["0.01", "0.00", "0.00"], USD, D("0.00")),  # 0.00333...
        (["0.02", "0.00", "0.00"], USD, D("0.01")),  # 0.00666...
        (["1", "2"], JPY, D("2")),  # 1.5 yen: half-up to whole yen
        (["-7.10", "-2.40"], USD, D("-4.75")),
    ],
)
def test_the_mean_is_rounded_once_to_the_currency(margins, money, mean):
    got = outcome(margins).quantiles(money)["mean"]
    assert got == mean and got.as_tuple().exponent == -money.minor_units


def test_quantiles_are_of_the_period_margins_not_revenues_or_costs():
    o = Outcome(scale=D(1), revenue=D("30"), cost=D("12"), period_revenues=(D("10"), D("20"), D("0")),
                period_costs=(D("4"), D("25"), D("3")))  # margins 6, -5, -3
    assert o.quantiles(USD) == {"mean": D("-0.67"), "min": D(-5), "p5": D(-5), "p10": D(-5), "p50": D(-3),
                                "p90": D(6), "p95": D(6), "max": D(6)}


# ---------------------------------------------------------------- percent


@pytest.mark.parametrize(
    ("share", "text"),
    [
        (None, "-"),
        (D(0), "0.00%"),
        (D("0.5"), "50.00%"),
        (D(1), "100.00%"),
        (D("0.49999"), "49.99%"),  # towards zero, not half-up
        (D("-0.49999"), "-49.99%"),  # towards zero for a loss too
        (D("0.0001"), "0.01%"),  # exactly one step
        (D("0.000099"), "0.00%"),  # just under it
        (D("0.123456"), "12.34%"),
        (D("-1.5"), "-150.00%"),
    ],
)
def test_percent(share, text):
    assert percent(share) == text
