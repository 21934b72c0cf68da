"""One read path for billing periods: the invoice preview and the per-customer draft read a customer's
billing period from the period totals metering keeps at ingest, as the bulk run does
(`billing_service.usage.period_usage` with a `Period` metering's calendar knows); a `Window` (the
forecast's period to date, shadow rating's windows) is read from the hourly rollups.

Shown by taking the hourly rollups and the task outcomes away after ingest: the preview, the draft and
the reconciliation still give every line (checked against a reference computed here from the events
sent), while a read of the same window as a `Window` loses what the rollups held. At the edge: a
customer at +05:30 with events a microsecond before and at its period start."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from billing.periods import billing_period
from billing_service.customers import assign_plan, set_customer
from billing_service.invoices import list_invoices, preview_invoice, show_invoice
from billing_service.reconcile import reconcile_money
from billing_service.run import billing_run
from billing_service.usage import kept_in_totals, period_usage
from pricing_service.books import read_cost_model
from tests.billing_service.conftest import BOOK_YAML, reference_amounts

COST = read_cost_model(None)
US = timedelta(microseconds=1)


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


# Asia/Kolkata (+05:30): local midnight on the 1st is 18:30 UTC the day before
FEB = (utc(2026, 1, 31, 18, 30), utc(2026, 2, 28, 18, 30))
MAR = (utc(2026, 2, 28, 18, 30), utc(2026, 3, 31, 18, 30))
AFTER = utc(2026, 4, 10)


def kolkata_customer(conn, customer: str) -> None:
    set_customer(conn, customer, now=utc(2025, 12, 1), timezone="Asia/Kolkata")
    assign_plan(conn, customer, BOOK_YAML, "bill-usd.yaml", "2026-01-01", now=utc(2025, 12, 1))


def forget_the_hours(conn, customer: str) -> None:
    """Only the period totals (and the raw events) of the customer remain: its hourly rollups and task
    outcomes are gone."""
    for table in ("request_rollup_hourly", "usage_rollup_hourly", "task_outcomes"):
        conn.execute(f"DELETE FROM {table} WHERE customer_id = %s", (customer,))


def amounts(lines: list[dict]) -> dict[tuple[str, str], Decimal]:
    out: dict[tuple[str, str], Decimal] = {}
    for line in lines:
        key = (line["meter"], line["group"])
        out[key] = out.get(key, Decimal(0)) + Decimal(line["amount"])
    return out


def preview_lines(conn, customer: str, label: str) -> list[dict]:
    shown = preview_invoice(conn, customer, label, now=AFTER, cost_model=COST)
    assert shown["status"] == "draft"
    return shown["lines"]


def test_the_preview_and_the_per_customer_draft_read_the_period_totals(conn, metering):
    kolkata_customer(conn, "kol")
    start, end = FEB
    for i, at in enumerate([start, start + timedelta(minutes=10), start + timedelta(hours=1, minutes=5),
                            utc(2026, 2, 10, 9), utc(2026, 2, 10, 9, 59), end - timedelta(minutes=20), end - US]):
        metering.request("kol", at, model=("m1", "big")[i % 2], input_tokens=10_000 + 977 * i, cached=31 * i,
                         output=2_000 + 101 * i, project=("web", None)[i % 2])
    metering.usage("kol", "tool_calls", "12.5", utc(2026, 2, 3, 7))
    metering.usage("kol", "tool_calls", "3", start + timedelta(minutes=1))
    metering.task("kol", "t1", "succeeded", utc(2026, 2, 4, 12, 0, 0, 5))
    metering.task("kol", "t2", "succeeded", end - US)
    metering.request("kol", end, input_tokens=999)  # March's

    before = preview_lines(conn, "kol", "2026-02")
    expected = reference_amounts(metering.sent, "kol", start, end)
    assert amounts(before) == expected
    assert {m for m, _ in expected} >= {"output_tokens", "successful_tasks", "usage:tool_calls"}
    period = billing_period("2026-02", "Asia/Kolkata", 1)
    assert (period.start, period.end) == FEB and kept_in_totals(conn, "kol", period) == period
    by_window = period_usage(conn, "kol", period.window, cost_model=COST)
    assert by_window == period_usage(conn, "kol", period, cost_model=COST)  # the same usage either way

    forget_the_hours(conn, "kol")
    assert preview_lines(conn, "kol", "2026-02") == before
    assert period_usage(conn, "kol", period, cost_model=COST) == by_window
    without = period_usage(conn, "kol", period.window, cost_model=COST)  # the hourly path: only the edge hours
    assert without != by_window
    assert without.quantities.get(next(k for k in by_window.quantities if k.meter == "successful_tasks")) is None

    # the per-customer path of the run (its own transaction and reads per customer) and the reconciliation
    billing_run(conn, "2026-02", now=AFTER, cost_model=COST, bulk=False)
    [feb] = [show_invoice(conn, i["id"]) for i in list_invoices(conn, customer_id="kol", period="2026-02")]
    assert feb["status"] == "open"
    assert amounts(feb["lines"]) == expected
    assert feb["lines"] == before
    assert reconcile_money(conn, "2026-02", cost_model=COST).ok


def test_a_microsecond_before_and_at_a_plus_0530_period_start(conn, metering):
    kolkata_customer(conn, "edge")
    for at, n in ((MAR[0] - US, 1), (MAR[0], 2)):
        metering.request("edge", at, input_tokens=1_000_000 * n, cached=1_000 * n, output=100_000 * n)
        metering.request("edge", at, model="big", input_tokens=7 * n, output=50_000 * n)
        metering.usage("edge", "tool_calls", f"{n}00", at)
        metering.task("edge", f"t{n}", "succeeded", at)
    shown = {label: preview_lines(conn, "edge", label) for label in ("2026-02", "2026-03")}
    for label, (start, end), n in (("2026-02", FEB, 1), ("2026-03", MAR, 2)):
        expected = reference_amounts(metering.sent, "edge", start, end)
        # each period holds exactly its own side of the edge
        assert (expected[("output_tokens", "m1")], expected[("usage:tool_calls", "")],
                expected[("successful_tasks", "")]) == (Decimal("0.80") * n, Decimal("0.30") * n, Decimal("0.05")), label
        assert amounts(shown[label]) == expected, label

    forget_the_hours(conn, "edge")
    for label in ("2026-02", "2026-03"):
        assert preview_lines(conn, "edge", label) == shown[label], label
    billing_run(conn, "2026-03", now=AFTER, cost_model=COST, bulk=False)
    invoices = {i["period"]: show_invoice(conn, i["id"]) for i in list_invoices(conn, customer_id="edge")}
    assert {label: invoices[label]["lines"] for label in ("2026-02", "2026-03")} == shown


def test_any_other_window_is_read_from_the_hourly_rollups(conn, metering):
    kolkata_customer(conn, "kol")
    metering.request("kol", utc(2026, 2, 1, 0, 10), output=300)  # the UTC month's and the Kolkata period's
    utc_month = billing_period("2026-02", "UTC", 1)  # not the customer's calendar
    assert kept_in_totals(conn, "kol", utc_month) is None
    assert kept_in_totals(conn, "kol", utc_month.window) is None
    assert kept_in_totals(conn, "nobody", billing_period("2026-02", "Asia/Kolkata", 1)) is None  # UTC months
    assert kept_in_totals(conn, "nobody", utc_month) == utc_month
    forget_the_hours(conn, "kol")
    assert period_usage(conn, "kol", utc_month).quantities == {}  # its whole hours were in the rollups
    assert period_usage(conn, "kol", billing_period("2026-02", "Asia/Kolkata", 1)).quantities  # the totals
