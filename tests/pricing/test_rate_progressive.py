"""`pricing.rating.rate_progressive` line by line, worked by hand: each line is the cumulative rating
minus the prior's (precise and rounded alike), a line whose quantity did not move is left out, and
the minimum lands on the final part only, computed over the whole period."""

from __future__ import annotations

from decimal import Decimal

import pytest

from pricing.book import price_book_from_data
from pricing.rating import line_id, rate, rate_progressive
from pricing.usage import Usage, UsageKey
from tests.pricing.helpers import T0, T1, T2

D = Decimal
OUT_M1 = UsageKey("output_tokens", model="m1")
OUT_M2 = UsageKey("output_tokens", model="m2")
REQ = UsageKey("requests", model="m1")

BOOK = price_book_from_data({
    "id": "prog", "currency": "USD", "minimum": "10.00",
    "charges": [
        {"meter": "output_tokens", "price": {"type": "unit", "amount": "3", "per": 1000}},  # 0.003 a token
        {"meter": "requests", "price": {"type": "unit", "amount": "0.50", "per": 1}},
    ],
})

PRIOR = Usage.build("c1", T0, T1, [(OUT_M1, D(1)), (REQ, D(4))])
WINDOW = Usage.build("c1", T1, T2, [(OUT_M1, D(1)), (OUT_M2, D(1000))])


def test_each_line_is_the_cumulative_rating_minus_the_prior():
    rating = rate_progressive(BOOK, PRIOR, WINDOW, final=False)
    assert (rating.book_id, rating.currency, rating.customer_id, rating.period_start, rating.period_end) == (
        "prog", "USD", "c1", T1, T2)
    rows = [(ln.line_id, ln.kind, ln.customer_id, ln.meter, ln.group, ln.quantity, ln.unit_price, ln.precise_amount,
             ln.amount) for ln in rating.lines]
    key = BOOK.charges[0].stable_key
    assert rows == [
        # m1: 2 tokens cost 0.006 -> 0.01, 1 token 0.003 -> 0.00: the line is 0.003 precise, 0.01 rounded
        (line_id(BOOK, "c1", key, "m1", T1, T2), "usage", "c1", "output_tokens", "m1", D(1), D("0.003"),
         D("0.003000000000"), D("0.01")),
        (line_id(BOOK, "c1", key, "m2", T1, T2), "usage", "c1", "output_tokens", "m2", D(1000), D("0.003"),
         D("3.000000000000"), D("3.00")),
        # the 4 requests of the prior did not move in the window: no line
    ]
    assert all(ln.charge_key == key for ln in rating.lines)


def test_the_final_part_tops_up_to_the_minimum_of_the_whole_period():
    rating = rate_progressive(BOOK, PRIOR, WINDOW, final=True)
    # the period's lines: 2 m1 tokens 0.01 + 1000 m2 tokens 3.00 + 4 requests 2.00 = 5.01; top-up 4.99
    top_up = rating.lines[-1]
    assert (top_up.line_id, top_up.kind, top_up.quantity, top_up.precise_amount, top_up.amount) == (
        line_id(BOOK, "c1", "minimum", "", T0, T2), "minimum", D(1), D("4.990000000000"), D("4.99"))
    first = rate_progressive(BOOK, PRIOR.empty_before(), PRIOR, final=False)
    assert first.total + rating.total == rate(BOOK, PRIOR.then(WINDOW)).total == D("10.00")


def test_a_first_part_after_the_empty_prior_is_the_windows_rating():
    rating = rate_progressive(BOOK, WINDOW.empty_before(), WINDOW, final=True)
    whole = rate(BOOK, WINDOW)
    assert rating.lines == whole.lines
    assert [(ln.kind, ln.amount) for ln in rating.lines] == [("usage", D("0.00")), ("usage", D("3.00")),
                                                             ("minimum", D("7.00"))]


@pytest.mark.parametrize(
    ("prior", "message"),
    [
        (Usage("c1", T0, T0, {}), "the empty prior must end where the window starts"),
        (Usage("c1", T2, T2, {}), "the empty prior must end where the window starts"),
        (Usage("c1", T0, T1 - (T1 - T0) / 2, {}), "periods are not adjacent"),
    ],
)
def test_a_prior_that_does_not_end_where_the_window_starts_is_refused(prior, message):
    with pytest.raises(ValueError) as err:
        rate_progressive(BOOK, prior, WINDOW, final=False)
    assert str(err.value) == message
