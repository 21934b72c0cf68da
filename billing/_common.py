"""Small helpers shared by the billing modules: stable ids, aware UTC datetimes, money checks."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from decimal import Decimal

from billing.errors import BillingError, MinorUnitError
from pricing.money import Currency, UnknownCurrency, exact_decimal

ZERO = Decimal(0)


def stable_id(namespace: str, *parts: str) -> str:
    """A 24-hex-digit sha256 of the namespace and parts (same length as pricing's line ids):
    the same inputs always give the same id, so a rerun finds the rows it wrote before."""
    text = "|".join((namespace, *parts))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def aware_utc(value: object, what: str, error: type[BillingError] = BillingError) -> datetime:
    """`value` as an aware datetime in UTC; a naive datetime (or anything else) is refused."""
    if not isinstance(value, datetime):
        raise error(f"{what} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise error(f"{what} {value.isoformat()} has no time zone: give an aware datetime (UTC)")
    return value.astimezone(UTC)


def currency_of(code: str, error: type[BillingError] = BillingError) -> Currency:
    try:
        return Currency.of(code)
    except UnknownCurrency as exc:
        raise error(str(exc)) from None


def decimal_amount(value: object, what: str, error: type[BillingError] = BillingError) -> Decimal:
    """An exact Decimal from a str/int/Decimal (floats refused), as `pricing.money.exact_decimal`."""
    try:
        return exact_decimal(value, what=what)
    except ValueError as exc:
        raise error(str(exc)) from None


def check_minor_units(
    amount: Decimal, currency: Currency, what: str, error: type[BillingError] = MinorUnitError
) -> Decimal:
    """`amount` unchanged if it has no more decimals than the currency's minor unit, else `error`."""
    if currency.round(amount) != amount:
        places = "no decimals" if currency.minor_units == 0 else f"at most {currency.minor_units} decimal places"
        raise error(
            f"{what} {amount} {currency.code} has more decimals than {currency.code} allows ({places}); "
            f"round it first (e.g. {currency.round(amount)})"
        )
    return amount
