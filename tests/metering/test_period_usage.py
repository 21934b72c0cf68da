"""The period-usage read (`metering.period_usage`): a label names each customer's own period (its
calendar's, billing's periods; the UTC month without one), and the rows are the period totals, in
customer order, for every customer or one, with the options rating needs."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import psycopg
import pytest

from billing.periods import billing_period
from infermeter.stack.postgres import to_libpq_url
from metering.period_usage import PeriodUsageError, label_periods, period_usages
from tests.metering.period_checks import Events, give_calendar, kept
from tests.metering.test_period_totals import scenario, writer_for

SCHEDULES = {
    "kir": ("Pacific/Kiritimati", 1),  # UTC+14: the 2026-03 period starts on Feb 28 10:00 UTC
    "kol": ("Asia/Kolkata", 31),  # +05:30, anchor 31 (Feb 28, Apr 30)
    "ktm": ("Asia/Kathmandu", 15),  # +05:45
    "nyc": ("America/New_York", 1),  # DST in March
    "w12": ("Etc/GMT+12", 31),  # UTC-12: a period starts at 12:00 UTC of its anchor day
}
LABELS = ["1970-01", "2025-12", *(f"2026-{m:02d}" for m in range(1, 13)), "2100-12"]


@pytest.fixture
def conn(db_url):
    with psycopg.connect(to_libpq_url(db_url)) as c:
        yield c


def test_a_label_names_each_customers_own_period_as_billing_cuts_it(conn):
    for customer, schedule in SCHEDULES.items():
        give_calendar(conn, customer, *schedule)
    give_calendar(conn, "utc-cal", "UTC", 1)
    for label in LABELS:
        periods = label_periods(conn, label)
        for customer, schedule in SCHEDULES.items():
            period = billing_period(label, *schedule)
            assert periods.of(customer) == (period.start, period.end), (label, customer)
            assert label_periods(conn, label, customer).of(customer) == (period.start, period.end)
        utc = billing_period(label, "UTC", 1)
        assert periods.of("utc-cal") == periods.of("never-seen") == (utc.start, utc.end)
    for bad in ("2026-13", "2026-1", "1969-12", "2101-01", None):
        with pytest.raises(PeriodUsageError):
            label_periods(conn, bad)


def _as_kept(usage) -> dict[str, dict]:
    """A PeriodUsage in the shape of `kept` (requests per model x deployment: requests, input, cached,
    output), all-zero rows left out."""
    requests = {}
    for r in usage.requests:
        requests[(r.model, r.deployment_id)] = (r.requests, r.uncached_input_tokens + r.cached_input_tokens,
                                                r.cached_input_tokens, r.output_tokens)
    return {
        "requests": {k: v for k, v in requests.items() if any(v)},
        "usage": {m.meter: (Decimal(m.quantity), m.events) for m in usage.meters},
        "tasks": {"": tuple(usage.tasks)} if usage.tasks and any(usage.tasks) else {},
        "gpu": {(g.deployment_id, g.gpu_type): (g.gpu_ms,) for g in usage.gpu if g.gpu_ms},
    }


def _kept_short(conn, customer, start) -> dict[str, dict]:
    k = kept(conn, customer, start)
    # kept's request counters: REQUEST_COUNTS (requests, ok, error, cancelled, rejected, input, cached, output, ...)
    k["requests"] = {key: (v[0], v[5], v[6], v[7]) for key, v in k["requests"].items()}
    return k


def test_the_rows_are_the_period_totals_in_customer_order(db_url, conn):
    schedules = {"kol": ("Asia/Kolkata", 1), "ktm": ("Asia/Kathmandu", 15), "nyc": ("America/New_York", 1)}
    for customer, schedule in schedules.items():
        give_calendar(conn, customer, *schedule)
    ev = Events("u")
    lines = []
    customers = [*schedules, "plain", "a-plain"]
    for customer in customers:
        first, late = scenario(ev, customer, billing_period("2026-03", *schedules.get(customer, ("UTC", 1))).start)
        lines += first + late
    writer = writer_for(db_url, "period-usage")
    writer.write(ev.messages(lines))
    writer.close()
    for label in ("2026-01", "2026-02", "2026-03", "2026-04"):
        rows = list(period_usages(conn, label, chunk_rows=2, chunks_ahead=1))
        assert [u.customer_id for u in rows] == sorted(u.customer_id for u in rows)
        seen = {u.customer_id: u for u in rows}
        for customer in customers:
            period = billing_period(label, *schedules.get(customer, ("UTC", 1)))
            expected = _kept_short(conn, customer, period.start)
            if not any(expected.values()):
                assert customer not in seen, (label, customer)
                continue
            usage = seen[customer]
            assert (usage.period_start, usage.period_end) == (period.start, period.end)
            assert _as_kept(usage) == expected, (label, customer)
            # one customer, by label and by its period start: the same rows
            assert list(period_usages(conn, label, customer_id=customer)) == [usage]
            assert list(period_usages(conn, customer_id=customer, period_start=period.start)) == [usage]
    # the options: by project, no deployment, chosen meters, nothing but requests
    march = billing_period("2026-03", "Asia/Kolkata", 1)
    (kol,) = period_usages(conn, "2026-03", customer_id="kol", by_deployment=False, by_project=True,
                           usage_meters={"verifier_s"}, tasks=False, gpu=False)
    assert {r.deployment_id for r in kol.requests} == {""}
    assert {r.project for r in kol.requests} == {"", "batch"}
    assert [m.meter for m in kol.meters] == ["verifier_s"] and kol.tasks is None and kol.gpu == ()
    by_project = {p: kept(conn, "kol", march.start, p)["requests"] for p in ("", "batch")}
    for project, expected in by_project.items():
        got = sum(r.output_tokens for r in kol.requests if r.project == project)
        assert got == sum(v[7] for v in expected.values()), project
    only = list(period_usages(conn, "2026-03", usage_meters=(), tasks=False, gpu=False))
    assert all(u.meters == () and u.tasks is None and u.gpu == () for u in only)
    with pytest.raises(PeriodUsageError, match="starts no period"):
        list(period_usages(conn, customer_id="plain", period_start=datetime(2026, 3, 2, tzinfo=UTC)))
    with pytest.raises(PeriodUsageError, match="no period of customer kol"):
        list(period_usages(conn, customer_id="kol", period_start=datetime(2026, 3, 1, tzinfo=UTC)))
