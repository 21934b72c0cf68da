"""Invoices: drafts from a rating, the state machine, immutability, void and reissue, credit notes."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing.credit_notes import credit_note
from billing.errors import CreditNoteError, InvoiceError, InvoiceImmutable, InvoiceStateError
from billing.invoice import TRANSITIONS, InvoiceStatus, invoice_id
from billing.invoice.drafts import (
    add_lines,
    draft_from_rating,
    first_invoice,
    line_from_rated,
    lines_from_rating,
    remove_lines,
    replace_lines,
    with_credits_applied,
)
from billing.invoice.states import (
    finalize,
    finalize_first,
    mark_paid,
    mark_payment_failed,
    reissue,
    transition,
    void,
)
from billing.numbering import format_number
from billing.periods import billing_period
from pricing.book import price_book_from_data, price_book_to_data
from tests.billing.helpers import BOOK, NEXT, PERIOD, ROWS, T_FINAL, rating

S = InvoiceStatus
D = Decimal


def draft(rows=ROWS, **kw):
    return draft_from_rating(rating(rows), PERIOD, price_book_version="tokens-2026-02@2026-01-01", **kw)


def finalized(rows=ROWS, seq=1):
    return finalize(draft(rows), number=format_number(2026, seq), at=T_FINAL)


# ---------------------------------------------------------------- drafts


def test_draft_copies_the_rating_lines_without_recomputing_money():
    rated = rating(ROWS)
    invoice = draft()
    assert invoice.status is S.DRAFT and invoice.number is None and invoice.finalized_at is None
    assert [ln.id for ln in invoice.lines] == [ln.line_id for ln in rated.lines]
    assert [(ln.quantity, ln.precise_amount, ln.amount, ln.unit_price) for ln in invoice.lines] == [
        (ln.quantity, ln.precise_amount, ln.amount, ln.unit_price) for ln in rated.lines
    ]
    assert invoice.subtotal == invoice.total == rated.total == D("142.83")
    assert all(ln.period == "2026-02" and ln.service_period_start == PERIOD.start for ln in invoice.lines)
    assert invoice.period_start == PERIOD.start and invoice.period_end == PERIOD.end
    assert invoice.currency == "USD" and invoice.customer_id == "c1"


def test_ids_are_stable_across_reruns():
    assert draft() == draft()
    assert draft().id == invoice_id("c1", "2026-02", 1)
    assert invoice_id("c1", "2026-02", 1) != invoice_id("c1", "2026-02", 2)
    assert invoice_id("c1", "2026-02", 1) != invoice_id("c2", "2026-02", 1)
    assert invoice_id("c1", "2026-02", 1).startswith("inv_")


def test_a_rating_of_another_window_is_refused():
    with pytest.raises(InvoiceError, match="rate exactly the billing period"):
        draft_from_rating(rating(ROWS), NEXT, price_book_version="v1")
    with pytest.raises(InvoiceError, match="price_book_version is required"):
        draft_from_rating(rating(ROWS), PERIOD, price_book_version="")


def test_book_minimum_and_credit_lines_become_invoice_lines():
    book = price_book_from_data({**BOOK.model_dump(mode="json"), "minimum": "200", "credits": "10"})
    invoice = draft_from_rating(rating(ROWS, book=book), PERIOD, price_book_version="v1")
    assert [ln.kind for ln in invoice.lines][-2:] == ["minimum", "credit"]
    assert invoice.total == D("190.00")


def test_draft_lines_can_change_until_finalized():
    invoice = draft()
    fewer = remove_lines(invoice, [invoice.lines[0].id])
    assert fewer.subtotal == invoice.subtotal - invoice.lines[0].amount
    assert add_lines(fewer, [invoice.lines[0]]).subtotal == invoice.subtotal
    with pytest.raises(InvoiceError, match="appears twice"):
        add_lines(invoice, [invoice.lines[0]])
    with pytest.raises(InvoiceError, match="no line"):
        remove_lines(invoice, ["nope"])
    credited = with_credits_applied(invoice, D("42.83"))
    assert (credited.credits_applied, credited.total) == (D("42.83"), D("100.00"))
    with pytest.raises(InvoiceError, match="exceeds the subtotal"):
        with_credits_applied(invoice, D("142.84"))
    with pytest.raises(InvoiceError, match="more decimals"):
        with_credits_applied(invoice, D("1.001"))


def test_hand_built_inconsistent_invoices_are_refused():
    invoice = draft()
    with pytest.raises(InvoiceError, match="not the sum of its lines"):
        dataclasses.replace(invoice, subtotal=D("1.00"))
    with pytest.raises(InvoiceError, match="no time zone"):
        dataclasses.replace(invoice, period_start=datetime(2026, 2, 7))
    with pytest.raises(InvoiceError, match="cannot have a number"):
        dataclasses.replace(invoice, number="INV-2026-000001")


# ---------------------------------------------------------------- the state machine

ALL = list(InvoiceStatus)
LEGAL = {
    (S.DRAFT, S.OPEN),
    (S.OPEN, S.PAID), (S.OPEN, S.PAYMENT_FAILED), (S.OPEN, S.VOID),
    (S.PAYMENT_FAILED, S.PAID), (S.PAYMENT_FAILED, S.VOID),
}


def invoice_in(status: InvoiceStatus):
    invoice = draft()
    path = {
        S.DRAFT: [], S.OPEN: [S.OPEN], S.PAID: [S.OPEN, S.PAID], S.PAYMENT_FAILED: [S.OPEN, S.PAYMENT_FAILED],
        S.VOID: [S.OPEN, S.VOID],
    }[status]
    for i, step in enumerate(path):
        number = format_number(2026, 7) if step is S.OPEN else None
        invoice = transition(invoice, step, at=T_FINAL + timedelta(hours=i), number=number)
    assert invoice.status is status
    return invoice


def test_the_transition_table_is_the_documented_one():
    assert {(a, b) for a in ALL for b in TRANSITIONS[a]} == LEGAL


@pytest.mark.parametrize(("start", "to"), [(a, b) for a in ALL for b in ALL])
def test_transitions(start, to):
    invoice = invoice_in(start)
    at = T_FINAL + timedelta(days=1)
    number = format_number(2026, 8) if to is S.OPEN else None
    if (start, to) in LEGAL:
        moved = transition(invoice, to, at=at, number=number)
        assert moved.status is to and moved.history[-1].at == at and moved.history[-1].from_status is start
        assert moved.id == invoice.id and moved.lines == invoice.lines
    else:
        with pytest.raises(InvoiceStateError, match=f"cannot go from {start} to {to}"):
            transition(invoice, to, at=at, number=number)


def test_finalize_sets_number_and_times():
    invoice = finalize(draft(), number="INV-2026-000123", at=T_FINAL)
    assert invoice.number == "INV-2026-000123"
    assert invoice.finalized_at == invoice.issued_at == T_FINAL
    issued = finalize(draft(), number="INV-2026-000123", at=T_FINAL, issued_at=T_FINAL - timedelta(hours=9))
    assert issued.issued_at == T_FINAL - timedelta(hours=9) and issued.finalized_at == T_FINAL
    with pytest.raises(InvoiceStateError, match="unknown invoice status 'sent'"):
        transition(draft(), "sent", at=T_FINAL)
    with pytest.raises(InvoiceStateError, match="needs the invoice number"):
        transition(draft(), S.OPEN, at=T_FINAL)
    with pytest.raises(InvoiceStateError, match="no time zone"):
        finalize(draft(), number="INV-2026-000123", at=datetime(2026, 3, 8))
    with pytest.raises(ValueError, match="not of the form"):
        finalize(draft(), number="2026-123", at=T_FINAL)


def test_paid_and_voided_times_and_clock_order():
    invoice = mark_paid(mark_payment_failed(finalized(), at=T_FINAL + timedelta(days=1)), at=T_FINAL + timedelta(days=2))
    assert invoice.paid_at == T_FINAL + timedelta(days=2) and invoice.voided_at is None
    assert [c.to_status for c in invoice.history] == [S.OPEN, S.PAYMENT_FAILED, S.PAID]
    with pytest.raises(InvoiceStateError, match="before its last change"):
        mark_paid(finalized(), at=T_FINAL - timedelta(seconds=1))


def test_a_negative_invoice_cannot_be_finalized():
    negative = add_lines(draft([]), [dataclasses.replace(draft().lines[0], id="x", amount=D("-1.00"))])
    with pytest.raises(InvoiceStateError, match="credit note"):
        finalize(negative, number="INV-2026-000001", at=T_FINAL)


@pytest.mark.parametrize("status", [S.OPEN, S.PAID, S.PAYMENT_FAILED, S.VOID])
def test_finalized_invoices_are_immutable(status):
    invoice = invoice_in(status)
    line = invoice.lines[0]
    for change in (
        lambda: add_lines(invoice, [dataclasses.replace(line, id="new")]),
        lambda: replace_lines(invoice, ()),
        lambda: remove_lines(invoice, [line.id]),
        lambda: with_credits_applied(invoice, D("1.00")),
    ):
        with pytest.raises(InvoiceImmutable, match=f"is {status}"):
            change()
    with pytest.raises(dataclasses.FrozenInstanceError):
        invoice.lines = ()  # type: ignore[misc]
    assert isinstance(invoice.lines, tuple)


# ---------------------------------------------------------------- void and reissue


def test_void_and_reissue():
    original = with_credits_applied(draft(), D("2.83"))
    original = finalize(original, number="INV-2026-000001", at=T_FINAL)
    voided = void(original, at=T_FINAL + timedelta(hours=1))
    assert voided.status is S.VOID and voided.voided_at == T_FINAL + timedelta(hours=1)
    assert voided.number == original.number and voided.lines == original.lines
    again = reissue(voided)
    assert again.status is S.DRAFT and again.number is None
    assert again.sequence == 2 and again.id == invoice_id("c1", "2026-02", 2) != voided.id
    assert again.lines == voided.lines and again.reissue_of == voided.id
    assert again.credits_applied == 0 and again.total == again.subtotal
    assert reissue(voided, sequence=5).id == invoice_id("c1", "2026-02", 5)
    assert reissue(voided) == again  # deterministic
    with pytest.raises(InvoiceError, match="must be after"):
        reissue(voided, sequence=1)
    with pytest.raises(InvoiceStateError, match="only a void invoice"):
        reissue(original)
    with pytest.raises(InvoiceStateError, match="cannot go from paid to void"):
        void(mark_paid(original, at=T_FINAL), at=T_FINAL)


# ---------------------------------------------------------------- credit notes


def test_whole_invoice_credit_note():
    invoice = finalized()
    note = credit_note(invoice, reason="service outage", at=T_FINAL + timedelta(days=1))
    assert note.total == invoice.total == D("142.83")
    assert [ln.invoice_line_id for ln in note.lines] == [ln.id for ln in invoice.lines]
    assert (note.refund_amount, note.credits_returned) == (D("142.83"), D("0"))
    assert note.id == credit_note(invoice, reason="service outage", at=T_FINAL + timedelta(days=1)).id
    with pytest.raises(CreditNoteError, match="nothing left to credit"):
        credit_note(invoice, reason="again", at=T_FINAL + timedelta(days=2), previous=[note])


def test_credit_notes_by_line_and_amount_never_exceed_what_is_left():
    invoice = finalized()
    tasks = invoice.lines[3]  # 135.00
    first = credit_note(invoice, amounts={tasks.id: D("100.00")}, reason="goodwill", at=T_FINAL)
    assert first.total == D("100.00") and first.sequence == 1
    with pytest.raises(CreditNoteError, match="only 35.00 is left uncredited"):
        credit_note(invoice, amounts={tasks.id: D("35.01")}, reason="more", at=T_FINAL, previous=[first])
    second = credit_note(invoice, line_ids=[tasks.id], reason="rest", at=T_FINAL, previous=[first])
    assert second.total == D("35.00") and second.sequence == 2 and second.id != first.id
    with pytest.raises(CreditNoteError, match="nothing left to credit"):
        credit_note(invoice, line_ids=[tasks.id], reason="x", at=T_FINAL, previous=[first, second])
    rest = credit_note(invoice, reason="all the rest", at=T_FINAL, previous=[first, second])
    assert tasks.id not in {ln.invoice_line_id for ln in rest.lines}
    assert first.total + second.total + rest.total == invoice.total


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"amounts": {"nope": D("1.00")}}, "has no line nope"),
        ({"amounts": {"LINE": D("0")}}, "positive Decimal"),
        ({"amounts": {"LINE": D("0.001")}}, "more decimals"),
        ({"line_ids": []}, "line_ids is empty"),
        ({"line_ids": ["LINE"], "amounts": {"LINE": D("1")}}, "not both"),
        ({"reason": " "}, "needs a reason"),
        ({"at": T_FINAL - timedelta(seconds=1)}, "before invoice"),
    ],
)
def test_bad_credit_notes(kwargs, message):
    invoice = finalized()
    line_id = invoice.lines[0].id
    kwargs = {k: ({line_id if i == "LINE" else i: a for i, a in v.items()} if k == "amounts" else
                  [line_id if i == "LINE" else i for i in v] if k == "line_ids" else v) for k, v in kwargs.items()}
    with pytest.raises(CreditNoteError, match=message):
        credit_note(invoice, **{"reason": "r", "at": T_FINAL, **kwargs})


@pytest.mark.parametrize("status", [S.DRAFT, S.VOID])
def test_credit_notes_need_a_charging_invoice(status):
    with pytest.raises(CreditNoteError, match=f"is {status}"):
        credit_note(invoice_in(status), reason="r", at=T_FINAL + timedelta(days=1))


def test_a_negative_line_limits_the_credit_and_prepaid_credits_go_back_last():
    book = price_book_from_data({**BOOK.model_dump(mode="json"), "credits": "40"})
    invoice = draft_from_rating(rating(ROWS, book=book), PERIOD, price_book_version="v1")  # 142.83 - 40
    invoice = finalize(with_credits_applied(invoice, D("2.83")), number="INV-2026-000002", at=T_FINAL)
    assert (invoice.subtotal, invoice.total) == (D("102.83"), D("100.00"))
    note = credit_note(invoice, reason="whole", at=T_FINAL)
    assert note.total == D("102.83")  # not 142.83: the book credit line was never charged
    assert (note.refund_amount, note.credits_returned) == (D("100.00"), D("2.83"))
    with pytest.raises(CreditNoteError, match="102.83 is left"):
        credit_note(invoice, line_ids=[ln.id for ln in invoice.lines if ln.amount > 0], reason="r", at=T_FINAL)


def test_other_periods_schedules():
    kolkata = billing_period("2026-03", "Asia/Kolkata", 1)
    invoice = draft_from_rating(rating(ROWS, period=kolkata), kolkata, price_book_version="v1")
    assert invoice.period_start == datetime(2026, 2, 28, 18, 30, tzinfo=UTC)


def test_lines_from_rating_equal_the_checked_copies_and_bad_lines_are_still_refused():
    from billing.invoice.drafts import line_from_rated, lines_from_rating

    rated = rating(ROWS)
    fast = lines_from_rating(rated, PERIOD)
    assert fast == tuple(line_from_rated(line, PERIOD) for line in rated.lines)
    assert all(hash(a) == hash(line_from_rated(b, PERIOD)) for a, b in zip(fast, rated.lines, strict=True))
    bad = dataclasses.replace(rated, lines=(rated.lines[0]._replace(kind="bonus"), *rated.lines[1:]))
    with pytest.raises(InvoiceError, match="kind 'bonus'"):
        lines_from_rating(bad, PERIOD)
    nan = dataclasses.replace(rated, lines=(rated.lines[0]._replace(amount=Decimal("NaN")), *rated.lines[1:]))
    with pytest.raises(InvoiceError, match="finite Decimal"):
        lines_from_rating(nan, PERIOD)


def _fields(invoice) -> dict:
    names = ("id", "customer_id", "currency", "period", "period_start", "period_end", "sequence", "status",
             "subtotal", "credits_applied", "total", "price_book_version", "number", "issued_at", "finalized_at",
             "reissue_of")
    return {name: getattr(invoice, name) for name in names}


def test_first_invoice_is_what_draft_from_rating_and_finalize_make():
    """The bulk run's quick path (`first_invoice`, `finalize_first`) and the domain's checked path
    (`draft_from_rating`, `finalize`) give the same `Invoice`: id, amounts, status, number, times,
    history, and lines (the rating's, copied as `lines_from_rating`)."""
    utc_period = billing_period("2026-02", "UTC", 1)
    minimum_book = price_book_from_data({**price_book_to_data(BOOK), "minimum": "25.00"})
    cases = [(rating(ROWS), PERIOD), (rating(ROWS, period=utc_period), utc_period), (rating([]), PERIOD),
             (rating([], book=minimum_book), PERIOD), (rating(ROWS[:1], book=minimum_book), PERIOD)]
    for rated, period in cases:
        quick = first_invoice(rated, period, currency="USD", price_book_version="v1")
        assert quick is not None
        domain = draft_from_rating(rated, period, price_book_version="v1")
        assert _fields(quick) == _fields(domain)
        assert tuple(line_from_rated(line, period) for line in rated.lines) == quick.lines == domain.lines == lines_from_rating(rated, period)
        assert quick == domain
        final = finalize_first(quick, number="INV-2026-000007", at=T_FINAL)
        domain_final = finalize(domain, number="INV-2026-000007", at=T_FINAL)
        assert _fields(final) == _fields(domain_final)
        assert final == domain_final


def test_first_invoice_leaves_what_it_does_not_check_to_the_domain():
    rated = rating(ROWS)
    assert first_invoice(rated, NEXT, currency="USD", price_book_version="v1") is None  # another window
    assert first_invoice(rated, PERIOD, currency="EUR", price_book_version="v1") is None  # another currency
    odd = dataclasses.replace(rated, lines=(rated.lines[0]._replace(amount=Decimal("0.001")), *rated.lines[1:]))
    assert first_invoice(odd, PERIOD, currency="USD", price_book_version="v1") is None  # not at minor units
    with pytest.raises(InvoiceError):
        draft_from_rating(odd, PERIOD, price_book_version="v1")
    twice = dataclasses.replace(rated, lines=(rated.lines[0], rated.lines[0]))
    assert first_invoice(twice, PERIOD, currency="USD", price_book_version="v1") is None  # a line id twice
    negative = dataclasses.replace(rated, lines=(rated.lines[0]._replace(amount=Decimal("-1.00")),))
    quick = first_invoice(negative, PERIOD, currency="USD", price_book_version="v1")
    with pytest.raises(InvoiceStateError, match="cannot be negative"):
        finalize_first(quick, number="INV-2026-000001", at=T_FINAL)
    with pytest.raises(InvoiceStateError):
        finalize_first(finalize_first(first_invoice(rated, PERIOD, currency="USD", price_book_version="v1"),
                                      number="INV-2026-000001", at=T_FINAL), number="INV-2026-000002", at=T_FINAL)
