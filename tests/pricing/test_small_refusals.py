"""Small pieces of pricing at their edges: which days are weekend days, the bootstrap's strata from
exactly two days of a kind, usage's refusals and joins, and the cost model's refusals word for word."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from pricing.bootstrap import MIN_STRATUM, day_draws, is_weekend
from pricing.cost import CostModel, CostModelError, largest_remainder, parse_cost_model, split_gpu_seconds
from pricing.usage import Usage, UsageKey

D = Decimal
MONDAY = datetime(2026, 11, 2, tzinfo=UTC)
DAY = timedelta(days=1)
T0, T1, T2 = MONDAY, MONDAY + DAY, MONDAY + 2 * DAY


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


# ---------------------------------------------------------------- the bootstrap


@pytest.mark.parametrize(("days_after_monday", "weekend"), [(4, False), (5, True), (6, True), (7, False)])
def test_saturday_and_sunday_are_the_weekend(days_after_monday, weekend):
    assert is_weekend(MONDAY + days_after_monday * DAY) is weekend


def test_exactly_two_days_of_each_kind_keep_weekends_apart():
    assert MIN_STRATUM == 2
    days = [MONDAY + k * DAY for k in (0, 1, 5, 6)]  # Monday, Tuesday, Saturday, Sunday
    slots = [(True, D(1)), (False, D(1))] * 5
    for draw in day_draws(days, slots, draws=40, seed="s"):
        assert [is_weekend(days[i]) for i, _ in draw] == [True, False] * 5


@pytest.mark.parametrize("days_after_monday", [(0, 5, 6), (0, 1, 5)])  # one weekday, or one weekend day
def test_one_day_of_a_kind_is_too_few_to_keep_the_kinds_apart(days_after_monday):
    days = [MONDAY + k * DAY for k in days_after_monday]
    slots = [(True, D(1)), (False, D(1))] * 5
    kinds = {(weekend, is_weekend(days[i])) for draw in day_draws(days, slots, draws=40, seed="s")
             for (i, _), (weekend, _) in zip(draw, slots, strict=True)}
    assert kinds == {(True, True), (True, False), (False, True), (False, False)}


# ---------------------------------------------------------------- usage


def test_period_bounds_without_a_zone_are_refused():
    with pytest.raises(ValueError, match=exactly("period bounds must be timezone-aware (UTC)")):
        Usage("c1", datetime(2026, 11, 2), T1)


@pytest.mark.parametrize(("quantity", "kind"), [(1.5, "float"), ("3", "str"), (True, "bool")])
def test_a_quantity_that_is_no_decimal_or_int_is_refused(quantity, kind):
    key = UsageKey("requests", model="m")
    with pytest.raises(TypeError, match=exactly(f"quantity of {key} must be Decimal or int, got {kind}")):
        Usage("c1", T0, T1, {key: quantity})


def test_joined_usage_keeps_its_customer_and_only_joins_one_customer():
    key = UsageKey("requests", model="m")
    joined = Usage("c1", T0, T1, {key: D(1)}).then(Usage("c1", T1, T2, {key: D(2)}))
    assert (joined.customer_id, joined.period_start, joined.period_end, dict(joined.quantities)) == (
        "c1", T0, T2, {key: D(3)})
    with pytest.raises(ValueError, match=exactly("cannot join usage of different customers")):
        Usage("c1", T0, T1).then(Usage("c2", T1, T2))


def test_the_empty_usage_before_a_period_is_the_customers():
    before = Usage("c1", T1, T2, {UsageKey("requests", model="m"): D(1)}).empty_before()
    assert (before.customer_id, before.period_start, before.period_end, dict(before.quantities)) == ("c1", T1, T1, {})


# ---------------------------------------------------------------- the cost model


def test_a_meter_without_a_unit_cost_costs_nothing():
    model = CostModel(gpu_hour={"h100": D("3.60")}, usage_unit_cost={"usage:images": D("0.01")})
    assert model.usage_cost("usage:images", D(3)) == D("0.03")
    assert model.usage_cost("usage:videos", D(3)) == 0


def test_an_unknown_gpu_type_lists_the_known_ones():
    model = CostModel(gpu_hour={"h100": D("3.60"), "a100": D("2.00")})
    with pytest.raises(CostModelError,
                       match=exactly("no $/GPU-hour configured for gpu_type 'l4' (cost model has: a100, h100)")):
        model.gpu_hour_cost("l4")


def test_every_problem_of_a_cost_model_is_on_its_own_line():
    with pytest.raises(CostModelError) as raised:
        parse_cost_model("gpu_hour: {h100: abc}\nprefill_weight: -1\n", "m.yaml")
    assert str(raised.value).splitlines() == [
        "m.yaml: gpu_hour.h100: amount 'abc' is not a decimal number",
        "m.yaml: prefill_weight: Input should be greater than or equal to 0",
    ]


def test_splitting_refusals_word_for_word():
    with pytest.raises(ValueError, match=exactly("nothing to split a non-zero whole among")):
        largest_remainder(1, [])
    with pytest.raises(ValueError, match=exactly("weights must be non-negative")):
        largest_remainder(1, [D(1), D(-1)])
    with pytest.raises(ValueError, match=exactly("no weight served: the hour is idle")):
        split_gpu_seconds(1000, D(0), [D(1)])
