"""Invoices, pure: lines from a rating, the status state machine, adjustments, void and reissue
(credit notes against them: `billing.credit_notes`).

Money is never computed here: invoice lines copy the line ids, quantities, precise and rounded
amounts of a `pricing.rating.Rating`, and adjustments and credit notes only subtract amounts that
rating already rounded. So every invoice of a period plus its adjustments adds up to the rating of
the period exactly.

State machine (`TRANSITIONS`):

    draft --finalize--> open --> paid
                         |  \\--> payment_failed --> paid
                         |                      \\--> void
                         \\--> void

A draft is the only status whose lines and amounts may change; from `open` on the invoice is a
document (`InvoiceImmutable` for any change). `paid` and `void` are terminal: a paid invoice is
corrected with a credit note, a wrong open one is voided and reissued as a new draft.

Ids are stable hashes: `invoice_id(customer, period label, sequence)`, line ids from rating,
adjustment line ids from (rated line id, target invoice id). A rerun with no new usage gives the same
ids, so adapters upsert instead of duplicating.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from enum import StrEnum
from types import MappingProxyType
from typing import Literal

from billing._common import ZERO, aware_utc, check_minor_units, currency_of, stable_id
from billing.errors import (
    InvoiceError,
    InvoiceImmutable,
    InvoiceStateError,
)
from billing.numbering import parse_number
from billing.periods import Period, parse_label
from pricing.money import Currency
from pricing.rating import Line, Rating

LineKind = Literal["usage", "minimum", "credit"]
LINE_KINDS: tuple[LineKind, ...] = ("usage", "minimum", "credit")


class InvoiceStatus(StrEnum):
    DRAFT = "draft"
    OPEN = "open"  # finalized: numbered, sent, awaiting payment
    PAID = "paid"
    PAYMENT_FAILED = "payment_failed"
    VOID = "void"

    @property
    def finalized(self) -> bool:
        return self is not InvoiceStatus.DRAFT


S = InvoiceStatus
TRANSITIONS: Mapping[InvoiceStatus, frozenset[InvoiceStatus]] = MappingProxyType(
    {
        S.DRAFT: frozenset({S.OPEN}),
        S.OPEN: frozenset({S.PAID, S.PAYMENT_FAILED, S.VOID}),
        S.PAYMENT_FAILED: frozenset({S.PAID, S.VOID}),
        S.PAID: frozenset(),
        S.VOID: frozenset(),
    }
)
# statuses whose lines count as invoiced (a void invoice charges nothing; a draft is not a document yet)
CHARGING = frozenset({S.OPEN, S.PAID, S.PAYMENT_FAILED})


# ---------------------------------------------------------------- ids


def invoice_id(customer_id: str, period_label: str, sequence: int) -> str:
    """Stable id of a customer's `sequence`-th invoice (1 = the regular one) for a period."""
    parse_label(period_label)
    _check_sequence(sequence)
    return "inv_" + stable_id("invoice", customer_id, period_label, str(sequence))


def adjustment_line_id(rated_line_id: str, target_invoice_id: str) -> str:
    return stable_id("adjustment", rated_line_id, target_invoice_id)


def _check_sequence(sequence: object) -> int:
    if not isinstance(sequence, int) or isinstance(sequence, bool) or sequence < 1:
        raise InvoiceError(f"invoice sequence {sequence!r} must be a whole number from 1")
    return sequence


# ---------------------------------------------------------------- values


