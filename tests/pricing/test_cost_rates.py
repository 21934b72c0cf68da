"""The cost per weighted token, task costs and the cost per successful task, worked by hand over a
small attribution: served cost only (idle time left out), a customer without tokens at the
platform's rate, cached tokens not weighed, and divisions kept to 80 digits."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from pricing.cost import Attribution, CostKey, CostModel, TaskCost, cost_per_successful_task, task_costs
from pricing.records import AttemptRecord, TaskRecord

D = Decimal
H = datetime(2026, 11, 2, tzinfo=UTC)
THIRD = D("0." + "3" * 80)  # 1/3 to the 80 digits of pricing.money.EXACT


def key(customer: str, model: str) -> CostKey:
    return CostKey(customer, model, "d", "A", H)


ATTRIBUTION = Attribution(
    cost={
        key("c1", "m1"): D("2.00"), key("c1", "m2"): D("2.00"), key("c2", "m1"): D("3.00"),
        key("c1", ""): D("5.00"),  # c1's dedicated deployment idle: not served, left out of the rate
        key("", ""): D("7.00"),  # the shared pool idle: the platform's
    },
    weighted_tokens={("c1", "m1"): D(100), ("c1", "m2"): D(300), ("c2", "m1"): D(600)},
)


@pytest.mark.parametrize(
    ("customer", "rate"),
    [
        ("c1", D("0.01")),  # 4.00 served / 400 weighted tokens
        ("c2", D("0.005")),  # 3.00 / 600
        (None, D("0.007")),  # 7.00 / 1000: the platform
        ("c3", D("0.007")),  # no tokens: the platform's rate
    ],
)
def test_cost_per_weighted_token(customer, rate):
    assert ATTRIBUTION.cost_per_weighted_token(customer) == rate


def test_cost_per_weighted_token_without_any_tokens_is_zero():
    assert Attribution().cost_per_weighted_token() == 0
    assert Attribution().cost_per_weighted_token("c1") == 0


def test_cost_per_weighted_token_divides_to_80_digits():
    att = Attribution(cost={key("c1", "m1"): D("1.00")}, weighted_tokens={("c1", "m1"): D(3)})
    assert att.cost_per_weighted_token("c1") == THIRD
    assert att.cost_per_weighted_token() == THIRD


def task(customer: str, outcome: str, *attempts: tuple[int, int, int], usage=None) -> TaskRecord:
    return TaskRecord(customer, f"t-{customer}-{outcome}", outcome, H,
                      tuple(AttemptRecord(i + 1, 1, inp, cached, out) for i, (inp, cached, out) in enumerate(attempts)),
                      usage or {})


MODEL = CostModel(gpu_hour={"A": "1"}, prefill_weight="1", decode_weight="2", usage_unit_cost={"verification_runs": "0.05"})


def test_task_costs_weigh_uncached_input_and_output_at_the_customers_rate():
    tasks = [
        # attempt 1: (150 - 50 cached) + 2 x 50 = 200; attempt 2: 100 + 2 x 0 = 100; at c1's 0.01
        task("c1", "succeeded", (150, 50, 50), (100, 0, 0), usage={"verification_runs": D(2)}),
        task("c2", "failed", (100, 0, 0)),  # 100 at c2's 0.005
        task("c3", "succeeded", (0, 0, 50)),  # 100 at the platform's 0.007
    ]
    got = task_costs(tasks, ATTRIBUTION, MODEL)
    assert got == [
        TaskCost("c1", "t-c1-succeeded", "succeeded", 2, D("3.00"), D("2.00"), D(200), D("0.10")),
        TaskCost("c2", "t-c2-failed", "failed", 1, D("0.500"), D(0), D(0), D(0)),
        TaskCost("c3", "t-c3-succeeded", "succeeded", 1, D("0.700"), D(0), D(0), D(0)),
    ]
    assert all(isinstance(c.tool_cost, Decimal) for c in got)  # money is Decimal, with no usage too
    # (3.00 + 0.10 + 0.50 + 0.70) / 2 successes
    assert cost_per_successful_task(got) == D("2.15")


def test_task_costs_multiply_to_80_digits():
    att = Attribution(cost={key("c1", "m1"): D("1.00")}, weighted_tokens={("c1", "m1"): D(3)})
    (cost,) = task_costs([task("c1", "succeeded", (3, 0, 0))], att, MODEL)
    assert cost.attempts_cost == D("0." + "9" * 80)  # 3 x 0.333...


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        ([], None),
        (["failed", "abandoned"], None),  # no success: no cost per success
        (["succeeded"], D("1.00")),
        (["succeeded", "failed"], D("2.00")),  # the failed task's cost is carried by the success
        (["succeeded", "succeeded", "succeeded"], D("1.00")),
        (["succeeded", "succeeded", "failed"], D("1.50")),
        (["succeeded", "Succeeded"], D("2.00")),  # outcomes are exact words
    ],
)
def test_cost_per_successful_task(outcomes, expected):
    costs = [TaskCost("c1", f"t{i}", o, 1, D("0.90"), D(0), D(0), D("0.10")) for i, o in enumerate(outcomes)]
    assert cost_per_successful_task(costs) == expected
    assert cost_per_successful_task(iter(costs)) == expected  # any iterable, read once


def test_cost_per_successful_task_divides_to_80_digits():
    costs = [TaskCost("c1", f"t{i}", "succeeded", 1, D("1.00") if i == 0 else D(0), D(0), D(0), D(0))
             for i in range(3)]
    assert cost_per_successful_task(costs) == THIRD
