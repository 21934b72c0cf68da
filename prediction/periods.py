"""Per period: each customer's spend at the end of its billing period (the invoice forecast, with an
80% interval), when its prepaid credit or its budget runs out, and the platform's revenue, cost and
margin under each price book.

How (docs/prediction.md, "Per period"): the rest of a period is made of days drawn, with
replacement, from the days already metered (24 hours each, the period's last one partial), by the
day bootstrap of `pricing.bootstrap.day_draws` (the price recommendation draws its periods with it
too): weekdays from the observed weekdays and weekend days from the observed weekend days when each
kind has enough days, else from all of them. Each draw first resamples the observed days themselves
(a two-stage bootstrap): a fortnight of days estimates the customer's daily rate with an error of
its own, and drawing straight from the observed days would leave that error out (intervals too
narrow: 66% of the demo month's customer-periods inside the 80% interval, 76% with it). Draws with
the same seed and period end are shared by customers and by the platform's cost, so their sums keep
the days' common swings. A customer's usage at the period's end in a draw is its usage to date plus
the drawn days' usage (a partial day in proportion); rating it with the customer's book
(`pricing.rating`: free allowances, tiers and minimum as the invoice applies them) gives the spend
of that draw. The forecast is the draws' mean, with their p10 and p90 as the 80% interval.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from prediction.distribution import Distribution
from pricing.book import PriceBook
from pricing.bootstrap import is_weekend
from pricing.money import Currency
from pricing.rating import line_quantities, rounded_total
from pricing.usage import Usage, UsageKey

DAY = timedelta(days=1)
ZERO = Decimal(0)
Quantities = Mapping[UsageKey, Decimal | int]


def observed_days(start: datetime, as_of: datetime) -> list[tuple[datetime, datetime]]:
    """The whole days [start + k days, start + (k + 1) days) that ended by `as_of`."""
    days = []
    t = start
    while t + DAY <= as_of:
        days.append((t, t + DAY))
        t += DAY
    return days


def remaining_slots(as_of: datetime, end: datetime) -> list[tuple[bool, Decimal]]:
    """The rest of [as_of, end) as (weekend?, fraction of a day) slots of at most a day each."""
    slots = []
    t = as_of
    while t < end:
        nxt = min(end, t + DAY)
        slots.append((is_weekend(t), Decimal(round((nxt - t) / DAY, 6)).quantize(Decimal("0.000001"))))
        t = nxt
    return slots


def _grown(to_date: Quantities, daily: Sequence[Quantities], draw: Sequence[tuple[int, Decimal]]) -> dict:
    total: dict[UsageKey, Decimal | int] = dict(to_date)
    for index, fraction in draw:
        for key, q in daily[index].items():
            total[key] = total.get(key, 0) + (q if fraction == 1 else q * fraction)
    return total


def spend_of(book: PriceBook, customer_id: str, quantities: Quantities, start: datetime, end: datetime) -> Decimal:
    """What the invoice would total for these quantities: the rating's lines, minimum and book credits."""
    usage = Usage.trusted(customer_id, start, end, {k: v for k, v in quantities.items() if v})
    return rounded_total(book, line_quantities(book, usage), commitments=True)


@dataclass(frozen=True)
class SpendForecast:
    """A customer's spend at the end of its period [period_start, period_end), forecast as of `as_of`."""

    customer_id: str
    period: str
    period_start: datetime
    period_end: datetime
    as_of: datetime
    currency: str
    book_id: str
    spend_to_date: Decimal
    spend: Distribution | None  # None: no observed day to draw from
    days_observed: int

    @property
    def remaining_days(self) -> Decimal:
        return Decimal(round((self.period_end - self.as_of) / DAY, 6))

    def daily_rate(self, at: str = "p50") -> Decimal:
        """Spend per day over the rest of the period (at the forecast's median, or p10 / p90)."""
        if self.spend is None or self.remaining_days <= 0:
            return ZERO
        return max(ZERO, (getattr(self.spend, at) - self.spend_to_date) / self.remaining_days)


