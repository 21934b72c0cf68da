"""The ledger entries `billing.credits.apply_credits` appends, at their edges: a grant already in the
ledger is not granted again, and a grant used to the cent when it expires leaves no expiry entry
(one cent left: an expiry of that cent)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing.credits import CreditGrant, apply_credits, grant_entry

D = Decimal
JAN = datetime(2026, 1, 1, tzinfo=UTC)
END = datetime(2026, 3, 1, tzinfo=UTC)
AT = END + timedelta(days=3)


def grant(amount="100.00", expires_at=None) -> CreditGrant:
    return CreditGrant("g", "c1", "USD", D(amount), JAN, expires_at, "prepaid top-up")


def apply(g, total, ledger=()):
    return apply_credits([g], ledger, D(total), AT, invoice_id="inv_1", customer_id="c1", currency="USD",
                         period_end=END)


def test_a_grant_already_in_the_ledger_is_not_granted_again():
    g = grant()
    result = apply(g, "30.00", ledger=[grant_entry(g)])
    assert [(e.kind, e.amount) for e in result.entries] == [("use", D("-30.00"))]
    assert [(e.kind, e.amount) for e in apply(g, "30.00").entries] == [("grant", D("100.00")), ("use", D("-30.00"))]


@pytest.mark.parametrize(
    ("total", "entries"),
    [
        ("100.00", [("grant", D("100.00")), ("use", D("-100.00"))]),  # used to the cent: nothing left to expire
        ("99.99", [("grant", D("100.00")), ("use", D("-99.99")), ("expiry", D("-0.01"))]),  # one cent left
    ],
)
def test_a_grant_expiring_when_applied_expires_only_what_is_left(total, entries):
    result = apply(grant(expires_at=AT), total)  # expires the instant credits are applied
    assert [(e.kind, e.amount) for e in result.entries] == entries
    assert result.applied == D(total)
