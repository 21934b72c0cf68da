"""Prepaid credits, pure: grants, an append-only ledger (grant / use / expiry entries) and how credits
pay an invoice.

Rules (deterministic; the clock is the `at` argument):
- A grant is valid over [granted_at, expires_at) (no expiry: for ever).
- A grant can pay an invoice when it was granted by `at` (the moment credits are applied, normally
  finalization) and does not expire before the invoice's period ends (expires_at >= period_end):
  every unit of usage in the period then happened while the grant was valid. So a grant expiring on
  March 15 pays the February invoice finalized on March 20, but not the March invoice.
- Grants are used oldest-expiring first (no expiry last), ties by granted_at, then id.
- Credits never take an invoice below zero: applied = min(invoice total, what the usable grants hold).
- Once a grant has expired at `at` (expires_at <= at), its unused remainder leaves the ledger as an
  `expiry` entry, dated at its expiry (or at its last use, if it paid an invoice after expiring).
- Applying credits twice for the same invoice writes nothing new and returns the same amount.

Ledger amounts are signed: grant +, use -, expiry -. `balance(ledger, at)` is what the customer can
spend at `at`: the entries up to `at` of the grants not expired at `at`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Literal

from billing._common import ZERO, aware_utc, check_minor_units, currency_of, decimal_amount, stable_id
from billing.errors import CreditError
from billing.invoice import Invoice
from billing.invoice.drafts import with_credits_applied
from pricing.money import EXACT, exact_sum

LedgerKind = Literal["grant", "use", "expiry"]
LEDGER_KINDS: tuple[LedgerKind, ...] = ("grant", "use", "expiry")


@dataclass(frozen=True)
class CreditGrant:
    id: str
    customer_id: str
    currency: str
    amount: Decimal
    granted_at: datetime
    expires_at: datetime | None
    reason: str

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise CreditError("a credit grant needs an id")
        if not isinstance(self.customer_id, str) or not self.customer_id:
            raise CreditError(f"credit grant {self.id} needs a customer_id")
        money = currency_of(self.currency, CreditError)
        amount = decimal_amount(self.amount, f"credit grant {self.id} amount", CreditError)
        if amount <= 0:
            raise CreditError(f"credit grant {self.id}: amount {amount} {self.currency} must be greater than zero")
        check_minor_units(amount, money, f"credit grant {self.id} amount", CreditError)
        object.__setattr__(self, "amount", amount)
        granted = aware_utc(self.granted_at, f"credit grant {self.id} granted_at", CreditError)
        object.__setattr__(self, "granted_at", granted)
        if self.expires_at is not None:
            expires = aware_utc(self.expires_at, f"credit grant {self.id} expires_at", CreditError)
            if expires <= granted:
                raise CreditError(
                    f"credit grant {self.id} expires at {expires.isoformat()}, not after it is granted "
                    f"({granted.isoformat()})"
                )
            object.__setattr__(self, "expires_at", expires)
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise CreditError(f"credit grant {self.id} needs a reason (e.g. 'prepaid top-up', 'goodwill')")

    def expired(self, at: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= at

    def can_pay(self, period_end: datetime, at: datetime) -> bool:
        """Granted by `at`, and not expiring before the invoice's period ends."""
        return self.granted_at <= at and (self.expires_at is None or self.expires_at >= period_end)


@dataclass(frozen=True)
class LedgerEntry:
    id: str
    kind: LedgerKind
    grant_id: str
    customer_id: str
    currency: str
    amount: Decimal  # signed: grant +, use and expiry -
    at: datetime
    invoice_id: str | None = None  # the invoice a `use` paid
    expires_at: datetime | None = None  # on `grant` entries: the grant's expiry

    def __post_init__(self) -> None:
        if self.kind not in LEDGER_KINDS:
            raise CreditError(f"ledger entry {self.id}: kind {self.kind!r} is not one of {', '.join(LEDGER_KINDS)}")
        if (self.kind == "grant") != (self.amount > 0):
            raise CreditError(f"ledger entry {self.id}: a {self.kind} entry must be {'positive' if self.kind == 'grant' else 'negative'}")
        if (self.kind == "use") != (self.invoice_id is not None):
            raise CreditError(f"ledger entry {self.id}: only a use entry names an invoice, and it must")
        object.__setattr__(self, "at", aware_utc(self.at, f"ledger entry {self.id} at", CreditError))


