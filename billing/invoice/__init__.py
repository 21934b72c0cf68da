"""Invoices, pure: the invoice and its lines, their statuses (`TRANSITIONS`) and their stable ids.

Money is never computed here: invoice lines copy the line ids, quantities, precise and rounded
amounts of a `pricing.rating.Rating`, and adjustments and credit notes only subtract amounts that
rating already rounded. So every invoice of a period plus its adjustments adds up to the rating of
the period exactly.

State machine (`TRANSITIONS`; the moves: `billing.invoice.states`):

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

The operations, one module per job:
- `billing.invoice.drafts`: drafts from a rating (`draft_from_rating`, `first_invoice` for the bulk
  run, `empty_draft`) and a draft's changes (`add_lines`, `replace_lines`, `remove_lines`,
  `with_credits_applied`);
- `billing.invoice.states`: the moves between statuses (`transition`, `finalize`, `finalize_first`,
  `mark_paid`, `mark_payment_failed`, `void`) and `reissue`;
- `billing.invoice.adjustments`: the lines that bring a finalized period up to its rating now
  (`invoiced_lines`, `adjustment_lines`);
- credit notes against invoices: `billing.credit_notes`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from enum import StrEnum
from types import MappingProxyType
from typing import Literal

from billing._common import ZERO, aware_utc, check_minor_units, currency_of, stable_id
from billing.errors import InvoiceError
from billing.numbering import parse_number
from billing.periods import Period, parse_label
from pricing.money import EXACT, Currency, exact_sum
from pricing.rating import Rating

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
    check_sequence(sequence)
    return "inv_" + stable_id("invoice", customer_id, period_label, str(sequence))


def adjustment_line_id(rated_line_id: str, target_invoice_id: str) -> str:
    return stable_id("adjustment", rated_line_id, target_invoice_id)


def check_sequence(sequence: object) -> int:
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
    project: str = ""  # the project of a line split by project ('' : no project, or a line not split)

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
        if not isinstance(self.project, str):
            raise InvoiceError(f"line {self.id}: project must be a string ('' for none), got {self.project!r}")
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
        check_sequence(self.sequence)
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
            subtotal = exact_sum(line.amount for line in lines)
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
        if self.total != EXACT.subtract(subtotal, self.credits_applied):
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


def build_draft(
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
    """A draft from its parts; subtotal and total follow from the lines (and the credits applied)."""
    lines = tuple(lines)
    subtotal = exact_sum(line.amount for line in lines)
    return Invoice(
        id=id, customer_id=customer_id, currency=currency, period=period, period_start=period_start,
        period_end=period_end, sequence=sequence, status=S.DRAFT, lines=lines, subtotal=subtotal,
        credits_applied=credits_applied, total=EXACT.subtract(subtotal, credits_applied), price_book_version=price_book_version,
        reissue_of=reissue_of,
    )


def same_window(rating: Rating, period: Period) -> None:
    """InvoiceError unless the rating covers exactly the billing period (drafts and adjustments check it)."""
    if (rating.period_start, rating.period_end) != (period.start, period.end):
        raise InvoiceError(
            f"the rating covers [{rating.period_start.isoformat()}, {rating.period_end.isoformat()}) but period "
            f"{period.label} is [{period.start.isoformat()}, {period.end.isoformat()}): rate exactly the billing period"
        )