def forecast_spend(book: PriceBook, customer_id: str, period: str, period_start: datetime, period_end: datetime,
                   as_of: datetime, to_date: Quantities, daily: Sequence[Quantities],
                   draws: Sequence[Sequence[tuple[int, Decimal]]]) -> SpendForecast:
    """The customer's forecast: `to_date` is its usage of [period_start, as_of), `daily` its usage of
    each observed day (the days `draws` index)."""
    money = Currency.of(book.currency)
    spent = spend_of(book, customer_id, to_date, period_start, period_end)
    spend = None
    if draws and as_of < period_end:
        spend = Distribution.of([spend_of(book, customer_id, _grown(to_date, daily, d), period_start, period_end)
                                 for d in draws])
        spend = Distribution(money.round(spend.mean), spend.p10, spend.p50, spend.p90)
    elif as_of >= period_end:
        spend = Distribution(spent, spent, spent, spent)
    return SpendForecast(customer_id, period, period_start, period_end, as_of, book.currency, book.id, spent, spend,
                         len(daily))


@dataclass(frozen=True)
class RunOut:
    """When an amount available runs out at the forecast's daily rate: `at` at the median rate,
    `earliest` at the p90 rate, `latest` at the p10 rate (None: not at that rate, ever)."""

    available: Decimal
    used: Decimal
    at: datetime | None
    earliest: datetime | None
    latest: datetime | None

    def to_json(self, currency: str) -> dict:
        money = Currency.of(currency)
        iso = lambda t: None if t is None else t.isoformat().replace("+00:00", "Z")  # noqa: E731
        return {"available": str(money.round(self.available)), "used": str(money.round(self.used)),
                "runs_out_at": iso(self.at), "earliest": iso(self.earliest), "latest": iso(self.latest)}


def runs_out(forecast: SpendForecast, available: Decimal, used: Decimal) -> RunOut:
    """When `available` is used up, having used `used` by `forecast.as_of`, at the forecast's rates."""
    def when(rate: Decimal) -> datetime | None:
        left = available - used
        if left <= 0:
            return forecast.as_of
        if rate <= 0:
            return None
        return forecast.as_of + timedelta(days=float(left / rate))

    return RunOut(available, used, when(forecast.daily_rate("p50")), when(forecast.daily_rate("p90")),
                  when(forecast.daily_rate("p10")))


def _rounded(money: Currency, d: Distribution) -> Distribution:
    return Distribution(money.round(d.mean), money.round(d.p10), money.round(d.p50), money.round(d.p90))


@dataclass(frozen=True)
class PlatformForecast:
    """The platform's month under one book: revenue (every customer on it), cost and margin."""

    book_id: str
    currency: str
    revenue_to_date: Decimal
    cost_to_date: Decimal
    revenue: Distribution
    cost: Distribution
    margin: Distribution


def forecast_platform(books: Sequence[PriceBook], start: datetime, end: datetime,
                      to_date: Mapping[str, Quantities], daily: Sequence[Mapping[str, Quantities]],
                      cost_to_date: Decimal, daily_cost: Sequence[Decimal],
                      draws: Sequence[Sequence[tuple[int, Decimal]]]) -> list[PlatformForecast]:
    """Per book, the month [start, end): `to_date` and `daily` are every customer's usage to date and
    per observed day, `cost_to_date` and `daily_cost` the platform's cost (the cost model's)."""
    customers = sorted(set(to_date).union(*(d.keys() for d in daily)))
    empty: dict = {}
    costs = [cost_to_date + sum((daily_cost[i] * f for i, f in d), ZERO) for d in draws] or [cost_to_date]
    out = []
    for book in books:
        money = Currency.of(book.currency)
        revenue_to_date = sum((spend_of(book, c, to_date.get(c, empty), start, end) for c in customers), ZERO)
        revenues = []
        for d in draws:
            revenues.append(sum((spend_of(book, c, _grown(to_date.get(c, empty), [x.get(c, empty) for x in daily], d),
                                          start, end) for c in customers), ZERO))
        revenues = revenues or [revenue_to_date]
        margins = [r - c for r, c in zip(revenues, costs, strict=True)]
        out.append(PlatformForecast(book.id, book.currency, revenue_to_date, money.round(cost_to_date),
                                    _rounded(money, Distribution.of(revenues)), _rounded(money, Distribution.of(costs)),
                                    _rounded(money, Distribution.of(margins))))
    return out
