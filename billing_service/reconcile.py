"""Money reconcile: for each customer invoiced for a period, the quantities and amounts on its
invoices (finalized ones plus adjustments and drafts) equal the period's usage and rating read from
metering now, line by line; invoice and credit note numbers have no gaps; unbilled usage is listed.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

import psycopg

from billing._common import ZERO
from billing.invoice import CHARGING, InvoiceStatus
from billing.numbering import gaps
from billing.periods import billing_period, parse_label
from billing_service.store import PgInvoiceStore, all_customers, load_book, money_text, number_text
from billing_service.usage import Unbilled, meters_of, period_usage, unbilled_usage
from pricing.cost import CostModel
from pricing.rating import rate


@dataclass
class MoneyDifference:
    customer_id: str
    period: str
    what: str
    expected: str
    found: str

    def to_json(self) -> dict:
        return self.__dict__.copy()


@dataclass
class ReconcileReport:
    period: str
    checked: list[dict]
    differences: list[MoneyDifference]
    unbilled: list[Unbilled]
    number_gaps: list[str]

    @property
    def ok(self) -> bool:
        return not self.differences and not self.number_gaps

    def to_json(self) -> dict:
        return {"period": self.period, "ok": self.ok, "checked": self.checked,
                "differences": [d.to_json() for d in self.differences],
                "unbilled": [u.to_json() for u in self.unbilled], "number_gaps": self.number_gaps}


def reconcile_money(conn: psycopg.Connection, period: str, *, cost_model: CostModel | None = None) -> ReconcileReport:
    """For each customer with invoices for `period`: the quantities on its invoices (charging ones and
    drafts, wherever the lines landed) equal the period's usage read from metering now, line by line,
    and their amounts equal the period's rating now (finalized invoices + adjustments = rated current
    usage). Also: invoice and credit note numbers have no gaps. Unbilled usage is listed."""
    parse_label(period)
    report = ReconcileReport(period, [], [], [], [])
    store = PgInvoiceStore(conn)
    with conn.transaction():
        for customer in all_customers(conn):
            stored = store.stored(customer.customer_id)
            mine = [s for s in stored if s.invoice.period == period]
            if not mine:
                continue
            target = billing_period(period, customer.timezone, customer.anchor_day)
            counted = [s for s in stored if s.invoice.status in CHARGING or s.invoice.status is InvoiceStatus.DRAFT]
            lines = [line for s in counted for line in s.invoice.lines if line.period == period]
            charging = [s for s in mine if s.invoice.status in CHARGING] or [s for s in mine if s.invoice.status is InvoiceStatus.DRAFT]
            if not charging:
                report.differences.append(MoneyDifference(customer.customer_id, period, "no charging invoice or draft",
                                                          "an invoice", "only void invoices"))
                continue
            book = load_book(conn, charging[-1].book_sha256)
            used = period_usage(conn, customer.customer_id, target, meters=meters_of(book.book), cost_model=cost_model,
                                task_outcomes=book.book.task_outcomes, by_project=book.book.lines_by_project)
            rating = rate(book.book, used)
            expected = {line.line_id: line for line in rating.lines}
            found: dict[str, tuple[Decimal, Decimal]] = {}
            for line in lines:
                q, a = found.get(line.rated_line_id, (ZERO, ZERO))
                found[line.rated_line_id] = (q + line.quantity, a + line.amount)
            for lid in sorted(set(expected) | set(found)):
                e = expected.get(lid)
                eq, ea = (e.quantity, e.amount) if e else (ZERO, ZERO)
                fq, fa = found.get(lid, (ZERO, ZERO))
                name = f"{e.meter}/{e.group}" + (f" project {e.project}" if e.project else "") if e else lid
                if eq != fq:
                    report.differences.append(MoneyDifference(customer.customer_id, period, f"quantity {name}",
                                                              number_text(eq), number_text(fq)))
                if ea != fa:
                    report.differences.append(MoneyDifference(customer.customer_id, period, f"amount {name}",
                                                              money_text(ea, book.book.currency),
                                                              money_text(fa, book.book.currency)))
            invoiced = sum((line.amount for line in lines), ZERO)
            report.checked.append({"customer_id": customer.customer_id, "period": period,
                                   "rated": money_text(rating.total, rating.currency),
                                   "invoiced": money_text(invoiced, rating.currency),
                                   "finalized": money_text(sum((line.amount for s in stored if s.invoice.status in CHARGING
                                                                for line in s.invoice.lines if line.period == period), ZERO),
                                                           rating.currency)})
        numbers = [r[0] for r in conn.execute("SELECT number FROM billing_invoices WHERE number IS NOT NULL "
                                              "UNION ALL SELECT number FROM billing_credit_notes")]
        report.number_gaps = [f"{p}-{y}-{s:06d}" for p, y, s in gaps(numbers)]
        report.unbilled = unbilled_usage(conn, period, cost_model=cost_model)
    return report
