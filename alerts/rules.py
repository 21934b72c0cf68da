"""Which alert thresholds a customer has crossed: pure, exact (Decimal), no I/O.

`crossings(customer_id, thresholds, budget=..., credit=..., forecast=..., credit_runs_out_at=..., now=...)`
gives one `Crossing` per threshold reached; its key (customer, kind, threshold, period) is what makes
an alert fire once per period (`alerts.store.record`):

| kind | threshold | reached when | period |
| --- | --- | --- | --- |
| `budget` | a percentage (`50`) | the month's spend x 100 >= percentage x the monthly cap | the budget's month, `2026-11` |
| `credit` | a percentage | the billing period's spend to date x 100 >= percentage x the credit balance | the billing period |
| `forecast_overspend` | `p50` | the invoice forecast's median > the monthly cap | the billing period |
| `credit_runout` | `<N>d` | the credit runs out (at the forecast's median rate) at most N days from now | the billing period |

A percentage is reached exactly at its boundary: 50.00% of the cap fires the 50% threshold, 49.99%
does not (the comparison multiplies, it never divides). A limit of zero is reached by any spend.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_DOWN, Decimal, InvalidOperation

KINDS = ("budget", "credit", "forecast_overspend", "credit_runout", "test")
MAX_PERCENT = Decimal(1000)
HUNDRED = Decimal(100)


class ThresholdError(ValueError):
    """A threshold that cannot be used (a percentage that is not a number, or out of range)."""


def parse_percents(text: str | Iterable[object], what: str = "percentages") -> tuple[Decimal, ...]:
    """"50,80,100" -> (50, 80, 100): sorted, without repeats; each above 0 and at most 1000, with at most
    two decimals. "" (or "none") -> (): no threshold of that kind."""
    items = [p.strip() for p in text.split(",")] if isinstance(text, str) else [str(p).strip() for p in text]
    items = [p.removesuffix("%") for p in items if p and p.lower() != "none"]
    out = set()
    for item in items:
        try:
            value = Decimal(item)
        except InvalidOperation:
            raise ThresholdError(f"{what}: {item!r} is not a percentage such as 80") from None
        if not value.is_finite() or not 0 < value <= MAX_PERCENT:
            raise ThresholdError(f"{what}: {item} must be above 0 and at most {MAX_PERCENT}")
        if value != value.quantize(Decimal("0.01")):
            raise ThresholdError(f"{what}: {item} has more than two decimals")
        out.add(value)
    return tuple(sorted(out))


def percents_text(percents: Iterable[Decimal]) -> str:
    return ",".join(_number(p) for p in percents)


def _number(value: Decimal) -> str:
    return f"{value.normalize():f}"


CENT = Decimal("0.01")


def amount_text(value: Decimal) -> str:
    """An amount as the webhook shows it: exact, at least two decimals, no trailing zeros past them
    (80.000000000000 from a NUMERIC column reads 80.00; 0.123450 reads 0.12345)."""
    return str(value.quantize(CENT)) if value == value.quantize(CENT) else _number(value)


@dataclass(frozen=True)
class Thresholds:
    """A customer's thresholds (`alerts.store.thresholds_for` fills in the defaults of the settings)."""

    budget_percents: tuple[Decimal, ...] = (Decimal(50), Decimal(80), Decimal(100))
    credit_percents: tuple[Decimal, ...] = (Decimal(50), Decimal(80), Decimal(100))
    forecast_overspend: bool = True
    credit_runout_days: int = 7  # 0: no run-out alert

    def to_json(self) -> dict:
        return {"budget_percents": [_number(p) for p in self.budget_percents],
                "credit_percents": [_number(p) for p in self.credit_percents],
                "forecast_overspend": self.forecast_overspend, "credit_runout_days": self.credit_runout_days}


def reached(used: Decimal, limit: Decimal, percent: Decimal) -> bool:
    """`used` is at least `percent`% of `limit`, exactly (no division, so no rounding)."""
    return limit <= 0 or used * HUNDRED >= percent * limit


def percent_used(used: Decimal, limit: Decimal) -> str:
    """The share used, in percent to 0.01 rounded towards zero (49.999% reads 49.99); 100.00 of a zero limit."""
    if limit <= 0:
        return "100.00"
    return str((used * HUNDRED / limit).quantize(Decimal("0.01"), ROUND_DOWN))


@dataclass(frozen=True)
class Level:
    """An amount used against a limit over a period: the month's spend against the budget's cap, the
    billing period's spend to date against the prepaid credit balance."""

    period: str
    limit: Decimal
    used: Decimal
    currency: str | None = None

    def to_json(self) -> dict:
        out = {"limit": amount_text(self.limit), "used": amount_text(self.used),
               "percent_used": percent_used(self.used, self.limit)}
        if self.currency:
            out["currency"] = self.currency
        return out


@dataclass(frozen=True)
class Forecast:
    """The invoice forecast of the customer's billing period: its median and 80% interval."""

    period: str
    median: Decimal
    low: Decimal
    high: Decimal
    currency: str | None = None


@dataclass(frozen=True)
class Crossing:
    customer_id: str
    kind: str
    threshold: str
    period: str
    data: dict = field(default_factory=dict)  # JSON-ready: amounts as decimal strings

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.customer_id, self.kind, self.threshold, self.period)


def crossings(customer_id: str, thresholds: Thresholds, *, now: datetime, budget: Level | None = None,
              credit: Level | None = None, forecast: Forecast | None = None,
              credit_runs_out_at: datetime | None = None) -> list[Crossing]:
    """Every threshold the customer has reached (see the module doc); None: that input does not apply
    (no budget, no prepaid credit, no forecast yet)."""
    out: list[Crossing] = []
    if budget is not None:
        for p in thresholds.budget_percents:
            if reached(budget.used, budget.limit, p):
                out.append(Crossing(customer_id, "budget", _number(p), budget.period,
                                    {**budget.to_json(), "percent": _number(p)}))
    if credit is not None:
        for p in thresholds.credit_percents:
            if reached(credit.used, credit.limit, p):
                out.append(Crossing(customer_id, "credit", _number(p), credit.period,
                                    {**credit.to_json(), "percent": _number(p)}))
    if thresholds.forecast_overspend and budget is not None and forecast is not None and forecast.median > budget.limit:
        out.append(Crossing(customer_id, "forecast_overspend", "p50", forecast.period, {
            "forecast": {"median": amount_text(forecast.median), "low": amount_text(forecast.low),
                         "high": amount_text(forecast.high), "interval": "80%"},
            "budget": amount_text(budget.limit), "budget_month": budget.period,
            **({"currency": forecast.currency} if forecast.currency else {})}))
    days = thresholds.credit_runout_days
    if days > 0 and credit is not None and credit_runs_out_at is not None and credit_runs_out_at <= now + timedelta(days=days):
        out.append(Crossing(customer_id, "credit_runout", f"{days}d", credit.period, {
            "runs_out_at": credit_runs_out_at.isoformat().replace("+00:00", "Z"), "within_days": days,
            **credit.to_json()}))
    return out
