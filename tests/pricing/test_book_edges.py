"""Price books at their edges: the shortest task timeout, durations written as strings, every error
text as a person reads it (source, field path, reason), and the stored form's decimal strings."""

from __future__ import annotations

from decimal import Decimal

import pytest

from pricing.book import PriceBookError, parse_price_book, price_book_from_data, price_book_to_data
from pricing.cost import CostModelError, parse_cost_model

BOOK = """
id: t
currency: USD
charges:
  - meter: successful_tasks
    price: {type: unit, amount: "0.20", per: 1}
task_outcomes:
  trusted_sources: ["//verifier/"]
  task_timeout: TIMEOUT
  untrusted_outcome: not_billed
"""


def timeout_of(text: str) -> int:
    return parse_price_book(BOOK.replace("TIMEOUT", text)).task_outcomes.task_timeout


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1", 1), ('"1"', 1), ("1s", 1), ('"3600"', 3600), ("90m", 5400), ("24h", 86400), ("2d", 172800)],
)
def test_task_timeouts_from_one_second_on(text, seconds):
    assert timeout_of(text) == seconds


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("0", "a task timeout must be longer than zero"),
        ("0s", "a task timeout must be longer than zero"),
        ("-1", "a task timeout must be longer than zero"),
        ("true", "a duration is a number of seconds or a string such as '24h', '90m', '3600s', '2d'"),
        ("xh", "'xh' is not a duration: give seconds or a string such as '24h', '90m', '3600s', '2d'"),
        ("4ah", "'4ah' is not a duration: give seconds or a string such as '24h', '90m', '3600s', '2d'"),
        ("h", "'h' is not a duration: give seconds or a string such as '24h', '90m', '3600s', '2d'"),
        ("24w", "'24w' is not a duration: give seconds or a string such as '24h', '90m', '3600s', '2d'"),
    ],
)
def test_bad_task_timeouts_say_what_a_duration_is(text, reason):
    with pytest.raises(PriceBookError) as caught:
        parse_price_book(BOOK.replace("TIMEOUT", text), "books/t.yaml")
    assert str(caught.value) == f"books/t.yaml: task_outcomes.task_timeout: {reason}"


def test_a_price_book_error_keeps_its_source_and_problems():
    with pytest.raises(PriceBookError) as caught:
        price_book_from_data({"id": "x", "charges": [{"meter": "nope", "price": {"amount": "1"}}]}, "books/x.yaml")
    error = caught.value
    assert error.source == "books/x.yaml"
    assert str(error).split("\n") == [f"books/x.yaml: {path}: {reason}" for path, reason in error.problems]
    assert error.problems == [
        ("currency", "required field is missing"),
        ("charges[0].meter", "unknown meter 'nope': expected one of uncached_input_tokens, cached_input_tokens, "
                             "output_tokens, requests, gpu_seconds, successful_tasks, failed_tasks, task_attempts "
                             "or 'usage:<name>' for an infermeter.usage.v1 meter"),
        ("charges[0].price", "price needs a `type`: one of unit, tiered_graduated, tiered_volume, package, flat"),
    ]
    with pytest.raises(PriceBookError) as caught:
        price_book_from_data([], "books/y.yaml")
    assert str(caught.value) == "books/y.yaml: (top level): a price book is a mapping with id, currency and charges"


def test_an_unknown_price_type_lists_the_known_ones():
    with pytest.raises(PriceBookError) as caught:
        price_book_from_data({"id": "x", "currency": "USD",
                              "charges": [{"meter": "requests", "price": {"type": "per_minute", "amount": "1"}}]})
    assert caught.value.problems == [
        ("charges[0].price", "unknown price type; expected one of unit, tiered_graduated, tiered_volume, package, flat")
    ]


def test_a_price_types_name_is_left_out_of_the_path_only_after_price():
    with pytest.raises(PriceBookError) as caught:
        price_book_from_data({"id": "x", "currency": "USD",
                              "charges": [{"meter": "requests", "price": {"type": "unit", "amount": "x", "per": 1}}]})
    assert [path for path, _ in caught.value.problems] == ["charges[0].price.amount"]
    with pytest.raises(CostModelError, match=r"^c.yaml: gpu_hour.flat: "):  # a key named like a price type
        parse_cost_model("gpu_hour: {flat: x}", "c.yaml")


def test_the_stored_form_writes_amounts_as_decimal_strings():
    book = parse_price_book(BOOK.replace("TIMEOUT", "24h"))
    data = price_book_to_data(book)
    assert data["charges"][0]["price"] == {"type": "unit", "amount": "0.20", "per": "1"}
    assert data["minimum"] is None and data["task_outcomes"]["task_timeout"] == 86400
    assert price_book_from_data(data) == book
    assert isinstance(book.charges[0].price.amount, Decimal)


def test_a_book_without_a_named_source_is_called_price_book_in_errors():
    with pytest.raises(PriceBookError, match=r"^<price book>: \(top level\): a price book is a mapping"):
        parse_price_book("- a list")
