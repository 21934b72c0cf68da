"""A price book's refusals, word for word (the field's path and the reason a person can act on):
tiers that are missing, open before the last or closed at the end, a quantity that is no number,
and a book given as data without a file name."""

from __future__ import annotations

import pytest

from pricing.book import PriceBookError, price_book_from_data


def book_with(price: dict) -> dict:
    return {"id": "b", "currency": "USD", "charges": [{"meter": "requests", "price": price}]}


def problems(data: dict, source: str = "book.yaml") -> list[tuple[str, str]]:
    with pytest.raises(PriceBookError) as caught:
        price_book_from_data(data, source)
    return caught.value.problems


@pytest.mark.parametrize("kind", ["tiered_graduated", "tiered_volume"])
def test_tiers_are_needed(kind):
    assert problems(book_with({"type": kind, "tiers": []})) == [
        ("charges[0].price.tiers", "at least one tier is needed"),
    ]


@pytest.mark.parametrize(("open_at", "number"), [(0, 1), (1, 2)])
def test_only_the_last_tier_may_be_open_and_the_refusal_counts_tiers_from_one(open_at, number):
    tiers = [{"up_to": "10", "amount": "1"}, {"up_to": "20", "amount": "1"}, {"up_to": None, "amount": "1"}]
    tiers[open_at]["up_to"] = None
    assert problems(book_with({"type": "tiered_graduated", "tiers": tiers})) == [
        ("charges[0].price.tiers",
         f"tier {number} has up_to null but is not the last tier (only the last may be open)"),
    ]


def test_the_last_tier_must_be_open():
    tiers = [{"up_to": "10", "amount": "1"}, {"up_to": "20", "amount": "1"}]
    assert problems(book_with({"type": "tiered_volume", "tiers": tiers})) == [
        ("charges[0].price.tiers",
         "the last tier must have up_to null (it covers everything above the previous tier)"),
    ]


def test_a_quantity_that_is_no_number_is_named_a_quantity():
    assert problems(book_with({"type": "unit", "amount": "1", "per": "lots"})) == [
        ("charges[0].price.per", "quantity 'lots' is not a decimal number"),
    ]
    assert problems(book_with({"type": "unit", "amount": "cheap", "per": "1"})) == [
        ("charges[0].price.amount", "amount 'cheap' is not a decimal number"),
    ]


def test_a_book_given_as_data_without_a_name_is_called_the_price_book():
    with pytest.raises(PriceBookError) as caught:
        price_book_from_data(book_with({"type": "unit", "amount": "1", "per": "lots"}))
    assert str(caught.value) == "<price book>: charges[0].price.per: quantity 'lots' is not a decimal number"
