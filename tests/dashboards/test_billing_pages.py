"""Billing on the dashboards, in Chromium against the real API app: the metered usage of the site
(through Kafka and the consumer) billed by a real billing run, then the customer page's invoices and
current-period spend equal what `infermeter invoices list` and `infermeter invoice preview` print, the
finance page's totals equal the revenue export, its charts draw, and no customer reaches another's
invoice by URL tampering."""

from __future__ import annotations

import csv
import io
from decimal import Decimal

import psycopg

from infermeter.stack.postgres import to_libpq_url
from tests.dashboards.conftest import BILLED_AT, PERIOD, SETUP_AT, infermeter
from tests.dashboards.test_pages import shoot


def money(text: str) -> Decimal:
    return Decimal(text.split()[0].replace(",", ""))


def test_customer_page_invoices_and_spend_equal_the_cli(web, site, billed):
    p = web()
    p.sign_in(site.keys["a"])
    for period in (None, PERIOD):  # the running period (period to date), then November (final)
        suffix = f"&period={period}" if period else ""
        p.goto(f"/dashboard?from=2026-11-01T00:00:00Z&to=2026-12-01T00:00:00Z{suffix}")
        p.wait_for_charts(5)
        shown = p.text("cp-period")
        preview = infermeter(site, "invoice", "preview", "--customer", "cust-a", "--period", shown)
        assert period in (None, shown)
        assert money(p.text("cp-subtotal")) == Decimal(preview["subtotal"])
        assert money(p.text("cp-credits")) == Decimal(preview["credits_applied"])
        assert money(p.text("cp-total")) == Decimal(preview["total"])
        as_json = p.context.request.get(f"{site.url}/dashboard/current-period.json?period={shown}").json()
        assert [(x["meter"], x["group"], x["amount"]) for x in as_json["lines"]] == \
            [(x["meter"], x["group"], x["amount"]) for x in preview["lines"]]
        assert as_json["total"] == preview["total"] and as_json["budget"]["monthly_cap"] == "50.00"
    assert money(p.text("cp-budget")) == Decimal("50.00")
    # the invoices: what `infermeter invoices list --customer cust-a` lists, drafts aside
    listed = [i for i in infermeter(site, "invoices", "list", "--customer", "cust-a")["invoices"] if i["status"] != "draft"]
    rows = p.page.eval_on_selector_all("[data-testid=invoice-table] > tbody > tr[data-invoice]", """rows => rows.map(r => ({
        number: r.dataset.invoice, status: r.children[2].innerText, total: r.children[5].innerText}))""")
    assert sorted((r["number"], r["total"].split()[0]) for r in rows) == sorted((i["number"], i["total"]) for i in listed)
    assert sorted(r["status"] for r in rows) == ["paid", "void"]
    # expand the paid invoice's lines, then open its page: the lines are `invoices show`'s
    paid = next(i for i in listed if i["status"] == "paid")
    p.page.click(f"tr[data-invoice='{paid['number']}'] summary")
    shown_lines = p.page.eval_on_selector_all(f"tr[data-invoice='{paid['number']}'] details tbody tr",
                                              "rows => rows.map(r => r.children[4].innerText)")
    full = infermeter(site, "invoices", "show", paid["id"])
    assert shown_lines == [f"{x['amount']} USD" for x in full["lines"]] and shown_lines
    body = p.page.inner_text("main").lower()
    assert "margin" not in body and "cost" not in body
    shoot(p, "customer")
    with p.page.expect_navigation():
        p.page.click(f"tr[data-invoice='{paid['number']}'] a")
    assert p.text("invoice-number") == paid["number"] and money(p.text("invoice-total")) == Decimal(paid["total"])
    req = p.context.request
    lines_csv = list(csv.DictReader(io.StringIO(req.get(f"{site.url}/dashboard/invoices/{paid['id']}.csv").text())))
    assert [r["amount"] for r in lines_csv] == [x["amount"] for x in full["lines"]]
    listed_csv = list(csv.DictReader(io.StringIO(req.get(f"{site.url}/dashboard/invoices.csv").text())))
    assert sorted(r["number"] for r in listed_csv) == sorted(i["number"] for i in listed)
    every_line = list(csv.DictReader(io.StringIO(req.get(f"{site.url}/dashboard/invoice-lines.csv").text())))
    assert {r["invoice_number"] for r in every_line} == {i["number"] for i in listed}
    assert p.problems == []


