"""Invoice, credit-note, prepaid-credit and adjustment sums wider than Python's default decimal context:
a 26-digit amount in Bahraini fils has 29 significant digits, which `sum()` (28 digits) rounds. Pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from billing.credit_notes import credit_note, credited_by_line
from billing.credits import CreditGrant, apply_credits, balance, grant_entry
from billing.invoice.adjustments import adjustment_lines, invoiced_lines
from billing.invoice.drafts import draft_from_rating, replace_lines, with_credits_applied
from billing.invoice.states import finalize
from billing.numbering import format_number
from pricing.book import price_book_from_data
from pricing.money import exact_sum
from pricing.rating import rate
from pricing.usage import Usage, UsageKey
from tests.billing.helpers import NEXT, PERIOD, T_FINAL

D = Decimal
FILS = D("0.001")
WIDEST = D("99999999999999999999999999.123456789012")
WIDEST_FILS = D("99999999999999999999999999.123")  # 29 significant digits
BOOK = price_book_from_data({
    "id": "wide", "currency": "BHD",
    "charges": [{"meter": "successful_tasks", "price": {"type": "unit", "amount": "1", "per": 1}},
                {"meter": "requests", "price": {"type": "unit", "amount": "1", "per": 1}}],
})
JAN = datetime(2026, 1, 1, tzinfo=UTC)


def rating(tasks, requests, period=PERIOD):
    return rate(BOOK, Usage.build("c1", period.start, period.end, [(UsageKey("successful_tasks"), D(tasks)),
                                                                   (UsageKey("requests", model="m"), D(requests))]))


def draft(tasks=WIDEST, requests="0.001"):
    return draft_from_rating(rating(tasks, requests), PERIOD, price_book_version="v1")


def test_a_draft_totals_29_digit_lines_exactly():
    invoice = draft()
    assert invoice.subtotal == invoice.total == D("99999999999999999999999999.124")
    assert replace_lines(invoice, invoice.lines).subtotal == invoice.subtotal
    prepaid = with_credits_applied(invoice, FILS)
    assert prepaid.total == WIDEST_FILS


def test_credit_notes_credit_29_digit_invoices_to_the_fils():
    invoice = finalize(draft(), number=format_number(2026, 1), at=T_FINAL)
    first = credit_note(invoice, reason="r", at=T_FINAL, amounts={invoice.lines[0].id: D("99999999999999999999999998.123")})
    assert first.total == first.refund_amount == D("99999999999999999999999998.123")
    rest = credit_note(invoice, reason="r", at=T_FINAL, previous=[first])
    assert [line.amount for line in rest.lines] == [D(1), FILS]
    assert rest.total == rest.refund_amount == D("1.001") and rest.credits_returned == 0
    assert credited_by_line([first, rest]) == {invoice.lines[0].id: WIDEST_FILS, invoice.lines[1].id: FILS}


def test_prepaid_credits_of_29_digits_pay_and_balance_to_the_fils():
    grants = [CreditGrant("g1", "c1", "BHD", WIDEST_FILS, JAN, None, "top-up"),
              CreditGrant("g2", "c1", "BHD", FILS, JAN + timedelta(days=1), None, "top-up")]
    ledger = [grant_entry(g) for g in grants]
    assert balance(ledger, T_FINAL) == D("99999999999999999999999999.124")
    application = apply_credits(grants, ledger, D("99999999999999999999999999.124"), T_FINAL, invoice_id="inv_1",
                                customer_id="c1", currency="BHD", period_end=PERIOD.end)
    assert application.applied == D("99999999999999999999999999.124")
    after = [*ledger, *application.entries]
    assert balance(after, T_FINAL) == 0
    rerun = apply_credits(grants, after, D("99999999999999999999999999.124"), T_FINAL, invoice_id="inv_1",
                          customer_id="c1", currency="BHD", period_end=PERIOD.end)
    assert rerun.applied == D("99999999999999999999999999.124") and rerun.entries == ()


def test_adjustments_of_29_digit_lines_add_up_to_the_rating():
    february = finalize(draft(WIDEST, "0.001"), number=format_number(2026, 1), at=T_FINAL)
    rated_now = rating("99999999999999999999999999.125456789012", "0.003")  # 0.002 more of each
    march = draft_from_rating(rating("1", "0", period=NEXT), NEXT, price_book_version="v1")
    lines = adjustment_lines(rated_now, invoiced_lines([february], PERIOD.label), period=PERIOD,
                             target_invoice_id=march.id)
    assert [line.amount for line in lines] == [D("0.002"), D("0.002")]
    assert exact_sum(line.amount for line in [*february.lines, *lines]) == rated_now.total
    assert rated_now.total == D("99999999999999999999999999.128")
