"""Drafts: built from a rating of one billing period (`draft_from_rating`, `first_invoice` for the bulk
billing run, `empty_draft`), and a draft's changes (`add_lines`, `replace_lines`, `remove_lines`,
`with_credits_applied`); a finalized invoice refuses them (`InvoiceImmutable`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal

from billing._common import ZERO
from billing.errors import InvoiceError, InvoiceImmutable
from billing.invoice import (
    LINE_KINDS,
    Invoice,
    InvoiceLine,
    InvoiceStatus,
    build_draft,
    check_sequence,
    invoice_id,
    same_window,
)
from billing.periods import Period
from pricing.money import EXACT, Currency, exact_sum
from pricing.rating import Line, Rating

S = InvoiceStatus


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
        same_window(self.rating, self.period)
        check_sequence(self.sequence)
        if not isinstance(self.price_book_version, str) or not self.price_book_version:
            raise InvoiceError("price_book_version is required (the stored book version the rating used)")



def line_from_rated(line: Line, period: Period) -> InvoiceLine:
    """An invoice line copying a rated line (id, quantity, unit price, precise and rounded amounts)."""
    return InvoiceLine(
        id=line.line_id, rated_line_id=line.line_id, kind=line.kind, charge_key=line.charge_key, meter=line.meter,
        group=line.group, quantity=line.quantity, unit_price=line.unit_price, precise_amount=line.precise_amount,
        amount=line.amount, period=period.label, service_period_start=period.start, service_period_end=period.end,
        project=line.project,
    )


def _copied(line: Line, label: str, start: datetime, end: datetime) -> InvoiceLine | None:
    """`line_from_rated` of a rated line of period (label, start, end), built without the frozen
    dataclass's per-field __init__ once the line passes what a rated line could get wrong (id, kind,
    finite Decimals); None when it does not (the checked constructor then says what is wrong)."""
    (line_id, kind, _, charge_key, meter, group, quantity, unit_price, precise_amount, amount, project) = line
    if (not line_id or kind not in LINE_KINDS or type(quantity) is not Decimal or type(amount) is not Decimal
            or type(precise_amount) is not Decimal or not (quantity.is_finite() and amount.is_finite()
                                                           and precise_amount.is_finite())
            or (unit_price is not None and type(unit_price) is not Decimal) or type(project) is not str):
        return None
    copied = object.__new__(InvoiceLine)
    copied.__dict__.update(id=line_id, rated_line_id=line_id, kind=kind, charge_key=charge_key, meter=meter,
                           group=group, quantity=quantity, unit_price=unit_price, precise_amount=precise_amount,
                           amount=amount, period=label, service_period_start=start, service_period_end=end,
                           project=project)
    return copied


def lines_from_rating(rating: Rating, period: Period) -> tuple[InvoiceLine, ...]:
    """`line_from_rated` of every line of a rating of `period`. The period (label, aware UTC bounds) was
    checked when it was cut, so each line is checked for what a rated line could get wrong (`_copied`)
    and built without the frozen dataclass's per-field __init__ (a billing run copies 10^5 lines)."""
    same_window(rating, period)
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
    return build_draft(
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
        subtotal = EXACT.add(subtotal, line.amount)
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


def empty_draft(
    customer_id: str, currency: str, period: Period, *, price_book_version: str, sequence: int = 1
) -> Invoice:
    """A draft without lines for a customer's period: for an invoice that carries only adjustments of
    earlier periods (`add_lines`), or a period without usage."""
    if not isinstance(period, Period):
        raise InvoiceError(f"period must be a billing.periods.Period, got {type(period).__name__}")
    return build_draft(
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
    return exact_sum(line.amount for line in lines)


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
    return replace(invoice, credits_applied=amount, total=EXACT.subtract(invoice.subtotal, amount))
