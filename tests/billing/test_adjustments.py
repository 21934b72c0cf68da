"""Late usage of a finalized period: adjustment lines make every invoice of the period add up to its
rating exactly, and reruns add nothing."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from datetime import timedelta
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from billing.errors import InvoiceError
from billing.invoice import InvoiceStatus, adjustment_line_id, invoice_id
from billing.invoice.adjustments import adjustment_lines, invoiced_lines
from billing.invoice.drafts import add_lines, draft_from_rating, empty_draft
from billing.invoice.states import finalize, void
from billing.numbering import format_number
from pricing.book import price_book_from_data
from pricing.rating import rate
from pricing.usage import Usage, UsageKey
from tests.billing.helpers import BOOK, NEXT, PERIOD, ROWS, T_FINAL, rating
from tests.examples import examples

D = Decimal


def regular_invoice(rows, book=BOOK, seq=1, period=PERIOD, at=T_FINAL):
    invoice = draft_from_rating(rating(rows, period=period, book=book), period, price_book_version="v1")
    return finalize(invoice, number=format_number(2026, seq), at=at)


def by_rated_line(lines):
    out = defaultdict(lambda: [D(0), D(0), D(0)])
    for line in lines:
        row = out[line.rated_line_id]
        row[0] += line.quantity
        row[1] += line.precise_amount
        row[2] += line.amount
    return {k: tuple(v) for k, v in out.items() if any(v)}


def test_late_usage_lands_on_the_next_invoice_naming_its_period():
    february = regular_invoice(ROWS)
    late = [*ROWS, (("output_tokens", "big"), 1_000_000), (("requests",), 5)]
    rated_now = rating(late)
    march = draft_from_rating(rating(ROWS, period=NEXT), NEXT, price_book_version="v1")
    adjustments = adjustment_lines(rated_now, invoiced_lines([february], "2026-02"), period=PERIOD,
                                   target_invoice_id=march.id)
    assert len(adjustments) == 1
    (line,) = adjustments
    assert line.period == "2026-02" and line.service_period_start == PERIOD.start
    assert line.quantity == 1_000_000 and line.amount == D("2.40") and line.meter == "output_tokens"
    assert line.rated_line_id == february.lines[2].id and line.id == adjustment_line_id(line.rated_line_id, march.id)
    assert line.is_adjustment and not february.lines[2].is_adjustment
    march = add_lines(march, adjustments)
    assert march.subtotal == rating(ROWS, period=NEXT).total + D("2.40")
    # a rerun before March is finalized gives the same lines (same ids: the adapter upserts)
    assert adjustment_lines(rated_now, invoiced_lines([february, march], "2026-02"), period=PERIOD,
                            target_invoice_id=march.id) == adjustments
    # once March is finalized its February lines count as invoiced: a rerun gives nothing
    march = finalize(march, number=format_number(2026, 2), at=T_FINAL + timedelta(days=31))
    assert adjustment_lines(rated_now, invoiced_lines([february, march], "2026-02"), period=PERIOD,
                            target_invoice_id=invoice_id("c1", "2026-04", 1)) == ()
    assert invoiced_lines([february, march], "2026-03") == march.lines[:-1]


def test_nothing_new_gives_no_lines():
    february = regular_invoice(ROWS)
    assert adjustment_lines(rating(ROWS), february.lines, period=PERIOD, target_invoice_id="inv_x") == ()


def test_usage_corrected_away_is_taken_back():
    february = regular_invoice(ROWS)
    fewer = ROWS[:2]
    adjustments = adjustment_lines(rating(fewer), february.lines, period=PERIOD, target_invoice_id="inv_x")
    assert sum(ln.amount for ln in adjustments) == rating(fewer).total - february.total
    assert {ln.rated_line_id for ln in adjustments} == {february.lines[2].id, february.lines[3].id}
    assert all(ln.amount < 0 and ln.quantity < 0 for ln in adjustments)


def test_a_void_invoice_charges_nothing():
    voided = void(regular_invoice(ROWS), at=T_FINAL + timedelta(hours=1))
    assert invoiced_lines([voided], "2026-02") == ()
    adjustments = adjustment_lines(rating(ROWS), invoiced_lines([voided], "2026-02"), period=PERIOD,
                                   target_invoice_id="inv_x")
    assert sum(ln.amount for ln in adjustments) == voided.total


def test_minimum_top_up_shrinks_as_late_usage_arrives():
    book = price_book_from_data({**BOOK.model_dump(mode="json"), "minimum": "150"})
    february = regular_invoice(ROWS, book=book)
    assert february.total == D("150.00")
    late = [*ROWS, (("successful_tasks",), 100)]  # +7.00
    adjustments = adjustment_lines(rating(late, book=book), february.lines, period=PERIOD, target_invoice_id="inv_x")
    assert {ln.kind: ln.amount for ln in adjustments} == {"usage": D("7.00"), "minimum": D("-7.00")}
    assert sum(ln.amount for ln in adjustments) == 0


def test_a_correction_that_lowers_the_amount_owed_cannot_be_invoiced():
    # volume pricing: crossing into the cheaper tier re-prices every unit, so late usage lowers the total
    book = price_book_from_data({"id": "vol", "currency": "USD", "charges": [{"meter": "successful_tasks", "price": {
        "type": "tiered_volume", "tiers": [{"up_to": 1000, "amount": "0.10"}, {"up_to": None, "amount": "0.05"}]}}]})
    february = regular_invoice([(("successful_tasks",), 1000)], book=book)  # 100.00
    late = rating([(("successful_tasks",), 1200)], book=book)  # 60.00
    lines = adjustment_lines(late, february.lines, period=PERIOD, target_invoice_id="inv_x")
    assert [(ln.quantity, ln.amount) for ln in lines] == [(200, D("-40.00"))]
    draft = add_lines(empty_draft("c1", "USD", PERIOD, price_book_version="v1", sequence=2), lines)
    with pytest.raises(InvoiceError, match="issue a credit note"):
        finalize(draft, number=format_number(2026, 2), at=T_FINAL)


def test_wrong_inputs_are_refused():
    february = regular_invoice(ROWS)
    with pytest.raises(InvoiceError, match="rate exactly the billing period"):
        adjustment_lines(rating(ROWS, period=NEXT), february.lines, period=PERIOD, target_invoice_id="inv_x")
    march = regular_invoice(ROWS, period=NEXT, seq=2)
    with pytest.raises(InvoiceError, match="belongs to period 2026-03"):
        adjustment_lines(rating(ROWS), march.lines, period=PERIOD, target_invoice_id="inv_x")
    target = "inv_target"
    own = adjustment_lines(rating([*ROWS, (("successful_tasks",), 1)]), february.lines, period=PERIOD,
                           target_invoice_id=target)
    with pytest.raises(InvoiceError, match="on the target invoice"):
        adjustment_lines(rating(ROWS), [*february.lines, *own], period=PERIOD, target_invoice_id=target)
    other = dataclasses.replace(regular_invoice(ROWS), customer_id="c2")
    with pytest.raises(InvoiceError, match="several customers"):
        invoiced_lines([february, other], "2026-02")


# ---------------------------------------------------------------- the property

METERS = [("uncached_input_tokens", "small"), ("output_tokens", "small"), ("output_tokens", "big"),
          ("successful_tasks", ""), ("gpu_seconds", "")]
amount = st.decimals(min_value=0, max_value=50, places=4).map(str)


@st.composite
def books(draw):
    def price():
        return draw(st.one_of(
            st.builds(lambda a, p: {"type": "unit", "amount": a, "per": p}, amount, st.sampled_from([1, 1000, 3600, 10**6])),
            st.builds(lambda a, b: {"type": "tiered_graduated", "per": 1000,
                                    "tiers": [{"up_to": 5000, "amount": a}, {"up_to": None, "amount": b}]}, amount, amount),
            st.builds(lambda a, b: {"type": "tiered_volume", "per": 1000,
                                    "tiers": [{"up_to": 5000, "amount": a}, {"up_to": None, "amount": b}]}, amount, amount),
            st.builds(lambda a: {"type": "package", "amount": a, "per": 100}, amount),
            st.builds(lambda a: {"type": "flat", "amount": a}, amount),
        ))

    charges = [
        {"meter": "uncached_input_tokens", "price": price()},
        {"meter": "output_tokens", "price": price()},
        {"meter": "output_tokens", "model": "big", "price": price()},
        {"meter": "successful_tasks", "price": price()},
        {"meter": "gpu_seconds", "price": price()},
    ]
    data = {"id": "prop", "currency": draw(st.sampled_from(["USD", "JPY", "BHD"])), "charges": charges}
    if draw(st.booleans()):
        data["minimum"] = draw(amount)
    return price_book_from_data(data)


def usage_of(parts) -> Usage:
    rows = []
    for (meter, model), quantity in parts:
        key = UsageKey(meter, gpu_type="H100") if meter == "gpu_seconds" else UsageKey(meter, model=model)
        rows.append((key, quantity))
    return Usage.build("c1", PERIOD.start, PERIOD.end, rows)


quantities = st.lists(
    st.tuples(st.sampled_from(METERS), st.integers(0, 10**7), st.integers(0, 3)),  # (meter, qty, batch 0 = known)
    max_size=12,
)


def charged(invoice, seq):
    """Finalize an adjustment invoice. One that lowers the amount owed (a volume tier, a smaller minimum
    top-up) cannot be finalized — the service issues a credit note instead — so for the arithmetic the
    test records it as charged as it is."""
    if invoice.total >= 0:
        return finalize(invoice, number=format_number(2026, seq), at=T_FINAL + timedelta(days=seq))
    return dataclasses.replace(
        invoice, status=InvoiceStatus.OPEN, number=format_number(2026, seq), finalized_at=T_FINAL, issued_at=T_FINAL
    )


@settings(max_examples=examples(200), deadline=None)
@given(book=books(), events=quantities)
def test_invoices_plus_adjustments_equal_the_rating_of_all_usage(book, events):
    batches = [[(m, D(q)) for m, q, b in events if b <= k] for k in range(4)]  # cumulative: known, +late, ...
    rated = rate(book, usage_of(batches[0]))
    invoices = [charged(draft_from_rating(rated, PERIOD, price_book_version="v1"), 1)]
    for k in range(1, 4):
        rated = rate(book, usage_of(batches[k]))
        target = invoice_id("c1", "2026-02", k + 1)
        lines = adjustment_lines(rated, invoiced_lines(invoices, "2026-02"), period=PERIOD, target_invoice_id=target)
        # a rerun for the same target before it is finalized gives the same lines
        assert adjustment_lines(rated, invoiced_lines(invoices, "2026-02"), period=PERIOD,
                                target_invoice_id=target) == lines
        if lines:
            draft = empty_draft("c1", book.currency, PERIOD, price_book_version="v1", sequence=k + 1)
            invoices.append(charged(add_lines(draft, lines), k + 1))
        everything = invoiced_lines(invoices, "2026-02")
        # the property: what was invoiced, per rated line and in total, is the rating of all usage so far, exactly
        assert sum(ln.amount for ln in everything) == rated.total
        assert by_rated_line(everything) == {
            ln.line_id: (ln.quantity, ln.precise_amount, ln.amount) for ln in rated.lines
            if any((ln.quantity, ln.precise_amount, ln.amount))
        }
        # a rerun with nothing new gives no lines
        assert adjustment_lines(rated, everything, period=PERIOD, target_invoice_id="inv_next") == ()
