"""A finalized invoice cannot be changed through any path: a rerun, late usage, a plan change, the
CLI, the API, the store, or SQL straight at the tables (the database's triggers refuse)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal

import psycopg
import pytest

from billing.errors import InvoiceImmutable
from billing_service.customers import assign_plan
from billing_service.invoices import show_invoice
from billing_service.run import billing_run
from billing_service.store import PgInvoiceStore
from tests.billing_service.conftest import BOOK_YAML, EUR_BOOK_YAML, auth, cost_model, table_counts


def frozen(conn, invoice_id):
    shown = show_invoice(conn, invoice_id)
    return {k: shown[k] for k in ("id", "number", "status", "subtotal", "credits_applied", "total", "lines",
                                  "price_book_version", "period_start", "period_end")}


def test_rerun_late_usage_and_plan_change_leave_it_alone(conn, metering, february, tmp_path):
    before = frozen(conn, february.invoice_id)
    history = conn.execute("SELECT count(*) FROM billing_invoice_history WHERE invoice_id = %s",
                           (february.invoice_id,)).fetchone()
    assert billing_run(conn, "2026-02", now=datetime(2026, 3, 9, tzinfo=UTC), cost_model=cost_model()).invoices == []
    metering.request("acme", datetime(2026, 2, 20, tzinfo=UTC), input_tokens=999_999)  # late February usage
    billing_run(conn, "2026-02", now=datetime(2026, 3, 9, tzinfo=UTC), cost_model=cost_model())
    billing_run(conn, "2026-03", now=datetime(2026, 3, 9, tzinfo=UTC), cost_model=cost_model())
    counts = table_counts(conn)
    other_book = BOOK_YAML.replace('amount: "2.00"', 'amount: "3.00"')
    for day in ("2026-01-15", "2026-02-01", "2026-01-31"):  # each would be February's plan
        with pytest.raises(ValueError, match="cannot reach a finalized period"):
            assign_plan(conn, "acme", other_book, "dearer.yaml", day, now=datetime(2026, 3, 9, tzinfo=UTC))
    assert table_counts(conn) == counts
    assert frozen(conn, february.invoice_id) == before
    assert conn.execute("SELECT count(*) FROM billing_invoice_history WHERE invoice_id = %s",
                        (february.invoice_id,)).fetchone() == history
    # a plan for January only (February keeps its own) is allowed, back-dated: it bills January, not February
    with pytest.raises(ValueError, match="first plan is in force from period 2026-02"):
        assign_plan(conn, "acme", other_book, "dearer.yaml", "2026-01-01", now=datetime(2026, 3, 9, tzinfo=UTC))
    assert table_counts(conn) == counts
    assert assign_plan(conn, "acme", other_book, "dearer.yaml", "2026-01-01", now=datetime(2026, 3, 9, tzinfo=UTC),
                       backdate=True).effective.label == "2026-01"
    # a change from inside February takes effect at the next boundary (March), which is allowed
    result = assign_plan(conn, "acme", other_book, "dearer.yaml", "2026-02-20", now=datetime(2026, 3, 9, tzinfo=UTC))
    assert result.effective.label == "2026-03"
    assert frozen(conn, february.invoice_id) == before


def test_the_store_and_sql_refuse(conn, february):
    store = PgInvoiceStore(conn)
    stored = store.get(february.invoice_id)
    changed = replace(stored.invoice, lines=stored.invoice.lines[:1], subtotal=stored.invoice.lines[0].amount,
                      total=stored.invoice.lines[0].amount)
    with pytest.raises(InvoiceImmutable):
        with conn.transaction():
            store.save(changed, book_sha256=stored.book_sha256, now=datetime(2026, 3, 9, tzinfo=UTC), previous=stored)
    for sql in (
        "UPDATE billing_invoice_lines SET amount = amount + 1 WHERE invoice_id = %s",
        "DELETE FROM billing_invoice_lines WHERE invoice_id = %s",
        "UPDATE billing_invoices SET total = total + 1 WHERE id = %s",
        "UPDATE billing_invoices SET number = 'INV-2026-000099' WHERE id = %s",
        "DELETE FROM billing_invoices WHERE id = %s",
        "UPDATE billing_invoice_history SET status = 'draft' WHERE invoice_id = %s",
        "DELETE FROM billing_invoice_history WHERE invoice_id = %s",
    ):
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(sql, (february.invoice_id,))
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("INSERT INTO billing_invoice_lines SELECT invoice_id, id || 'x', position + 100, rated_line_id, kind, "
                     "charge_key, meter, grp, quantity, unit_price, precise_amount, amount, period, "
                     "service_period_start, service_period_end FROM billing_invoice_lines WHERE invoice_id = %s",
                     (february.invoice_id,))
    assert Decimal(show_invoice(conn, february.invoice_id)["total"]) == february.total


def test_cli_paths_leave_it_alone(conn, february, cli, tmp_path):
    before = frozen(conn, february.invoice_id)
    book = tmp_path / "eur.yaml"
    book.write_text(EUR_BOOK_YAML)
    dearer = tmp_path / "dearer.yaml"
    dearer.write_text(BOOK_YAML.replace('amount: "8.00"', 'amount: "9.00"'))
    assert cli("billing", "run", "--period", "2026-02", "--json").code == 0
    assert cli("plans", "assign", "--customer", "acme", "--price-book", str(dearer), "--from", "2026-02-01").code == 2
    assert cli("customers", "set", "acme", "--timezone", "Asia/Kolkata").code == 2
    assert cli("customers", "set", "acme", "--anchor-day", "15").code == 2
    assert cli("customers", "set", "acme", "--currency", "EUR").code == 2
    note = cli("invoices", "credit-note", february.invoice_id, "--reason", "goodwill", "--json")
    assert note.code == 0, note.err
    assert frozen(conn, february.invoice_id) == before  # a credit note is its own document


def test_api_paths_leave_it_alone(conn, february, api):
    client, keys = api
    before = frozen(conn, february.invoice_id)
    admin = auth(keys["admin"])
    dearer = BOOK_YAML.replace('amount: "8.00"', 'amount: "9.00"')
    r = client.post("/v1/billing/customers/acme/plans", json={"price_book": dearer, "from": "2026-02-01"}, headers=admin)
    assert r.status_code == 400 and "finalized period" in r.json()["error"]["message"]
    r = client.put("/v1/billing/customers/acme", json={"timezone": "Asia/Kolkata"}, headers=admin)
    assert r.status_code == 400
    assert client.post("/v1/billing/runs", json={"period": "2026-02"}, headers=admin).status_code == 200
    # customers cannot act as admin
    r = client.post(f"/v1/billing/invoices/{february.invoice_id}/void", headers=auth(keys["acme"]))
    assert r.status_code == 403
    assert frozen(conn, february.invoice_id) == before
    assert Decimal(before["total"]) == february.total


def test_one_statement_touching_a_finalized_invoices_lines_writes_no_line(conn, metering, february):
    """The draft-only check runs once per INSERT / DELETE statement (migration 0011): a statement that
    copies lines to a draft and to a finalized invoice fails whole; the draft's lines alone go through."""
    metering.request("acme", datetime(2026, 3, 4, tzinfo=UTC), input_tokens=5_000, output=500)
    [march] = billing_run(conn, "2026-03", now=datetime(2026, 3, 10, tzinfo=UTC), cost_model=cost_model()).invoices
    assert march.status == "draft"
    copy_to = ("INSERT INTO billing_invoice_lines SELECT t.target, l.id || 'x', l.position + 100, l.rated_line_id, "
               "l.kind, l.charge_key, l.meter, l.grp, l.quantity, l.unit_price, l.precise_amount, l.amount, l.period, "
               "l.service_period_start, l.service_period_end FROM billing_invoice_lines l, unnest(%s::text[]) AS "
               "t(target) WHERE l.invoice_id = %s")
    before = conn.execute("SELECT count(*) FROM billing_invoice_lines").fetchone()
    with pytest.raises(psycopg.errors.CheckViolation, match="lines of a finalized invoice cannot change"):
        conn.execute(copy_to, ([march.invoice_id, february.invoice_id], march.invoice_id))
    assert conn.execute("SELECT count(*) FROM billing_invoice_lines").fetchone() == before
    with pytest.raises(psycopg.errors.CheckViolation, match="lines of a finalized invoice cannot change"):
        conn.execute("DELETE FROM billing_invoice_lines WHERE invoice_id = ANY(%s)",
                     ([march.invoice_id, february.invoice_id],))
    assert conn.execute("SELECT count(*) FROM billing_invoice_lines").fetchone() == before
    conn.execute(copy_to, ([march.invoice_id], march.invoice_id))  # a draft's lines may change
    conn.execute("DELETE FROM billing_invoice_lines WHERE invoice_id = %s AND position >= 100", (march.invoice_id,))
    assert conn.execute("SELECT count(*) FROM billing_invoice_lines").fetchone() == before


