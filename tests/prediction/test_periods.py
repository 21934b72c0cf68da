"""Per period: the day grid, the draws, the spend forecast and when an amount runs out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from prediction.periods import (
    forecast_platform,
    forecast_spend,
    observed_days,
    remaining_slots,
    runs_out,
)
from pricing.book import parse_price_book
from pricing.bootstrap import day_draws
from pricing.usage import UsageKey

START, END = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)  # Nov 1 is a Sunday
BOOK = parse_price_book("""
id: p
currency: USD
charges:
  - meter: output_tokens
    price: {type: unit, amount: "10.00", per: 1000000}
""")
OUT = UsageKey("output_tokens", "m")


def test_days_and_slots():
    assert observed_days(START, START + timedelta(days=2, hours=5)) == [
        (START, START + timedelta(days=1)), (START + timedelta(days=1), START + timedelta(days=2))]
    slots = remaining_slots(START + timedelta(days=29, hours=12), END)
    assert slots == [(False, Decimal("0.5"))]
    assert len(remaining_slots(START, END)) == 30 and remaining_slots(END, END) == []


def test_draws_keep_weekends_apart_once_each_kind_has_two_days():
    days = [START + timedelta(days=k) for k in range(14)]  # 4 weekend days, 10 weekdays
    slots = remaining_slots(START + timedelta(days=14), END)
    for draw in day_draws(days, slots, draws=50):
        for (index, _), (weekend, _) in zip(draw, slots, strict=True):
            assert (days[index].weekday() >= 5) == weekend
    assert day_draws([], slots) == []
    assert day_draws(days, slots, draws=5) == day_draws(days, slots, draws=5)  # seeded


def test_a_steady_customer_is_forecast_exactly():
    as_of = START + timedelta(days=14)
    days = [START + timedelta(days=k) for k in range(14)]
    daily = [{OUT: 1_000_000}] * 14
    draws = day_draws(days, remaining_slots(as_of, END))
    f = forecast_spend(BOOK, "c", "2026-11", START, END, as_of, {OUT: 14_000_000}, daily, draws)
    assert f.spend_to_date == Decimal("140.00")
    assert f.spend.p10 == f.spend.p50 == f.spend.p90 == f.spend.mean == Decimal("300.00")
    assert f.daily_rate() == Decimal("10")
    credit = runs_out(f, Decimal("200"), f.spend_to_date)
    assert credit.at == as_of + timedelta(days=6) == credit.earliest == credit.latest
    assert runs_out(f, Decimal("100"), f.spend_to_date).at == as_of  # already used up
    idle = forecast_spend(BOOK, "c", "2026-11", START, END, as_of, {}, [{}] * 14, draws)
    assert runs_out(idle, Decimal("1"), Decimal(0)).at is None


def test_a_bursty_customer_gets_a_wide_interval_and_the_platform_sums_customers():
    as_of = START + timedelta(days=14)
    days = [START + timedelta(days=k) for k in range(14)]
    daily = [{OUT: 10_000_000} if k % 7 == 3 else {} for k in range(14)]
    draws = day_draws(days, remaining_slots(as_of, END))
    f = forecast_spend(BOOK, "c", "2026-11", START, END, as_of, {OUT: 20_000_000}, daily, draws)
    assert f.spend.p10 < f.spend.p50 < f.spend.p90 and f.spend.p10 >= Decimal("200.00")
    [p] = forecast_platform([BOOK], START, END, {"c": {OUT: 20_000_000}, "d": {OUT: 14_000_000}},
                            [{"c": d, "d": {OUT: 1_000_000}} for d in daily], Decimal("100"), [Decimal("5")] * 14, draws)
    assert p.revenue_to_date == Decimal("340.00") and p.cost_to_date == Decimal("100.00")
    assert p.cost.mean == Decimal("180.00")  # 16 days at 5 a day
    assert p.revenue.p10 == f.spend.p10 + Decimal("300.00")  # d: 140 to date + 16 days at 10
    assert p.margin.mean == p.revenue.mean - p.cost.mean
