"""`adjustment_lines` and `lines_from_rating` on a rating worked in tests/billing/helpers.py: an
adjustment line carries every field of the rated line it corrects (charge key, group, unit price,
project, also of a line split by project), the refusals have their exact messages, and a period that
only looks like one is refused."""

from __future__ import annotations

from decimal import Decimal
from types import SimpleNamespace

import pytest

from billing.errors import InvoiceError
from billing.invoice import adjustment_line_id
from billing.invoice.adjustments import adjustment_lines, invoiced_lines
from billing.invoice.drafts import draft_from_rating, lines_from_rating
from pricing.book import price_book_from_data
from pricing.rating import rate
from pricing.usage import Usage, UsageKey
from tests.billing.helpers import PERIOD, ROWS, rating


def test_an_adjustment_line_is_the_rated_line_less_what_was_invoiced():
    now = rating(ROWS)
    lines = adjustment_lines(now, [], period=PERIOD, target_invoice_id="inv-2")
    assert len(lines) == len(now.lines)
    for adj, rated in zip(lines, now.lines, strict=True):
        assert (adj.id, adj.rated_line_id) == (adjustment_line_id(rated.line_id, "inv-2"), rated.line_id)
        assert (adj.kind, adj.charge_key, adj.meter, adj.group, adj.unit_price, adj.project) == (
            rated.kind, rated.charge_key, rated.meter, rated.group, rated.unit_price, rated.project)
        assert (adj.quantity, adj.precise_amount, adj.amount) == (rated.quantity, rated.precise_amount, rated.amount)
        assert (adj.period, adj.service_period_start, adj.service_period_end) == ("2026-02", PERIOD.start, PERIOD.end)
    assert any(line.unit_price is not None for line in lines) and any(line.group for line in lines)


def test_an_adjustment_needs_its_target_invoice():
    with pytest.raises(InvoiceError) as raised:
        adjustment_lines(rating(ROWS), [], period=PERIOD, target_invoice_id="")
    assert str(raised.value) == "target_invoice_id is required (the draft the adjustment lines go on)"


def test_lines_from_rating_refuses_what_only_looks_like_a_period():
    fake = SimpleNamespace(label=PERIOD.label, start=PERIOD.start, end=PERIOD.end)
    with pytest.raises(InvoiceError) as raised:
        lines_from_rating(rating(ROWS), fake)
    assert str(raised.value) == "period must be a billing.periods.Period, got SimpleNamespace"


def test_an_adjustment_line_of_a_project_keeps_its_project():
    book = price_book_from_data({
        "id": "p", "currency": "USD", "invoice": {"group_by": "project"},
        "charges": [{"meter": "output_tokens", "price": {"type": "unit", "amount": "1", "per": 1}}],
    })
    u = Usage.build("c1", PERIOD.start, PERIOD.end, [(UsageKey("output_tokens", model="m", project="alpha"),
                                                      Decimal(2))])
    lines = adjustment_lines(rate(book, u), [], period=PERIOD, target_invoice_id="inv-2")
    assert [(line.project, line.quantity, line.amount) for line in lines] == [("alpha", Decimal(2), Decimal("2.00"))]


def test_invoiced_lines_of_several_customers_are_refused_naming_them():
    drafts = [draft_from_rating(rating(ROWS, customer=c), PERIOD, price_book_version="v1") for c in ("c2", "c1")]
    with pytest.raises(InvoiceError) as raised:
        invoiced_lines(drafts, "2026-02")
    assert str(raised.value) == "invoices of several customers given (c1, c2): pass one customer's"
