"""Invoice numbers: formatting, parsing, gaps."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from billing.errors import NumberingError
from billing.numbering import InvoiceNumber, format_number, gaps, parse_number


@pytest.mark.parametrize(
    ("args", "text"),
    [
        ((2026, 123), "INV-2026-000123"),
        ((2026, 1), "INV-2026-000001"),
        ((2026, 999_999), "INV-2026-999999"),
        ((2026, 1_234_567), "INV-2026-1234567"),  # past six digits the number just grows
        ((2027, 5, "ACME-EU"), "ACME-EU-2027-000005"),
    ],
)
def test_format_and_parse(args, text):
    assert format_number(*args) == text
    number = parse_number(text)
    assert (number.year, number.seq) == args[:2] and str(number) == text


@pytest.mark.parametrize(
    ("args", "message"),
    [((2026, 0), "from 1"), ((2026, -3), "from 1"), ((26, 1), "four-digit year"), ((2026, 1, "inv"), "upper-case"),
     ((2026, 1, "INV-"), "upper-case"), ((2026, 1, ""), "upper-case"), ((2026, 1, "A" * 21), "at most 20")],
)
def test_bad_numbers_are_refused(args, message):
    with pytest.raises(NumberingError, match=message):
        format_number(*args)


@pytest.mark.parametrize("text", ["INV-2026-123", "INV2026000123", "INV-26-000123", "inv-2026-000123",
                                  "INV-2026-0001234", "INV-2026-000123 ", "", "INV-2026-00012a"])
def test_bad_texts_are_refused(text):
    with pytest.raises(NumberingError):
        parse_number(text)


@given(year=st.integers(1000, 9999), seq=st.integers(1, 10**9), prefix=st.sampled_from(["INV", "CN", "ACME-EU", "X1"]))
def test_round_trip(year, seq, prefix):
    assert parse_number(format_number(year, seq, prefix)) == InvoiceNumber(prefix, year, seq)


def test_gaps():
    assert gaps(["INV-2026-000001", "INV-2026-000002", "INV-2027-000001"]) == []
    assert gaps(["INV-2026-000003", "INV-2026-000001", "CN-2026-000002"]) == [
        ("CN", 2026, 1), ("INV", 2026, 2),
    ]
    with pytest.raises(NumberingError, match="used twice"):
        gaps(["INV-2026-000001", "INV-2026-000001"])
