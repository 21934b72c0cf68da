"""The small pure helpers of `pricing.experiments`, table-driven with hand-worked values: the spread
of margins (`stdev`), quantities as reports print them (`quantity_text`), usage without a share of
its GPU time or tokens (`usage_without`, `_keep_shares`) and usage without retried attempts
(`without_retries`)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from pricing.anatomy import Part
from pricing.cost import Attribution, TaskCost
from pricing.experiments import _keep_shares, quantity_text, stdev, usage_without, without_retries
from pricing.money import EXACT
from pricing.usage import Usage, UsageKey
from tests.pricing.helpers import T0, T2

D = Decimal
H = datetime(2026, 11, 1, 5, tzinfo=UTC)


# ---------------------------------------------------------------- stdev


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], "0"),
        ([D("7.5")], "0"),  # one value: no spread (the len < 2 edge)
        ([D(1), D(3)], "1.000000000000"),  # two values, the smallest that spread: mean 2, variance 1
        ([D(1), D(2)], "0.500000000000"),  # variance 0.25
        ([D(-1), D(1)], "1.000000000000"),  # a loss and a gain
        ([D(0), D(0), D(3)], "1.414213562373"),  # mean 1, variance (1 + 1 + 4) / 3 = 2, sqrt 2 = 1.41421356237309...
        ([D(2), D(4), D(4), D(4), D(5), D(5), D(7), D(9)], "2.000000000000"),
        ([D("0.01"), D("0.01"), D("0.01")], "0E-12"),  # no spread
        ([D("0.000000000001"), D("0.000000000002")], "1E-12"),  # 0.5e-12 rounds half-up to 1e-12
    ],
)
def test_stdev_is_the_population_standard_deviation_at_the_project_scale(values, expected):
    result = stdev(values)
    assert isinstance(result, Decimal)
    assert str(result) == expected


def test_stdev_of_large_margins_keeps_every_digit():
    # mean 0, deviations of 32 significant digits (the default context keeps 28): their square has 64
    big = D("12345678901234567890.123456789012")
    assert stdev([D("-12345678901234567890.123456789012"), big]) == big


# ---------------------------------------------------------------- quantity_text


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (D("172800.000000000000"), "172800"),  # not 1.728E+5
        (D("172800"), "172800"),
        (3, "3"),
        (0, "0"),
        (D("0E-12"), "0"),
        (D("1.500000000000"), "1.5"),
        (D("0.000000000001"), "1E-12"),
        (D("0.0000000000005"), "1E-12"),  # half a quantum rounds up
        (D("0.00000000000049"), "0"),  # just under half: down to 0
        (D("2.9999999999995"), "3"),  # rounds up to a whole number
        (D("10.10"), "10.1"),
    ],
)
def test_quantity_text_drops_trailing_zeros(value, expected):
    assert str(quantity_text(value)) == expected


# ---------------------------------------------------------------- usage_without

GPU_D1 = UsageKey("gpu_seconds", deployment="d1", gpu_type="a100")
GPU_D2 = UsageKey("gpu_seconds", deployment="d2", gpu_type="a100")
IN_M1 = UsageKey("uncached_input_tokens", model="m1")
CACHED_M1 = UsageKey("cached_input_tokens", model="m1")
OUT_M1 = UsageKey("output_tokens", model="m1")
REQ_M1 = UsageKey("requests", model="m1")
OUT_M2 = UsageKey("output_tokens", model="m2")
TASKS = UsageKey("successful_tasks")
ATTEMPTS = UsageKey("task_attempts")


def usage(quantities: dict[UsageKey, str | int]) -> Usage:
    return Usage.build("c1", T0, T2, [(k, D(v)) for k, v in quantities.items()])


def test_usage_without_scales_gpu_time_by_deployment_and_request_meters_by_model():
    before = usage({GPU_D1: "100", GPU_D2: "40", IN_M1: 1000, CACHED_M1: 300, OUT_M1: 200, REQ_M1: 4,
                    OUT_M2: 10, TASKS: 5})
    after = usage_without(before, {"d1": D("0.25")}, {"m1": D("0.5")})
    assert after.customer_id == "c1" and after.period_start == T0 and after.period_end == T2
    assert after.quantities == {
        GPU_D1: D(25),  # 100 x 0.25
        GPU_D2: D(40),  # no share given for d2: all kept
        IN_M1: D(500), CACHED_M1: D(150), OUT_M1: D(100), REQ_M1: D(2),  # every request meter of m1 halved
        OUT_M2: D(10),  # m2 not given
        TASKS: D(5),  # a task meter is neither GPU time nor a request meter
    }


def test_usage_without_keeps_gpu_shares_to_gpu_time_and_model_shares_to_request_meters():
    # a deployment named like the model, and a model named like the deployment: each share applies to its own kind
    before = usage({UsageKey("gpu_seconds", model="x", deployment="y"): 10,
                    UsageKey("output_tokens", model="y", deployment="x"): 10})
    after = usage_without(before, {"x": D(0), "y": D("0.5")}, {"x": D(0), "y": D("0.1")})
    assert after.quantities == {
        UsageKey("gpu_seconds", model="x", deployment="y"): D(5),
        UsageKey("output_tokens", model="y", deployment="x"): D(1),
    }


def test_usage_without_rounds_to_the_project_scale_and_drops_what_is_gone():
    before = usage({GPU_D1: 1, OUT_M1: 7, OUT_M2: 3})
    after = usage_without(before, {"d1": D(1) / D(3)}, {"m1": D(0)})
    assert after.quantities == {GPU_D1: D("0.333333333333"), OUT_M2: D(3)}  # m1's 0 tokens are no line


def test_usage_without_keeps_every_digit_of_large_quantities():
    # half of 2000000000000000.000000000001 has 29 significant digits; in the default context's 28 it
    # would round half-even to ...000, at the project scale it rounds half-up to ...001
    big = "2000000000000000.000000000001"
    after = usage_without(usage({GPU_D1: big, OUT_M1: big}), {"d1": D("0.5")}, {"m1": D("0.5")})
    assert after.quantities == {GPU_D1: D("1000000000000000.000000000001"),
                                OUT_M1: D("1000000000000000.000000000001")}


def test_usage_without_nothing_taken_is_the_same_usage():
    before = usage({GPU_D1: "1.5", OUT_M1: 7})
    assert usage_without(before, {}, {}).quantities == before.quantities


# ---------------------------------------------------------------- _keep_shares


def part(customer, model, deployment, term, amount) -> Part:
    return Part(customer, model, deployment, H, term, "", D(amount), 1)


C1_D1_IDLE_KEPT = EXACT.subtract(1, EXACT.divide(2, 13))  # 1 - 2/13, to 80 digits

KEEP_PARTS = [
    part("c1", "m1", "d1", "new_compute", "6"),
    part("c1", "m1", "d1", "failure", "2"),
    part("c1", "", "d1", "queue_and_idle", "2"),
    part("c1", "m2", "d1", "context_not_reused", "3"),
    part("c1", "m2", "d2", "kv_cache", "5"),  # not a token term
    part("c2", "m1", "d1", "new_compute", "4"),
    part("c3", "m1", "d3", "kv_cache", "0"),  # nothing to share: no entry
    part("c3", "m3", "d3", "new_compute", "0"),
]


@pytest.mark.parametrize(
    ("term", "by", "expected"),
    [
        # c1 on d1: 6 + 2 + 2 + 3 = 13 of GPU cost; d2: 5
        ("queue_and_idle", "deployment",
         {"c1": {"d1": C1_D1_IDLE_KEPT, "d2": D(1)}, "c2": {"d1": D(1)}}),
        ("failure", "deployment",
         {"c1": {"d1": C1_D1_IDLE_KEPT, "d2": D(1)}, "c2": {"d1": D(1)}}),
        # by model only the token terms count: c1/m1 = 6 + 2 (failure), c1/m2 = 3 (kv_cache is no token term)
        ("failure", "model", {"c1": {"m1": D("0.75"), "m2": D(1)}, "c2": {"m1": D(1)}}),
        ("new_compute", "model", {"c1": {"m1": D("0.25"), "m2": D(1)}, "c2": {"m1": D(0)}}),
        ("context_not_reused", "model", {"c1": {"m1": D(1), "m2": D(0)}, "c2": {"m1": D(1)}}),
        ("queue_and_idle", "model", {"c1": {"m1": D(1), "m2": D(1)}, "c2": {"m1": D(1)}}),
    ],
)
def test_keep_shares_is_one_minus_the_terms_share(term, by, expected):
    got = _keep_shares(KEEP_PARTS, term, by)
    assert {c: dict(v) for c, v in got.items()} == expected


def test_keep_shares_divides_exactly():
    parts = [part("c1", "m1", "d1", "new_compute", "1"), part("c1", "m1", "d1", "failure", "0.000000000000000000000000000002")]
    got = _keep_shares(parts, "failure", "deployment")
    # 1 - 2e-30 / 1.000000000000000000000000000002: in the default context's 28 digits that is 1
    assert D("0.999999999999999999999999999997") < got["c1"]["d1"] < D(1)


def test_keep_shares_adds_up_every_part_of_the_term():
    parts = [part("c1", "m1", "d1", "failure", "1"), part("c1", "m1", "d1", "failure", "2"),
             part("c1", "m1", "d1", "new_compute", "5")]
    assert _keep_shares(parts, "failure", "deployment") == {"c1": {"d1": D("0.625")}}  # 1 - 3/8
    assert _keep_shares(parts, "failure", "model") == {"c1": {"m1": D("0.625")}}


def test_keep_shares_of_no_parts_is_empty():
    assert _keep_shares([], "failure", "model") == {}


# ---------------------------------------------------------------- without_retries


def task_cost(attempts: int, retried_w: str, customer="c1") -> TaskCost:
    return TaskCost(customer, f"t{attempts}", "succeeded", attempts, D(0), D(0), D(retried_w), D(0))


def test_without_retries_takes_the_retried_share_off_request_meters_and_gpu_time():
    before = usage({GPU_D1: "100", IN_M1: 1000, CACHED_M1: 400, OUT_M1: 200, REQ_M1: 10, OUT_M2: 50,
                    TASKS: 3, ATTEMPTS: 7})
    # retried weighted tokens 100 + 50 = 150 of 600: a quarter goes
    retried = [task_cost(3, "100"), task_cost(2, "50")]
    after = without_retries(before, retried, Attribution(), {"m1": D(400), "m2": D(200)})
    assert (after.customer_id, after.period_start, after.period_end) == ("c1", T0, T2)
    assert after.quantities == {
        GPU_D1: D(75), IN_M1: D(750), CACHED_M1: D(300), OUT_M1: D(150), REQ_M1: D("7.5"), OUT_M2: D("37.5"),
        TASKS: D(3),  # not a request meter
        ATTEMPTS: D(4),  # 7 - (3 - 1) - (2 - 1)
    }


def test_without_retries_counts_only_the_attempts_beyond_the_first():
    before = usage({OUT_M1: 100, ATTEMPTS: 5})
    # a task of one attempt, or of none recorded, in the list (its retried tokens 0) takes no attempt off
    retried = [task_cost(1, "0"), task_cost(0, "0"), task_cost(2, "10")]
    after = without_retries(before, retried, Attribution(), {"m1": D(100)})
    assert after.quantities == {OUT_M1: D(90), ATTEMPTS: D(4)}


@pytest.mark.parametrize(
    ("retried_w", "total_w", "attempts", "expected"),
    [
        ("100", "100", 2, {ATTEMPTS: D(8)}),  # everything retried: keep 0, no token line left
        ("150", "100", 2, {ATTEMPTS: D(8)}),  # more retried than weighted: keep never below 0
        ("99.999999999999", "100", 2, {OUT_M1: D("0.000000000001"), ATTEMPTS: D(8)}),  # a smallest step short of all
        ("1", "3", 9, {OUT_M1: D("66.666666666667"), ATTEMPTS: D(1)}),  # two thirds kept, half-up at 12 places
    ],
)
def test_without_retries_edges(retried_w, total_w, attempts, expected):
    before = usage({OUT_M1: 100, ATTEMPTS: 9})
    after = without_retries(before, [task_cost(attempts, retried_w)], Attribution(), {"m1": D(total_w)})
    assert after.quantities == expected


def test_without_retries_attempts_never_go_below_zero():
    before = usage({OUT_M1: 100, ATTEMPTS: 1})
    after = without_retries(before, [task_cost(4, "10")], Attribution(), {"m1": D(100)})
    assert after.quantities == {OUT_M1: D(90)}  # 1 - 3 attempts: 0, no line


@pytest.mark.parametrize(
    ("retried", "weights"),
    [
        ([], {"m1": D(100)}),  # nothing retried
        ([task_cost(2, "0")], {"m1": D(100)}),  # retried attempts without weighted tokens
        ([task_cost(2, "10")], {}),  # no weighted tokens at all
        ([task_cost(2, "10")], {"m1": D(0)}),
    ],
)
def test_without_retries_returns_the_usage_itself_when_there_is_nothing_to_take(retried, weights):
    before = usage({OUT_M1: 100, ATTEMPTS: 5})
    assert without_retries(before, retried, Attribution(), weights) is before


def test_without_retries_keeps_every_digit_of_large_quantities():
    big = "2000000000000000.000000000001"  # half of it: 29 significant digits (see usage_without's test)
    after = without_retries(usage({OUT_M1: big}), [task_cost(2, "1")], Attribution(), {"m1": D(2)})
    assert after.quantities == {OUT_M1: D("1000000000000000.000000000001")}


def test_without_retries_sums_every_model_weight():
    before = usage({OUT_M1: 100})
    # 10 retried of 10 + 30 = 40 weighted tokens: a quarter goes, not all of it
    after = without_retries(before, [task_cost(2, "10")], Attribution(), {"m1": D(10), "m2": D(30)})
    assert after.quantities == {OUT_M1: D(75)}
