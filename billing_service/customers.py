"""Customers and their plans: a customer's record (time zone, currency, anchor day: they cut its
billing periods), which price book it is billed under from which local date, and the local dates
those commands take (`parse_local_date`, `local_midnight`). Every function takes an open psycopg
connection and the injected clock (`now`); each runs in its own transaction and writes nothing
when it raises.

A customer's calendar (time zone, anchor day) is handed to metering as data in the transaction that
creates the customer or changes its calendar (`metering.calendars.set_calendar`), so metering keeps
the customer's period totals by the periods billing cuts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime

import psycopg

from billing.invoice import CHARGING
from billing.periods import Period, check_anchor_day, next_period, period_containing, periods_between, zone
from billing_service.store import (
    BillingServiceError,
    Customer,
    Plan,
    StoredBook,
    add_plan,
    check_customer_id,
    checked_now,
    get_customer,
    has_billing_history,
    lock_customer,
    parse_book_text,
    plan_at,
    plans,
    require_customer,
    save_customer,
    store_book,
)
from metering.calendars import SPAN, set_calendar
from pricing.money import Currency, UnknownCurrency


def set_customer(
    conn: psycopg.Connection,
    customer_id: str,
    *,
    now: datetime,
    name: str | None = None,
    email: str | None = None,
    timezone: str | None = None,
    currency: str | None = None,
    anchor_day: int | None = None,
) -> tuple[Customer, bool]:
    """Create a customer (defaults UTC, USD, anchor day 1) or update the fields given. The time zone,
    anchor day and currency are fixed once the customer has a plan or an invoice (its periods and
    plans were cut from them). When the customer is created or its time zone or anchor day changes,
    its calendar is handed to metering in the same transaction (`calendar_to_metering`). Returns
    (the customer, whether anything changed)."""
    now = checked_now(now)
    check_customer_id(customer_id)
    if timezone is not None:
        zone(timezone)
    if anchor_day is not None:
        check_anchor_day(anchor_day)
    if currency is not None:
        try:
            Currency.of(currency)
        except UnknownCurrency as exc:
            raise BillingServiceError(str(exc)) from None
    if email is not None and (email.count("@") != 1 or " " in email or email.startswith("@") or email.endswith("@")):
        raise BillingServiceError(f"email {email!r} is not an e-mail address (name@example.com)")
    with conn.transaction():
        lock_customer(conn, customer_id)
        old = get_customer(conn, customer_id)
        new = Customer(
            customer_id,
            name if name is not None else (old.name if old else None),
            email if email is not None else (old.email if old else None),
            timezone if timezone is not None else (old.timezone if old else "UTC"),
            currency if currency is not None else (old.currency if old else "USD"),
            anchor_day if anchor_day is not None else (old.anchor_day if old else 1),
        )
        if old == new:
            return new, False
        if old is not None and (old.timezone, old.anchor_day, old.currency) != (new.timezone, new.anchor_day, new.currency):
            if has_billing_history(conn, customer_id):
                raise BillingServiceError(
                    f"customer {customer_id} already has plans or invoices: its time zone ({old.timezone}), anchor "
                    f"day ({old.anchor_day}) and currency ({old.currency}) cut its periods and are fixed; "
                    "bill under a new customer id instead"
                )
        save_customer(conn, new, now)
        if old is None or (old.timezone, old.anchor_day) != (new.timezone, new.anchor_day):
            calendar_to_metering(conn, new)
    return new, True


def calendar_to_metering(conn: psycopg.Connection, customer: Customer) -> None:
    """Hand metering the customer's calendar inside the caller's transaction: its schedule and, if
    metering does not have that schedule yet, its periods labelled `metering.calendars.SPAN`, cut by
    `billing.periods` (metering does no time zone arithmetic). Metering rebuilds the customer's
    period totals when the schedule it kept them by changes and it holds usage of the customer."""
    timezone, anchor_day = customer.timezone, customer.anchor_day
    set_calendar(conn, customer.customer_id, timezone, anchor_day,
                 ((p.start, p.end) for p in periods_between(*SPAN, timezone, anchor_day)))


def parse_local_date(text: str, what: str) -> date:
    try:
        if len(text) != 10:
            raise ValueError
        return date.fromisoformat(text)
    except (TypeError, ValueError):
        raise BillingServiceError(f"{what} {text!r} is not a date of the form YYYY-MM-DD (e.g. 2026-03-01)") from None


def local_midnight(day: date, timezone: str) -> datetime:
    """00:00 of a local date in a time zone, in UTC (fold=0, as billing.periods cuts periods)."""
    return datetime(day.year, day.month, day.day, tzinfo=zone(timezone)).astimezone(UTC)


def effective_boundary(customer: Customer, day: date) -> Period:
    """The first period of the customer starting at or after 00:00 local on `day`: a plan assigned
    from inside a period takes effect at the next period boundary."""
    at = local_midnight(day, customer.timezone)
    period = period_containing(at, customer.timezone, customer.anchor_day)
    return period if period.start == at else next_period(period)


@dataclass(frozen=True)
class PlanAssignment:
    plan: Plan | None
    created: bool
    effective: Period
    book: StoredBook


def assign_plan(
    conn: psycopg.Connection, customer_id: str, book_text: str, source_name: str, from_date: str, *, now: datetime,
    backdate: bool = False, backdate_hint: str = "pass --backdate",
) -> PlanAssignment:
    """Give the customer a price book from a local date (in force from the first period boundary at
    or after it). Refused for a book in another currency, when a finalized invoice exists for a
    period it would reach (a plan change never rewrites an issued invoice), and, unless `backdate`,
    from a period before the customer's first plan (it would bill those periods too; the refusal ends
    with `backdate_hint`, how the caller's user says yes)."""
    now = checked_now(now)
    day = parse_local_date(from_date, "from")
    customer = require_customer(conn, customer_id)
    stored_preview = parse_book_text(book_text, source_name)
    if stored_preview.book.currency != customer.currency:
        raise BillingServiceError(
            f"price book {stored_preview.book.id} is in {stored_preview.book.currency} but customer {customer_id} "
            f"is billed in {customer.currency}: use a {customer.currency} book"
        )
    effective = effective_boundary(customer, day)
    with conn.transaction():
        lock_customer(conn, customer_id)
        assigned = plans(conn, customer_id)
        first = min(assigned, key=lambda p: p.effective_at, default=None)
        if first is not None and effective.start < first.effective_at and not backdate:
            raise BillingServiceError(
                f"customer {customer_id}'s first plan is in force from period {first.effective_period}; a plan from "
                f"{from_date} (period {effective.label}) would bill the periods before it: {backdate_hint} to do so"
            )
        finalized = conn.execute(
            "SELECT period, number, period_start FROM billing_invoices WHERE customer_id = %s AND status = ANY(%s) "
            "AND period_start >= %s ORDER BY period_start",
            (customer_id, [str(s) for s in CHARGING], effective.start),
        ).fetchall()
        newest = max((p.id for p in assigned), default=0) + 1
        candidate = Plan(newest, customer_id, day, effective.start, effective.label, stored_preview.sha256,
                         stored_preview.book.id, now)
        for period_label, number, start in finalized:  # would the new plan be the one in force there?
            if plan_at([*assigned, candidate], start) is candidate:
                raise BillingServiceError(
                    f"customer {customer_id} has a finalized invoice for period {period_label} ({number}): a plan "
                    f"change cannot reach a finalized period; assign it from a later date, or void that invoice first"
                )
        stored = store_book(conn, book_text, source_name)
        current = plan_at(assigned, effective.start)
        if current is not None and current.effective_at == effective.start and current.book_sha256 == stored.sha256:
            return PlanAssignment(current, False, effective, stored)
        add_plan(conn, customer_id, day, effective.start, effective.label, stored.sha256, now)
        plan = plan_at(plans(conn, customer_id), effective.start)
    return PlanAssignment(plan, True, effective, stored)
