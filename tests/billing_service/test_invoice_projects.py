"""Invoice lines by project on the real database: a month with two projects and requests without one,
billed under a book with `invoice: {group_by: project}`. The per-customer path (`period_usage` over
metering's queries) and the bulk path (`rate_period` over `metering.period_reads`) write the same
invoices, row by row; the project lines add up to the ungrouped invoice to the cent; a customer on a
book without the option gets the lines it always got; late usage after finalization lands as
adjustments per project line; the exports, `invoices show` and the API carry the project."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from decimal import Decimal

import pyarrow.parquet as pq
import pytest

from billing_service.customers import assign_plan, set_customer
from billing_service.exports import export
from billing_service.invoices import show_invoice
from billing_service.reconcile import reconcile_money
from billing_service.run import billing_run
from billing_service.usage import period_usage
from pricing.book import parse_price_book
from pricing.rating import rate
from tests.billing_service.conftest import BOOK_YAML, auth, cost_model
from tests.billing_service.test_bulk_run import COST, Twins
from tests.conftest import new_database

T0 = datetime(2026, 1, 20, tzinfo=UTC)
D = Decimal
UNGROUPED_YAML = """\
id: bill-projects
currency: USD
charges:
  - meter: uncached_input_tokens
    price: {type: unit, amount: "2.00", per: 1000000}
  - meter: cached_input_tokens
    free: 100
    price: {type: tiered_graduated, per: 1000000, tiers: [{up_to: 1000000, amount: "1.00"}, {up_to: null, amount: "0.50"}]}
  - meter: output_tokens
    price: {type: unit, amount: "8.00", per: 1000000}
  - meter: output_tokens
    model: big
    price: {type: unit, amount: "24.00", per: 1000000}
  - meter: requests
    price: {type: flat, amount: "5.00"}
  - meter: "usage:tool_calls"
    price: {type: unit, amount: "0.003", per: 1}
