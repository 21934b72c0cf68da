"""The small readers of pricing's values that the adapters use (a line as JSON, a rating's amounts by
meter, a dataset's customers, minor units, trusted sources) and the cost model's edge cases."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from pricing.anatomy import FailureRow, Failures, grew_most
from pricing.book import PriceBookError, parse_price_book
from pricing.cost import (
    Attribution,
    CostKey,
    CostModelError,
    cost_model_from_data,
    parse_cost_model,
    split_amount,
)
from pricing.money import EXACT, Currency
from pricing.rating import rate
from pricing.records import Dataset, GpuRecord, MeterRecord, RequestRecord, TaskRecord
from pricing.task_outcomes import tasks_from_rows
from pricing.usage import Usage, UsageKey
from tests.pricing.helpers import T0, T2
from tests.pricing.test_rating import ISSUE_BOOK, usage
from tests.pricing.test_task_outcomes import trust

D = Decimal
H0 = datetime(2026, 11, 2, tzinfo=UTC)


def issue_rating():
    return rate(parse_price_book(ISSUE_BOOK), usage([
        (("output_tokens", "small"), 1_000_000),  # 0.80
        (("output_tokens", "big-model"), 1_000_000),  # 2.40
        (("uncached_input_tokens", "small"), 5_000_000),  # 1.00
    ]))


def test_a_line_as_json_keeps_decimals_as_strings():
    rating = issue_rating()
    line = next(x for x in rating.lines if x.charge_key == "output_tokens;model=big-model")
    assert line.to_dict() == {
        "line_id": line.line_id, "kind": "usage", "customer_id": "c1", "charge": "output_tokens;model=big-model",
        "meter": "output_tokens", "group": "big-model", "quantity": "1000000", "unit_price": "0.000002400000",
        "precise_amount": "2.400000000000", "amount": "2.40", "project": None,
    }
    minimum = next(x for x in rating.lines if x.kind == "minimum")
    assert minimum.to_dict()["unit_price"] is None and minimum.to_dict()["amount"] == "95.80"


def test_amounts_by_meter_and_group_count_usage_lines_only():
    rating = issue_rating()
    assert rating.total == D("100.00") and rating.usage_total == D("4.20")
    assert rating.amount_by() == D("4.20")  # the minimum top-up is not usage
    assert rating.amount_by(meter="output_tokens") == D("3.20")
    assert rating.amount_by(group="small") == D("1.80")
    assert rating.amount_by(meter="output_tokens", group="small") == D("0.80")
    assert rating.amount_by(meter="requests") == 0


def test_a_datasets_customers_come_from_every_record_but_the_shared_pool():
    dataset = Dataset(
        H0, T2,
        requests=(RequestRecord("r", "m", "d", H0, 1, 10, 2, 3),),
        gpu=(GpuRecord("", "pool", "H100", H0, 1000), GpuRecord("g", "ded", "H100", H0, 1000)),
        tasks=(TaskRecord("t", "task", "succeeded", H0),),
        meters=(MeterRecord("m", "usage:x", H0, D(1)),),
    )
    assert dataset.customers() == ["g", "m", "r", "t"]
    assert dataset.requests[0].uncached_input_tokens == 8
    assert dataset.gpu[0].gpu_seconds == D("1.000")
    assert dataset.tasks[0].last_attempt == 0


@pytest.mark.parametrize(("currency", "amount", "minor"), [("USD", "12.34", 1234), ("USD", "0.005", 1),
                                                           ("JPY", "2.5", 3), ("BHD", "1.2345", 1235)])
def test_currency_minor_units_round_half_up_first(currency, amount, minor):
    money = Currency.of(currency)
    assert money.to_minor_units(D(amount)) == minor
    assert money.minor_unit == D(1).scaleb(-money.minor_units)


def test_a_trusted_source_is_one_of_the_prefixes():
    t = trust()
    assert t.trusts("//verifier/checks") and t.trusts("infermeter://gateway/gw-1")
    assert not t.trusts("//customer/acme") and not t.trusts("//verifier")


def test_rows_keep_each_reports_fields():
    (task,) = tasks_from_rows([("acme", "a", T0, None, "//v/", "e7", "failed", T2)])
    assert task.attempts == 0  # no attempts recorded
    assert [tuple(r) for r in task.reports] == [("//v/", "e7", "failed", T2)]


# ---------------------------------------------------------------- the cost model's edges


def test_cost_model_errors_name_the_source_and_the_field():
    with pytest.raises(CostModelError, match=r"^<cost model>: \(top level\): "):
        parse_cost_model("- a list")
    with pytest.raises(CostModelError, match=r"^models/c.yaml: gpu_hour: required field is missing$"):
        parse_cost_model("currency: USD", "models/c.yaml")
    with pytest.raises(CostModelError, match=r"^c.yaml: not valid YAML: "):
        parse_cost_model("a: [", "c.yaml")
    with pytest.raises(CostModelError) as caught:
        parse_cost_model("gpu_hour: {H100: x}\nprefill_weight: -1", "c.yaml")
    assert str(caught.value).count("\n") == 1 and str(caught.value).startswith("c.yaml: gpu_hour.H100: ")
    assert cost_model_from_data({"gpu_hour": {"H100": "4"}}).gpu_hour_cost("H100") == D(4)


def test_split_amount_needs_a_whole_number_of_quanta():
    assert split_amount(D("1.00"), [1, 1, 1], D("0.01")) == [D("0.34"), D("0.33"), D("0.33")]
    with pytest.raises(ValueError, match=r"^1.005 is not a multiple of 0.01$"):
        split_amount(D("1.005"), [1], D("0.01"))


def test_cost_per_request_of_a_pair_without_requests_is_zero_and_otherwise_exact_to_80_digits():
    att = Attribution()
    assert att.cost_per_request("nobody", "m") == 0
    att.cost[CostKey("a", "m", "d", "H100", H0)] = D(1)
    att.requests[("a", "m")] = 3
    assert att.cost_per_request("a", "m") == EXACT.divide(D(1), D(3))  # 80 digits, not the default 28


# ---------------------------------------------------------------- which failure cause grew most


def failures_of(**costs):
    return Failures("USD", tuple(FailureRow(cause, "failure", "m", "c", D(cost), 7) for cause, cost in costs.items()))


@pytest.mark.parametrize(
    ("now", "before", "grew"),
    [
        ({"runtime": "1.00", "client": "3.00"}, {"runtime": "0.50", "client": "1.00"}, ("client", D("2.00"))),
        ({"runtime": "2.00", "client": "2.00"}, {}, ("runtime", D("2.00"))),  # a tie: the earlier cause
        ({"routing": "0.01"}, {}, ("routing", D("0.01"))),  # the smallest growth still counts
        ({"runtime": "1.00"}, {"runtime": "1.00"}, None),  # nothing grew
        ({"runtime": "0.50"}, {"runtime": "1.00"}, None),  # it shrank
    ],
)
def test_the_cause_that_grew_most(now, before, grew):
    assert grew_most(failures_of(**now), failures_of(**before)) == grew


# ---------------------------------------------------------------- YAML numbers, exactly


def test_yaml_floats_are_read_from_their_text():
    book = parse_price_book('id: y\ncurrency: USD\ncharges:\n  - meter: requests\n'
                            '    price: {type: unit, amount: 1_000.000_5, per: 1}\n')
    assert book.charges[0].price.amount == D("1000.0005")


@pytest.mark.parametrize("text", [".inf", "-.inf", ".nan", "190:20:30.15"])
def test_yaml_floats_that_are_not_finite_decimals_are_refused_with_their_line(text):
    with pytest.raises(PriceBookError) as caught:
        parse_price_book(f"id: y\ncurrency: USD\ncharges:\n  - meter: requests\n    price: {{type: unit, amount: {text}, per: 1}}\n",
                         "books/y.yaml")
    message = str(caught.value)
    assert message.startswith("books/y.yaml: (top level): not valid YAML: ")
    assert f"{text.replace('_', '')!r} is not a finite decimal number" in message
    assert "line 5, column 33" in message  # the mark of the number itself


def test_a_usage_total_is_a_decimal_even_when_nothing_was_used():
    assert usage([]).total("requests") == 0 and type(usage([]).total("requests")) is D


def test_trusted_usage_keeps_what_it_is_given():
    quantities = {UsageKey("requests", "m"): 3}
    trusted = Usage.trusted("c1", T0, T2, quantities)
    assert (trusted.customer_id, trusted.period_start, trusted.period_end) == ("c1", T0, T2)
    assert trusted.quantities is quantities


def test_an_empty_ratings_amounts_are_decimal_zero():
    empty = rate(parse_price_book(ISSUE_BOOK).model_copy(update={"minimum": None}), usage([]))
    assert empty.lines == ()
    for value in (empty.total, empty.usage_total, empty.amount_by()):
        assert value == 0 and type(value) is D


def test_usage_sums_quantities_beyond_28_digits_exactly():
    # 33 significant digits: the default decimal context (28) would round the sum and the total.
    half = Decimal("6172839450617283945.061728394506")
    key = UsageKey("input_tokens", model="m")
    built = Usage.build("c", T0, T2, [(key, half), (key, half), (UsageKey("output_tokens", model="m"), 1)])
    assert built.quantities[key] == Decimal("12345678901234567890.123456789012")
    assert built.total("input_tokens") == Decimal("12345678901234567890.123456789012")
    assert built.then(Usage("c", T2, T2, {})).quantities[key] == Decimal("12345678901234567890.123456789012")