@dataclass(frozen=True)
class InvoiceLine:
    """One line of an invoice. `rated_line_id` is the rating's stable line id; for a line copied from a
    rating `id == rated_line_id`, for an adjustment `id` is derived from it and the target invoice.
    `period` and the service period name the billing period the line belongs to, which for an
    adjustment is an earlier period than the invoice it lands on."""

    id: str
    rated_line_id: str
    kind: LineKind
    charge_key: str
    meter: str
    group: str  # the model, the GPU type, or ''
    quantity: Decimal
    unit_price: Decimal | None  # None for tiered, package, flat, minimum and credit lines
    precise_amount: Decimal
    amount: Decimal  # rounded once by rating (or the difference of two rounded amounts)
    period: str
    service_period_start: datetime
    service_period_end: datetime

    def __post_init__(self) -> None:
        if not self.id or not self.rated_line_id:
            raise InvoiceError("an invoice line needs an id and the rated line id it comes from")
        if self.kind not in LINE_KINDS:
            raise InvoiceError(f"line {self.id}: kind {self.kind!r} is not one of {', '.join(LINE_KINDS)}")
        for name in ("quantity", "precise_amount", "amount"):
            value = getattr(self, name)
            if not isinstance(value, Decimal) or not value.is_finite():
                raise InvoiceError(f"line {self.id}: {name} must be a finite Decimal, got {value!r}")
        if self.unit_price is not None and not isinstance(self.unit_price, Decimal):
            raise InvoiceError(f"line {self.id}: unit_price must be a Decimal or None")
        parse_label(self.period)
        start, end = self.service_period_start, self.service_period_end
        if not (isinstance(start, datetime) and start.tzinfo is UTC):  # already aware UTC: nothing to convert
            start = aware_utc(start, f"line {self.id}: service_period_start", InvoiceError)
        if not (isinstance(end, datetime) and end.tzinfo is UTC):
            end = aware_utc(end, f"line {self.id}: service_period_end", InvoiceError)
        if end <= start:
            raise InvoiceError(f"line {self.id}: service period end {end.isoformat()} is not after its start")
        object.__setattr__(self, "service_period_start", start)
        object.__setattr__(self, "service_period_end", end)

    @property
    def is_adjustment(self) -> bool:
        return self.id != self.rated_line_id


@dataclass(frozen=True)
class StatusChange:
    from_status: InvoiceStatus
    to_status: InvoiceStatus
    at: datetime


# Lines tuples that passed Invoice's line checks (kept referenced, so an id is never reused while
# here): every state change copies the invoice with the same tuple, which needs no second check.
_CHECKED_LINES: dict[int, tuple[tuple[InvoiceLine, ...], str, Decimal]] = {}


