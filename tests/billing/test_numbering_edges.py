"""Invoice numbers at their edges: the first and last four-digit years and one past each, a prefix
of exactly the longest length, values of the wrong type refused as NumberingError (never a
TypeError), and the refusals of `parse_number` word for word."""

from __future__ import annotations

import re

import pytest

from billing.errors import NumberingError
from billing.numbering import InvoiceNumber, format_number, parse_number


@pytest.mark.parametrize(("year", "text"), [(1000, "INV-1000-000001"), (9999, "INV-9999-000001")])
def test_the_first_and_last_four_digit_years(year, text):
    assert format_number(year, 1) == text
    assert parse_number(text) == InvoiceNumber("INV", year, 1)


@pytest.mark.parametrize("year", [999, 10000])
def test_a_year_of_three_or_five_digits_is_refused(year):
    with pytest.raises(NumberingError, match=f"^invoice number year {year} must be a four-digit year$"):
        InvoiceNumber("INV", year, 1)


@pytest.mark.parametrize("year", ["2026", 2026.0, None])
def test_a_year_that_is_not_an_int_is_refused(year):
    with pytest.raises(NumberingError, match=re.escape(f"invoice number year {year!r} must be a four-digit year")):
        InvoiceNumber("INV", year, 1)


@pytest.mark.parametrize("seq", ["1", 1.0, None])
def test_a_sequence_that_is_not_an_int_is_refused(seq):
    with pytest.raises(NumberingError,
                       match=re.escape(f"invoice number sequence {seq!r} must be a whole number from 1")):
        InvoiceNumber("INV", 2026, seq)


def test_a_prefix_of_exactly_twenty_characters_is_allowed_and_twenty_one_is_not():
    twenty = "EDGE-" + "7" * 15
    assert len(twenty) == 20
    assert format_number(2026, 1, twenty) == twenty + "-2026-000001"
    with pytest.raises(NumberingError, match="at most 20 characters"):
        format_number(2026, 1, twenty + "7")


@pytest.mark.parametrize(
    ("text", "message"),
    [(123, "invoice number must be a string, got int"),
     (None, "invoice number must be a string, got NoneType"),
     ("INV-2026-0001234", "invoice number 'INV-2026-0001234' has a zero-padded sequence longer than 6 digits"),
     ("INV-2026-123", "invoice number 'INV-2026-123' is not of the form PREFIX-YYYY-NNNNNN (e.g. 'INV-2026-000123')")],
)
def test_parse_number_refusals_word_for_word(text, message):
    with pytest.raises(NumberingError, match=f"^{re.escape(message)}$"):
        parse_number(text)


@pytest.mark.parametrize("prefix", [["INV"], None, 7])
def test_a_prefix_that_is_not_a_string_is_refused_as_a_numbering_error(prefix):
    with pytest.raises(NumberingError, match=re.escape(f"issuer prefix {prefix!r} is not valid")):
        format_number(2026, 1, prefix)
