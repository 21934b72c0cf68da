"""Prepaid credits at their exact time and money boundaries: a grant's start, its expiry against the
period's end and against `at`, the ledger's balance at an entry's instant, and invoices paid to the cent.

Each case sits on the boundary and one microsecond (or one minor unit) beside it, so flipping a `<=`
into `<` (or `>=` into `>`) in `billing.credits` fails a test."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest

from billing.credits import CreditGrant, LedgerEntry, apply_credits, balance, grant_entry
from billing.errors import CreditError

D = Decimal
US = timedelta(microseconds=1)
JAN = datetime(2026, 1, 1, tzinfo=UTC)
END = datetime(2026, 3, 1, tzinfo=UTC)  # the invoice's period end
AT = END + timedelta(days=3)  # when credits are applied (finalization)


def grant(id="g", amount="40.00", granted_at=JAN, expires_at=None):
    return CreditGrant(id, "c1", "USD", D(amount), granted_at, expires_at, "prepaid top-up")


def apply(grants, total="100.00", ledger=(), at=AT, period_end=END, invoice="inv_1"):
    return apply_credits(grants, ledger, D(total), at, invoice_id=invoice, customer_id="c1", currency="USD",
                         period_end=period_end)


# ---------------------------------------------------------------- the expiry against the period's end


@pytest.mark.parametrize(
    ("expires_at", "pays"),
    [
        (END - US, False),  # expires inside the period: its last microsecond of usage was not covered
        (END, True),  # expires exactly when the period ends: valid over all of [start, end)
        (END + US, True),
        (None, True),
    ],
    ids=["one-us-before-the-end", "exactly-at-the-end", "one-us-after", "no-expiry"],
)
def test_a_grant_pays_the_period_when_it_expires_at_or_after_its_end(expires_at, pays):
    assert grant(expires_at=expires_at).can_pay(END, AT) is pays
    result = apply([grant(expires_at=expires_at)])
    assert result.applied == (D("40.00") if pays else 0)
    uses = [e for e in result.entries if e.kind == "use"]
    assert [e.amount for e in uses] == ([D("-40.00")] if pays else [])


def test_a_grant_expiring_exactly_at_the_period_end_pays_it_and_its_rest_expires_at_its_expiry():
    result = apply([grant(amount="150.00", expires_at=END)], at=END)  # applied the instant the period ends
    assert result.applied == D("100.00")
    assert [(e.kind, e.amount, e.at) for e in result.entries] == [
        ("grant", D("150.00"), JAN),
        ("use", D("-100.00"), END),
        ("expiry", D("-50.00"), END),  # expired at `at` (expires_at <= at): the rest leaves the ledger
    ]


# ---------------------------------------------------------------- the grant's start against `at`


@pytest.mark.parametrize(
    ("granted_at", "pays"),
    [(AT - US, True), (AT, True), (AT + US, False)],
    ids=["one-us-before-at", "exactly-at", "one-us-after-at"],
)
def test_a_grant_pays_when_it_was_granted_by_at(granted_at, pays):
    assert grant(granted_at=granted_at).can_pay(END, AT) is pays
    result = apply([grant(granted_at=granted_at)])
    assert result.applied == (D("40.00") if pays else 0)
    # a grant made after `at` is not in the ledger yet either
    assert [e.kind for e in result.entries] == (["grant", "use"] if pays else [])


# ---------------------------------------------------------------- expired at `at`


@pytest.mark.parametrize(
    ("at", "expired"),
    [(END - US, False), (END, True), (END + US, True)],
    ids=["one-us-before-expiry", "exactly-at-expiry", "one-us-after"],
)
def test_a_grant_is_expired_from_its_expiry_instant_on(at, expired):
    g = grant(expires_at=END)
    assert g.expired(at) is expired
    # paying an invoice whose period ended a day earlier: the grant pays, then its rest expires (or not)
    result = apply([grant(amount="150.00", expires_at=END)], at=at, period_end=END - timedelta(days=1))
    assert result.applied == D("100.00")
    rest = [(e.amount, e.at) for e in result.entries if e.kind == "expiry"]
    assert rest == ([(D("-50.00"), max(END, at))] if expired else [])


def test_a_grant_without_expiry_never_expires():
    assert grant().expired(datetime(9999, 12, 31, tzinfo=UTC)) is False


def test_an_expiry_is_dated_at_the_expiry_or_at_the_last_use_whichever_is_later():
    g = grant(amount="150.00", expires_at=END + timedelta(days=1))
    # a first invoice used it before it expired; applying later finds it expired: dated at its expiry
    first = apply([g], total="10.00", at=END, invoice="inv_0", period_end=END)
    assert [e.kind for e in first.entries] == ["grant", "use"]
    later = apply([g], total="0", ledger=first.entries, at=END + timedelta(days=5), invoice="inv_1")
    assert [(e.kind, e.amount, e.at) for e in later.entries] == [("expiry", D("-140.00"), END + timedelta(days=1))]
    # used after its expiry (for a period it covered): dated at that use, never before it
    late = apply([g], total="10.00", at=END + timedelta(days=5), period_end=END)
    assert [(e.kind, e.at) for e in late.entries][-1] == ("expiry", END + timedelta(days=5))


def test_a_grant_expires_only_after_it_was_granted():
    with pytest.raises(CreditError, match="not after it is granted"):
        grant(granted_at=JAN, expires_at=JAN)
    assert grant(granted_at=JAN, expires_at=JAN + US).expires_at == JAN + US


# ---------------------------------------------------------------- money: to the cent


@pytest.mark.parametrize(
    ("held", "total", "applied", "left"),
    [
        ("40.00", "39.99", "39.99", "0.01"),  # one cent short of the grant: a cent stays
        ("40.00", "40.00", "40.00", "0.00"),  # exactly the grant
        ("40.00", "40.01", "40.00", "0.00"),  # one cent more: the invoice keeps that cent
        ("0.01", "0.01", "0.01", "0.00"),  # the smallest grant pays the smallest invoice
    ],
)
def test_credits_pay_to_the_cent(held, total, applied, left):
    result = apply([grant(amount=held)], total=total)
    assert result.applied == D(applied)
    assert balance(result.entries, AT) == D(left)


def test_a_zero_invoice_uses_nothing_and_the_grants_are_still_recorded():
    result = apply([grant()], total="0")
    assert result.applied == 0
    assert [e.kind for e in result.entries] == ["grant"]


def test_the_second_grant_is_touched_only_when_the_first_is_used_up():
    soon = grant("soon", "40.00", expires_at=END + timedelta(days=10))
    late = grant("late", "40.00", expires_at=END + timedelta(days=20))
    exactly = apply([soon, late], total="40.00")
    assert [(e.grant_id, e.amount) for e in exactly.entries if e.kind == "use"] == [("soon", D("-40.00"))]
    one_cent_more = apply([soon, late], total="40.01")
    assert [(e.grant_id, e.amount) for e in one_cent_more.entries if e.kind == "use"] == [
        ("soon", D("-40.00")), ("late", D("-0.01")),
    ]


def test_a_used_up_grant_writes_no_empty_use():
    g = grant(amount="40.00")
    first = apply([g], total="40.00", invoice="inv_0")
    second = apply([g, grant("h", "5.00")], total="3.00", ledger=first.entries, invoice="inv_1")
    assert [(e.grant_id, e.kind, e.amount) for e in second.entries] == [
        ("h", "grant", D("5.00")), ("h", "use", D("-3.00")),
    ]


# ---------------------------------------------------------------- the ledger's balance at an instant


def test_balance_counts_an_entry_from_its_instant_on():
    g = grant(amount="40.00", granted_at=JAN + timedelta(days=1))
    entry = grant_entry(g)
    assert balance([entry], entry.at - US) == 0
    assert balance([entry], entry.at) == D("40.00")


def test_balance_drops_a_grant_from_its_expiry_instant_on():
    entry = grant_entry(grant(amount="40.00", expires_at=END))
    assert balance([entry], END - US) == D("40.00")
    assert balance([entry], END) == 0


def test_balance_of_one_currency_among_several():
    usd = grant_entry(grant(amount="40.00"))
    eur = LedgerEntry("led_eur", "grant", "e", "c1", "EUR", D("7.00"), JAN)
    assert balance([usd, eur], AT, currency="USD") == D("40.00")
    assert balance([usd, eur], AT, currency="EUR") == D("7.00")
    assert balance([usd], AT) == D("40.00")  # one currency: no need to name it
    with pytest.raises(CreditError, match="several currencies"):
        balance([usd, eur], AT)


# ---------------------------------------------------------------- ledger entries: signs


@pytest.mark.parametrize(
    ("kind", "amount", "invoice_id", "message"),
    [
        ("grant", "0", None, "must be positive"),
        ("grant", "-1", None, "must be positive"),
        ("use", "1", "inv_1", "must be negative"),
        ("expiry", "1", None, "must be negative"),
        ("use", "-1", None, "only a use entry names an invoice"),
        ("expiry", "-1", "inv_1", "only a use entry names an invoice"),
        ("refund", "-1", None, "is not one of grant, use, expiry"),
    ],
)
def test_ledger_entries_carry_their_sign(kind, amount, invoice_id, message):
    with pytest.raises(CreditError, match=message):
        LedgerEntry("led_x", kind, "g", "c1", "USD", D(amount), JAN, invoice_id=invoice_id)


@pytest.mark.parametrize(
    ("kind", "amount", "invoice_id"),
    [("grant", "0.01", None), ("use", "-0.01", "inv_1"), ("expiry", "-0.01", None)],
)
def test_the_smallest_entry_of_each_kind_is_valid(kind, amount, invoice_id):
    entry = LedgerEntry("led_x", kind, "g", "c1", "USD", D(amount), JAN, invoice_id=invoice_id)
    assert entry.amount == D(amount)


# ---------------------------------------------------------------- ids and fields of the entries written


def ledger_id(*parts: str) -> str:
    return "led_" + hashlib.sha256("|".join(("ledger", *parts)).encode()).hexdigest()[:24]


def test_ledger_entry_ids_are_the_documented_hashes_so_a_rerun_finds_them():
    """The ledger table stores these ids: a rerun (or a later release) must derive the same ones."""
    result = apply([grant("g", "150.00", expires_at=END)], at=END, invoice="inv_7")
    grant_e, use, expiry = result.entries
    assert (grant_e.id, use.id, expiry.id) == (ledger_id("grant", "g"), ledger_id("use", "g", "inv_7"),
                                               ledger_id("expiry", "g"))
    for entry in result.entries:
        assert (entry.grant_id, entry.customer_id, entry.currency) == ("g", "c1", "USD")
    assert (use.invoice_id, grant_e.invoice_id, expiry.invoice_id) == ("inv_7", None, None)
    assert (grant_e.expires_at, use.expires_at, expiry.expires_at) == (END, None, None)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"currency": "XYZ"}, r"^unknown currency 'XYZ'"),
        ({"at": datetime(2026, 3, 4)}, r"^at 2026-03-04T00:00:00 has no time zone"),
        ({"period_end": datetime(2026, 3, 1)}, r"^period_end 2026-03-01T00:00:00 has no time zone"),
        ({"invoice_id": ""}, r"^invoice_id is required"),
        ({"invoice_total": D("-0.01")}, r"^invoice total -0.01 USD is negative"),
        ({"invoice_total": D("0.001")}, r"^invoice_total 0.001 USD has more decimals than USD allows"),
    ],
)
def test_applying_credits_names_what_is_wrong(change, message):
    kwargs = {"invoice_total": D("1.00"), "at": AT, "invoice_id": "inv_1", "customer_id": "c1", "currency": "USD",
              "period_end": END} | change
    total, at = kwargs.pop("invoice_total"), kwargs.pop("at")
    with pytest.raises(CreditError, match=message):
        apply_credits([grant()], [], total, at, **kwargs)


def test_balance_names_a_bad_instant_and_the_currencies_it_holds():
    usd = grant_entry(grant(amount="40.00"))
    eur = LedgerEntry("led_eur", "grant", "e", "c1", "EUR", D("7.00"), JAN)
    with pytest.raises(CreditError, match=r"^the ledger holds several currencies \(EUR, USD\): name one$"):
        balance([usd, eur], AT)
    with pytest.raises(CreditError, match=r"^at 2026-03-04T00:00:00 has no time zone"):
        balance([usd], datetime(2026, 3, 4))
    assert type(balance([], AT)) is D and balance([], AT) == 0


def test_a_ledger_entry_keeps_its_instant_in_utc_and_names_a_naive_one():
    entry = LedgerEntry("led_x", "grant", "g", "c1", "USD", D("1.00"), datetime(2026, 1, 1, 1, tzinfo=ZoneInfo("Europe/Berlin")))
    assert entry.at == JAN and entry.at.tzinfo is UTC
    with pytest.raises(CreditError, match=r"^ledger entry led_x at 2026-01-01T00:00:00 has no time zone"):
        LedgerEntry("led_x", "grant", "g", "c1", "USD", D("1.00"), datetime(2026, 1, 1))


def test_a_grant_amount_given_as_a_float_is_named():
    with pytest.raises(CreditError, match=r"^credit grant g amount must be a decimal string"):
        CreditGrant("g", "c1", "USD", 1.5, JAN, None, "top-up")


def test_a_grant_keeps_an_exact_amount_and_utc_instants():
    berlin = ZoneInfo("Europe/Berlin")
    g = CreditGrant("g", "c1", "USD", "50.10", datetime(2026, 1, 1, 1, tzinfo=berlin), datetime(2026, 2, 1, 1, tzinfo=berlin),
                    "top-up")
    assert g.amount == D("50.10") and type(g.amount) is D
    assert (g.granted_at, g.expires_at) == (JAN, datetime(2026, 2, 1, tzinfo=UTC))
    assert g.granted_at.tzinfo is UTC and g.expires_at.tzinfo is UTC


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"id": ""}, r"^a credit grant needs an id$"),
        ({"customer_id": ""}, r"^credit grant g needs a customer_id$"),
        ({"customer_id": None}, r"^credit grant g needs a customer_id$"),
        ({"reason": " "}, r"^credit grant g needs a reason \(e.g. 'prepaid top-up', 'goodwill'\)$"),
        ({"reason": None}, r"^credit grant g needs a reason"),
        ({"amount": "1.001"}, r"^credit grant g amount 1.001 USD has more decimals than USD allows"),
        ({"granted_at": datetime(2026, 1, 1)}, r"^credit grant g granted_at 2026-01-01T00:00:00 has no time zone"),
        ({"expires_at": datetime(2026, 2, 1)}, r"^credit grant g expires_at 2026-02-01T00:00:00 has no time zone"),
    ],
)
def test_a_bad_grant_is_named_in_its_error(change, message):
    fields = {"id": "g", "customer_id": "c1", "currency": "USD", "amount": "1.00", "granted_at": JAN,
              "expires_at": None, "reason": "top-up"} | change
    with pytest.raises(CreditError, match=message):
        CreditGrant(**fields)


def test_a_grant_not_yet_made_does_not_stop_the_later_expiring_ones_from_paying():
    future = grant("future", "40.00", granted_at=AT + US, expires_at=AT + timedelta(days=5))  # first in order
    made = grant("made", "40.00", expires_at=AT + timedelta(days=50))
    result = apply([future, made], total="10.00")
    assert [(e.grant_id, e.kind) for e in result.entries] == [("made", "grant"), ("made", "use")]


def test_applying_credits_refuses_a_float_total_and_a_grant_given_twice():
    with pytest.raises(CreditError, match=r"^invoice_total must be a decimal string"):
        apply_credits([grant()], [], 1.5, AT, invoice_id="i", customer_id="c1", currency="USD", period_end=END)
    with pytest.raises(CreditError, match=r"^the same grant id is given twice$"):
        apply([grant(), grant()])


def test_an_instant_that_is_not_a_datetime_or_has_no_offset_is_refused():
    from datetime import tzinfo

    class NoOffset(tzinfo):
        def utcoffset(self, dt):
            return None

    with pytest.raises(CreditError, match=r"^credit grant g granted_at must be a datetime, got str$"):
        grant(granted_at="2026-01-01T00:00:00Z")
    with pytest.raises(CreditError, match=r"^credit grant g granted_at 2026-01-01T00:00:00 has no time zone"):
        grant(granted_at=datetime(2026, 1, 1, tzinfo=NoOffset()))