@dataclass(frozen=True)
class Invoice:
    """An invoice of one customer. Build drafts with `draft_from_rating` / `reissue`; change them with
    `add_lines`, `replace_lines`, `remove_lines`, `with_credits_applied`; move them with `transition`.
    `subtotal` is the sum of the line amounts, `total = subtotal - credits_applied` (prepaid credits)."""

    id: str
    customer_id: str
    currency: str
    period: str
    period_start: datetime
    period_end: datetime
    sequence: int
    status: InvoiceStatus
    lines: tuple[InvoiceLine, ...]
    subtotal: Decimal
    credits_applied: Decimal
    total: Decimal
    price_book_version: str
    number: str | None = None
    issued_at: datetime | None = None
    finalized_at: datetime | None = None
    history: tuple[StatusChange, ...] = ()
    reissue_of: str | None = None  # the voided invoice this draft replaces

    def __post_init__(self) -> None:
        money = currency_of(self.currency, InvoiceError)
        parse_label(self.period)
        _check_sequence(self.sequence)
        if not self.customer_id:
            raise InvoiceError("an invoice needs a customer_id")
        if not self.price_book_version:
            raise InvoiceError("an invoice needs the price book version it was rated with")
        if not isinstance(self.status, InvoiceStatus):
            raise InvoiceError(f"status {self.status!r} is not an InvoiceStatus")
        start = aware_utc(self.period_start, "period_start", InvoiceError)
        end = aware_utc(self.period_end, "period_end", InvoiceError)
        if end <= start:
            raise InvoiceError(f"invoice {self.id}: period end is not after its start")
        object.__setattr__(self, "period_start", start)
        object.__setattr__(self, "period_end", end)
        lines = tuple(self.lines)
        object.__setattr__(self, "lines", lines)
        checked = _CHECKED_LINES.get(id(lines))
        if checked is not None and checked[0] is lines and checked[1] == self.currency:
            subtotal = checked[2]  # the same lines as an invoice built a moment ago (replace() keeps them)
        else:
            seen: set[str] = set()
            for line in lines:
                if not isinstance(line, InvoiceLine):
                    raise InvoiceError(f"invoice {self.id}: lines must be InvoiceLine, got {type(line).__name__}")
                if line.id in seen:
                    raise InvoiceError(f"invoice {self.id}: line id {line.id} appears twice")
                seen.add(line.id)
                check_minor_units(line.amount, money, f"invoice {self.id} line {line.id} amount", InvoiceError)
            subtotal = sum((line.amount for line in lines), ZERO)
            if len(_CHECKED_LINES) >= 256:
                _CHECKED_LINES.clear()
            _CHECKED_LINES[id(lines)] = (lines, self.currency, subtotal)
        if self.subtotal != subtotal:
            raise InvoiceError(f"invoice {self.id}: subtotal {self.subtotal} is not the sum of its lines ({subtotal})")
        check_minor_units(self.credits_applied, money, f"invoice {self.id} credits_applied", InvoiceError)
        if self.credits_applied < 0:
            raise InvoiceError(f"invoice {self.id}: credits_applied {self.credits_applied} is negative")
        if self.credits_applied > max(subtotal, ZERO):
            raise InvoiceError(
                f"invoice {self.id}: credits_applied {self.credits_applied} exceeds the subtotal {subtotal} "
                f"(credits never take an invoice below zero)"
            )
        if self.total != subtotal - self.credits_applied:
            raise InvoiceError(f"invoice {self.id}: total {self.total} is not subtotal - credits_applied")
        if self.status.finalized:
            if self.number is None or self.finalized_at is None or self.issued_at is None:
                raise InvoiceError(f"invoice {self.id} is {self.status} but has no number, issued_at or finalized_at")
            parse_number(self.number)
        elif self.number is not None or self.finalized_at is not None:
            raise InvoiceError(f"draft invoice {self.id} cannot have a number or finalized_at (finalize it instead)")

    @property
    def money(self) -> Currency:
        return currency_of(self.currency, InvoiceError)

    def line(self, line_id: str) -> InvoiceLine:
        for line in self.lines:
            if line.id == line_id:
                return line
        raise InvoiceError(f"invoice {self.id} has no line {line_id}")

    @property
    def paid_at(self) -> datetime | None:
        return next((c.at for c in self.history if c.to_status is S.PAID), None)

    @property
    def voided_at(self) -> datetime | None:
        return next((c.at for c in self.history if c.to_status is S.VOID), None)


def _build(
    *,
    id: str,
    customer_id: str,
    currency: str,
    period: str,
    period_start: datetime,
    period_end: datetime,
    sequence: int,
    lines: Iterable[InvoiceLine],
    price_book_version: str,
    credits_applied: Decimal = ZERO,
    reissue_of: str | None = None,
) -> Invoice:
    lines = tuple(lines)
    subtotal = sum((line.amount for line in lines), ZERO)
    return Invoice(
        id=id, customer_id=customer_id, currency=currency, period=period, period_start=period_start,
        period_end=period_end, sequence=sequence, status=S.DRAFT, lines=lines, subtotal=subtotal,
        credits_applied=credits_applied, total=subtotal - credits_applied, price_book_version=price_book_version,
        reissue_of=reissue_of,
    )


# ---------------------------------------------------------------- drafts


@dataclass(frozen=True)
class DraftInvoiceInput:
    """What a draft is built from: a rating of exactly one billing period of one customer."""

    rating: Rating
    period: Period
    price_book_version: str
    sequence: int = 1

    def validate(self) -> None:
        if not isinstance(self.rating, Rating):
            raise InvoiceError(f"rating must be a pricing.rating.Rating, got {type(self.rating).__name__}")
        if not isinstance(self.period, Period):
            raise InvoiceError(f"period must be a billing.periods.Period, got {type(self.period).__name__}")
        _same_window(self.rating, self.period)
        _check_sequence(self.sequence)
        if not isinstance(self.price_book_version, str) or not self.price_book_version:
            raise InvoiceError("price_book_version is required (the stored book version the rating used)")


