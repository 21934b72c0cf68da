"""Invoices at their exact boundaries, through the public functions: a total of exactly zero, prepaid
credits equal to the subtotal, a status change at the very instant of the last one, a credit note at
the instant of finalization, refunds that reach the charged total to the cent."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from decimal import Decimal

import pytest

from billing.credit_notes import credit_note
from billing.errors import CreditNoteError, InvoiceError, InvoiceStateError
from billing.invoice import invoice_id
from billing.invoice.drafts import add_lines, draft_from_rating, empty_draft, with_credits_applied
from billing.invoice.states import finalize, mark_paid, reissue, void
from tests.billing.helpers import PERIOD, ROWS, T_FINAL, rating

D = Decimal
US = timedelta(microseconds=1)
NUMBER = "INV-2026-000001"


def draft():
    return draft_from_rating(rating(ROWS), PERIOD, price_book_version="v1")  # 142.83 over four lines


def with_line(invoice, amount: str):
    return add_lines(invoice, [dataclasses.replace(draft().lines[0], id=f"x{amount}", amount=D(amount))])


# ---------------------------------------------------------------- totals at zero


def test_an_invoice_of_exactly_zero_is_finalized_and_one_cent_below_is_not():
    zero = empty_draft("c1", "USD", PERIOD, price_book_version="v1")
    assert finalize(zero, number=NUMBER, at=T_FINAL).total == 0
    balanced = with_line(with_line(zero, "-1.00"), "1.00")
    assert finalize(balanced, number=NUMBER, at=T_FINAL).total == 0
    with pytest.raises(InvoiceStateError, match="totals -0.01 USD"):
        finalize(with_line(zero, "-0.01"), number=NUMBER, at=T_FINAL)


def test_prepaid_credits_may_pay_the_whole_subtotal_and_not_a_cent_more():
    paid = with_credits_applied(draft(), D("142.83"))
    assert (paid.credits_applied, paid.total) == (D("142.83"), D("0.00"))
    assert finalize(paid, number=NUMBER, at=T_FINAL).status == "open"
    with pytest.raises(InvoiceError, match="exceeds the subtotal 142.83"):
        with_credits_applied(draft(), D("142.84"))
    with pytest.raises(InvoiceError, match="is negative"):
        with_credits_applied(draft(), D("-0.01"))


def test_a_negative_subtotal_takes_no_prepaid_credit():
    negative = with_line(empty_draft("c1", "USD", PERIOD, price_book_version="v1"), "-5.00")
    assert with_credits_applied(negative, D("0")).total == D("-5.00")
    with pytest.raises(InvoiceError, match="exceeds the subtotal -5.00"):
        with_credits_applied(negative, D("0.01"))


# ---------------------------------------------------------------- the clock's order


def test_a_status_change_may_share_the_instant_of_the_last_one_but_not_precede_it():
    invoice = finalize(draft(), number=NUMBER, at=T_FINAL)
    assert mark_paid(invoice, at=T_FINAL).paid_at == T_FINAL
    with pytest.raises(InvoiceStateError, match="before its last change"):
        mark_paid(invoice, at=T_FINAL - US)
    voided = void(invoice, at=T_FINAL + US)
    assert [c.at for c in voided.history] == [T_FINAL, T_FINAL + US]


def test_a_credit_note_may_be_issued_at_the_instant_of_finalization_but_not_before():
    invoice = finalize(draft(), number=NUMBER, at=T_FINAL)
    assert credit_note(invoice, reason="outage", at=T_FINAL).issued_at == T_FINAL
    with pytest.raises(CreditNoteError, match="before invoice"):
        credit_note(invoice, reason="outage", at=T_FINAL - US)


# ---------------------------------------------------------------- credit notes to the cent


def test_a_line_can_be_credited_up_to_exactly_what_is_left_on_it():
    invoice = finalize(draft(), number=NUMBER, at=T_FINAL)
    tasks = invoice.lines[3]  # 135.00
    whole = credit_note(invoice, amounts={tasks.id: D("135.00")}, reason="r", at=T_FINAL)
    assert whole.total == D("135.00")
    with pytest.raises(CreditNoteError, match="only 135.00 is left"):
        credit_note(invoice, amounts={tasks.id: D("135.01")}, reason="r", at=T_FINAL)
    with pytest.raises(CreditNoteError, match="only 0.00 is left"):
        credit_note(invoice, amounts={tasks.id: D("0.01")}, reason="r", at=T_FINAL, previous=[whole])


def test_refunds_reach_the_charged_total_and_the_next_cent_returns_prepaid_credit():
    invoice = finalize(with_credits_applied(draft(), D("40.00")), number=NUMBER, at=T_FINAL)  # charged 102.83
    tasks, big = invoice.lines[3], invoice.lines[2]  # 135.00, 2.96
    first = credit_note(invoice, amounts={tasks.id: D("102.83")}, reason="r", at=T_FINAL)
    assert (first.refund_amount, first.credits_returned) == (D("102.83"), D("0"))
    second = credit_note(invoice, amounts={tasks.id: D("0.01")}, reason="r", at=T_FINAL, previous=[first])
    assert (second.refund_amount, second.credits_returned) == (D("0"), D("0.01"))
    # one note across the charged total: the refund stops at it, the rest returns prepaid credit
    across = credit_note(invoice, amounts={tasks.id: D("100.00"), big.id: D("2.84")}, reason="r", at=T_FINAL)
    assert (across.total, across.refund_amount, across.credits_returned) == (D("102.84"), D("102.83"), D("0.01"))


def test_a_whole_invoice_note_stops_at_what_is_left_of_the_subtotal():
    invoice = finalize(with_line(draft(), "-135.00"), number=NUMBER, at=T_FINAL)  # 7.83 charged in all
    note = credit_note(invoice, reason="whole", at=T_FINAL)
    assert note.total == D("7.83")
    assert [line.amount for line in note.lines] == [D("2.47"), D("2.40"), D("2.96")]  # the fourth stops at room
    with pytest.raises(CreditNoteError, match="7.83 is left"):
        credit_note(invoice, amounts={invoice.lines[3].id: D("7.84")}, reason="r", at=T_FINAL)
    assert credit_note(invoice, amounts={invoice.lines[3].id: D("7.83")}, reason="r", at=T_FINAL).total == D("7.83")


# ---------------------------------------------------------------- sequences


def test_invoice_sequences_start_at_one():
    assert invoice_id("c1", "2026-02", 1).startswith("inv_")
    for bad in (0, -1, True, "1"):
        with pytest.raises(InvoiceError, match="must be a whole number from 1"):
            invoice_id("c1", "2026-02", bad)


def test_a_reissue_takes_the_next_sequence_or_a_later_one():
    voided = void(finalize(draft(), number=NUMBER, at=T_FINAL), at=T_FINAL)
    assert reissue(voided, sequence=2).sequence == 2
    with pytest.raises(InvoiceError, match="must be after"):
        reissue(voided, sequence=1)


def test_a_line_is_found_by_its_id():
    invoice = draft()
    assert invoice.line(invoice.lines[2].id) is invoice.lines[2]
    with pytest.raises(InvoiceError, match=f"invoice {invoice.id} has no line nope"):
        invoice.line("nope")
