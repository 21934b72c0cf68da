"""Prepaid credit grants: validation, order of use, expiry, never below zero, ledger balance."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from billing.credits import (
    CreditGrant,
    apply_credits,
    apply_credits_to_invoice,
    balance,
    grant_entry,
)
from billing.errors import BillingError, CreditError
from billing.invoice.drafts import draft_from_rating
from tests.billing.helpers import PERIOD, ROWS, rating
from tests.examples import examples

D = Decimal
JAN = datetime(2026, 1, 1, tzinfo=UTC)
END = PERIOD.end  # 2026-03-06 23:00 UTC
AT = END + timedelta(days=1)  # finalization


def grant(id="g1", amount="50.00", granted_at=JAN, expires_at=None, currency="USD", customer="c1"):
    return CreditGrant(id, customer, currency, D(amount) if isinstance(amount, str) else amount, granted_at,
                       expires_at, "prepaid top-up")


def apply(grants, total, ledger=(), at=AT, invoice="inv_1", period_end=END):
    return apply_credits(grants, ledger, D(total), at, invoice_id=invoice, customer_id="c1", currency="USD",
                         period_end=period_end)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"amount": "50.001"}, "50.001 USD has more decimals than USD allows"),
        ({"amount": "5.5", "currency": "JPY"}, "5.5 JPY has more decimals than JPY allows"),
        ({"amount": "1.2345", "currency": "BHD"}, "BHD allows \\(at most 3"),
        ({"amount": "0"}, "greater than zero"),
        ({"amount": "-1"}, "greater than zero"),
        ({"amount": 1.5}, "binary float"),
        ({"currency": "XYZ"}, "unknown currency"),
        ({"granted_at": datetime(2026, 1, 1)}, "no time zone"),
        ({"expires_at": JAN}, "not after it is granted"),
        ({"id": ""}, "needs an id"),
    ],
)
def test_grant_validation(kwargs, message):
    with pytest.raises(CreditError, match=message) as caught:
        grant(**kwargs)
    assert isinstance(caught.value, BillingError)


def test_valid_grants_in_each_minor_unit():
    assert grant(amount="5", currency="JPY").amount == 5
    assert grant(amount="1.234", currency="BHD").amount == D("1.234")
    assert grant(amount="50.10").amount == D("50.10")


def test_a_grant_larger_than_the_invoice_pays_it_all_and_keeps_the_rest():
    result = apply([grant(amount="500.00")], "142.83")
    assert result.applied == D("142.83")
    assert [(e.kind, e.amount) for e in result.entries] == [("grant", D("500.00")), ("use", D("-142.83"))]
    assert balance(result.entries, AT) == D("357.17")


def test_never_below_zero_and_zero_invoices():
    result = apply([grant(amount="10.00")], "0")
    assert result.applied == 0 and [e.kind for e in result.entries] == ["grant"]
    with pytest.raises(CreditError, match="negative"):
        apply([grant()], "-1.00")
    with pytest.raises(CreditError, match="more decimals"):
        apply([grant()], "1.001")


def test_two_grants_oldest_expiring_first_no_expiry_last():
    grants = [
        grant("forever", "100.00", granted_at=JAN),
        grant("late", "30.00", granted_at=JAN, expires_at=datetime(2026, 12, 1, tzinfo=UTC)),
        grant("soon", "20.00", granted_at=JAN + timedelta(days=9), expires_at=datetime(2026, 6, 1, tzinfo=UTC)),
    ]
    result = apply(grants, "60.00")
    assert result.applied == D("60.00")
    assert [(e.grant_id, e.amount) for e in result.entries if e.kind == "use"] == [
        ("soon", D("-20.00")), ("late", D("-30.00")), ("forever", D("-10.00")),
    ]
    assert apply(list(reversed(grants)), "60.00") == result  # the order given does not matter


def test_ties_by_granted_at_then_id():
    b = grant("b", "10.00", granted_at=JAN)
    a = grant("a", "10.00", granted_at=JAN)
    earlier = grant("z", "10.00", granted_at=JAN - timedelta(days=1))
    uses = [e.grant_id for e in apply([a, b, earlier], "25.00").entries if e.kind == "use"]
    assert uses == ["z", "a", "b"]


def test_a_grant_expiring_mid_period_cannot_pay_it_and_expires():
    mid = PERIOD.start + timedelta(days=10)
    expiring = grant("mid", "40.00", expires_at=mid)
    result = apply([expiring, grant("forever", "15.00")], "50.00")
    assert result.applied == D("15.00")
    kinds = [(e.grant_id, e.kind, e.amount, e.at) for e in result.entries]
    assert ("mid", "expiry", D("-40.00"), mid) in kinds
    assert ("forever", "use", D("-15.00"), AT) in kinds
    assert balance(result.entries, AT) == 0
    assert balance(result.entries, mid - timedelta(seconds=1)) == D("55.00")  # before it expired
    assert balance(result.entries, mid) == D("15.00")  # valid in [granted_at, expires_at)


def test_a_grant_expiring_after_the_period_end_pays_even_when_applied_after_its_expiry():
    expires = END + timedelta(hours=1)  # the period ended before the expiry; finalization comes later
    result = apply([grant("g", "100.00", expires_at=expires)], "60.00", at=END + timedelta(days=2))
    assert result.applied == D("60.00")
    assert [(e.kind, e.amount, e.at) for e in result.entries] == [
        ("grant", D("100.00"), JAN),
        ("use", D("-60.00"), END + timedelta(days=2)),
        ("expiry", D("-40.00"), END + timedelta(days=2)),  # dated at its last use, never before it
    ]
    assert sum(e.amount for e in result.entries) == 0 == balance(result.entries, END + timedelta(days=2))


def test_a_grant_made_after_at_is_not_used():
    result = apply([grant("future", granted_at=AT + timedelta(seconds=1))], "10.00")
    assert result.applied == 0 and result.entries == ()


def test_reruns_and_successive_invoices():
    grants = [grant("g", "100.00")]
    first = apply(grants, "60.00")
    ledger = list(first.entries)
    assert apply(grants, "60.00", ledger=ledger) == type(first)(D("60.00"), ())  # same invoice: nothing new
    second = apply(grants, "60.00", ledger=ledger, invoice="inv_2", at=AT + timedelta(days=30),
                   period_end=END + timedelta(days=30))
    assert second.applied == D("40.00")
    assert [e.kind for e in second.entries] == ["use"]  # the grant entry is already in the ledger
    ledger += second.entries
    assert balance(ledger, AT + timedelta(days=30)) == 0
    assert len({e.id for e in ledger}) == len(ledger)


def test_other_currencies_and_customers():
    result = apply([grant("eur", "10.00", currency="EUR"), grant("usd", "5.00")], "20.00")
    assert result.applied == D("5.00")
    with pytest.raises(CreditError, match="several currencies"):
        balance(result.entries, AT)
    assert balance(result.entries, AT, currency="EUR") == D("10.00")
    with pytest.raises(CreditError, match="belongs to customer c2"):
        apply([grant(customer="c2")], "1.00")
    with pytest.raises(CreditError, match="not among the grants given"):
        apply([], "1.00", ledger=[grant_entry(grant())])


def test_apply_credits_to_a_draft_invoice():
    invoice = draft_from_rating(rating(ROWS), PERIOD, price_book_version="v1")
    paid, entries = apply_credits_to_invoice(invoice, [grant("g", "100.00")], [], AT)
    assert (paid.credits_applied, paid.total) == (D("100.00"), D("42.83"))
    assert [e.invoice_id for e in entries if e.kind == "use"] == [invoice.id]


cents = st.integers(1, 20_000).map(lambda c: D(c).scaleb(-2))
offsets = st.integers(-60, 120).map(lambda d: timedelta(days=d))


@settings(max_examples=examples(200), deadline=None)
@given(
    grants=st.lists(st.tuples(cents, st.integers(0, 60), st.one_of(st.none(), offsets)), max_size=6),
    totals=st.lists(cents, min_size=1, max_size=4),
)
def test_ledger_properties(grants, totals):
    made = []
    for i, (amount, granted_day, expiry) in enumerate(grants):
        granted = JAN + timedelta(days=granted_day)
        expires = None if expiry is None or expiry <= timedelta(0) else granted + expiry
        made.append(grant(f"g{i}", amount, granted_at=granted, expires_at=expires))
    ledger = []
    for k, total in enumerate(totals):
        at = AT + timedelta(days=30 * k)
        before = balance(ledger, at)
        result = apply(made, total, ledger=ledger, invoice=f"inv_{k}", at=at, period_end=END + timedelta(days=30 * k))
        assert 0 <= result.applied <= total  # never below zero
        ledger += result.entries
        after = balance(ledger, at)
        assert after >= 0
        # applying only spends: the balance grows by no more than the grants recorded now
        assert after <= before + sum(e.amount for e in result.entries if e.kind == "grant")
        # a grant pays only if it does not expire before the period ends (it may have expired by `at`)
        payable = sum(g.amount for g in made if g.can_pay(END + timedelta(days=30 * k), at))
        assert result.applied <= payable
        # once the grants expired by `at` have their expiry entries, the balance is the sum of the entries
        assert after == sum(e.amount for e in ledger if e.at <= at)
        # deterministic and idempotent
        assert apply(made, total, ledger=ledger, invoice=f"inv_{k}", at=at,
                     period_end=END + timedelta(days=30 * k)).entries == ()
    assert len({e.id for e in ledger}) == len(ledger)
    granted_total = sum(e.amount for e in ledger if e.kind == "grant")
    used = -sum(e.amount for e in ledger if e.kind == "use")
    expired = -sum(e.amount for e in ledger if e.kind == "expiry")
    assert used + expired <= granted_total
