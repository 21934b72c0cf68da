"""Prepaid credits at finalization: a grant that expires mid-period, two grants (oldest-expiring
first), a grant larger than the invoice (never below zero, the rest carries over)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from billing_service.credits import credits_view, grant_credits
from billing_service.customers import assign_plan, set_customer
from billing_service.run import billing_run
from tests.billing_service.conftest import BOOK_YAML, FEB_START, MAR_START, cost_model, reference_total

T0 = datetime(2026, 1, 20, tzinfo=UTC)
APR_START = datetime(2026, 4, 1, tzinfo=UTC)


@pytest.fixture
def acme(conn, metering):
    set_customer(conn, "acme", now=T0)
    assign_plan(conn, "acme", BOOK_YAML, "bill-usd.yaml", "2026-02-01", now=T0)
    metering.request("acme", datetime(2026, 2, 3, tzinfo=UTC), input_tokens=2_000_000, output=500_000)  # 4.00 + 4.00
    metering.request("acme", datetime(2026, 3, 3, tzinfo=UTC), input_tokens=1_000_000, output=250_000)  # 2.00 + 2.00
    assert reference_total(metering.sent, "acme", FEB_START, MAR_START) == Decimal("8.00")
    return "acme"


def finalize(conn, period, now):
    [inv] = [o for o in billing_run(conn, period, now=now, cost_model=cost_model()).invoices if o.period == period]
    assert inv.status == "open"
    return inv


def test_a_grant_that_expires_mid_period_does_not_pay_that_period(conn, acme):
    grant_credits(conn, acme, "10.00", now=T0, expires="2026-02-15", reason="trial")
    feb = finalize(conn, "2026-02", datetime(2026, 3, 2, 1, tzinfo=UTC))
    assert (feb.subtotal, feb.credits_applied, feb.total) == (Decimal("8.00"), 0, Decimal("8.00"))
    view = credits_view(conn, acme, now=datetime(2026, 3, 2, 2, tzinfo=UTC))
    assert view["balance"] == "0.00"
    assert [(e["kind"], e["amount"], e["at"], e["recorded"]) for e in view["ledger"]] == [
        ("grant", "10.00", "2026-01-20T00:00:00Z", True),
        ("expiry", "-10.00", "2026-02-15T00:00:00Z", True),  # recorded by the finalization after it
    ]


def test_an_expiry_is_shown_before_any_finalization_records_it(conn, acme):
    grant_credits(conn, acme, "10.00", now=T0, expires="2026-02-15")
    view = credits_view(conn, acme, now=datetime(2026, 2, 20, tzinfo=UTC))
    assert view["balance"] == "0.00"
    assert [(e["kind"], e["recorded"]) for e in view["ledger"]] == [("grant", True), ("expiry", False)]
    assert credits_view(conn, acme, now=datetime(2026, 2, 10, tzinfo=UTC))["balance"] == "10.00"


def test_a_grant_expiring_after_the_period_ends_pays_it(conn, acme):
    grant_credits(conn, acme, "3.00", now=T0, expires="2026-03-15")
    feb = finalize(conn, "2026-02", datetime(2026, 3, 2, 1, tzinfo=UTC))
    assert (feb.credits_applied, feb.total) == (Decimal("3.00"), Decimal("5.00"))


def test_two_grants_oldest_expiring_first(conn, acme):
    no_expiry = grant_credits(conn, acme, "5.00", now=T0, reason="top-up")
    expiring = grant_credits(conn, acme, "6.00", now=datetime(2026, 1, 25, tzinfo=UTC), expires="2026-06-01")
    feb = finalize(conn, "2026-02", datetime(2026, 3, 2, 1, tzinfo=UTC))
    assert (feb.credits_applied, feb.total) == (Decimal("8.00"), Decimal("0.00"))
    view = credits_view(conn, acme, now=datetime(2026, 3, 2, 2, tzinfo=UTC))
    uses = {e["grant_id"]: e["amount"] for e in view["ledger"] if e["kind"] == "use"}
    assert uses == {expiring.id: "-6.00", no_expiry.id: "-2.00"}
    assert view["balance"] == "3.00"
    mar = finalize(conn, "2026-03", datetime(2026, 4, 2, 1, tzinfo=UTC))
    assert (mar.subtotal, mar.credits_applied, mar.total) == (Decimal("4.00"), Decimal("3.00"), Decimal("1.00"))
    assert credits_view(conn, acme, now=datetime(2026, 4, 3, tzinfo=UTC))["balance"] == "0.00"


def test_a_grant_larger_than_the_invoice_never_takes_it_below_zero(conn, acme):
    grant_credits(conn, acme, "100.00", now=T0)
    feb = finalize(conn, "2026-02", datetime(2026, 3, 2, 1, tzinfo=UTC))
    assert (feb.subtotal, feb.credits_applied, feb.total) == (Decimal("8.00"), Decimal("8.00"), Decimal("0.00"))
    assert credits_view(conn, acme, now=datetime(2026, 3, 3, tzinfo=UTC))["balance"] == "92.00"
    # a rerun applies nothing twice
    assert billing_run(conn, "2026-02", now=datetime(2026, 3, 4, tzinfo=UTC), cost_model=cost_model()).invoices == []
    assert credits_view(conn, acme, now=datetime(2026, 3, 4, tzinfo=UTC))["balance"] == "92.00"
    mar = finalize(conn, "2026-03", datetime(2026, 4, 2, 1, tzinfo=UTC))
    assert (mar.credits_applied, mar.total) == (Decimal("4.00"), Decimal("0.00"))
    assert credits_view(conn, acme, now=datetime(2026, 4, 3, tzinfo=UTC))["balance"] == "88.00"


def test_credits_in_the_cli(conn, acme, cli):
    granted = cli("credits", "grant", "--customer", "acme", "--amount", "50.00", "--expires", "2026-12-31",
                  "--reason", "prepaid", "--json", now=T0)
    assert granted.code == 0, granted.err
    assert granted.json()["amount"] == "50.00"
    cli("billing", "run", "--period", "2026-02", now=datetime(2026, 3, 2, 1, tzinfo=UTC))
    shown = cli("credits", "show", "--customer", "acme", "--json", now=datetime(2026, 3, 3, tzinfo=UTC))
    assert shown.code == 0, shown.err
    view = shown.json()
    assert view["balance"] == "42.00"
    assert [e["kind"] for e in view["ledger"]] == ["grant", "use"]
