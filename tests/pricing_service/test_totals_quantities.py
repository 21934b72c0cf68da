"""A customer's period totals as rating's quantities (`pricing_service.rate_period.totals_quantities`),
the one conversion the bulk run (`rate_billing_period`) and the per-customer path
(`billing_service.usage.period_usage`) share. Pure: no database."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from metering.period_usage import GpuTotal, MeterTotal, PeriodUsage, RequestTotals, TaskTotals
from pricing.usage import UsageKey
from pricing_service.rate_period import totals_quantities

START, END = datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC)
TOTALS = PeriodUsage(
    "acme", START, END,
    requests=(RequestTotals("m1", "d1", "", 3, 100, 20, 50), RequestTotals("m1", "d1", "web", 1, 7, 0, 9)),
    meters=(MeterTotal("pages", Decimal("2.5"), 2),),
    tasks=TaskTotals(succeeded=2, failed=1, abandoned=4, succeeded_attempts=3, failed_attempts=2),
    gpu=(GpuTotal("d1", "H100", 3_600_000),),
)


def test_every_meter_of_the_totals_becomes_its_usage_key():
    assert totals_quantities(TOTALS) == {
        UsageKey("requests", "m1", "d1"): 3,
        UsageKey("uncached_input_tokens", "m1", "d1"): 100,
        UsageKey("cached_input_tokens", "m1", "d1"): 20,
        UsageKey("output_tokens", "m1", "d1"): 50,
        UsageKey("requests", "m1", "d1", "", "web"): 1,
        UsageKey("uncached_input_tokens", "m1", "d1", "", "web"): 7,
        UsageKey("cached_input_tokens", "m1", "d1", "", "web"): 0,
        UsageKey("output_tokens", "m1", "d1", "", "web"): 9,
        UsageKey("usage:pages"): Decimal("2.5"),
        UsageKey("successful_tasks"): 2,
        UsageKey("failed_tasks"): 1,
        UsageKey("task_attempts"): 5,  # the succeeded and failed tasks' attempts; abandoned ones' are not billed
    }  # GPU time is attributed per deployment-hour, not taken from the dedicated totals


def test_only_the_request_meters_asked_for_and_no_tasks_when_not_read():
    keys: dict = {}
    got = totals_quantities(PeriodUsage("acme", START, END, requests=TOTALS.requests[:1]), ["output_tokens"], keys)
    assert got == {UsageKey("output_tokens", "m1", "d1"): 50}
    assert totals_quantities(PeriodUsage("acme", START, END, requests=TOTALS.requests[:1]), ["output_tokens"],
                             keys) == got  # the cached keys give the same
