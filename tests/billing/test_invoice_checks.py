"""`billing.invoice.Invoice`'s own checks and `billing.invoice.states.transition`'s refusals,
table-driven: every refusal with its exact message and error class, the period's edges (end equal to
the start, one microsecond after), edges given in another zone kept as the same instant in UTC, and
the lines' minor-unit check made again when the same lines are given in another currency."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from billing.errors import InvoiceError, InvoiceStateError
from billing.invoice import Invoice, InvoiceLine, InvoiceStatus
from billing.invoice.states import finalize, finalize_first, mark_paid, mark_payment_failed, transition, void

D = Decimal
S = InvoiceStatus
START = datetime(2026, 2, 1, tzinfo=UTC)
END = datetime(2026, 3, 1, tzinfo=UTC)
US = timedelta(microseconds=1)
NUMBER = "INV-2026-000001"


def line(id: str = "l1", amount: str = "2.00") -> InvoiceLine:
    return InvoiceLine(id=id, rated_line_id=id, kind="usage", charge_key="c0", meter="output_tokens", group="m",
                       quantity=D("1000"), unit_price=D("0.002"), precise_amount=D("2.000000000000"),
                       amount=D(amount), period="2026-02", service_period_start=START, service_period_end=END)


def fields(**changes) -> dict:
    values = dict(id="inv1", customer_id="c1", currency="USD", period="2026-02", period_start=START, period_end=END,
                  sequence=1, status=S.DRAFT, lines=(line(),), subtotal=D("2.00"), credits_applied=D("0.00"),
                  total=D("2.00"), price_book_version="v1")
    values.update(changes)
    return values


def refused(error: type[Exception], call, *args, **kwargs) -> str:
    """The message of the error `call` raises, after checking its class is exactly `error`."""
    with pytest.raises(Exception) as raised:
        call(*args, **kwargs)
    assert type(raised.value) is error, raised.value
    return str(raised.value)


# ---------------------------------------------------------------- Invoice.__post_init__


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"customer_id": ""}, "an invoice needs a customer_id"),
        ({"price_book_version": ""}, "an invoice needs the price book version it was rated with"),
        ({"status": "draft"}, "status 'draft' is not an InvoiceStatus"),
        ({"period_start": datetime(2026, 2, 1)},
         "period_start 2026-02-01T00:00:00 has no time zone: give an aware datetime (UTC)"),
        ({"period_end": datetime(2026, 3, 1)},
         "period_end 2026-03-01T00:00:00 has no time zone: give an aware datetime (UTC)"),
        ({"period_start": "2026-02-01"}, "period_start must be a datetime, got str"),
        ({"period_end": None}, "period_end must be a datetime, got NoneType"),
        ({"period_end": START}, "invoice inv1: period end is not after its start"),
        ({"period_end": START - US}, "invoice inv1: period end is not after its start"),
        ({"lines": ("l1",), "subtotal": D("0"), "total": D("0")},
         "invoice inv1: lines must be InvoiceLine, got str"),
        ({"lines": (line(), line()), "subtotal": D("4.00"), "total": D("4.00")},
         "invoice inv1: line id l1 appears twice"),
        ({"lines": (line(amount="2.001"),), "subtotal": D("2.001"), "total": D("2.001")},
         "invoice inv1 line l1 amount 2.001 USD has more decimals than USD allows (at most 2 decimal places); "
         "round it first (e.g. 2.00)"),
        ({"subtotal": D("2.01")}, "invoice inv1: subtotal 2.01 is not the sum of its lines (2.00)"),
        ({"credits_applied": D("0.001"), "total": D("1.999")},
         "invoice inv1 credits_applied 0.001 USD has more decimals than USD allows (at most 2 decimal places); "
         "round it first (e.g. 0.00)"),
        ({"credits_applied": D("-0.01"), "total": D("2.01")}, "invoice inv1: credits_applied -0.01 is negative"),
        ({"credits_applied": D("2.01"), "total": D("-0.01")},
         "invoice inv1: credits_applied 2.01 exceeds the subtotal 2.00 (credits never take an invoice below zero)"),
        ({"total": D("2.01")}, "invoice inv1: total 2.01 is not subtotal - credits_applied"),
        ({"total": D("1.99")}, "invoice inv1: total 1.99 is not subtotal - credits_applied"),
        ({"number": NUMBER}, "draft invoice inv1 cannot have a number or finalized_at (finalize it instead)"),
        ({"finalized_at": END}, "draft invoice inv1 cannot have a number or finalized_at (finalize it instead)"),
    ],
)
def test_an_invoice_refuses_with_the_exact_message(changes, message):
    assert refused(InvoiceError, Invoice, **fields(**changes)) == message


def test_an_unknown_currency_is_an_invoice_error():
    message = refused(InvoiceError, Invoice, **fields(currency="XYZ"))
    assert message.startswith("unknown currency 'XYZ' (known: ")


def test_the_period_may_be_one_microsecond_long():
    assert Invoice(**fields(period_end=START + US)).period_end == START + US


def test_credits_may_pay_the_subtotal_exactly_and_not_one_cent_more():
    paid = Invoice(**fields(credits_applied=D("2.00"), total=D("0.00")))
    assert (paid.credits_applied, paid.total) == (D("2.00"), D("0.00"))
    assert refused(InvoiceError, Invoice, **fields(credits_applied=D("2.01"), total=D("-0.01"))).startswith(
        "invoice inv1: credits_applied 2.01 exceeds the subtotal 2.00")


def test_edges_in_another_zone_are_kept_in_utc_and_lines_as_a_tuple():
    plus_one = timezone(timedelta(hours=1))
    invoice = Invoice(**fields(period_start=datetime(2026, 2, 1, 1, tzinfo=plus_one),
                               period_end=datetime(2026, 3, 1, 1, tzinfo=plus_one), lines=[line()]))
    assert (invoice.period_start, invoice.period_end) == (START, END)
    assert invoice.period_start.tzinfo is UTC and invoice.period_end.tzinfo is UTC
    assert type(invoice.lines) is tuple and invoice.lines == (line(),)


def test_the_same_lines_are_checked_again_in_another_currency():
    lines = (line(amount="2.50"),)
    usd = Invoice(**fields(lines=lines, subtotal=D("2.50"), total=D("2.50")))
    assert usd.lines is lines
    message = refused(InvoiceError, Invoice, **fields(currency="JPY", lines=lines, subtotal=D("2.50"), total=D("2.50")))
    assert message == ("invoice inv1 line l1 amount 2.50 JPY has more decimals than JPY allows (no decimals); "
                       "round it first (e.g. 3)")  # half-up


@pytest.mark.parametrize(
    "missing",
    [
        {"number": None, "issued_at": START, "finalized_at": START},
        {"number": NUMBER, "issued_at": None, "finalized_at": START},
        {"number": NUMBER, "issued_at": START, "finalized_at": None},
        {"number": None, "issued_at": None, "finalized_at": None},
    ],
)
def test_a_finalized_invoice_needs_its_number_issued_at_and_finalized_at(missing):
    assert refused(InvoiceError, Invoice, **fields(status=S.OPEN, **missing)) == (
        "invoice inv1 is open but has no number, issued_at or finalized_at")


def test_a_finalized_invoice_with_all_three_is_accepted():
    invoice = Invoice(**fields(status=S.PAID, number=NUMBER, issued_at=START, finalized_at=START))
    assert (invoice.status, invoice.number) == (S.PAID, NUMBER)


# ---------------------------------------------------------------- transition


def draft() -> Invoice:
    return Invoice(**fields())


def opened() -> Invoice:
    return finalize(draft(), number=NUMBER, at=END)


def test_an_unknown_status_lists_the_known_ones():
    assert refused(InvoiceStateError, transition, draft(), "nope", at=END) == (
        "unknown invoice status 'nope' (one of draft, open, paid, payment_failed, void)")


@pytest.mark.parametrize(
    ("make", "to", "message"),
    [
        (draft, S.PAID, "invoice inv1 cannot go from draft to paid (allowed from draft: open)"),
        (opened, S.DRAFT, "invoice inv1 cannot go from open to draft (allowed from open: paid, payment_failed, void)"),
        (lambda: mark_paid(opened(), at=END), S.VOID,
         "invoice inv1 cannot go from paid to void (allowed from paid: none: it is terminal)"),
        (lambda: void(opened(), at=END), S.OPEN,
         "invoice inv1 cannot go from void to open (allowed from void: none: it is terminal)"),
        (lambda: mark_payment_failed(opened(), at=END), S.OPEN,
         "invoice inv1 cannot go from payment_failed to open (allowed from payment_failed: paid, void)"),
    ],
)
def test_a_move_not_allowed_names_the_allowed_ones(make, to, message):
    assert refused(InvoiceStateError, transition, make(), to, at=END, number=NUMBER) == message


def test_a_naive_or_missing_time_is_refused():
    assert refused(InvoiceStateError, mark_paid, opened(), at=datetime(2026, 3, 2)) == (
        "at 2026-03-02T00:00:00 has no time zone: give an aware datetime (UTC)")
    assert refused(InvoiceStateError, mark_paid, opened(), at=None) == "at must be a datetime, got NoneType"


def test_issued_at_is_checked_and_kept_in_utc():
    assert refused(InvoiceStateError, finalize, draft(), number=NUMBER, at=END, issued_at=datetime(2026, 3, 1)) == (
        "issued_at 2026-03-01T00:00:00 has no time zone: give an aware datetime (UTC)")
    assert refused(InvoiceStateError, finalize, draft(), number=NUMBER, at=END, issued_at="2026-03-01") == (
        "issued_at must be a datetime, got str")
    issued = datetime(2026, 3, 1, 1, tzinfo=timezone(timedelta(hours=1)))
    final = finalize(draft(), number=NUMBER, at=END + US, issued_at=issued)
    assert (final.issued_at, final.finalized_at) == (END, END + US)
    assert final.issued_at.tzinfo is UTC


@pytest.mark.parametrize("extra", [{"number": NUMBER}, {"issued_at": END}, {"number": NUMBER, "issued_at": END}])
def test_number_and_issued_at_are_for_finalizing_only(extra):
    assert refused(InvoiceStateError, transition, opened(), S.PAID, at=END, **extra) == (
        "number and issued_at are set when finalizing only")


# ---------------------------------------------------------------- finalize_first


def test_finalize_first_refuses_a_naive_time_as_finalize_does():
    for at, message in [(datetime(2026, 3, 1), "at 2026-03-01T00:00:00 has no time zone: give an aware datetime (UTC)"),
                        ("2026-03-01", "at must be a datetime, got str")]:
        assert refused(InvoiceStateError, finalize_first, draft(), number=NUMBER, at=at) == message
        assert refused(InvoiceStateError, finalize, draft(), number=NUMBER, at=at) == message


@pytest.mark.parametrize(("amount", "credits"), [("2.00", "2.00"), ("2.00", "1.01"), ("2.00", "1.00"), ("0.00", "0.00")])
def test_finalize_first_is_finalize_at_totals_of_zero_and_around_one(amount, credits):
    lines = (line(amount=amount),)
    total = D(amount) - D(credits)
    invoice = Invoice(**fields(lines=lines, subtotal=D(amount), credits_applied=D(credits), total=total))
    first = finalize_first(invoice, number=NUMBER, at=END)
    assert first == finalize(invoice, number=NUMBER, at=END)
    assert (first.status, first.total, first.issued_at, first.finalized_at) == (S.OPEN, total, END, END)
    assert dataclasses.asdict(first) == dataclasses.asdict(finalize(invoice, number=NUMBER, at=END))