@dataclass(frozen=True)
class CreditApplication:
    applied: Decimal
    entries: tuple[LedgerEntry, ...]  # the new ledger entries to append (none on a rerun)


def grant_entry(grant: CreditGrant) -> LedgerEntry:
    return LedgerEntry(
        id="led_" + stable_id("ledger", "grant", grant.id), kind="grant", grant_id=grant.id,
        customer_id=grant.customer_id, currency=grant.currency, amount=grant.amount, at=grant.granted_at,
        expires_at=grant.expires_at,
    )


def _use_entry(grant: CreditGrant, amount: Decimal, invoice_id: str, at: datetime) -> LedgerEntry:
    return LedgerEntry(
        id="led_" + stable_id("ledger", "use", grant.id, invoice_id), kind="use", grant_id=grant.id,
        customer_id=grant.customer_id, currency=grant.currency, amount=EXACT.minus(amount), at=at, invoice_id=invoice_id,
    )


def _expiry_entry(grant: CreditGrant, amount: Decimal, at: datetime) -> LedgerEntry:
    return LedgerEntry(
        id="led_" + stable_id("ledger", "expiry", grant.id), kind="expiry", grant_id=grant.id,
        customer_id=grant.customer_id, currency=grant.currency, amount=EXACT.minus(amount), at=at,
    )


def _order(grant: CreditGrant) -> tuple[bool, datetime, datetime, str]:
    """Oldest-expiring first, no expiry last; ties by granted_at, then id."""
    return (grant.expires_at is None, grant.expires_at or grant.granted_at, grant.granted_at, grant.id)


@dataclass(frozen=True)
class ApplyCreditsInput:
    grants: Sequence[CreditGrant]
    ledger: Sequence[LedgerEntry]
    invoice_total: Decimal
    at: datetime
    invoice_id: str
    customer_id: str
    currency: str
    period_end: datetime

    def validate(self) -> None:
        money = currency_of(self.currency, CreditError)
        aware_utc(self.at, "at", CreditError)
        aware_utc(self.period_end, "period_end", CreditError)
        if not self.invoice_id:
            raise CreditError("invoice_id is required (use entries name the invoice they paid)")
        total = decimal_amount(self.invoice_total, "invoice_total", CreditError)
        if total < 0:
            raise CreditError(f"invoice total {total} {self.currency} is negative: credits pay only what is owed")
        check_minor_units(total, money, "invoice_total", CreditError)
        ids = [grant.id for grant in self.grants]
        if len(set(ids)) != len(ids):
            raise CreditError("the same grant id is given twice")
        for grant in self.grants:
            if grant.customer_id != self.customer_id:
                raise CreditError(f"grant {grant.id} belongs to customer {grant.customer_id}, not {self.customer_id}")
        known = set(ids)
        for entry in self.ledger:
            if entry.grant_id not in known:
                raise CreditError(
                    f"ledger entry {entry.id} is for grant {entry.grant_id}, which is not among the grants given: "
                    f"pass every grant of the customer"
                )


