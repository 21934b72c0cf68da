"""Customers at UTC+05:30 (Asia/Kolkata), +05:45 (Asia/Kathmandu) and in America/New_York across a
DST change: every event lands in the period of its customer's local calendar, checked against a
reference computed here from the list of events sent and literal UTC period edges."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing_service.customers import assign_plan, set_customer
from billing_service.invoices import list_invoices, show_invoice
from billing_service.reconcile import reconcile_money
from billing_service.run import billing_run
from pricing_service.books import read_cost_model
from tests.billing_service.conftest import BOOK_YAML, GPU_BOOK_YAML, reference_amounts

COST = read_cost_model(None)
Z = UTC


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=Z)


# Literal period edges in UTC (local midnight on the 1st), written out by hand, not computed by billing.
EDGES = {
    "Asia/Kolkata": {"2026-01": (utc(2025, 12, 31, 18, 30), utc(2026, 1, 31, 18, 30)),
                     "2026-02": (utc(2026, 1, 31, 18, 30), utc(2026, 2, 28, 18, 30)),
                     "2026-03": (utc(2026, 2, 28, 18, 30), utc(2026, 3, 31, 18, 30))},
    "Asia/Kathmandu": {"2026-01": (utc(2025, 12, 31, 18, 15), utc(2026, 1, 31, 18, 15)),
                       "2026-02": (utc(2026, 1, 31, 18, 15), utc(2026, 2, 28, 18, 15)),
                       "2026-03": (utc(2026, 2, 28, 18, 15), utc(2026, 3, 31, 18, 15))},
    # EST (-05:00) until Sunday 2026-03-08 02:00 local, then EDT (-04:00): March is 743 hours long
    "America/New_York": {"2026-01": (utc(2026, 1, 1, 5), utc(2026, 2, 1, 5)),
                         "2026-02": (utc(2026, 2, 1, 5), utc(2026, 3, 1, 5)),
                         "2026-03": (utc(2026, 3, 1, 5), utc(2026, 4, 1, 4))},
}
CUSTOMERS = {"kol": "Asia/Kolkata", "ktm": "Asia/Kathmandu", "ny": "America/New_York"}


def edge_instants(tz: str) -> list[datetime]:
    """Instants just around every period edge, and inside the split hours at the edges."""
    out = []
    for start, _ in EDGES[tz].values():
        for delta in (-timedelta(minutes=31), -timedelta(minutes=1), -timedelta(microseconds=1), timedelta(0),
                      timedelta(seconds=1), timedelta(minutes=14), timedelta(minutes=29, seconds=59)):
            out.append(start + delta)
    end = EDGES[tz]["2026-03"][1]
    out += [end - timedelta(seconds=1), end, end + timedelta(minutes=5)]
    return out


def test_events_land_in_the_period_of_the_customers_local_month(conn, metering):
    t0 = utc(2025, 12, 1)
    for customer, tz in CUSTOMERS.items():
        set_customer(conn, customer, now=t0, timezone=tz)
        assign_plan(conn, customer, BOOK_YAML, "bill-usd.yaml", "2026-01-01", now=t0)
    i = 0
    for customer, tz in CUSTOMERS.items():
        for at in edge_instants(tz):
            i += 1
            metering.request(customer, at, model=("m1", "big")[i % 2], input_tokens=1000 + i * 7919, cached=i * 13,
                             output=100 + i * 31, project=(None, "web", "batch")[i % 3])  # projects change nothing
            if i % 3 == 0:
                metering.usage(customer, "tool_calls", f"{i}.5", at)
            if i % 4 == 0:
                metering.task(customer, f"t{i}", "succeeded", at)
        # the DST night in New York: 2026-03-08 01:59 EST, then 03:00 EDT
        metering.request(customer, utc(2026, 3, 8, 6, 59), input_tokens=5)
        metering.request(customer, utc(2026, 3, 8, 7, 0), input_tokens=6)

    result = billing_run(conn, "2026-03", now=utc(2026, 4, 10), cost_model=COST)
    # the December usage before the plans is reported, not dropped (in 2026-03 there is none)
    assert result.unbilled == []
    assert {(o.customer_id, o.period, o.status) for o in result.invoices} == {
        (c, p, "open") for c in CUSTOMERS for p in ("2026-01", "2026-02", "2026-03")}

    for customer, tz in CUSTOMERS.items():
        invoices = {i["period"]: show_invoice(conn, i["id"]) for i in list_invoices(conn, customer_id=customer)}
        for label, (start, end) in EDGES[tz].items():
            inv = invoices[label]
            assert (inv["period_start"], inv["period_end"]) == (start.isoformat().replace("+00:00", "Z"),
                                                                end.isoformat().replace("+00:00", "Z"))
            got: dict = {}
            for line in inv["lines"]:
                got[(line["meter"], line["group"])] = got.get((line["meter"], line["group"]), 0) + Decimal(line["amount"])
            assert got == reference_amounts(metering.sent, customer, start, end), (customer, label)
    ny_march = EDGES["America/New_York"]["2026-03"]
    assert ny_march[1] - ny_march[0] == timedelta(hours=743)
    for label in ("2026-01", "2026-02", "2026-03"):
        assert reconcile_money(conn, label, cost_model=COST).ok


@pytest.mark.parametrize("interval", [
    (utc(2026, 1, 31, 18, 0), utc(2026, 1, 31, 19, 0)),   # the whole split hour
    (utc(2026, 1, 31, 18, 20), utc(2026, 1, 31, 18, 40)),  # straddles the Kolkata edge at 18:30
    (utc(2026, 1, 31, 18, 40), utc(2026, 1, 31, 18, 50)),  # after the edge, inside the split hour
])
def test_gpu_time_of_a_split_hour_belongs_to_the_period_of_the_hours_start(conn, metering, interval):
    """The edge-hour rule (docs/billing.md): metering splits GPU time at UTC hours; an hour that a
    +05:30 period edge cuts (18:00-19:00 UTC, edge 18:30) goes wholly to the period holding 18:00."""
    set_customer(conn, "kol", now=utc(2025, 12, 1), timezone="Asia/Kolkata")
    assign_plan(conn, "kol", GPU_BOOK_YAML, "bill-gpu.yaml", "2026-01-01", now=utc(2025, 12, 1))
    metering.replica("kol", *interval, gpus=2)
    metering.replica("kol", utc(2026, 1, 31, 19, 0), utc(2026, 1, 31, 19, 30), replica="rep-2")  # February's
    billing_run(conn, "2026-02", now=utc(2026, 3, 5), cost_model=COST)
    gpu = {}
    for summary in list_invoices(conn, customer_id="kol"):
        inv = show_invoice(conn, summary["id"])
        gpu[inv["period"]] = sum((Decimal(x["quantity"]) for x in inv["lines"] if x["meter"] == "gpu_seconds"),
                                 Decimal(0))
    seconds = Decimal((interval[1] - interval[0]).seconds * 2)
    assert gpu == {"2026-01": seconds, "2026-02": Decimal(1800)}