def _same_window(rating: Rating, period: Period) -> None:
    if (rating.period_start, rating.period_end) != (period.start, period.end):
        raise InvoiceError(
            f"the rating covers [{rating.period_start.isoformat()}, {rating.period_end.isoformat()}) but period "
            f"{period.label} is [{period.start.isoformat()}, {period.end.isoformat()}): rate exactly the billing period"
        )


def line_from_rated(line: Line, period: Period) -> InvoiceLine:
    """An invoice line copying a rated line (id, quantity, unit price, precise and rounded amounts)."""
    return InvoiceLine(
        id=line.line_id, rated_line_id=line.line_id, kind=line.kind, charge_key=line.charge_key, meter=line.meter,
        group=line.group, quantity=line.quantity, unit_price=line.unit_price, precise_amount=line.precise_amount,
        amount=line.amount, period=period.label, service_period_start=period.start, service_period_end=period.end,
    )


def _copied(line: Line, label: str, start: datetime, end: datetime) -> InvoiceLine | None:
    """`line_from_rated` of a rated line of period (label, start, end), built without the frozen
    dataclass's per-field __init__ once the line passes what a rated line could get wrong (id, kind,
    finite Decimals); None when it does not (the checked constructor then says what is wrong)."""
    (line_id, kind, _, charge_key, meter, group, quantity, unit_price, precise_amount, amount) = line
    if (not line_id or kind not in LINE_KINDS or type(quantity) is not Decimal or type(amount) is not Decimal
            or type(precise_amount) is not Decimal or not (quantity.is_finite() and amount.is_finite()
                                                           and precise_amount.is_finite())
            or (unit_price is not None and type(unit_price) is not Decimal)):
        return None
    copied = object.__new__(InvoiceLine)
    copied.__dict__.update(id=line_id, rated_line_id=line_id, kind=kind, charge_key=charge_key, meter=meter,
                           group=group, quantity=quantity, unit_price=unit_price, precise_amount=precise_amount,
                           amount=amount, period=label, service_period_start=start, service_period_end=end)
    return copied


def lines_from_rating(rating: Rating, period: Period) -> tuple[InvoiceLine, ...]:
    """`line_from_rated` of every line of a rating of `period`. The period (label, aware UTC bounds) was
    checked when it was cut, so each line is checked for what a rated line could get wrong (`_copied`)
    and built without the frozen dataclass's per-field __init__ (a billing run copies 10^5 lines)."""
    _same_window(rating, period)
    if not isinstance(period, Period):
        raise InvoiceError(f"period must be a billing.periods.Period, got {type(period).__name__}")
    label, start, end = period.label, period.start, period.end
    if not (start.tzinfo is UTC and end.tzinfo is UTC):
        return tuple(line_from_rated(line, period) for line in rating.lines)
    return tuple(_copied(line, label, start, end) or line_from_rated(line, period) for line in rating.lines)


def draft_from_rating(rating: Rating, period: Period, *, price_book_version: str, sequence: int = 1) -> Invoice:
    """The draft invoice of a rated period: one line per rated line, same ids and amounts."""
    request = DraftInvoiceInput(rating, period, price_book_version, sequence)
    request.validate()
    return _build(
        id=invoice_id(rating.customer_id, period.label, sequence), customer_id=rating.customer_id,
        currency=rating.currency, period=period.label, period_start=period.start, period_end=period.end,
        sequence=sequence, lines=lines_from_rating(rating, period), price_book_version=price_book_version,
    )


