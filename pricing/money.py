"""Money: exact decimals, currencies that own their minor unit, and the one rounding rule.

Amounts are `Decimal` built from `str`/`int` only. A precise amount keeps the project-wide
scale (12 decimal places, like `infermeter.db.QUANTITY_SCALE`); a line is rounded once, half-up,
to its currency's minor unit, and the precise amount is kept beside the rounded one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, ROUND_HALF_UP, Context, Decimal, InvalidOperation

# Same scale as the NUMERIC columns (infermeter.db.QUANTITY_SCALE); pricing/ stays free of I/O imports,
# so the number is repeated here and a test checks the two agree.
SCALE = 12
PRECISION = 38  # digits in all in those columns (NUMERIC(38, 12)): at most 26 before the decimal point
QUANT = Decimal(1).scaleb(-SCALE)  # 0.000000000001

# Wide enough that products of 38-digit quantities and 12-decimal prices never lose digits.
EXACT = Context(prec=80, rounding=ROUND_HALF_UP)
# Sums and differences without any rounding (a sum of decimals has finitely many digits): two totals
# of the same amounts are then the same number whatever the order they were added in, also where
# 80 digits would round their last digit on either side of a half cent. For adding and subtracting
# only (a division in it could try to write infinitely many digits).
SUMS = Context(prec=MAX_PREC, rounding=ROUND_HALF_UP, Emax=MAX_EMAX, Emin=MIN_EMIN)

# ISO 4217 minor units of the currencies a price book may use.
MINOR_UNITS: dict[str, int] = {
    "USD": 2, "EUR": 2, "GBP": 2, "CHF": 2, "CAD": 2, "AUD": 2, "NZD": 2, "SGD": 2, "HKD": 2,
    "CNY": 2, "INR": 2, "SEK": 2, "NOK": 2, "DKK": 2, "PLN": 2, "CZK": 2, "BRL": 2, "MXN": 2,
    "ZAR": 2, "ILS": 2, "AED": 2, "SAR": 2, "TWD": 2, "THB": 2,
    "JPY": 0, "KRW": 0, "VND": 0, "CLP": 0, "ISK": 0, "HUF": 2,
    "BHD": 3, "KWD": 3, "OMR": 3, "JOD": 3, "TND": 3,
}


_MINOR = {n: Decimal(1).scaleb(-n) for n in range(0, 5)}


class UnknownCurrency(ValueError):
    pass


@dataclass(frozen=True)
class Currency:
    code: str
    minor_units: int

    @classmethod
    def of(cls, code: str) -> Currency:
        try:
            return cls(code, MINOR_UNITS[code])
        except KeyError:
            raise UnknownCurrency(
                f"unknown currency {code!r} (known: {', '.join(sorted(MINOR_UNITS))})"
            ) from None

    @property
    def minor_unit(self) -> Decimal:
        return Decimal(1).scaleb(-self.minor_units)

    def round(self, amount: Decimal) -> Decimal:
        """Half-up to the minor unit (the only rounding done on money)."""
        return amount.quantize(_MINOR[self.minor_units], rounding=ROUND_HALF_UP, context=EXACT)

    def to_minor_units(self, amount: Decimal) -> int:
        """Integer minor units of an already rounded amount (what Stripe receives)."""
        return int(self.round(amount).scaleb(self.minor_units))


def precise(amount: Decimal) -> Decimal:
    """An amount kept at the project scale (12 places, half-up): what is stored as the precise amount."""
    return Decimal(amount).quantize(QUANT, rounding=ROUND_HALF_UP, context=EXACT)


def exact_decimal(value: object, *, what: str = "amount") -> Decimal:
    """A Decimal from a str/int/Decimal with at most SCALE decimal places; floats are refused.

    Raises ValueError with a reason a person can act on.
    """
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a decimal string such as \"0.20\", got a boolean")
    if isinstance(value, float):
        raise ValueError(
            f"{what} must be a decimal string such as \"0.20\" (a binary float cannot hold it exactly)"
        )
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, Decimal):
        d = value
    elif isinstance(value, str):
        text = value.strip().replace("_", "")
        try:
            d = Decimal(text)
        except InvalidOperation:
            raise ValueError(f"{what} {value!r} is not a decimal number") from None
    else:
        raise ValueError(f"{what} must be a decimal string, got {type(value).__name__}")
    if not d.is_finite():
        raise ValueError(f"{what} {value!r} is not a finite number")
    exponent = d.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -SCALE:
        raise ValueError(
            f"{what} {value!r} has more than {SCALE} decimal places (the project-wide scale)"
        )
    return d


_PLAIN_DECIMAL = re.compile(r"-?([0-9]+)(?:\.([0-9]+))?")


def plain_decimal(text: str, *, what: str = "amount") -> Decimal:
    """An amount typed by a person ("50", "50.00", "-0.5") as a Decimal that fits the NUMERIC(PRECISION,
    SCALE) columns. Exponents ("1e3"), NaN, Infinity, separators, more than SCALE decimal places or more
    than PRECISION - SCALE digits before the point are refused with a one-line ValueError. The sign and
    the currency's minor unit are the caller's to check."""
    stripped = text.strip()
    match = _PLAIN_DECIMAL.fullmatch(stripped)
    if match is None:
        raise ValueError(f"{what} {text!r} is not a decimal number such as 50.00 (digits, at most one '.', "
                         f"no exponent)")
    whole, fraction = match.group(1).lstrip("0"), match.group(2) or ""
    if len(whole) > PRECISION - SCALE:
        raise ValueError(f"{what} {stripped} has {len(whole)} digits before the decimal point; at most "
                         f"{PRECISION - SCALE} fit")
    if len(fraction) > SCALE:
        raise ValueError(f"{what} {stripped} has {len(fraction)} decimal places; at most {SCALE} fit")
    return Decimal(stripped)


def exact_sum(amounts: Iterable[Decimal | int], start: Decimal = Decimal(0)) -> Decimal:
    """The sum of amounts, exactly (`SUMS`: no digit rounded, so the same amounts give the same sum in
    any order). Python's `sum` and `+` add in the thread's context, 28 digits by default, which rounds a
    NUMERIC(38, 12) amount: 26 integer digits and 3 decimals are already 29 digits. Every sum of money
    in pricing/ and billing/ goes through this (or SUMS, or EXACT where a product or quotient is in it)."""
    add = SUMS.add
    total = start
    for amount in amounts:
        total = add(total, amount)
    return total


def mul_div(quantity: Decimal | int, amount: Decimal, per: Decimal) -> Decimal:
    """quantity x amount / per, exactly (to 80 digits) — never rounded here."""
    return EXACT.divide(EXACT.multiply(quantity, amount), per)