def apply_credits(
    grants: Iterable[CreditGrant],
    ledger_so_far: Iterable[LedgerEntry],
    invoice_total: Decimal,
    at: datetime,
    *,
    invoice_id: str,
    customer_id: str,
    currency: str,
    period_end: datetime,
) -> CreditApplication:
    """How much prepaid credit pays an invoice of `invoice_total` (before credits) whose period ends at
    `period_end`, applied at `at`; and the ledger entries to append (missing grant entries, uses,
    expiries of grants expired by `at`). Grants in another currency are left alone."""
    grants = tuple(grants)
    ledger = tuple(ledger_so_far)
    request = ApplyCreditsInput(grants, ledger, invoice_total, at, invoice_id, customer_id, currency, period_end)
    request.validate()
    when = aware_utc(at, "at", CreditError)
    end = aware_utc(period_end, "period_end", CreditError)
    total = decimal_amount(invoice_total, "invoice_total", CreditError)

    earlier = [e for e in ledger if e.kind == "use" and e.invoice_id == invoice_id]
    if earlier:  # a rerun: the invoice was paid from credits already
        return CreditApplication(EXACT.minus(exact_sum(e.amount for e in earlier)), ())

    new: list[LedgerEntry] = []
    remaining: dict[str, Decimal] = {}
    last_at: dict[str, datetime] = {}
    granted = {e.grant_id for e in ledger if e.kind == "grant"}
    for grant in sorted(grants, key=_order):
        if grant.granted_at > when:
            continue  # not granted yet at `at`
        if grant.id not in granted:
            new.append(grant_entry(grant))
        entries = [e for e in ledger if e.grant_id == grant.id]
        remaining[grant.id] = exact_sum((e.amount for e in entries if e.kind != "grant"), grant.amount)
        last_at[grant.id] = max([grant.granted_at, *(e.at for e in entries)])

    need = total
    for grant in sorted(grants, key=_order):
        if need <= 0:
            break
        if grant.currency != currency or grant.id not in remaining or not grant.can_pay(end, when):
            continue
        use = min(need, remaining[grant.id])
        if use > 0:
            new.append(_use_entry(grant, use, invoice_id, when))
            remaining[grant.id] = EXACT.subtract(remaining[grant.id], use)
            last_at[grant.id] = max(last_at[grant.id], when)
            need = EXACT.subtract(need, use)

    for grant in sorted(grants, key=_order):
        if grant.id in remaining and remaining[grant.id] > 0 and grant.expired(when):
            assert grant.expires_at is not None
            new.append(_expiry_entry(grant, remaining[grant.id], max(grant.expires_at, last_at[grant.id])))
    return CreditApplication(EXACT.subtract(total, need), tuple(new))


def apply_credits_to_invoice(
    invoice: Invoice, grants: Iterable[CreditGrant], ledger_so_far: Iterable[LedgerEntry], at: datetime
) -> tuple[Invoice, tuple[LedgerEntry, ...]]:
    """(the draft with prepaid credits applied, the ledger entries to append) for a draft invoice."""
    application = apply_credits(
        grants, ledger_so_far, max(invoice.subtotal, ZERO), at, invoice_id=invoice.id,
        customer_id=invoice.customer_id, currency=invoice.currency, period_end=invoice.period_end,
    )
    return with_credits_applied(invoice, application.applied), application.entries


def balance(ledger: Iterable[LedgerEntry], at: datetime, *, currency: str | None = None) -> Decimal:
    """What the customer can spend at `at`: the entries up to `at` of grants not expired at `at`.
    With entries in several currencies, name the currency."""
    when = aware_utc(at, "at", CreditError)
    entries = tuple(ledger)
    currencies = {e.currency for e in entries}
    if currency is None and len(currencies) > 1:
        raise CreditError(f"the ledger holds several currencies ({', '.join(sorted(currencies))}): name one")
    expiry = {e.grant_id: e.expires_at for e in entries if e.kind == "grant"}
    per_grant: dict[str, Decimal] = {}
    for e in entries:
        if e.at <= when and (currency is None or e.currency == currency):
            per_grant[e.grant_id] = EXACT.add(per_grant.get(e.grant_id, ZERO), e.amount)
    return exact_sum(
        amount for grant_id, amount in per_grant.items() if not (expiry.get(grant_id) and expiry[grant_id] <= when)
    )