def first_invoice(rating: Rating, period: Period, *, currency: str, price_book_version: str) -> Invoice | None:
    """The draft `draft_from_rating(rating, period, ...)` makes (sequence 1), for the bulk billing run's
    first invoices (10^4 invoices, 10^5 lines a run): the same `Invoice`, built without the per-field
    __init__ and the checks of `Invoice` once the ones below hold, or None when one does not (period
    bounds not in UTC, a line whose kind, types, id or amount `Invoice` would question, a rating in
    another currency): then build the `Invoice` the usual way, whose checks say what is wrong."""
    if (rating.period_start, rating.period_end) != (period.start, period.end) or rating.currency != currency:
        return None
    if not (isinstance(period, Period) and period.start.tzinfo is UTC and period.end.tzinfo is UTC):
        return None
    if not price_book_version or not rating.customer_id:
        return None
    try:
        money = Currency.of(currency)
    except ValueError:
        return None
    label, start, end = period.label, period.start, period.end
    lines = []
    subtotal = ZERO
    for rated in rating.lines:
        line = _copied(rated, label, start, end)
        if line is None or money.round(line.amount) != line.amount:
            return None
        subtotal += line.amount
        lines.append(line)
    if len({line.id for line in lines}) != len(lines):
        return None
    draft = object.__new__(Invoice)
    draft.__dict__.update(
        id=invoice_id(rating.customer_id, label, 1), customer_id=rating.customer_id, currency=currency,
        period=label, period_start=start, period_end=end, sequence=1, status=S.DRAFT, lines=tuple(lines),
        subtotal=subtotal, credits_applied=ZERO, total=subtotal, price_book_version=price_book_version, number=None,
        issued_at=None, finalized_at=None, history=(), reissue_of=None,
    )
    return draft


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


def empty_draft(
    customer_id: str, currency: str, period: Period, *, price_book_version: str, sequence: int = 1
) -> Invoice:
    """A draft without lines for a customer's period: for an invoice that carries only adjustments of
    earlier periods (`add_lines`), or a period without usage."""
    if not isinstance(period, Period):
        raise InvoiceError(f"period must be a billing.periods.Period, got {type(period).__name__}")
    return _build(
        id=invoice_id(customer_id, period.label, sequence), customer_id=customer_id, currency=currency,
        period=period.label, period_start=period.start, period_end=period.end, sequence=sequence, lines=(),
        price_book_version=price_book_version,
    )


def _draft_only(invoice: Invoice, what: str) -> None:
    if invoice.status is not S.DRAFT:
        raise InvoiceImmutable(
            f"cannot {what}: invoice {invoice.id} ({invoice.number}) is {invoice.status}; a finalized invoice "
            f"is immutable — issue a credit note, or void it and reissue"
        )


def replace_lines(invoice: Invoice, lines: Iterable[InvoiceLine]) -> Invoice:
    """The draft with these lines instead (prepaid credits applied are reset to zero: apply them again)."""
    _draft_only(invoice, "change its lines")
    lines = tuple(lines)
    subtotal = _sum(lines)
    return replace(invoice, lines=lines, subtotal=subtotal, credits_applied=ZERO, total=subtotal)


def _sum(lines: Iterable[InvoiceLine]) -> Decimal:
    return sum((line.amount for line in lines), ZERO)


def add_lines(invoice: Invoice, lines: Iterable[InvoiceLine]) -> Invoice:
    """The draft with more lines (adjustments of earlier periods, say); a line id already there is an error."""
    return replace_lines(invoice, (*invoice.lines, *lines))


def remove_lines(invoice: Invoice, line_ids: Iterable[str]) -> Invoice:
    _draft_only(invoice, "remove lines")
    drop = set(line_ids)
    unknown = drop - {line.id for line in invoice.lines}
    if unknown:
        raise InvoiceError(f"invoice {invoice.id} has no line(s) {', '.join(sorted(unknown))}")
    return replace_lines(invoice, tuple(line for line in invoice.lines if line.id not in drop))


def with_credits_applied(invoice: Invoice, amount: Decimal) -> Invoice:
    """The draft with `amount` of prepaid credit applied (see `billing.credits.apply_credits`)."""
    _draft_only(invoice, "apply credits")
    return replace(invoice, credits_applied=amount, total=invoice.subtotal - amount)


