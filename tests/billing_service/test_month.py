"""A whole month walked through on a frozen clock: usage, late usage inside the grace window,
finalization, late usage after it (an adjustment on the next invoice), the next month's run."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from billing_service.customers import assign_plan, set_customer
from billing_service.invoices import list_invoices, show_invoice
from billing_service.reconcile import reconcile_money
from billing_service.run import billing_run
from pricing_service.books import read_cost_model
from tests.billing_service.conftest import BOOK_YAML, reference_amounts, reference_total

COST = read_cost_model(None)
FEB = (datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC))
MAR = (datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC))


def run(conn, period, now, **kw):
    return billing_run(conn, period, now=now, cost_model=COST, **kw)


def snapshot(conn):
    return [
        conn.execute("SELECT id, status, number, subtotal, credits_applied, total, revision, updated_at "
                     "FROM billing_invoices ORDER BY id").fetchall(),
        conn.execute("SELECT invoice_id, id, quantity, amount FROM billing_invoice_lines ORDER BY 1, 2").fetchall(),
        conn.execute("SELECT count(*) FROM billing_invoice_history").fetchone(),
        conn.execute("SELECT count(*) FROM billing_credit_ledger").fetchone(),
    ]


def test_a_month_walked_through(conn, metering):
    t0 = datetime(2026, 1, 20, tzinfo=UTC)
    set_customer(conn, "acme", now=t0, name="Acme", email="billing@acme.test")
    assign_plan(conn, "acme", BOOK_YAML, "bill-usd.yaml", "2026-02-01", now=t0)

    metering.request("acme", datetime(2026, 2, 3, 10, 15, tzinfo=UTC), input_tokens=1_234_567, cached=200_000,
                     output=54_321, project="search")  # a key's project: the invoice does not change
    metering.request("acme", datetime(2026, 2, 14, 23, 59, 59, tzinfo=UTC), model="big", input_tokens=10_000,
                     output=77_777, task_id="t1")
    metering.task("acme", "t1", "succeeded", datetime(2026, 2, 15, 0, 0, 1, tzinfo=UTC))
    metering.usage("acme", "tool_calls", "7", datetime(2026, 2, 20, 8, tzinfo=UTC))
    metering.request("acme", datetime(2026, 1, 31, 23, 59, 59, tzinfo=UTC))  # January: before the plan

    # mid-month: a draft, period to date
    mid = run(conn, "2026-02", datetime(2026, 2, 21, tzinfo=UTC))
    [draft] = mid.invoices
    assert (draft.status, draft.action, draft.number) == ("draft", "created", None)
    assert draft.total == reference_total(metering.sent, "acme", *FEB)
    assert mid.unbilled == []  # January is not this period

    # the last minutes of February arrive after midnight; the run inside the grace window picks them up
    metering.request("acme", datetime(2026, 2, 28, 23, 50, tzinfo=UTC), input_tokens=333, output=33, project="search")
    again = run(conn, "2026-02", datetime(2026, 3, 1, 0, 30, tzinfo=UTC))
    assert [(o.invoice_id, o.action, o.status) for o in again.invoices] == [
        (draft.invoice_id, "refreshed", "draft")]
    assert again.invoices[0].total == reference_total(metering.sent, "acme", *FEB)

    # past the grace window (24 h): finalized, numbered
    final = run(conn, "2026-02", datetime(2026, 3, 2, 0, 0, 1, tzinfo=UTC))
    [feb] = final.invoices
    assert (feb.invoice_id, feb.status, feb.action, feb.number) == (draft.invoice_id, "open", "finalized",
                                                                    "INV-2026-000001")
    feb_total = reference_total(metering.sent, "acme", *FEB)
    assert feb.total == feb_total
    before = snapshot(conn)
    assert run(conn, "2026-02", datetime(2026, 3, 3, tzinfo=UTC)).invoices == []  # nothing left to do
    assert snapshot(conn) == before

    # March usage, and February usage that arrives after February was finalized
    metering.request("acme", datetime(2026, 3, 2, 12, tzinfo=UTC), input_tokens=500_000, output=40_000)
    metering.request("acme", datetime(2026, 2, 27, 9, tzinfo=UTC), input_tokens=2_000_000, output=1_000)
    metering.usage("acme", "tool_calls", "2.5", datetime(2026, 2, 27, 9, tzinfo=UTC))
    march = run(conn, "2026-03", datetime(2026, 3, 10, tzinfo=UTC))
    [mar] = march.invoices
    shown = show_invoice(conn, mar.invoice_id)
    adjustments = [line for line in shown["lines"] if line["period"] == "2026-02"]
    assert adjustments and all(line["adjustment"] for line in adjustments)
    late = reference_total(metering.sent, "acme", *FEB) - feb_total
    assert sum(Decimal(line["amount"]) for line in adjustments) == late
    assert mar.total == reference_total(metering.sent, "acme", *MAR) + late

    # a rerun with no new usage changes nothing: same ids, same lines, no new history
    before = snapshot(conn)
    rerun = run(conn, "2026-03", datetime(2026, 3, 11, tzinfo=UTC))
    assert [(o.invoice_id, o.action) for o in rerun.invoices] == [(mar.invoice_id, "unchanged")]
    assert snapshot(conn) == before

    # the February invoice never changed
    assert show_invoice(conn, feb.invoice_id)["total"] == str(feb_total)

    # the next month's run finalizes March with the adjustment on it
    done = run(conn, "2026-03", datetime(2026, 4, 2, 1, tzinfo=UTC))
    [mar_final] = done.invoices
    assert (mar_final.status, mar_final.number) == ("open", "INV-2026-000002")

    # every period: the sum of its lines over all invoices = its rating, exactly (reference from the events)
    invoices = [show_invoice(conn, i["id"]) for i in list_invoices(conn, customer_id="acme")]
    for label, window in (("2026-02", FEB), ("2026-03", MAR)):
        lines = [line for inv in invoices for line in inv["lines"] if line["period"] == label]
        assert sum(Decimal(line["amount"]) for line in lines) == reference_total(metering.sent, "acme", *window)
        by_line: dict = {}
        for line in lines:
            key = (line["meter"], line["group"])
            by_line[key] = by_line.get(key, Decimal(0)) + Decimal(line["amount"])
        assert by_line == reference_amounts(metering.sent, "acme", *window)
    assert sum(Decimal(i["total"]) for i in invoices) == sum(
        reference_total(metering.sent, "acme", *w) for w in (FEB, MAR))
    for label in ("2026-02", "2026-03"):
        report = reconcile_money(conn, label, cost_model=COST)
        assert report.ok, report.to_json()
