"""A bad price book gets a clear error naming the file, the field and the reason."""

from __future__ import annotations

from decimal import Decimal

import pytest

from pricing.book import PriceBookError, parse_price_book

HEAD = "id: bad\ncurrency: USD\ncharges:\n"


def problem(text: str) -> str:
    with pytest.raises(PriceBookError) as info:
        parse_price_book(text, "books/bad.yaml")
    message = str(info.value)
    assert message.startswith("books/bad.yaml: ")
    return message


def test_unknown_meter():
    msg = problem(HEAD + '  - meter: output_token\n    price: {type: unit, amount: "1", per: 1}\n')
    assert "charges[0].meter: unknown meter 'output_token'" in msg


def test_unordered_tiers():
    msg = problem(
        HEAD + "  - meter: requests\n    price: {type: tiered_graduated, tiers: "
        '[{up_to: 1000, amount: "1"}, {up_to: 500, amount: "2"}, {up_to: null, amount: "3"}]}\n'
    )
    assert "charges[0].price.tiers:" in msg
    assert "tiers overlap or are out of order: tier 2 up_to 500 is not above tier 1 up_to 1000" in msg


def test_overlapping_equal_tiers():
    msg = problem(
        HEAD + "  - meter: requests\n    price: {type: tiered_volume, tiers: "
        '[{up_to: 1000, amount: "1"}, {up_to: 1000, amount: "2"}, {up_to: null, amount: "3"}]}\n'
    )
    assert "overlap or are out of order" in msg


def test_open_tier_must_be_last():
    msg = problem(
        HEAD + "  - meter: requests\n    price: {type: tiered_volume, tiers: "
        '[{up_to: null, amount: "1"}, {up_to: 1000, amount: "2"}]}\n'
    )
    assert "only the last may be open" in msg


def test_float_looking_amount_with_too_much_precision():
    msg = problem(HEAD + "  - meter: requests\n    price: {type: unit, amount: 0.0000000000001, per: 1}\n")
    assert "charges[0].price.amount: amount" in msg
    assert "more than 12 decimal places" in msg


def test_bare_yaml_float_is_taken_from_its_source_text():
    # 0.1 has no exact binary float; the book keeps exactly the digits written.
    book = parse_price_book(HEAD + "  - meter: requests\n    price: {type: unit, amount: 0.1, per: 3}\n", "f.yaml")
    assert book.charges[0].price.amount == Decimal("0.1")
    assert str(book.charges[0].price.amount) == "0.1"


def test_python_float_is_refused():
    from pricing.book import price_book_from_data

    with pytest.raises(PriceBookError, match="binary float"):
        price_book_from_data(
            {"id": "x", "currency": "USD", "charges": [{"meter": "requests", "price": {"type": "unit", "amount": 0.1, "per": 1}}]},
            "dict",
        )


def test_missing_per():
    msg = problem(HEAD + '  - meter: requests\n    price: {type: unit, amount: "0.10"}\n')
    assert "charges[0].price.per: required field is missing" in msg


def test_unknown_currency():
    msg = problem('id: bad\ncurrency: XYZ\ncharges:\n  - meter: requests\n    price: {type: flat, amount: "1"}\n')
    assert "currency: unknown currency 'XYZ'" in msg


def test_unknown_price_type_and_field():
    msg = problem(HEAD + '  - meter: requests\n    price: {type: stairs, amount: "1"}\n')
    assert "charges[0].price: unknown price type" in msg
    msg = problem(HEAD + '  - meter: requests\n    colour: red\n    price: {type: flat, amount: "1"}\n')
    assert "charges[0].colour: unknown field" in msg


def test_selector_that_does_not_fit_the_meter():
    msg = problem(HEAD + '  - meter: successful_tasks\n    model: m\n    price: {type: flat, amount: "1"}\n')
    assert "`model` only applies to" in msg


def test_duplicate_charge():
    msg = problem(
        HEAD + '  - meter: requests\n    price: {type: flat, amount: "1"}\n'
        '  - meter: requests\n    price: {type: flat, amount: "2"}\n'
    )
    assert "charges[1] duplicates charges[0]" in msg


def test_every_problem_is_listed():
    with pytest.raises(PriceBookError) as info:
        parse_price_book('id: bad\ncurrency: XYZ\ncharges:\n  - meter: nope\n    price: {type: flat, amount: "1"}\n', "b.yaml")
    assert len(info.value.problems) == 2


def test_not_yaml():
    assert "not valid YAML" in problem("id: [unclosed\n")


@pytest.mark.parametrize("name", ["per-token.yaml", "gpu-hour.yaml", "per-task.yaml"])
def test_every_example_book_round_trips_through_its_stored_form(name):
    """The store keeps price_book_to_data's output; the per-task book's open last tier (up_to null)
    once came back without up_to and failed to load."""
    from pathlib import Path

    from pricing.book import parse_price_book, price_book_from_data, price_book_to_data

    path = Path(__file__).resolve().parents[2] / "pricing_books" / name
    book = parse_price_book(path.read_text(), str(path))
    assert price_book_from_data(price_book_to_data(book), "stored") == book