def test_prepaid_credit_shows_against_the_preview(web, site, billed):
    p = web()
    p.sign_in(site.keys["b"])
    p.goto(f"/dashboard?period={PERIOD}")
    p.wait_for_charts(5)
    preview = infermeter(site, "invoice", "preview", "--customer", "cust-b", "--period", PERIOD)
    credits = infermeter(site, "credits", "show", "--customer", "cust-b")
    assert money(p.text("cp-credits")) == Decimal(preview["credits_applied"]) == Decimal("0.05")
    assert money(p.text("cp-balance")) == Decimal(credits["balance"])
    assert p.page.query_selector("[data-testid=cp-budget]") is None
    [invoice] = billed["cust-b"]
    assert p.page.inner_text(f"tr[data-invoice='{invoice['number']}'] [data-testid=invoice-total]") == \
        f"{invoice['total']} USD"
    assert p.problems == []


def test_a_customer_cannot_reach_another_customers_invoices(web, site, billed):
    p = web()
    p.sign_in(site.keys["a"])
    req = p.context.request
    [b_invoice] = billed["cust-b"]
    a_invoice = billed["cust-a"][0]
    assert req.get(f"{site.url}/dashboard/invoices/{a_invoice['id']}.json").status == 200
    for path in (f"/dashboard/invoices/{b_invoice['id']}", f"/dashboard/invoices/{b_invoice['id']}.json",
                 f"/dashboard/invoices/{b_invoice['id']}.csv", f"/dashboard/invoices/{b_invoice['id']}.json?customer_id=cust-b",
                 "/dashboard/invoices.json?customer_id=cust-b", "/dashboard/invoices.csv?customer_id=cust-b",
                 "/dashboard/invoice-lines.csv?customer_id=cust-b", "/dashboard/current-period.json?customer_id=cust-b",
                 "/dashboard/invoices/no-such-invoice"):
        assert req.get(site.url + path).status == 404, path
    for path in ("/admin/finance", f"/admin/finance/data/revenue_customer.json?period={PERIOD}",
                 f"/admin/finance/exports/revenue.csv?period={PERIOD}"):
        assert req.get(site.url + path, max_redirects=0).status == 403, path
    bearer = {"Authorization": f"Bearer {site.keys['a']}"}
    assert req.get(f"{site.url}/dashboard/invoices/{b_invoice['id']}.json", headers=bearer).status == 404
    own = req.get(f"{site.url}/dashboard/invoices.json", headers=bearer).json()
    assert {i["customer_id"] for i in own["invoices"]} == {"cust-a"}
    # the page and its JSON say nothing of cust-b's invoice
    p.goto("/dashboard")
    assert b_invoice["number"] not in p.page.content()
    # without signing in: back to sign-in (pages) or 401 (data)
    anonymous = p.context.browser.new_context()
    try:
        assert anonymous.request.get(f"{site.url}/dashboard/invoices.json").status == 401
    finally:
        anonymous.close()


def test_finance_page_totals_equal_the_revenue_export(web, site, billed):
    p = web()
    p.admin_sign_in(site.keys["admin"])
    p.goto("/admin/finance")
    p.wait_for_charts(5)
    assert p.text("finance-period") == PERIOD
    export = p.context.request.get(f"{site.url}/admin/finance/exports/revenue.csv?period={PERIOD}")
    assert export.status == 200
    rows = list(csv.DictReader(io.StringIO(export.text())))
    # the same bytes as the admin API's export
    api = p.context.request.get(f"{site.url}/v1/billing/exports/revenue?period={PERIOD}&format=csv",
                                headers={"Authorization": f"Bearer {site.keys['admin']}"})
    assert api.body() == export.body()
    per_customer: dict[str, Decimal] = {}
    for r in rows:
        per_customer[r["customer_id"]] = per_customer.get(r["customer_id"], Decimal(0)) + Decimal(r["net_amount"])
    shown = p.page.eval_on_selector_all("[data-testid=rows-revenue_customer] tbody tr", """rows => rows.map(r => ({
        customer: r.querySelector('[data-col=customer_id]').innerText,
        net: r.querySelector('[data-col=net_amount]').innerText}))""")
    assert {s["customer"]: Decimal(s["net"]) for s in shown} == per_customer
    assert set(per_customer) == {"cust-a", "cust-b"}
    total = sum(per_customer.values())
    month = p.page.eval_on_selector_all("[data-testid=rows-revenue_month] tbody tr", """rows => rows.map(r => ({
        period: r.querySelector('[data-col=period]').innerText, net: r.querySelector('[data-col=net_amount]').innerText}))""")
    assert {m["period"]: Decimal(m["net"]) for m in month} == {PERIOD: total}
    meters = p.context.request.get(f"{site.url}/admin/finance/data/revenue_meter.json?period={PERIOD}").json()["rows"]
    assert sum(Decimal(m["net_amount"]) for m in meters) == total
    # the charts drew the table's numbers
    drawn = p.chart_data("revenue_customer")
    assert drawn[0]["x"] == sorted(per_customer) and [Decimal(str(y)) for y in drawn[0]["y"]] == \
        [per_customer[c] for c in sorted(per_customer)]
    assert p.svg_points("revenue_customer") == 2
    # invoice statuses: cust-a's voided and its paid reissue, cust-b's final
    statuses = {s["status"]: s["invoices"] for s in p.context.request.get(
        f"{site.url}/admin/finance/data/invoice_status.json?period={PERIOD}").json()["rows"]}
    assert statuses == {"draft": 0, "final": 1, "paid": 1, "failed": 0, "void": 1}
    assert p.svg_points("invoice_status") == 5
    # credits outstanding: cust-b's grant, used by its invoice
    credits = p.context.request.get(f"{site.url}/admin/finance/data/credits.csv").text()
    [credit] = list(csv.DictReader(io.StringIO(credits)))
    assert credit["customer_id"] == "cust-b" and credit["granted"] == "0.05"
    # every export is linked and downloads
    for kind in ("invoices", "lines", "revenue", "usage"):
        for fmt in ("csv", "parquet"):
            link = p.page.get_attribute(f"[data-testid=export-{kind}-{fmt}]", "href")
            assert p.context.request.get(site.url + link).status == 200, link
    assert p.problems == []
    shoot(p, "finance")