# ---------------------------------------------------------------- the state machine


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
    seq = voided.sequence + 1 if sequence is None else _check_sequence(sequence)
    if seq <= voided.sequence:
        raise InvoiceError(f"the reissue's sequence {seq} must be after the voided invoice's ({voided.sequence})")
    return _build(
        id=invoice_id(voided.customer_id, voided.period, seq), customer_id=voided.customer_id,
        currency=voided.currency, period=voided.period, period_start=voided.period_start,
        period_end=voided.period_end, sequence=seq, lines=voided.lines,
        price_book_version=voided.price_book_version, reissue_of=voided.id,
    )


# ---------------------------------------------------------------- adjustments


def invoiced_lines(invoices: Iterable[Invoice], period_label: str) -> tuple[InvoiceLine, ...]:
    """The lines of `period_label` on the customer's charging invoices (open, paid, payment_failed),
    wherever they landed (an adjustment of February may sit on the March invoice). Drafts and void
    invoices charge nothing and are left out."""
    parse_label(period_label)
    out: list[InvoiceLine] = []
    customers: set[str] = set()
    for invoice in invoices:
        customers.add(invoice.customer_id)
        if invoice.status in CHARGING:
            out.extend(line for line in invoice.lines if line.period == period_label)
    if len(customers) > 1:
        raise InvoiceError(f"invoices of several customers given ({', '.join(sorted(customers))}): pass one customer's")
    return tuple(out)


def adjustment_lines(
    rated_now: Rating,
    invoiced: Iterable[InvoiceLine],
    *,
    period: Period,
    target_invoice_id: str,
) -> tuple[InvoiceLine, ...]:
    """The lines that bring what was invoiced for an already finalized period up (or down) to its
    rating now: per rated line id, rated now minus the sum already invoiced (quantity, precise and
    rounded amounts). Lines name the period they belong to; their ids come from (rated line id,
    target invoice id), so a rerun for the same target gives the same lines, and once the target is
    finalized (its lines then in `invoiced`) a rerun with nothing new gives none.

    Invariant: sum(invoiced amounts) + sum(adjustment amounts) == rated_now.total, exactly."""
    _same_window(rated_now, period)
    if not target_invoice_id:
        raise InvoiceError("target_invoice_id is required (the draft the adjustment lines go on)")
    done: dict[str, list[InvoiceLine]] = {}
    for line in invoiced:
        if line.period != period.label:
            raise InvoiceError(f"invoiced line {line.id} belongs to period {line.period}, not {period.label}")
        if line.id == adjustment_line_id(line.rated_line_id, target_invoice_id):
            raise InvoiceError(
                f"invoiced line {line.id} is an adjustment on the target invoice {target_invoice_id} itself: "
                f"pass only lines of finalized invoices (see invoiced_lines)"
            )
        done.setdefault(line.rated_line_id, []).append(line)
    now = {line.line_id: line for line in rated_now.lines}
    out: list[InvoiceLine] = []
    for rated_id in [*now, *sorted(set(done) - set(now))]:
        previous = done.get(rated_id, [])
        q0 = sum((line.quantity for line in previous), ZERO)
        p0 = sum((line.precise_amount for line in previous), ZERO)
        a0 = sum((line.amount for line in previous), ZERO)
        current = now.get(rated_id)
        if current is not None:
            q1, p1, a1 = current.quantity, current.precise_amount, current.amount
            kind, charge_key, meter, group, unit_price = (
                current.kind, current.charge_key, current.meter, current.group, current.unit_price
            )
        else:  # the rated line is gone (usage corrected away): take back everything invoiced for it
            q1 = p1 = a1 = ZERO
            last = previous[-1]
            kind, charge_key, meter, group, unit_price = last.kind, last.charge_key, last.meter, last.group, last.unit_price
        if (q1, p1, a1) == (q0, p0, a0):
            continue
        out.append(
            InvoiceLine(
                id=adjustment_line_id(rated_id, target_invoice_id), rated_line_id=rated_id, kind=kind,
                charge_key=charge_key, meter=meter, group=group, quantity=q1 - q0, unit_price=unit_price,
                precise_amount=p1 - p0, amount=a1 - a0, period=period.label, service_period_start=period.start,
                service_period_end=period.end,
            )
        )
    return tuple(out)