"""
GROUPED_YAML = UNGROUPED_YAML + "invoice:\n  group_by: project\n"
REQUEST_METERS = ("uncached_input_tokens", "cached_input_tokens", "output_tokens")


def at(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


@pytest.fixture
def twins(pg_server_url):
    t = Twins(new_database(pg_server_url), new_database(pg_server_url))
    yield t
    t.close()


def february(both, event) -> None:
    """acme on the grouped book, plain on bill-usd (not grouped), the same usage: web, batch and none.
    `both(fn, *args)` runs a billing call on the database(s), `event(kind, *args)` writes usage."""
    for cid, book, name in [("acme", GROUPED_YAML, "grouped.yaml"), ("plain", BOOK_YAML, "bill-usd.yaml")]:
        both(set_customer, cid, now=T0)
        both(assign_plan, cid, book, name, "2026-02-01", now=T0)
        event("request", cid, at(2026, 2, 3, 10), input_tokens=1_234_567, cached=0, output=1, project="web")
        event("request", cid, at(2026, 2, 4, 11, 30), input_tokens=765_433, cached=0, output=1, project="batch")
        event("request", cid, at(2026, 2, 5, 12), input_tokens=1, output=1_001)  # a key without a project
        event("request", cid, at(2026, 2, 6, 13), input_tokens=2_100_000, cached=2_000_000, output=5, project="web")
        event("request", cid, at(2026, 2, 7, 14), model="big", input_tokens=433_433, cached=333_333, output=77_777,
              project="batch")
        event("request", cid, at(2026, 2, 8, 15), model="big", output=3)
        event("usage", cid, "tool_calls", "40", at(2026, 2, 11))


def lines_of(conn, customer: str, period: str) -> list[dict]:
    [row] = conn.execute("SELECT id FROM billing_invoices WHERE customer_id = %s AND period = %s AND status <> 'void'",
                         (customer, period)).fetchall()
    return show_invoice(conn, row[0])["lines"]


def stored_lines(conn, customer: str) -> list[tuple]:
    return conn.execute(
        "SELECT l.id, l.rated_line_id, l.charge_key, l.grp, l.project, l.quantity, l.precise_amount, l.amount, l.period "
        "FROM billing_invoice_lines l JOIN billing_invoices i ON i.id = l.invoice_id "
        "WHERE i.customer_id = %s ORDER BY i.period_start, i.sequence, l.position", (customer,)).fetchall()


def test_both_billing_paths_split_lines_by_project_and_the_projects_add_up_to_the_ungrouped_invoice(twins):
    t = twins
    february(t.both, t.event)
    t.run("2026-02", at(2026, 2, 21))  # drafts; both paths, the tables compared row by row
    t.event("request", "acme", at(2026, 2, 22, 8), input_tokens=50, output=5, project="web")
    final = t.run("2026-02", at(2026, 3, 2, 1))  # the draft refreshed (its lines replaced), then finalized
    replaced = t.conns[0].execute("SELECT DISTINCT project FROM billing_invoice_lines_replaced l JOIN billing_invoices i "
                                  "ON i.id = l.invoice_id WHERE i.customer_id = 'acme'").fetchall()
    assert {p for (p,) in replaced} == {"web", "batch", ""}  # the replaced lines keep their projects (0021)
    assert {i["status"] for i in final["invoices"]} == {"open"}
    conn = t.conns[0]

    # the ungrouped rating of the same usage (per-customer read, summed over projects)
    period = next(i for i in final["invoices"] if i["customer_id"] == "acme")
    start, end = at(2026, 2, 1), at(2026, 3, 1)
    whole = rate(parse_price_book(UNGROUPED_YAML), period_usage(conn, "acme", _window(start, end)))
    grouped = stored_lines(conn, "acme")
    assert D(period["total"]) == whole.total == sum((r[7] for r in grouped), D(0))
    for line in whole.lines:
        parts = [r for r in grouped if (r[2], r[3]) == (line.charge_key, line.group)]
        assert sum((r[7] for r in parts), D(0)) == line.amount, line.charge_key
        assert sum((r[6] for r in parts), D(0)) == line.precise_amount, line.charge_key
        assert sum((r[5] for r in parts), D(0)) == line.quantity, line.charge_key
        if line.meter in REQUEST_METERS:
            assert parts and all(r[0] == r[1] != line.line_id for r in parts)  # one line per project
        else:  # flat requests, usage meters: one line, no project, the ungrouped line's id
            assert [(r[0], r[4]) for r in parts] == [(line.line_id, "")]
    projects = {(r[2], r[3]): {p[4]: p[7] for p in grouped if (p[2], p[3]) == (r[2], r[3])} for r in grouped}
    # 4.200102 of uncached input on m1 over 1,334,617 (web) + 765,433 (batch) + 1 (none): 266.91 / 153.08 / 0.0002
    # cents; the cent left over to web (the largest remainder): 2.67 / 1.53 / 0.00
    uncached_m1 = {r[4]: (r[5], r[7]) for r in grouped if (r[2], r[3]) == ("uncached_input_tokens", "m1")}
    assert uncached_m1 == {"web": (D(1_334_617), D("2.67")), "batch": (D(765_433), D("1.53")), "": (D(1), D("0.00"))}
    assert set(projects[("output_tokens;model=big", "big")]) == {"batch", ""}
    assert len({r[0] for r in grouped}) == len(grouped)

    # plain's book is not grouped: its lines are the rating of its usage without projects, as before 0021
    plain = rate(parse_price_book(BOOK_YAML), period_usage(conn, "plain", _window(start, end)))
    assert [(r[0], r[4], r[7]) for r in stored_lines(conn, "plain")] == [(x.line_id, "", x.amount) for x in plain.lines]
    assert all(line["project"] is None for line in lines_of(conn, "plain", "2026-02"))
    assert {line["project"] for line in lines_of(conn, "acme", "2026-02")} == {"web", "batch", None}

    # February usage after finalization: adjustments on March's draft, per project line, on both paths
    t.event("request", "acme", at(2026, 2, 27, 12), input_tokens=500_000, output=5_000, project="web")
    t.event("request", "acme", at(2026, 2, 27, 13), input_tokens=10, project="mobile")
    t.event("request", "acme", at(2026, 3, 3, 9), input_tokens=400_000, output=40_000, project="batch")
    march = t.run("2026-03", at(2026, 3, 20))
    assert any(i["customer_id"] == "acme" for i in march["invoices"])
    adjustments = [line for line in lines_of(conn, "acme", "2026-03") if line["adjustment"]]
    # the new projects' lines, and any line whose share moved (the flat requests line: 2 requests more, 0.00)
    assert {"web", "mobile"} <= {line["project"] for line in adjustments}
    assert {line["project"] for line in adjustments} <= {"web", "mobile", "batch", None}
    again = rate(parse_price_book(UNGROUPED_YAML), period_usage(conn, "acme", _window(start, end)))
    feb_lines = [r for r in stored_lines(conn, "acme") if r[8] == "2026-02"]
    assert sum((r[7] for r in feb_lines), D(0)) == again.total  # invoiced + adjustments = the rating now
    for c in t.conns:  # money reconcile reads per project too: every project line matches its rating
        report = reconcile_money(c, "2026-02", cost_model=COST)
        assert report.differences == [] and {x["customer_id"] for x in report.checked} == {"acme", "plain"}


def _window(start: datetime, end: datetime):
    from infermeter.times import Window

    return Window(start, end)


def test_exports_invoices_show_and_the_api_carry_the_project(conn, metering, cli, api):
    february(lambda fn, *args, **kw: fn(conn, *args, **kw), lambda kind, *args, **kw: getattr(metering, kind)(*args, **kw))
    billing_run(conn, "2026-02", now=at(2026, 3, 2, 1), cost_model=cost_model())

    rows = list(csv.DictReader(io.StringIO(export(conn, "lines", "2026-02", "csv").decode())))
    assert list(rows[0])[-1] == "project"
    acme = [r for r in rows if r["customer_id"] == "acme"]
    assert {r["project"] for r in acme if r["meter"] in REQUEST_METERS} == {"web", "batch", ""}
    assert {r["project"] for r in acme if r["meter"] not in REQUEST_METERS} == {""}
    assert {r["project"] for r in rows if r["customer_id"] == "plain"} == {""}
    assert sum((D(r["amount"]) for r in acme), D(0)) == sum(
        (D(line["amount"]) for line in lines_of(conn, "acme", "2026-02")), D(0))
    table = pq.read_table(io.BytesIO(export(conn, "lines", "2026-02", "parquet"))).to_pylist()
    assert {r["project"] for r in table if r["customer_id"] == "acme"} == {"web", "batch", None}

    usage = list(csv.DictReader(io.StringIO(export(conn, "usage", "2026-02", "csv").decode())))
    assert list(usage[0])[-1] == "project"
    requests = {(r["model"], r["project"]): D(r["quantity"]) for r in usage
                if r["customer_id"] == "acme" and r["meter"] == "requests"}
    assert requests == {("m1", "web"): 2, ("m1", "batch"): 1, ("m1", ""): 1, ("big", "batch"): 1, ("big", ""): 1}
    assert {r["project"] for r in usage if r["meter"].startswith("usage:")} == {""}
    parquet_usage = pq.read_table(io.BytesIO(export(conn, "usage", "2026-02", "parquet"))).to_pylist()
    assert {r["project"] for r in parquet_usage if r["customer_id"] == "acme"} == {"web", "batch", None}

    [invoice_id] = [r[0] for r in conn.execute("SELECT id FROM billing_invoices WHERE customer_id = 'acme'")]
    [plain_id] = [r[0] for r in conn.execute("SELECT id FROM billing_invoices WHERE customer_id = 'plain'")]
    shown = cli("invoices", "show", invoice_id)
    assert shown.code == 0, shown.err
    header = next(line for line in shown.out.splitlines() if "meter" in line)
    assert "project" in header and "web" in shown.out and "batch" in shown.out
    plain_shown = cli("invoices", "show", plain_id)
    assert "project" not in next(line for line in plain_shown.out.splitlines() if "meter" in line)
    as_json = cli("invoices", "show", invoice_id, "--json").json()
    assert {line["project"] for line in as_json["lines"]} == {"web", "batch", None}

    client, keys = api
    got = client.get(f"/v1/billing/invoices/{invoice_id}", headers=auth(keys["admin"]))
    assert got.status_code == 200, got.text
    assert {line["project"] for line in got.json()["lines"]} == {"web", "batch", None}