def test_bad_periods_and_exports_get_a_clear_error(web, site, billed):
    p = web()
    p.sign_in(site.keys["a"])
    req = p.context.request
    bad = req.get(f"{site.url}/dashboard/current-period.json?period=2026-13")
    assert bad.status == 400 and "2026-13" in bad.json()["error"]["message"]
    page = req.get(f"{site.url}/dashboard?period=November")
    assert page.status == 400 and "Check the filters" in page.text()
    admin = web()
    admin.admin_sign_in(site.keys["admin"])
    req = admin.context.request
    assert req.get(f"{site.url}/admin/finance?period=2026-13").status == 400
    for path in ("/admin/finance/exports/profits.csv?period=2026-11", "/admin/finance/exports/revenue.xlsx?period=2026-11",
                 "/admin/finance/exports/revenue.csv", "/admin/finance/exports/revenue.csv?period=11-2026"):
        answer = req.get(site.url + path)
        assert answer.status == 400 and answer.json()["error"]["message"], path
    assert req.get(f"{site.url}/admin/finance/data/profits.json").status == 404
    # a period without invoices: empty tables, every status at zero
    empty = req.get(f"{site.url}/admin/finance/data/invoice_status.json?period=2025-01").json()
    assert {r["status"]: r["invoices"] for r in empty["rows"]} == {"draft": 0, "final": 0, "paid": 0, "failed": 0,
                                                                    "void": 0}


def test_billing_views_have_the_shape_the_pages_need():
    """billing_service.dashboard_views.DashboardViews has every operation of
    dashboards.billing_views.BillingViews, with its parameters (the shape is not checked otherwise:
    billing_service may not import dashboards)."""
    import inspect

    from billing_service.dashboard_views import DashboardViews
    from dashboards.billing_views import BillingViews

    wanted = {name: inspect.signature(f) for name, f in vars(BillingViews).items()
              if inspect.isfunction(f) and not name.startswith("_")}
    assert sorted(wanted) == ["current_period_spend", "customer_name", "customer_price_book", "finance_export", "finance_page",
                              "invoice", "invoices"]
    for name, signature in wanted.items():
        assert list(inspect.signature(getattr(DashboardViews, name)).parameters) == list(signature.parameters), name


def test_billing_figures_are_shown_as_of_the_apps_billing_clock(site, billed):
    """The current period's preview and the credit balance are as of the app's billing clock when it
    is built with one (`create_app(..., billing_clock=)`; the demo serves its pages as of the instant
    its billing run is made as of): before the billing run cust-b's prepaid credit is whole, after it
    the invoice has used it, as `billing_service.run.credits_view` says for the same instant."""
    from datetime import timedelta

    from fastapi.testclient import TestClient

    from app.api import create_app
    from app.demo.bill import BILLING_AS_OF, demo_billing_clock
    from billing_service.credits import credits_view

    headers = {"Authorization": f"Bearer {site.keys['b']}"}
    shown = {}
    clock = {}
    app = create_app(site.settings, site.settings.database_url, None, keys=site.store,
                     billing_clock=lambda: clock["at"])
    with TestClient(app) as client:
        for at in (SETUP_AT + timedelta(days=1), BILLED_AT + timedelta(hours=1)):
            clock["at"] = at
            answer = client.get(f"/dashboard/current-period.json?period={PERIOD}", headers=headers).json()
            with psycopg.connect(to_libpq_url(site.settings.database_url)) as conn:
                assert answer["credit_balance"] == credits_view(conn, "cust-b", now=at)["balance"]
            shown[at] = Decimal(answer["credit_balance"])
    assert list(shown.values()) == [Decimal("0.05"), Decimal("0.00")]
    assert demo_billing_clock() >= BILLING_AS_OF
