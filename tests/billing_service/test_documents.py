"""Void and reissue, credit notes, preview (CLI and the customer's own key), unbilled usage,
reconcile, and the history that reproduces what was known at a moment."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from billing_service.customers import assign_plan
from billing_service.invoices import list_invoices, show_invoice
from billing_service.reconcile import reconcile_money
from billing_service.run import billing_run
from tests.billing_service.conftest import (
    AFTER_GRACE,
    BOOK_YAML,
    FEB_START,
    MAR_START,
    auth,
    cost_model,
    reference_total,
)


def test_void_and_reissue(conn, metering, february, cli):
    voided = cli("invoices", "void", february.invoice_id, "--json", now=datetime(2026, 3, 5, tzinfo=UTC))
    assert voided.code == 0, voided.err
    payload = voided.json()
    assert payload["voided"]["status"] == "void" and payload["voided"]["number"] == "INV-2026-000001"
    reissue = payload["reissue"]
    assert (reissue["status"], reissue["period"], reissue["total"]) == ("draft", "2026-02", payload["voided"]["total"])
    assert cli("invoices", "void", february.invoice_id).code == 2  # void is terminal
    metering.request("acme", datetime(2026, 2, 25, tzinfo=UTC), input_tokens=500_000)  # arrives meanwhile
    run = cli("billing", "run", "--period", "2026-02", "--json", now=datetime(2026, 3, 6, tzinfo=UTC))
    [o] = run.json()["invoices"]
    assert (o["id"], o["status"], o["number"]) == (reissue["id"], "open", "INV-2026-000002")
    assert Decimal(o["total"]) == reference_total(metering.sent, "acme", FEB_START, MAR_START)
    assert show_invoice(conn, reissue["id"])["reissue_of"] == february.invoice_id
    listed = cli("invoices", "list", "--customer", "acme", "--json").json()["invoices"]
    assert [(i["number"], i["status"]) for i in listed] == [("INV-2026-000001", "void"), ("INV-2026-000002", "open")]
    assert set(listed[0]) == {"id", "number", "customer_id", "period", "status", "currency", "subtotal",
                              "credits_applied", "total"}
    assert reconcile_money(conn, "2026-02", cost_model=cost_model()).ok


def test_credit_notes_whole_and_by_line(conn, february, cli):
    lines = show_invoice(conn, february.invoice_id)["lines"]
    one = cli("invoices", "credit-note", february.invoice_id, "--line", lines[0]["id"], "--reason", "wrong model",
              "--json")
    assert one.code == 0, one.err
    assert one.json()["number"] == "CN-2026-000001"
    assert one.json()["total"] == lines[0]["amount"]
    again = cli("invoices", "credit-note", february.invoice_id, "--line", lines[0]["id"], "--reason", "twice")
    assert again.code == 2 and "nothing left to credit" in again.err
    rest = cli("invoices", "credit-note", "INV-2026-000001", "--reason", "goodwill", "--json")  # by number
    assert rest.code == 0, rest.err
    assert Decimal(rest.json()["total"]) == february.total - Decimal(lines[0]["amount"])
    assert rest.json()["number"] == "CN-2026-000002"
    shown = cli("invoices", "show", february.invoice_id, "--json").json()
    assert [n["number"] for n in shown["credit_notes"]] == ["CN-2026-000001", "CN-2026-000002"]
    assert shown["status"] == "open" and Decimal(shown["total"]) == february.total
    draft_month = billing_run(conn, "2026-03", now=datetime(2026, 3, 10, tzinfo=UTC), cost_model=cost_model())
    [draft] = draft_month.invoices
    refused = cli("invoices", "credit-note", draft.invoice_id, "--reason", "x")
    assert refused.code == 2 and "needs a finalized" in refused.err


def test_preview_period_to_date_in_the_cli_and_for_the_customers_own_key(conn, metering, february, cli, api):
    metering.request("acme", datetime(2026, 3, 4, tzinfo=UTC), input_tokens=3_000_000, cached=1_000_000, output=7)
    shown = cli("invoice", "preview", "--customer", "acme", "--period", "2026-03", "--json",
                now=datetime(2026, 3, 5, tzinfo=UTC))
    assert shown.code == 0, shown.err
    p = shown.json()
    assert {"customer_id", "currency", "period_start", "period_end", "lines", "subtotal", "credits_applied",
            "total"} <= set(p)
    assert (p["period_start"], p["period_end"], p["currency"]) == ("2026-03-01T00:00:00Z", "2026-04-01T00:00:00Z", "USD")
    assert {"id", "meter", "model", "quantity", "unit_price", "amount", "period"} <= set(p["lines"][0])
    by = {(x["meter"], x["model"]): x for x in p["lines"]}
    assert by[("uncached_input_tokens", "m1")]["quantity"] == "2000000"
    assert by[("uncached_input_tokens", "m1")]["unit_price"] == "0.000002"
    assert by[("uncached_input_tokens", "m1")]["amount"] == "4.00"
    assert p["total"] == str(reference_total(metering.sent, "acme", MAR_START, datetime(2026, 4, 1, tzinfo=UTC)))
    assert conn.execute("SELECT count(*) FROM billing_invoices WHERE period = '2026-03'").fetchone() == (0,)
    client, keys = api
    own = client.get("/v1/invoices/preview", params={"period": "2026-03"}, headers=auth(keys["acme"]))
    assert own.status_code == 200, own.text
    assert own.json()["total"] == p["total"]
    other = client.get("/v1/invoices/preview", params={"period": "2026-03", "customer_id": "acme"},
                       headers=auth(keys["other"]))
    assert other.status_code == 404
    admin = client.get("/v1/invoices/preview", params={"period": "2026-03", "customer_id": "acme"},
                       headers=auth(keys["admin"]))
    assert admin.json()["total"] == p["total"]
    assert client.get(f"/v1/billing/invoices/{february.invoice_id}", headers=auth(keys["other"])).status_code == 404
    assert client.get(f"/v1/billing/invoices/{february.invoice_id}", headers=auth(keys["acme"])).status_code == 200
    mine = client.get("/v1/billing/invoices", headers=auth(keys["other"])).json()["invoices"]
    assert mine == []


def test_unbilled_usage_is_listed_and_fails_the_run(conn, metering, february, cli):
    metering.request("ghost", datetime(2026, 2, 10, tzinfo=UTC), input_tokens=10)
    cli("customers", "set", "noplan", "--timezone", "Europe/Berlin")
    metering.request("noplan", datetime(2026, 2, 10, tzinfo=UTC), output=5)
    failed = cli("billing", "run", "--period", "2026-02", "--json")
    assert failed.code == 1
    unbilled = {u["customer_id"]: u for u in failed.json()["unbilled"]}
    assert set(unbilled) == {"ghost", "noplan"}
    assert unbilled["ghost"]["quantities"]["uncached_input_tokens/m1"] == "10"
    assert "no customer record" in unbilled["ghost"]["reason"] and "no plan" in unbilled["noplan"]["reason"]
    assert "unbilled usage: ghost 2026-02" in failed.err
    assert cli("billing", "run", "--period", "2026-02", "--allow-unbilled").code == 0


def test_reconcile_finds_late_usage_until_a_run_puts_it_on_an_invoice(conn, metering, february, cli):
    ok = cli("billing", "reconcile", "--period", "2026-02")
    assert ok.code == 0 and "reconcile ok" in ok.out, ok.out + ok.err
    metering.request("acme", datetime(2026, 2, 27, tzinfo=UTC), input_tokens=1_000_000, output=0)
    late = cli("billing", "reconcile", "--period", "2026-02", "--json")
    assert late.code == 1
    assert [d["what"] for d in late.json()["differences"]] == ["quantity uncached_input_tokens/m1",
                                                                "amount uncached_input_tokens/m1"]
    cli("billing", "run", "--period", "2026-03", now=datetime(2026, 3, 10, tzinfo=UTC))
    assert cli("billing", "reconcile", "--period", "2026-02").code == 0


def test_history_reproduces_what_was_known(conn, metering, cli):
    cli("customers", "set", "acme", now=datetime(2026, 1, 1, tzinfo=UTC))
    assign_plan(conn, "acme", BOOK_YAML, "b.yaml", "2026-02-01", now=datetime(2026, 1, 1, tzinfo=UTC))
    metering.request("acme", datetime(2026, 2, 3, tzinfo=UTC), input_tokens=1_000_000)
    cli("billing", "run", "--period", "2026-02", now=datetime(2026, 2, 10, tzinfo=UTC))
    metering.request("acme", datetime(2026, 2, 20, tzinfo=UTC), input_tokens=1_000_000)
    cli("billing", "run", "--period", "2026-02", now=datetime(2026, 2, 21, tzinfo=UTC))
    cli("billing", "run", "--period", "2026-02", now=AFTER_GRACE)
    [inv] = list_invoices(conn, customer_id="acme")
    at = {t: cli("invoices", "show", inv["id"], "--as-of", t).json() for t in
          ("2026-02-15T00:00:00Z", "2026-02-22T00:00:00Z", "2026-03-03T00:00:00Z")}
    assert [(d["status"], d["total"]) for d in at.values()] == [
        ("draft", "2.00"), ("draft", "4.00"), ("open", "4.00")]
    assert at["2026-03-03T00:00:00Z"]["number"] == "INV-2026-000001"
    early = cli("invoices", "show", inv["id"], "--as-of", "2026-02-01T00:00:00Z")
    assert early.code == 2 and "did not exist yet" in early.err
    history = cli("invoices", "show", inv["id"], "--json").json()["history"]
    assert [(h["revision"], h["change"], h["status"]) for h in history] == [
        (1, "created", "draft"), (2, "refreshed", "draft"), (3, "finalized", "open")]


def test_a_plan_change_inside_a_period_applies_from_the_next_one(conn, metering, february, cli, tmp_path):
    dearer = tmp_path / "dearer.yaml"
    dearer.write_text(BOOK_YAML.replace("id: bill-usd", "id: bill-usd-2").replace('amount: "2.00"', 'amount: "3.00"'))
    changed = cli("plans", "assign", "--customer", "acme", "--price-book", str(dearer), "--from", "2026-03-15", "--json",
                  now=datetime(2026, 3, 10, tzinfo=UTC))
    assert changed.code == 0, changed.err
    assert (changed.json()["effective_period"], changed.json()["effective_at"]) == ("2026-04", "2026-04-01T00:00:00Z")
    same = cli("plans", "assign", "--customer", "acme", "--price-book", str(dearer), "--from", "2026-03-15", "--json")
    assert same.json()["created"] is False  # idempotent
    metering.request("acme", datetime(2026, 3, 20, tzinfo=UTC), input_tokens=1_000_000, output=0)
    metering.request("acme", datetime(2026, 4, 2, tzinfo=UTC), input_tokens=1_000_000, output=0)
    billing_run(conn, "2026-04", now=datetime(2026, 4, 10, tzinfo=UTC), cost_model=cost_model())
    books = {i["period"]: show_invoice(conn, i["id"]) for i in list_invoices(conn, customer_id="acme")}
    assert books["2026-03"]["price_book_version"].startswith("bill-usd@sha256:")
    assert books["2026-03"]["total"] == "2.00"
    assert books["2026-04"]["price_book_version"].startswith("bill-usd-2@sha256:")
    assert books["2026-04"]["total"] == "3.00"
    plans = cli("plans", "list", "--customer", "acme", "--json").json()["plans"]
    assert [(p["price_book"], p["effective_period"]) for p in plans] == [("bill-usd", "2026-02"), ("bill-usd-2", "2026-04")]
