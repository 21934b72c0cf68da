"""Credit notes, pure and table-driven, on a hand-made invoice whose amounts are worked out below:
what each note credits, refunds and returns to prepaid credits, to the cent, at the edge of what is
left and one cent either side; every refusal with its exact message. Also `credited_by_line`,
`credit_note_id`, the draft line copy `_copied` and `periods_between`, which the pure tests did not
reach directly before."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import pytest

from billing._common import stable_id
from billing.credit_notes import (
    CreditNote,
    CreditNoteInput,
    CreditNoteLine,
    _sum_notes,
    credit_note,
    credit_note_id,
    credited_by_line,
)
from billing.errors import CreditNoteError
from billing.invoice import InvoiceLine, InvoiceStatus
from billing.invoice.drafts import _copied, add_lines, empty_draft, line_from_rated, with_credits_applied
from billing.invoice.states import finalize, mark_paid, mark_payment_failed, void
from billing.periods import billing_period, periods_between
from pricing.rating import Line
from tests.billing.helpers import PERIOD, T_FINAL

D = Decimal
US = timedelta(microseconds=1)
NUMBER = "INV-2026-000001"


def line(line_id: str, amount: str, kind: str = "usage") -> InvoiceLine:
    return InvoiceLine(
        id=line_id, rated_line_id=line_id, kind=kind, charge_key="k", meter="output_tokens", group="",
        quantity=D(1), unit_price=None, precise_amount=D(amount), amount=D(amount), period=PERIOD.label,
        service_period_start=PERIOD.start, service_period_end=PERIOD.end,
    )


def draft(*amounts: str):
    """A draft with lines a, b, c, ... of the given amounts."""
    lines = [line(chr(ord("a") + i), amount, "credit" if amount.startswith("-") else "usage")
             for i, amount in enumerate(amounts)]
    return add_lines(empty_draft("c1", "USD", PERIOD, price_book_version="v1"), lines)


def invoice(*amounts: str, prepaid: str = "0"):
    return finalize(with_credits_applied(draft(*amounts), D(prepaid)), number=NUMBER, at=T_FINAL)


INV = invoice("10.00", "5.00", "2.50")  # subtotal 17.50, nothing prepaid: total 17.50
IID = INV.id


def note(inv=INV, **kwargs) -> CreditNote:
    return credit_note(inv, **{"reason": "r", "at": T_FINAL, **kwargs})


def lines_of(n: CreditNote) -> list[tuple[str, Decimal]]:
    return [(ln.invoice_line_id, ln.amount) for ln in n.lines]


# ---------------------------------------------------------------- what a note credits


@pytest.mark.parametrize(
    ("amounts", "prepaid", "kwargs", "lines", "total", "refund", "returned"),
    [
        # the whole invoice: every line, in invoice order
        (("10.00", "5.00", "2.50"), "0", {}, [("a", "10.00"), ("b", "5.00"), ("c", "2.50")], "17.50", "17.50", "0"),
        # prepaid 7.50 of 17.50: 10.00 was charged and is refunded, 7.50 goes back to credits
        (("10.00", "5.00", "2.50"), "7.50", {}, [("a", "10.00"), ("b", "5.00"), ("c", "2.50")],
         "17.50", "10.00", "7.50"),
        # the whole subtotal prepaid: nothing to refund, all returned
        (("10.00", "5.00", "2.50"), "17.50", {}, [("a", "10.00"), ("b", "5.00"), ("c", "2.50")],
         "17.50", "0.00", "17.50"),
        # line_ids: what is left on those lines only, in the order given
        (("10.00", "5.00", "2.50"), "0", {"line_ids": ["c", "a"]}, [("c", "2.50"), ("a", "10.00")],
         "12.50", "12.50", "0"),
        # amounts: exactly what is asked per line
        (("10.00", "5.00", "2.50"), "0", {"amounts": {"b": D("0.01")}}, [("b", "0.01")], "0.01", "0.01", "0"),
        (("10.00", "5.00", "2.50"), "0", {"amounts": {"a": D("10.00"), "c": D("2.49")}},
         [("a", "10.00"), ("c", "2.49")], "12.49", "12.49", "0"),
        # refund exactly at the charged total (10.00 charged) and one cent over it
        (("10.00", "5.00", "2.50"), "7.50", {"amounts": {"a": D("10.00")}}, [("a", "10.00")], "10.00", "10.00", "0"),
        (("10.00", "5.00", "2.50"), "7.50", {"amounts": {"a": D("10.00"), "b": D("0.01")}},
         [("a", "10.00"), ("b", "0.01")], "10.01", "10.00", "0.01"),
        (("10.00", "5.00", "2.50"), "7.50", {"amounts": {"a": D("9.99")}}, [("a", "9.99")], "9.99", "9.99", "0"),
        # a negative (credit) line is never credited and lowers the room: 4.00 + 5.00 - 6.00 = 3.00, so a
        # whole-invoice note stops inside line a (3.00 of its 4.00) and b gets nothing
        (("4.00", "5.00", "-6.00"), "0", {}, [("a", "3.00")], "3.00", "3.00", "0"),
        # room 3.00 after a negative line of -2.00 on 5.00: a whole note stops at the room exactly
        (("5.00", "-2.00"), "0", {}, [("a", "3.00")], "3.00", "3.00", "0"),
        # a line of exactly zero is skipped by a whole note
        (("0.00", "1.00"), "0", {}, [("b", "1.00")], "1.00", "1.00", "0"),
    ],
)
def test_what_a_first_note_credits(amounts, prepaid, kwargs, lines, total, refund, returned):
    n = note(invoice(*amounts, prepaid=prepaid), **kwargs)
    assert lines_of(n) == [(i, D(a)) for i, a in lines]
    assert (n.total, n.refund_amount, n.credits_returned) == (D(total), D(refund), D(returned))
    assert n.credits_returned + n.refund_amount == n.total


def test_a_note_carries_the_invoice_its_sequence_a_stripped_reason_and_the_instant_in_utc():
    berlin = datetime(2026, 3, 8, 11, 30, tzinfo=UTC).astimezone(ZoneInfo("Europe/Berlin"))
    n = credit_note(INV, reason="  outage  ", at=berlin, amounts={"a": D("1.00")})
    assert (n.invoice_id, n.customer_id, n.currency, n.sequence, n.reason) == (IID, "c1", "USD", 1, "outage")
    assert n.issued_at == datetime(2026, 3, 8, 11, 30, tzinfo=UTC) and n.issued_at.tzinfo is UTC
    assert n.id == credit_note_id(IID, 1)
    second = note(amounts={"a": D("1.00")}, previous=[n])
    assert (second.sequence, second.id) == (2, credit_note_id(IID, 2))
    third = note(amounts={"a": D("1.00")}, previous=[n, second])
    assert (third.sequence, third.id) == (3, credit_note_id(IID, 3))


def test_later_notes_count_what_earlier_ones_credited_and_refunded():
    inv = invoice("10.00", "5.00", "2.50", prepaid="7.50")  # charged 10.00
    first = note(inv, amounts={"a": D("6.00"), "b": D("1.00")})
    assert (first.total, first.refund_amount, first.credits_returned) == (D("7.00"), D("7.00"), D("0"))
    # a has 4.00 left, b 4.00, c 2.50; 3.00 of the charged 10.00 is still refundable
    second = note(inv, amounts={"a": D("4.00")}, previous=[first])
    assert (second.total, second.refund_amount, second.credits_returned) == (D("4.00"), D("3.00"), D("1.00"))
    # nothing refundable is left: all of the rest returns prepaid credit
    rest = note(inv, previous=[first, second])
    assert lines_of(rest) == [("b", D("4.00")), ("c", D("2.50"))]
    assert (rest.total, rest.refund_amount, rest.credits_returned) == (D("6.50"), D("0"), D("6.50"))
    assert first.total + second.total + rest.total == inv.subtotal
    with pytest.raises(CreditNoteError, match=re.escape(f"invoice {IID} has nothing left to credit")):
        note(inv, previous=[first, second, rest])


def test_line_ids_credit_what_is_left_after_earlier_notes():
    first = note(amounts={"a": D("9.99")})
    assert lines_of(note(line_ids=["a"], previous=[first])) == [("a", D("0.01"))]
    whole_a = note(amounts={"a": D("10.00")})
    with pytest.raises(CreditNoteError, match=re.escape(f"line a of invoice {IID} has nothing left to credit")):
        note(line_ids=["a"], previous=[whole_a])
    # a whole note skips the line with nothing left instead of refusing
    assert lines_of(note(previous=[whole_a])) == [("b", D("5.00")), ("c", D("2.50"))]


# ---------------------------------------------------------------- a line's edge, and the invoice's


@pytest.mark.parametrize(
    ("asked", "ok"), [("4.99", True), ("5.00", True), ("5.01", False)],
)
def test_a_line_takes_up_to_exactly_what_is_left_on_it(asked, ok):
    if ok:
        assert note(amounts={"b": D(asked)}).total == D(asked)
    else:
        with pytest.raises(CreditNoteError, match=re.escape(
                f"cannot credit 5.01 USD on line b of invoice {IID}: only 5.00 is left uncredited on it")):
            note(amounts={"b": D(asked)})


@pytest.mark.parametrize(("asked", "ok"), [("2.99", True), ("3.00", True), ("3.01", False)])
def test_explicit_credits_stop_at_what_is_left_of_the_subtotal(asked, ok):
    inv = invoice("5.00", "-2.00")  # subtotal 3.00: line a alone has 5.00 left
    if ok:
        assert note(inv, amounts={"a": D(asked)}).total == D(asked)
    else:
        with pytest.raises(CreditNoteError, match=re.escape(
                f"cannot credit 3.01 USD on invoice {inv.id}: its subtotal is 3.00 and 0 is already credited, "
                f"so 3.00 is left")):
            note(inv, amounts={"a": D(asked)})


def test_the_subtotal_room_counts_earlier_notes_and_sums_every_wanted_line_in_the_message():
    inv = invoice("5.00", "4.00", "-6.00")  # subtotal 3.00
    first = note(inv, amounts={"a": D("1.00")})
    assert note(inv, amounts={"a": D("1.00"), "b": D("1.00")}, previous=[first]).total == D("2.00")
    with pytest.raises(CreditNoteError, match=re.escape(
            f"cannot credit 2.01 USD on invoice {inv.id}: its subtotal is 3.00 and 1.00 is already credited, "
            f"so 2.00 is left")):
        note(inv, amounts={"a": D("1.00"), "b": D("1.01")}, previous=[first])
    with pytest.raises(CreditNoteError, match=re.escape("so 2.00 is left")):
        note(inv, line_ids=["b"], previous=[first])


def test_a_whole_note_fills_the_room_line_by_line_and_stops_when_it_is_used():
    inv = invoice("2.00", "3.00", "4.00", "-5.50")  # subtotal 3.50
    assert lines_of(note(inv)) == [("a", D("2.00")), ("b", D("1.50"))]
    first = note(inv, amounts={"c": D("3.49")})  # room left: 0.01
    assert lines_of(note(inv, previous=[first])) == [("a", D("0.01"))]
    used = note(inv, amounts={"c": D("3.50")})
    with pytest.raises(CreditNoteError, match=re.escape(f"invoice {inv.id} has nothing left to credit")):
        note(inv, previous=[used])


# ---------------------------------------------------------------- bad input, exact messages


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"amounts": {"z": D("1.00")}}, f"invoice {IID} has no line z"),
        ({"line_ids": ["z"]}, f"invoice {IID} has no line z"),
        ({"amounts": {"a": D("0")}}, "credit on line a must be a positive Decimal, got Decimal('0')"),
        ({"amounts": {"a": D("-0.01")}}, "credit on line a must be a positive Decimal, got Decimal('-0.01')"),
        ({"amounts": {"a": D("NaN")}}, "credit on line a must be a positive Decimal, got Decimal('NaN')"),
        ({"amounts": {"a": D("Infinity")}}, "credit on line a must be a positive Decimal, got Decimal('Infinity')"),
        ({"amounts": {"a": 1}}, "credit on line a must be a positive Decimal, got 1"),
        ({"amounts": {"a": "1.00"}}, "credit on line a must be a positive Decimal, got '1.00'"),
        ({"amounts": {"a": D("0.001")}},
         "credit on line a 0.001 USD has more decimals than USD allows (at most 2 decimal places); "
         "round it first (e.g. 0.00)"),
        ({"line_ids": []}, "line_ids is empty: pass None to credit the whole invoice"),
        ({"line_ids": ["a"], "amounts": {"a": D("1")}},
         "give either line_ids (credit what is left on them) or amounts, not both"),
        ({"reason": ""}, "a credit note needs a reason (it is printed on the document)"),
        ({"reason": " \t"}, "a credit note needs a reason (it is printed on the document)"),
        ({"reason": None}, "a credit note needs a reason (it is printed on the document)"),
        ({"at": T_FINAL - US},
         f"credit note at {(T_FINAL - US).isoformat()} is before invoice {IID} was finalized"),
        ({"at": datetime(2026, 3, 8, 9)}, "at 2026-03-08T09:00:00 has no time zone: give an aware datetime (UTC)"),
        ({"at": "2026-03-08"}, "at must be a datetime, got str"),
    ],
)
def test_bad_credit_notes_say_exactly_what_is_wrong(kwargs, message):
    with pytest.raises(CreditNoteError) as caught:
        note(**kwargs)
    assert str(caught.value) == message


def test_a_note_at_the_instant_of_finalization_is_accepted():
    assert note(at=T_FINAL).issued_at == T_FINAL
    assert note(at=T_FINAL + US).issued_at == T_FINAL + US


@pytest.mark.parametrize(("status", "ok"), [
    (InvoiceStatus.DRAFT, False), (InvoiceStatus.OPEN, True), (InvoiceStatus.PAID, True),
    (InvoiceStatus.PAYMENT_FAILED, True), (InvoiceStatus.VOID, False),
])
def test_only_a_finalized_not_void_invoice_takes_a_note(status, ok):
    inv = {
        InvoiceStatus.DRAFT: draft("10.00"),
        InvoiceStatus.OPEN: invoice("10.00"),
        InvoiceStatus.PAID: mark_paid(invoice("10.00"), at=T_FINAL),
        InvoiceStatus.PAYMENT_FAILED: mark_payment_failed(invoice("10.00"), at=T_FINAL),
        InvoiceStatus.VOID: void(invoice("10.00"), at=T_FINAL),
    }[status]
    if ok:
        assert note(inv).total == D("10.00")
    else:
        with pytest.raises(CreditNoteError) as caught:
            note(inv)
        assert str(caught.value) == (
            f"a credit note needs a finalized, not void, invoice; invoice {inv.id} is {status}")


def test_a_previous_note_of_another_invoice_is_refused():
    other = dataclasses.replace(note(amounts={"a": D("1.00")}), id="cn_x", invoice_id="inv_other")
    with pytest.raises(CreditNoteError) as caught:
        note(previous=[other])
    assert str(caught.value) == f"credit note cn_x is for invoice inv_other, not {IID}"


def test_the_input_object_validates_alone():
    CreditNoteInput(INV, "r", T_FINAL).validate()
    CreditNoteInput(INV, "r", T_FINAL, line_ids=["a"]).validate()
    CreditNoteInput(INV, "r", T_FINAL, amounts={"a": D(1)}, previous=(note(),)).validate()
    with pytest.raises(CreditNoteError, match="not both"):
        CreditNoteInput(INV, "r", T_FINAL, line_ids=["a"], amounts={"a": D(1)}).validate()
    with pytest.raises(CreditNoteError, match="is before invoice"):
        CreditNoteInput(INV, "r", T_FINAL - US).validate()
    # an invoice without a finalization time (a stand-in: `Invoice` itself refuses one) sets no lower bound
    untimed = SimpleNamespace(id=IID, status=InvoiceStatus.OPEN, finalized_at=None)
    CreditNoteInput(untimed, "r", T_FINAL - timedelta(days=400)).validate()


# ---------------------------------------------------------------- helpers


def test_credit_note_ids_are_stable_and_differ_by_invoice_and_sequence():
    assert credit_note_id("inv_1", 1) == "cn_" + stable_id("credit_note", "inv_1", "1")
    assert credit_note_id("inv_1", 1) == "cn_" + hashlib.sha256(b"credit_note|inv_1|1").hexdigest()[:24]
    assert len({credit_note_id("inv_1", 1), credit_note_id("inv_1", 2), credit_note_id("inv_2", 1)}) == 3


def _note(*lines: tuple[str, str]) -> CreditNote:
    cl = tuple(CreditNoteLine(i, D(a)) for i, a in lines)
    return CreditNote(id="cn", invoice_id="i", customer_id="c", currency="USD", sequence=1, lines=cl,
                      total=_sum_notes(cl), refund_amount=D(0), credits_returned=D(0), reason="r", issued_at=T_FINAL)


@pytest.mark.parametrize(
    ("notes", "expected"),
    [
        ([], {}),
        ([_note(("a", "1.00"))], {"a": D("1.00")}),
        ([_note(("a", "1.00"), ("b", "0.01")), _note(("a", "2.50"))], {"a": D("3.50"), "b": D("0.01")}),
        ([_note(("a", "1.00"), ("a", "1.00"))], {"a": D("2.00")}),
    ],
)
def test_credited_by_line_sums_every_note(notes, expected):
    assert credited_by_line(notes) == expected


@pytest.mark.parametrize(
    ("amounts", "total"), [((), "0"), (("0.01",), "0.01"), (("1.10", "2.20", "0.01"), "3.31")],
)
def test_sum_of_a_notes_lines(amounts, total):
    got = _sum_notes(CreditNoteLine(str(i), D(a)) for i, a in enumerate(amounts))
    assert got == D(total) and isinstance(got, Decimal)


# ---------------------------------------------------------------- a rated line copied onto a draft


def rated(**changes) -> Line:
    base = Line(line_id="l1", kind="usage", customer_id="c1", charge_key="k", meter="output_tokens",
                group="big", quantity=D("1234567"), unit_price=D("0.0000024"), precise_amount=D("2.9629608"),
                amount=D("2.96"))
    return base._replace(**changes)


def test_a_copied_line_is_the_checked_line_field_for_field():
    start, end = PERIOD.start, PERIOD.end
    for line_ in (rated(), rated(unit_price=None), rated(kind="minimum"), rated(kind="credit", amount=D("-1.00"))):
        copied = _copied(line_, PERIOD.label, start, end)
        assert type(copied) is InvoiceLine
        assert copied == line_from_rated(line_, PERIOD)
        assert vars(copied) == vars(line_from_rated(line_, PERIOD))


@pytest.mark.parametrize(
    "changes",
    [
        {"line_id": ""}, {"kind": "usages"}, {"kind": "flat"},
        {"quantity": 5}, {"amount": "2.96"}, {"precise_amount": 2.96},
        {"quantity": D("NaN")}, {"amount": D("Infinity")}, {"precise_amount": D("-Infinity")},
        {"unit_price": "0.0000024"}, {"unit_price": 1},
    ],
)
def test_a_rated_line_the_checked_constructor_would_question_is_not_copied(changes):
    assert _copied(rated(**changes), PERIOD.label, PERIOD.start, PERIOD.end) is None


# ---------------------------------------------------------------- periods_between


@pytest.mark.parametrize(
    ("first", "last", "labels"),
    [
        ("2026-02", "2026-02", ["2026-02"]),
        ("2026-02", "2026-03", ["2026-02", "2026-03"]),
        ("2025-11", "2026-02", ["2025-11", "2025-12", "2026-01", "2026-02"]),
        ("2026-03", "2026-02", []),  # last before first: nothing
    ],
)
def test_periods_between_both_labels_included(first, last, labels):
    got = list(periods_between(first, last, "Europe/Berlin", 7))
    assert [p.label for p in got] == labels
    assert got == [billing_period(label, "Europe/Berlin", 7) for label in labels]
    assert all(a.end == b.start for a, b in zip(got, got[1:], strict=False))


def test_periods_between_stops_at_the_last_label_even_when_more_follow():
    walk = periods_between("2026-01", "2026-02", "UTC", 1)
    assert next(walk).label == "2026-01"
    assert next(walk).label == "2026-02"
    with pytest.raises(StopIteration):
        next(walk)


def test_periods_between_reaches_the_last_period_of_the_calendar():
    assert [p.label for p in periods_between("9998-11", "9998-12", "UTC", 1)] == ["9998-11", "9998-12"]
