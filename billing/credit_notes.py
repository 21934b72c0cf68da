"""Credit notes, pure: a credit against a finalized invoice, the whole of it, what is left on some
lines, or given amounts per line, never beyond what the invoice charged (earlier notes counted). Of a
note's total, `refund_amount` gives back what the customer was charged and `credits_returned` goes
back to the prepaid credits the invoice used. Ids are stable: `credit_note_id(invoice id, note
sequence)`. Amounts are only ever the invoice's, already rounded by rating.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from billing._common import ZERO, aware_utc, check_minor_units, stable_id
from billing.errors import CreditNoteError
from billing.invoice import CHARGING, Invoice
from pricing.money import EXACT, exact_sum


def credit_note_id(invoice_id: str, sequence: int) -> str:
    return "cn_" + stable_id("credit_note", invoice_id, str(sequence))


@dataclass(frozen=True)
class CreditNoteLine:
    invoice_line_id: str
    amount: Decimal  # positive: what is credited back on that line


@dataclass(frozen=True)
class CreditNote:
    """A credit against a finalized invoice. `total` = sum of the lines; of it, `refund_amount` gives
    back what the customer was charged (the invoice total) and `credits_returned` goes back to the
    prepaid credits the invoice used (returned only once the charged amount is all given back)."""

    id: str
    invoice_id: str
    customer_id: str
    currency: str
    sequence: int
    lines: tuple[CreditNoteLine, ...]
    total: Decimal
    refund_amount: Decimal
    credits_returned: Decimal
    reason: str
    issued_at: datetime


@dataclass(frozen=True)
class CreditNoteInput:
    """`amounts` maps invoice line id -> amount to credit; None credits everything left (whole invoice,
    or the lines in `line_ids`). `previous` are the invoice's earlier credit notes."""

    invoice: Invoice
    reason: str
    at: datetime
    line_ids: Sequence[str] | None = None
    amounts: Mapping[str, Decimal] | None = None
    previous: Sequence[CreditNote] = field(default=())

    def validate(self) -> None:
        invoice = self.invoice
        if invoice.status not in CHARGING:
            raise CreditNoteError(
                f"a credit note needs a finalized, not void, invoice; invoice {invoice.id} is {invoice.status}"
            )
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise CreditNoteError("a credit note needs a reason (it is printed on the document)")
        when = aware_utc(self.at, "at", CreditNoteError)
        if invoice.finalized_at is not None and when < invoice.finalized_at:
            raise CreditNoteError(f"credit note at {when.isoformat()} is before invoice {invoice.id} was finalized")
        if self.line_ids is not None and self.amounts is not None:
            raise CreditNoteError("give either line_ids (credit what is left on them) or amounts, not both")
        if self.line_ids is not None and not self.line_ids:
            raise CreditNoteError("line_ids is empty: pass None to credit the whole invoice")
        for note in self.previous:
            if note.invoice_id != invoice.id:
                raise CreditNoteError(f"credit note {note.id} is for invoice {note.invoice_id}, not {invoice.id}")


def credited_by_line(notes: Iterable[CreditNote]) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {}
    for note in notes:
        for line in note.lines:
            out[line.invoice_line_id] = EXACT.add(out.get(line.invoice_line_id, ZERO), line.amount)
    return out


def credit_note(
    invoice: Invoice,
    *,
    reason: str,
    at: datetime,
    line_ids: Sequence[str] | None = None,
    amounts: Mapping[str, Decimal] | None = None,
    previous: Sequence[CreditNote] = (),
) -> CreditNote:
    """A credit note against a finalized invoice: the whole invoice (default), what is left on some
    lines (`line_ids`), or given amounts per line (`amounts`). A line can never be credited beyond its
    amount minus what earlier notes (`previous`) credited on it, and all notes together never beyond
    the invoice's subtotal (a negative line, such as a book credit, lowers what can be credited).
    Lines with nothing left are skipped when crediting the whole invoice."""
    request = CreditNoteInput(invoice, reason, at, line_ids, amounts, tuple(previous))
    request.validate()
    money = invoice.money
    credited = credited_by_line(previous)
    credited_total = exact_sum(note.total for note in previous)
    left_on_invoice = EXACT.subtract(invoice.subtotal, credited_total)
    by_id = {line.id: line for line in invoice.lines}

    def left_on(line_id: str) -> Decimal:
        if line_id not in by_id:
            raise CreditNoteError(f"invoice {invoice.id} has no line {line_id}")
        return max(by_id[line_id].amount, ZERO) - credited.get(line_id, ZERO)

    wanted: list[tuple[str, Decimal]] = []
    if amounts is not None:
        for line_id, amount in amounts.items():
            if not isinstance(amount, Decimal) or not amount.is_finite() or amount <= 0:
                raise CreditNoteError(f"credit on line {line_id} must be a positive Decimal, got {amount!r}")
            check_minor_units(amount, money, f"credit on line {line_id}", CreditNoteError)
            left = left_on(line_id)
            if amount > left:
                raise CreditNoteError(
                    f"cannot credit {amount} {invoice.currency} on line {line_id} of invoice {invoice.id}: "
                    f"only {left} is left uncredited on it"
                )
            wanted.append((line_id, amount))
        explicit = True
    else:
        explicit = line_ids is not None
        for line_id in (line_ids if line_ids is not None else [line.id for line in invoice.lines]):
            left = left_on(line_id)
            if left > 0:
                wanted.append((line_id, left))
            elif explicit:
                raise CreditNoteError(f"line {line_id} of invoice {invoice.id} has nothing left to credit")
    lines: list[CreditNoteLine] = []
    room = left_on_invoice
    for line_id, amount in wanted:
        if amount > room:
            if explicit:
                raise CreditNoteError(
                    f"cannot credit {exact_sum(a for _, a in wanted)} {invoice.currency} on invoice {invoice.id}: "
                    f"its subtotal is {invoice.subtotal} and {credited_total} is already credited, "
                    f"so {left_on_invoice} is left"
                )
            amount = room  # whole-invoice note: stop at what the invoice charged in all
        if amount > 0:
            lines.append(CreditNoteLine(line_id, amount))
            room = EXACT.subtract(room, amount)
    if not lines:
        raise CreditNoteError(f"invoice {invoice.id} has nothing left to credit")
    total = _sum_notes(lines)
    refunded_before = exact_sum(note.refund_amount for note in previous)
    refund = min(total, max(EXACT.subtract(invoice.total, refunded_before), ZERO))
    sequence = len(previous) + 1
    return CreditNote(
        id=credit_note_id(invoice.id, sequence), invoice_id=invoice.id, customer_id=invoice.customer_id,
        currency=invoice.currency, sequence=sequence, lines=tuple(lines), total=total, refund_amount=refund,
        credits_returned=EXACT.subtract(total, refund), reason=reason.strip(), issued_at=aware_utc(at, "at", CreditNoteError),
    )


def _sum_notes(lines: Iterable[CreditNoteLine]) -> Decimal:
    return exact_sum(line.amount for line in lines)