def test_a_drafts_replaced_lines_stay_in_its_history(conn, metering, february):
    """History rows keep the invoice without its lines; when a draft's lines are replaced (late usage
    inside the period) the database keeps the old ones, so the invoice as of before the refresh is
    still the one that was known then, lines included."""
    from billing_service.store import invoice_as_of, revision_lines

    mid, later = datetime(2026, 3, 10, tzinfo=UTC), datetime(2026, 3, 11, tzinfo=UTC)
    metering.request("acme", datetime(2026, 3, 3, tzinfo=UTC), input_tokens=1_000, output=10)
    [draft] = billing_run(conn, "2026-03", now=mid, cost_model=cost_model()).invoices
    then = invoice_as_of(conn, draft.invoice_id, mid)
    assert [line["amount"] for line in then["lines"]] == [line["amount"] for line in show_invoice(conn, draft.invoice_id)["lines"]]
    [document] = conn.execute("SELECT document FROM billing_invoice_history WHERE invoice_id = %s",
                              (draft.invoice_id,)).fetchone()
    assert "lines" not in document and document["total"] == then["total"]
    metering.request("acme", datetime(2026, 3, 4, tzinfo=UTC), input_tokens=500_000, output=10)
    [refreshed] = billing_run(conn, "2026-03", now=later, cost_model=cost_model()).invoices
    assert (refreshed.invoice_id, refreshed.action) == (draft.invoice_id, "refreshed")
    assert invoice_as_of(conn, draft.invoice_id, mid) == then
    now_known = invoice_as_of(conn, draft.invoice_id, later)
    assert now_known["lines"] != then["lines"] and now_known["total"] == money_total(refreshed.total)
    assert conn.execute("SELECT DISTINCT revision FROM billing_invoice_lines_replaced WHERE invoice_id = %s",
                        (draft.invoice_id,)).fetchall() == [(1,)]
    assert len(revision_lines(conn, [(draft.invoice_id, 1)])[(draft.invoice_id, 1)]) == len(then["lines"])

    # lines are replaced, never updated; an invoice with lines is never deleted nor renamed; a line needs
    # an invoice (no foreign key: checked once per statement); what was replaced is append-only
    for sql, error in (
        ("UPDATE billing_invoice_lines SET amount = amount WHERE invoice_id = %s", psycopg.errors.CheckViolation),
        ("DELETE FROM billing_invoices WHERE id = %s", psycopg.errors.ForeignKeyViolation),
        ("UPDATE billing_invoices SET id = id || 'x' WHERE id = %s", psycopg.errors.CheckViolation),
        ("INSERT INTO billing_invoice_lines SELECT %s || 'x', id, position, rated_line_id, kind, charge_key, meter, "
         "grp, quantity, unit_price, precise_amount, amount, period, service_period_start, service_period_end "
         "FROM billing_invoice_lines LIMIT 1", psycopg.errors.CheckViolation),
        ("DELETE FROM billing_invoice_lines_replaced WHERE invoice_id = %s", psycopg.errors.CheckViolation),
        ("UPDATE billing_invoice_lines_replaced SET amount = 0 WHERE invoice_id = %s", psycopg.errors.CheckViolation),
    ):
        with pytest.raises(error):
            conn.execute(sql, (draft.invoice_id,))
    assert invoice_as_of(conn, draft.invoice_id, later) == now_known


def money_total(value: Decimal) -> str:
    return format(value.quantize(Decimal("0.01")), "f")
