"""The moves between an invoice's statuses (`billing.invoice.TRANSITIONS`): `transition` and its
named moves (`finalize`, `finalize_first` for the bulk billing run, `mark_paid`, `mark_payment_failed`,
`void`), and `reissue`, the draft that replaces a voided invoice."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from billing._common import aware_utc
from billing.errors import InvoiceError, InvoiceStateError
from billing.invoice import (
    TRANSITIONS,
    Invoice,
    InvoiceStatus,
    StatusChange,
    build_draft,
    check_sequence,
    invoice_id,
)
from billing.numbering import parse_number

S = InvoiceStatus


def finalize_first(draft: Invoice, *, number: str, at: datetime) -> Invoice:
    """`finalize(draft, number=number, at=at)` without `dataclasses.replace`'s rebuild and re-check of an
    invoice that is already an `Invoice` (the bulk billing run finalizes 10^4 first invoices a run, made
    by `first_invoice`): the same open invoice. A draft that `finalize` refuses (a negative total), or
    an invoice that is not a draft, goes through `finalize`, which says why."""
    if draft.status is not S.DRAFT or draft.total < 0:
        return finalize(draft, number=number, at=at)
    when = aware_utc(at, "at", InvoiceStateError)
    parse_number(number)
    final = object.__new__(Invoice)
    final.__dict__.update(draft.__dict__, status=S.OPEN, number=number, issued_at=when, finalized_at=when,
                          history=(StatusChange(S.DRAFT, S.OPEN, when),))
    return final


def can_transition(from_status: InvoiceStatus, to_status: InvoiceStatus) -> bool:
    return to_status in TRANSITIONS[from_status]


def transition(
    invoice: Invoice,
    to: InvoiceStatus,
    *,
    at: datetime,
    number: str | None = None,
    issued_at: datetime | None = None,
) -> Invoice:
    """The invoice in status `to` at time `at` (the injected clock). Finalizing (draft -> open) needs the
    `number` the adapter allocated; `issued_at` (the date on the document) defaults to `at`."""
    try:
        to = InvoiceStatus(to)
    except ValueError:
        raise InvoiceStateError(f"unknown invoice status {to!r} (one of {', '.join(InvoiceStatus)})") from None
    when = aware_utc(at, "at", InvoiceStateError)
    if not can_transition(invoice.status, to):
        allowed = ", ".join(sorted(TRANSITIONS[invoice.status])) or "none: it is terminal"
        raise InvoiceStateError(
            f"invoice {invoice.id} cannot go from {invoice.status} to {to} (allowed from {invoice.status}: {allowed})"
        )
    if invoice.history and when < invoice.history[-1].at:
        raise InvoiceStateError(
            f"invoice {invoice.id}: {to} at {when.isoformat()} is before its last change "
            f"({invoice.history[-1].to_status} at {invoice.history[-1].at.isoformat()})"
        )
    history = (*invoice.history, StatusChange(invoice.status, to, when))
    if to is S.OPEN:
        if number is None:
            raise InvoiceStateError(f"finalizing invoice {invoice.id} needs the invoice number the adapter allocated")
        parse_number(number)
        if invoice.total < 0:
            raise InvoiceStateError(
                f"invoice {invoice.id} totals {invoice.total} {invoice.currency}: an invoice cannot be negative; "
                f"issue a credit note against the invoice being corrected instead"
            )
        issued = when if issued_at is None else aware_utc(issued_at, "issued_at", InvoiceStateError)
        return replace(invoice, status=to, number=number, finalized_at=when, issued_at=issued, history=history)
    if number is not None or issued_at is not None:
        raise InvoiceStateError("number and issued_at are set when finalizing only")
    return replace(invoice, status=to, history=history)


def finalize(invoice: Invoice, *, number: str, at: datetime, issued_at: datetime | None = None) -> Invoice:
    return transition(invoice, S.OPEN, at=at, number=number, issued_at=issued_at)


def mark_paid(invoice: Invoice, *, at: datetime) -> Invoice:
    return transition(invoice, S.PAID, at=at)


def mark_payment_failed(invoice: Invoice, *, at: datetime) -> Invoice:
    return transition(invoice, S.PAYMENT_FAILED, at=at)


def void(invoice: Invoice, *, at: datetime) -> Invoice:
    """The voided invoice (open or payment_failed only: a paid invoice is corrected with a credit note)."""
    return transition(invoice, S.VOID, at=at)


def reissue(voided: Invoice, *, sequence: int | None = None) -> Invoice:
    """A new draft replacing a voided invoice: same customer, period, lines and book version; new id
    from the next sequence (default voided.sequence + 1; pass the adapter's next free sequence if an
    adjustment invoice took that one). Prepaid credits are not carried over: apply them again."""
    if voided.status is not S.VOID:
        raise InvoiceStateError(f"only a void invoice is reissued; invoice {voided.id} is {voided.status} (void it first)")
    seq = voided.sequence + 1 if sequence is None else check_sequence(sequence)
    if seq <= voided.sequence:
        raise InvoiceError(f"the reissue's sequence {seq} must be after the voided invoice's ({voided.sequence})")
    return build_draft(
        id=invoice_id(voided.customer_id, voided.period, seq), customer_id=voided.customer_id,
        currency=voided.currency, period=voided.period, period_start=voided.period_start,
        period_end=voided.period_end, sequence=seq, lines=voided.lines,
        price_book_version=voided.price_book_version, reissue_of=voided.id,
    )
