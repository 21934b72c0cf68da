"""Adjustments: the lines that bring what was invoiced for an already finalized period up (or down)
to its rating now, on a later draft."""

from __future__ import annotations

from collections.abc import Iterable

from billing._common import ZERO
from billing.errors import InvoiceError
from billing.invoice import CHARGING, Invoice, InvoiceLine, adjustment_line_id, same_window
from billing.periods import Period, parse_label
from pricing.money import EXACT, exact_sum
from pricing.rating import Rating


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
    same_window(rated_now, period)
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
        q0 = exact_sum(line.quantity for line in previous)
        p0 = exact_sum(line.precise_amount for line in previous)
        a0 = exact_sum(line.amount for line in previous)
        current = now.get(rated_id)
        if current is not None:
            q1, p1, a1 = current.quantity, current.precise_amount, current.amount
            kind, charge_key, meter, group, unit_price, project = (
                current.kind, current.charge_key, current.meter, current.group, current.unit_price, current.project
            )
        else:  # the rated line is gone (usage corrected away): take back everything invoiced for it
            q1 = p1 = a1 = ZERO
            last = previous[-1]
            kind, charge_key, meter, group, unit_price, project = (
                last.kind, last.charge_key, last.meter, last.group, last.unit_price, last.project
            )
        if (q1, p1, a1) == (q0, p0, a0):
            continue
        out.append(
            InvoiceLine(
                id=adjustment_line_id(rated_id, target_invoice_id), rated_line_id=rated_id, kind=kind,
                charge_key=charge_key, meter=meter, group=group, quantity=EXACT.subtract(q1, q0), unit_price=unit_price,
                precise_amount=EXACT.subtract(p1, p0), amount=EXACT.subtract(a1, a0), period=period.label, service_period_start=period.start,
                service_period_end=period.end, project=project,
            )
        )
    return tuple(out)
