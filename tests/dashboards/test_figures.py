"""Figures that read well, in Chromium: money with its currency in every column, quantities with
thousands separators, unit prices with their unit, credit notes to the second and the invoice's net
amount; the cache-hit axis in percent; empty charts that say so; daily bars with daily ticks; date
pickers for the pages' times; the customer's display name on its pages."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from dashboards.web.responses import moment_text, quantity_text, unit_price_text
from tests.dashboards.conftest import PERIOD, WINDOW, infermeter

Q = f"from={WINDOW['from']}&to={WINDOW['to']}"
TICK_TEXTS = "els => els.map(e => e.textContent)"


def paid_invoice(billed) -> dict:
    return next(i for i in billed["cust-a"] if i["status"] == "paid")


@pytest.mark.parametrize(("unit_price", "meter", "shown"), [
    ("0.00000155", "uncached_input_tokens", "1.55 USD per 1M tokens"),
    ("0.000007", "output_tokens", "7 USD per 1M tokens"),
    ("0.0007", "gpu_seconds", "2.52 USD per GPU-hour"),
    ("0.25", "successful_tasks", "0.25 USD per successful task"),
    ("0.001", "requests", "0.001 USD per request"),
    ("0.002", "usage:tool_calls", "0.002 USD per unit of usage:tool_calls"),
    (None, "output_tokens", "-"),
])
def test_unit_prices_are_shown_with_their_unit(unit_price, meter, shown):
    assert unit_price_text(unit_price, meter, "USD") == shown


def test_quantities_and_times_as_shown():
    assert [quantity_text(q) for q in ("1234567", "1234.500", "12", None)] == ["1,234,567", "1,234.500", "12", "-"]
    assert moment_text("2026-12-03T09:15:42.25Z") == "2026-12-03 09:15:42 UTC"


def test_invoice_figures_carry_their_units_and_the_net_amount(web, site, billed):
    p = web()
    p.sign_in(site.keys["a"])
    paid = paid_invoice(billed)
    full = infermeter(site, "invoices", "show", paid["id"])
    p.goto(f"/dashboard/invoices/{paid['id']}")
    cells = p.page.eval_on_selector_all("[data-testid=invoice-lines] tbody tr", """rows => rows.map(r => ({
        quantity: r.children[3].innerText, unit_price: r.children[4].innerText, amount: r.children[5].innerText}))""")
    assert [c["amount"] for c in cells] == [f"{x['amount']} USD" for x in full["lines"]]
    assert [c["quantity"] for c in cells] == [format(Decimal(x["quantity"]), ",f") for x in full["lines"]]
    assert any("," in c["quantity"] for c in cells)  # cust-a's token counts are in the thousands
    assert all(c["unit_price"].endswith(" USD per 1M tokens") for c in cells), cells  # a per-token book
    assert {c["unit_price"] for c in cells} >= {"1.55 USD per 1M tokens", "7 USD per 1M tokens"}
    # the credit note: its total with its currency, issued to the second; the invoice's net amount
    [note] = full["credit_notes"]
    assert p.page.eval_on_selector_all("[data-testid=credit-notes] tbody td", TICK_TEXTS) == \
        [note["number"], f"{note['total']} USD", "goodwill", "2026-12-03 09:15:42 UTC"]
    assert p.text("invoice-credited") == f"-{note['total']} USD"
    assert p.text("invoice-net") == f"{Decimal(full['subtotal']) - Decimal(note['total'])} USD"
    assert Decimal(note["total"]) > 0
    assert p.text("invoice-customer") == "CUST-A (cust-a)"
    assert p.problems == []


def test_customer_page_money_columns_and_axes_carry_their_units(web, site, billed):
    p = web()
    p.sign_in(site.keys["a"])
    p.goto(f"/dashboard?{Q}&period={PERIOD}")
    p.wait_for_charts(5)
    assert p.text("customer-name") == "CUST-A" and p.text("customer") == "cust-a"
    rows = p.page.eval_on_selector_all("[data-testid=invoice-table] > tbody > tr[data-invoice]", """rows => rows.map(r =>
        [3, 4, 5].map(i => r.children[i].innerText))""")
    assert rows and all(cell.endswith(" USD") for row in rows for cell in row), rows
    p.page.click(f"tr[data-invoice='{paid_invoice(billed)['number']}'] summary")
    nested = p.page.eval_on_selector_all(f"tr[data-invoice='{paid_invoice(billed)['number']}'] details tbody tr",
                                         "rows => rows.map(r => [r.children[3].innerText, r.children[4].innerText])")
    assert nested and all(price.endswith("per 1M tokens") and amount.endswith(" USD") for price, amount in nested)
    p.page.click("[data-testid=cp-lines] summary")
    previewed = p.page.eval_on_selector_all("[data-testid=cp-lines] tbody tr",
                                            "rows => [3, 4, 5].map(i => rows[0].children[i].innerText)")
    assert re.fullmatch(r"[\d,]+", previewed[0]) and previewed[1].endswith("per 1M tokens") and previewed[2].endswith(" USD")
    # the cache-hit chart reads in percent, like its card
    ticks = p.page.eval_on_selector_all("#chart-cache_hit .ytick text", TICK_TEXTS)
    assert ticks and all(t.endswith("%") for t in ticks), ticks
    assert p.text("cache-hit").endswith("%")
    assert p.problems == []


def test_empty_charts_say_no_data(web, site):
    p = web()
    p.sign_in(site.keys["a"])
    p.goto("/dashboard?from=2026-10-01T00:00:00Z&to=2026-10-02T00:00:00Z")  # nothing metered then
    p.wait_for_charts(5)
    for chart in ("tokens", "requests", "cache_hit", "gpu", "tasks"):
        assert p.page.get_attribute(f"#chart-{chart}", "data-empty") == "true"
        assert p.svg_points(chart, ".xtick") == 0 and p.page.query_selector(f"#chart-{chart} .main-svg") is None
        card = p.page.inner_text(f"section.chart-card:has(#chart-{chart})")
        assert "No data in this window." in card
    assert p.problems == []


def test_daily_bars_get_daily_ticks(web, site):
    p = web()
    p.sign_in(site.keys["a"])
    p.goto("/dashboard?from=2026-10-30T00:00:00Z&to=2026-11-05T00:00:00Z")  # six days: one bar a day
    p.wait_for_charts(5)
    for chart in ("tokens", "requests"):
        labels = p.page.eval_on_selector_all(f"#chart-{chart} .xtick text", TICK_TEXTS)
        assert labels and all(re.fullmatch(r"[A-Z][a-z]{2} \d\d", t) for t in labels), labels  # a date, no hour
        assert len(set(labels)) == len(labels)
        assert "Nov 02" in labels
    assert p.problems == []


def test_times_are_picked_with_date_pickers(web, site, billed):
    p = web()
    p.sign_in(site.keys["a"])
    p.goto(f"/dashboard?{Q}&period={PERIOD}")
    p.wait_for_charts(5)
    assert p.page.get_attribute("input[name=from]", "type") == "datetime-local"
    assert p.page.input_value("input[name=from]") == "2026-11-02T00:00"
    assert p.page.get_attribute("input[name=period]", "type") == "month"
    assert p.page.input_value("input[name=period]") == PERIOD
    # pick 10:00-12:00 (UTC, as the page says): cust-a's eight m1 requests of those two hours
    p.page.fill("input[name=from]", "2026-11-02T10:00")
    p.page.fill("input[name=to]", "2026-11-02T12:00")
    with p.page.expect_navigation():
        p.page.click("form[data-testid=filters] button[type=submit]")
    p.wait_for_charts(5)
    assert p.text("total-requests") == "8"
    assert p.page.input_value("input[name=from]") == "2026-11-02T10:00"
    assert "from=2026-11-02T10%3A00Z" in p.page.get_attribute("[data-testid=json-tokens]", "href")
    admin = web()
    admin.admin_sign_in(site.keys["admin"])
    for path, names in ((f"/admin/ops?{Q}", ("from", "to", "reconcile_from", "reconcile_to")),
                        (f"/admin/pricing?{Q}", ("from", "to", "effective_from"))):
        admin.goto(path)
        assert [admin.page.get_attribute(f"input[name={n}]", "type") for n in names] == ["datetime-local"] * len(names)
    assert p.problems == [] and admin.problems == []
