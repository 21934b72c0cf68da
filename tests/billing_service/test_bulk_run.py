"""The bulk billing run (`billing_run` without --customer) and the per-customer path (`bulk=False`)
write the same invoices: two databases get the same usage, customers, plans and credits, one is billed
by each path, step by step through two months, and after every run the billing tables are compared
row by row (ids, lines and positions, amounts, numbers, revisions, history documents, the credit
ledger, the number counters) and so are the run results.

The customers cover what the bulk path must get right: UTC, a DST zone and +05:30 (each customer's
own period, rated from the period totals by `rate_billing_period`), anchor day 7, a book with a minimum and no usage, GPU
time, tasks and usage meters, two credit grants (one expiring mid-period), late usage inside the grace
window (refresh) and after finalization (adjustments on the next draft), a void and its reissue,
usage without a customer record or without a plan (unbilled), and reruns that change nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import psycopg
import pytest

from billing.credits import grant_entry
from billing_service.credits import grant_credits
from billing_service.customers import assign_plan, set_customer
from billing_service.invoices import void_invoice
from billing_service.run import billing_run, first_invoice_outcome
from billing_service.store import PgCreditLedger
from billing_service.usage import period_usage
from infermeter.stack.postgres import to_libpq_url
from pricing_service.books import read_cost_model
from tests.billing_service.conftest import BOOK_YAML, GPU_BOOK_YAML, Metering
from tests.conftest import new_database

COST = read_cost_model(None)
MIN_BOOK_YAML = BOOK_YAML.replace("id: bill-usd", "id: bill-min") + 'minimum: "25.00"\n'
T0 = datetime(2026, 1, 20, tzinfo=UTC)

TABLES = {
    "billing_invoices": "SELECT * FROM billing_invoices ORDER BY id",
    "billing_invoice_lines": "SELECT * FROM billing_invoice_lines ORDER BY invoice_id, position",
    "billing_invoice_lines_replaced": "SELECT * FROM billing_invoice_lines_replaced ORDER BY invoice_id, revision, "
                                      "position",
    "billing_invoice_history": "SELECT invoice_id, revision, recorded_at, change, status, document "
                               "FROM billing_invoice_history ORDER BY invoice_id, revision",
    "billing_credit_ledger": "SELECT * FROM billing_credit_ledger ORDER BY id",
    "billing_number_counters": "SELECT * FROM billing_number_counters ORDER BY prefix, year",
}


def at(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


class Twins:
    """Two databases that get the same writes; `run` bills A per customer and B in bulk (`quick`: the
    customers whose invoices B's run made by its quick path, `first_invoice_outcome`)."""

    def __init__(self, url_a: str, url_b: str):
        self.urls = (url_a, url_b)
        self.quick: list[str] = []
        self.conns = [psycopg.connect(to_libpq_url(u), autocommit=True) for u in self.urls]
        for c in self.conns:
            c.execute("SET TIME ZONE 'UTC'")
        self.meterings = [Metering(u) for u in self.urls]

    def close(self) -> None:
        for m in self.meterings:
            m.close()
        for c in self.conns:
            c.close()

    def both(self, fn, *args, **kw) -> list:
        return [fn(c, *args, **kw) for c in self.conns]

    def event(self, kind: str, *args, **kw) -> None:
        for m in self.meterings:
            getattr(m, kind)(*args, **kw)

    def grant(self, customer: str, amount: str, now: datetime, expires: str | None = None) -> None:
        grant = grant_credits(self.conns[0], customer, amount, now=now, expires=expires)
        ledger = PgCreditLedger(self.conns[1])  # the same grant (its id is random) in B
        ledger.add_grant(grant)
        ledger.append([grant_entry(grant)], now)

    def run(self, period: str, now: datetime) -> dict:
        a = billing_run(self.conns[0], period, now=now, cost_model=COST, bulk=False)
        read_alone: list[str] = []  # customers whose usage the bulk run read on their own

        def read_usage(conn, customer_id, *args, **kw):
            read_alone.append(customer_id)
            return period_usage(conn, customer_id, *args, **kw)

        def quick_path(conn, customer, *args, **kw):
            outcome = first_invoice_outcome(conn, customer, *args, **kw)
            if outcome is not None:
                self.quick.append(customer.customer_id)
            return outcome

        b = billing_run(self.conns[1], period, now=now, cost_model=COST, read_usage=read_usage, quick_path=quick_path)
        # rate_billing_period rated every customer's period up front, +05:30 included
        assert read_alone == []
        assert b.to_json() == a.to_json()
        self.assert_same()
        return b.to_json()

    def tables(self, i: int) -> dict[str, list[tuple]]:
        return {name: self.conns[i].execute(sql).fetchall() for name, sql in TABLES.items()}

    def assert_same(self) -> None:
        a, b = self.tables(0), self.tables(1)
        for name in TABLES:
            assert b[name] == a[name], name


@pytest.fixture
def twins(pg_server_url):
    t = Twins(new_database(pg_server_url), new_database(pg_server_url))
    yield t
    t.close()


def test_bulk_and_per_customer_runs_write_the_same_invoices(twins):
    t = twins
    for cid, kw in [("a-utc", {}), ("b-ny", {"timezone": "America/New_York", "anchor_day": 7}),
                    ("c-kolkata", {"timezone": "Asia/Kolkata"}), ("d-credit", {}), ("e-min", {}), ("f-gpu", {}),
                    ("g-noplan", {})]:
        t.both(set_customer, cid, now=T0, **kw)
    for cid, book in [("a-utc", BOOK_YAML), ("b-ny", BOOK_YAML), ("c-kolkata", BOOK_YAML), ("d-credit", BOOK_YAML),
                      ("e-min", MIN_BOOK_YAML), ("f-gpu", GPU_BOOK_YAML)]:
        t.both(assign_plan, cid, book, f"{cid}.yaml", "2026-02-01", now=T0)
    t.grant("d-credit", "3.00", T0, expires="2026-02-15")  # expires mid-period: unused
    t.grant("d-credit", "0.50", T0)

    # February (and the first days of March: b-ny's period runs to March 7, local)
    for cid in ("a-utc", "b-ny", "c-kolkata", "d-credit", "g-noplan", "unknown-co"):
        t.event("request", cid, at(2026, 2, 3, 10, 15), input_tokens=1_234_567, cached=200_000, output=54_321)
        t.event("request", cid, at(2026, 2, 14, 23, 59, 59), model="big", input_tokens=10_000, output=77_777,
                task_id=f"{cid}-t1")
        t.event("task", cid, f"{cid}-t1", "succeeded", at(2026, 2, 15, 0, 0, 1))
        t.event("usage", cid, "tool_calls", "7", at(2026, 2, 20, 8))
    t.event("request", "c-kolkata", at(2026, 1, 31, 18, 45), output=1000)  # 00:15 Feb 1 in Kolkata: February
    t.event("request", "c-kolkata", at(2026, 2, 28, 18, 15), output=1000)  # 23:45 Feb 28 local
    t.event("request", "b-ny", at(2026, 3, 7, 4, 59), output=5000)  # 23:59 Mar 6 EST: still February's period
    t.event("request", "f-gpu", at(2026, 2, 10, 10), output=4000, input_tokens=100)
    t.event("replica", "f-gpu", at(2026, 2, 10, 9), at(2026, 2, 10, 12))

    mid = t.run("2026-02", at(2026, 2, 21))
    assert {i["action"] for i in mid["invoices"]} == {"created"}
    assert {u["customer_id"] for u in mid["unbilled"]} == {"g-noplan", "unknown-co"}

    t.event("request", "a-utc", at(2026, 2, 28, 23, 50), input_tokens=333, output=33)  # late, inside the grace window
    t.event("request", "c-kolkata", at(2026, 2, 28, 18, 20), output=77)
    grace = t.run("2026-02", at(2026, 3, 1, 12))
    assert {i["customer_id"] for i in grace["invoices"] if i["action"] == "refreshed"} == {"a-utc", "c-kolkata"}
    assert t.run("2026-02", at(2026, 3, 1, 13))["invoices"] == [
        {**i, "action": "unchanged"} for i in grace["invoices"]]

    final = t.run("2026-02", at(2026, 3, 8, 6))  # past every February period + 24 h
    assert {i["status"] for i in final["invoices"]} == {"open"}
    numbers = [i["number"] for i in final["invoices"]]
    assert numbers == [f"INV-2026-{n:06d}" for n in range(1, 7)]
    credit = next(i for i in final["invoices"] if i["customer_id"] == "d-credit")
    assert Decimal(credit["credits_applied"]) == Decimal("0.50")
    assert Decimal(next(i for i in final["invoices"] if i["customer_id"] == "e-min")["total"]) == Decimal("25.00")
    before = t.tables(1)
    assert t.run("2026-02", at(2026, 3, 8, 7))["invoices"] == []  # all finalized: a rerun touches nothing
    assert t.tables(1) == before

    # usage of February after finalization (adjustments on March's draft), and March's own usage
    t.event("request", "a-utc", at(2026, 2, 27, 12), input_tokens=50_000, output=5_000)
    t.event("request", "c-kolkata", at(2026, 2, 27, 12), input_tokens=50_000, output=5_000)
    for cid in ("a-utc", "b-ny", "c-kolkata", "d-credit"):
        t.event("request", cid, at(2026, 3, 12, 9), input_tokens=400_000, output=40_000)
    march = t.run("2026-03", at(2026, 3, 20))
    adjusted = {i["customer_id"] for i in march["invoices"]}
    assert {"a-utc", "c-kolkata"} <= adjusted
    closed = t.run("2026-03", at(2026, 4, 9))
    assert all(i["status"] == "open" for i in closed["invoices"])

    # a void March invoice: its reissue is refreshed and finalized by the next run, on both paths
    ids = [i["id"] for i in closed["invoices"] if i["customer_id"] == "a-utc"]
    for conn in t.conns:
        void_invoice(conn, ids[0], now=at(2026, 4, 10))
    t.assert_same()
    again = t.run("2026-03", at(2026, 4, 11))
    assert [i["action"] for i in again["invoices"] if i["customer_id"] == "a-utc"] == ["finalized"]
    before = t.tables(1)
    t.run("2026-03", at(2026, 4, 12))
    assert t.tables(1) == before


def test_first_invoices_made_straight_from_the_rating_equal_the_domains(twins):
    """Customers billed for the first time after the grace window: the bulk run makes most invoices by
    its quick path (`first_invoice_outcome`: `first_invoice` + `finalize_first`, rows straight from the
    rating) and the rest through `_run_customer`; the per-customer path builds every one through the
    domain's `Invoice`. The tables and results are the same; then a refresh and next month through both."""
    t = twins
    quick = t.quick
    for cid, kw in [("a-utc", {}), ("b-ny", {"timezone": "America/New_York", "anchor_day": 7}),
                    ("c-kolkata", {"timezone": "Asia/Kolkata"}), ("d-credit", {}), ("e-min", {}), ("f-idle", {}),
                    ("h-jan", {})]:
        t.both(set_customer, cid, now=T0, **kw)
    for cid, book, day in [("a-utc", BOOK_YAML, "2026-02-01"), ("b-ny", BOOK_YAML, "2026-02-01"),
                           ("c-kolkata", BOOK_YAML, "2026-02-01"), ("d-credit", BOOK_YAML, "2026-02-01"),
                           ("e-min", MIN_BOOK_YAML, "2026-02-01"), ("f-idle", BOOK_YAML, "2026-02-01"),
                           ("h-jan", BOOK_YAML, "2026-01-01")]:
        t.both(assign_plan, cid, book, f"{cid}.yaml", day, now=T0)
    t.grant("d-credit", "0.50", T0)
    for cid in ("a-utc", "b-ny", "c-kolkata", "d-credit", "h-jan"):
        t.event("request", cid, at(2026, 2, 3, 10, 15), input_tokens=1_234_567, cached=200_000, output=54_321)
        t.event("request", cid, at(2026, 2, 14, 23, 59, 59), model="big", input_tokens=10_000, output=77_777)
    final = t.run("2026-02", at(2026, 3, 9))
    # kolkata too (its +05:30 period rated from the totals up front); not: credit; two periods; nothing to bill
    assert sorted(quick) == ["a-utc", "b-ny", "c-kolkata", "e-min"]
    assert [i["action"] for i in final["invoices"]] == ["finalized"] * 6
    assert [i["number"] for i in final["invoices"]] == [f"INV-2026-{n:06d}" for n in range(1, 7)]
    # no usage and no minimum: no invoice for f-idle's February nor h-jan's January
    assert final["nothing_to_bill"] == [{"customer_id": "f-idle", "period": "2026-02"},
                                        {"customer_id": "h-jan", "period": "2026-01"}]
    assert Decimal(next(i for i in final["invoices"] if i["customer_id"] == "e-min")["total"]) == Decimal("25.00")
    quick.clear()
    assert t.run("2026-02", at(2026, 3, 10))["invoices"] == [] and quick == []

    # drafts made by the quick path, refreshed by the usual one; late usage of February as adjustments
    t.event("request", "a-utc", at(2026, 3, 2), input_tokens=5_000, output=50)
    t.event("request", "a-utc", at(2026, 2, 20), input_tokens=7_000, output=70)
    first = t.run("2026-03", at(2026, 3, 5))
    assert {i["action"] for i in first["invoices"]} == {"created"}
    assert "a-utc" not in quick  # it has invoices: adjustments of February go on its March draft
    t.event("request", "e-min", at(2026, 3, 3), input_tokens=9_000, output=90)
    refreshed = t.run("2026-03", at(2026, 3, 6))
    assert [i["customer_id"] for i in refreshed["invoices"] if i["action"] == "refreshed"] == ["e-min"]
    t.run("2026-03", at(2026, 4, 9))


def test_concurrent_bulk_and_per_customer_runs_number_without_gaps_or_duplicates(db_url, metering):
    """Two bulk runs (small batches, so they interleave) and a per-customer run of the same month at once:
    every customer's invoice is finalized exactly once, the numbers are 1..N without a gap or a duplicate."""
    import threading

    customers = [f"cust-{i:02d}" for i in range(12)]
    with psycopg.connect(to_libpq_url(db_url), autocommit=True) as conn:
        for cid in customers:
            set_customer(conn, cid, now=T0)
            assign_plan(conn, cid, BOOK_YAML, "bill-usd.yaml", "2026-02-01", now=T0)
            metering.request(cid, at(2026, 2, 3, 10), input_tokens=10_000 + len(cid), output=1_000)
    after_grace = at(2026, 3, 2, 1)
    finalized: list[str] = []
    errors: list[BaseException] = []

    def bill(bulk: bool, only: str | None = None) -> None:
        try:
            with psycopg.connect(to_libpq_url(db_url), autocommit=True) as conn:
                conn.execute("SET TIME ZONE 'UTC'")
                result = billing_run(conn, "2026-02", now=after_grace, cost_model=COST, bulk=bulk, customer_id=only,
                                     batch_size=3)
                finalized.extend(o.customer_id for o in result.invoices if o.action == "finalized")
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=bill, args=(True,)), threading.Thread(target=bill, args=(True,)),
               threading.Thread(target=bill, args=(False,)), threading.Thread(target=bill, args=(False, "cust-07"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(finalized) == customers  # each finalized by exactly one of the runs
    with psycopg.connect(to_libpq_url(db_url), autocommit=True) as conn:
        rows = conn.execute("SELECT customer_id, status, number FROM billing_invoices ORDER BY number").fetchall()
        assert [r[0] for r in sorted(rows)] == customers and {r[1] for r in rows} == {"open"}
        assert [r[2] for r in rows] == [f"INV-2026-{n:06d}" for n in range(1, len(customers) + 1)]
        assert conn.execute("SELECT last_seq FROM billing_number_counters").fetchall() == [(len(customers),)]
        assert conn.execute("SELECT count(*) FROM billing_invoice_history").fetchone() == (2 * len(customers),)



def test_model_names_and_book_ids_with_tabs_backslashes_and_newlines_are_written_as_they_are(twins):
    """The bulk run writes lines, invoices and history rows in COPY's text format by hand: a model name
    (any string up to 256 characters in the event contract) and a price book id (any string) with the
    characters that format escapes come back unchanged, on a first invoice (the quick path) and on a
    new draft with adjustment lines (the general one); `twins.run` compares every table with the
    per-customer path's."""
    odd = ["tab\there", "back\\slash\\N", "new\nline\r\n", "\\.", "émoji ✓"]
    book = BOOK_YAML.replace("id: bill-usd", 'id: "odd\\tbook\\\\N é"')
    twins.both(set_customer, "odd", now=T0)
    twins.both(assign_plan, "odd", book, "odd.yaml", "2026-02-01", now=T0)
    for i, model in enumerate(odd):
        twins.event("request", "odd", at(2026, 2, 3, 10 + i), model=model, input_tokens=1000 + i, output=10)
    twins.run("2026-02", at(2026, 3, 2, 1))  # finalized straight away: the quick path
    twins.event("request", "odd", at(2026, 2, 20), model=odd[0], input_tokens=5, output=5)  # late: an adjustment
    twins.event("request", "odd", at(2026, 3, 4), model=odd[1], input_tokens=7, output=7)
    twins.run("2026-03", at(2026, 3, 10))  # March's draft, with February's adjustment lines
    for conn in twins.conns:
        groups = {r[0] for r in conn.execute("SELECT grp FROM billing_invoice_lines WHERE grp <> ''")}
        assert groups == set(odd)
        versions = {r[0] for r in conn.execute("SELECT document->>'price_book_version' FROM billing_invoice_history")}
        assert {v.split("@")[0] for v in versions} == {"odd\tbook\\N é"}
        assert conn.execute("SELECT DISTINCT price_book_version FROM billing_invoices").fetchall() == [(versions.pop(),)]
        assert conn.execute("SELECT count(DISTINCT period) FROM billing_invoice_lines WHERE invoice_id IN "
                            "(SELECT id FROM billing_invoices WHERE period = '2026-03')").fetchone() == (2,)
