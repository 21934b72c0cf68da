"""Drafts' and invoices' refusals word for word, and the fields a draft keeps: what a draft is
built from, a finalized invoice refusing each change by name, lines that are not there, the project
of a rated line, credits applied when a draft is built or its lines replaced, the stable id of an
adjustment line, and what the bulk run's fast path leaves to the checked one."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal
from types import SimpleNamespace

import pytest

from billing.errors import InvoiceError, InvoiceImmutable
from billing.invoice import InvoiceLine, adjustment_line_id, build_draft
from billing.invoice.drafts import (
    DraftInvoiceInput,
    draft_from_rating,
    empty_draft,
    first_invoice,
    line_from_rated,
    remove_lines,
    replace_lines,
    with_credits_applied,
)
from billing.invoice.states import finalize
from pricing.book import price_book_from_data
from pricing.rating import rate
from pricing.usage import Usage, UsageKey
from tests.billing.helpers import PERIOD, ROWS, T_FINAL, rating

D = Decimal


def draft():
    return draft_from_rating(rating(ROWS), PERIOD, price_book_version="v1")


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


# ---------------------------------------------------------------- what a draft is built from


@pytest.mark.parametrize(
    ("rating_", "period", "message"),
    [("r", PERIOD, "rating must be a pricing.rating.Rating, got str"),
     (None, PERIOD, "rating must be a pricing.rating.Rating, got NoneType"),
     (rating(ROWS), "2026-02", "period must be a billing.periods.Period, got str")],
)
def test_a_draft_is_built_from_a_rating_and_a_period(rating_, period, message):
    with pytest.raises(InvoiceError, match=exactly(message)):
        DraftInvoiceInput(rating_, period, "v1").validate()


def test_a_draft_needs_the_book_version():
    with pytest.raises(InvoiceError,
                       match=exactly("price_book_version is required (the stored book version the rating used)")):
        draft_from_rating(rating(ROWS), PERIOD, price_book_version="")


def test_an_empty_draft_totals_a_decimal_zero():
    empty = empty_draft("c1", "USD", PERIOD, price_book_version="v1")
    assert (empty.lines, empty.subtotal, empty.total) == ((), D(0), D(0))
    assert isinstance(empty.subtotal, Decimal) and isinstance(empty.total, Decimal)


def test_an_empty_draft_is_built_from_a_period():
    with pytest.raises(InvoiceError, match=exactly("period must be a billing.periods.Period, got str")):
        empty_draft("c1", "USD", "2026-02", price_book_version="v1")


# ---------------------------------------------------------------- a finalized invoice refuses changes


@pytest.mark.parametrize(
    ("change", "what"),
    [(lambda inv: replace_lines(inv, ()), "change its lines"),
     (lambda inv: remove_lines(inv, [inv.lines[0].id]), "remove lines"),
     (lambda inv: with_credits_applied(inv, D("1.00")), "apply credits")],
)
def test_a_finalized_invoice_refuses_each_change_by_name(change, what):
    final = finalize(draft(), number="INV-2026-000001", at=T_FINAL)
    message = (f"cannot {what}: invoice {final.id} (INV-2026-000001) is open; a finalized invoice is immutable "
               f"— issue a credit note, or void it and reissue")
    with pytest.raises(InvoiceImmutable, match=exactly(message)):
        change(final)


def test_removing_lines_that_are_not_there_names_them_all():
    inv = draft()
    with pytest.raises(InvoiceError, match=exactly(f"invoice {inv.id} has no line(s) x1, x2")):
        remove_lines(inv, ["x2", "x1", inv.lines[0].id])


def test_removing_every_line_leaves_a_decimal_zero():
    inv = draft()
    empty = remove_lines(inv, [line.id for line in inv.lines])
    assert (empty.lines, empty.subtotal, empty.total) == ((), D(0), D(0))
    assert isinstance(empty.subtotal, Decimal) and isinstance(empty.total, Decimal)


def test_replacing_lines_resets_the_credits_applied():
    inv = with_credits_applied(draft(), D("1.00"))
    assert inv.total == inv.subtotal - D("1.00")
    again = replace_lines(inv, inv.lines)
    assert (again.credits_applied, again.total) == (D(0), inv.subtotal)


def test_a_draft_built_with_credits_applied_totals_the_lines_less_the_credits():
    inv = draft()
    built = build_draft(id=inv.id, customer_id="c1", currency="USD", period=PERIOD.label,
                        period_start=PERIOD.start, period_end=PERIOD.end, sequence=1, lines=inv.lines,
                        price_book_version="v1", credits_applied=D("2.50"))
    assert (built.subtotal, built.credits_applied, built.total) == (inv.subtotal, D("2.50"), inv.subtotal - D("2.50"))


# ---------------------------------------------------------------- fields kept


BY_PROJECT = price_book_from_data({
    "id": "p", "currency": "USD", "invoice": {"group_by": "project"},
    "charges": [{"meter": "output_tokens", "price": {"type": "unit", "amount": "1", "per": 1}}],
})


def test_a_line_of_a_project_keeps_its_project():
    u = Usage.build("c1", PERIOD.start, PERIOD.end, [(UsageKey("output_tokens", model="m", project="alpha"), D(2))])
    rated = rate(BY_PROJECT, u)
    assert line_from_rated(rated.lines[0], PERIOD).project == "alpha"
    assert [line.project for line in draft_from_rating(rated, PERIOD, price_book_version="v1").lines] == ["alpha"]


def test_a_line_whose_project_is_not_a_string_is_refused_by_name():
    line = draft().lines[0]
    fields = {f: getattr(line, f) for f in InvoiceLine.__dataclass_fields__}
    fields["project"] = None
    with pytest.raises(InvoiceError, match=exactly(f"line {line.id}: project must be a string ('' for none), got None")):
        InvoiceLine(**fields)


def test_an_invoice_period_without_a_zone_is_named():
    naive = datetime(2026, 2, 1)
    with pytest.raises(InvoiceError, match=exactly("period_start 2026-02-01T00:00:00 has no time zone: give an aware "
                                                   "datetime (UTC)")):
        build_draft(id="inv_x", customer_id="c1", currency="USD", period="2026-02", period_start=naive,
                    period_end=datetime(2026, 3, 1, tzinfo=UTC), sequence=1, lines=(), price_book_version="v1")


def test_adjustment_line_ids_are_stable_and_distinct():
    # pinned: a rerun must find the adjustment rows it wrote before
    assert adjustment_line_id("r1", "inv_a") == "46824060a5f92eaa45c0b6ad"
    assert adjustment_line_id("r2", "inv_a") == "23dd1b3db25ef890ad27dbbc"
    assert adjustment_line_id("r1", "inv_b") != adjustment_line_id("r1", "inv_a")


# ---------------------------------------------------------------- the bulk run's fast path


def test_the_fast_first_invoice_leaves_what_is_not_a_period_or_has_no_version_or_customer_to_the_checked_path():
    r = rating(ROWS)
    assert first_invoice(r, PERIOD, currency="USD", price_book_version="v1") == draft()
    like_a_period = SimpleNamespace(label=PERIOD.label, start=PERIOD.start, end=PERIOD.end)
    assert first_invoice(r, like_a_period, currency="USD", price_book_version="v1") is None
    assert first_invoice(r, PERIOD, currency="USD", price_book_version="") is None
    anonymous = rating(ROWS, customer="")
    assert first_invoice(anonymous, PERIOD, currency="USD", price_book_version="v1") is None


def test_a_draft_checks_its_sequence_before_its_book_version():
    with pytest.raises(InvoiceError, match=exactly("invoice sequence 0 must be a whole number from 1")):
        draft_from_rating(rating(ROWS), PERIOD, price_book_version="", sequence=0)
