"""Every page, in Chromium at a laptop's and a phone's size (1280x800, 390x844): no control sends data
off the machine and the browser requests nothing from another host; the layout fits the screen.
Pages: sign-in (customer and admin), the customer dashboard with its billing, an invoice, operations,
pricing experiments and finance, on the site's metered and billed data; and the pricing report
(`infermeter pricing compare --html`, which the demo writes as pricing.html)."""

from __future__ import annotations

import re
import urllib.parse

from pricing_service.books import EXAMPLE_COST_MODEL
from tests.dashboards.conftest import PERIOD, WINDOW, infermeter

Q = f"from={WINDOW['from']}&to={WINDOW['to']}"
MONTH = "from=2026-11-01T00:00:00Z&to=2026-12-01T00:00:00Z"


def every_page(billed) -> list[tuple[str, str]]:
    """(who opens it: anyone, customer or admin; path) of every page."""
    paid = next(i for i in billed["cust-a"] if i["status"] == "paid")
    return [("anyone", "/signin"), ("anyone", "/admin/signin"),
            ("customer", f"/dashboard?{MONTH}&period={PERIOD}"), ("customer", f"/dashboard/invoices/{paid['id']}"),
            ("admin", f"/admin/ops?{Q}"), ("admin", f"/admin/pricing?{Q}"), ("admin", f"/admin/finance?period={PERIOD}")]


def browsers(web, site, viewport) -> dict:
    """A browser per audience at the viewport's size: signed out, signed in as cust-a, as the admin."""
    customer, admin = web(viewport=viewport), web(viewport=viewport)
    customer.sign_in(site.keys["a"])
    admin.admin_sign_in(site.keys["admin"])
    return {"anyone": web(viewport=viewport), "customer": customer, "admin": admin}


def open_drawn(page, path: str) -> None:
    """Open a page and wait until each of its charts is drawn."""
    page.goto(path)
    page.page.wait_for_function("document.querySelectorAll('[data-chart]').length === 0 || "
                                "document.body.dataset.chartsDrawn === String(document.querySelectorAll('[data-chart]').length)",
                                timeout=30000)


# a text's lines: the distinct tops of the boxes its words are laid out in
LINES_OF_HEADER_ITEMS = """() => Array.from(document.querySelectorAll(
    'header.top .brand, header.top nav a, header.top .who, header.top button')).map(e => {
  const range = document.createRange(); range.selectNodeContents(e);
  return [e.textContent.trim(), new Set(Array.from(range.getClientRects()).map(r => Math.round(r.top))).size];
})"""


def test_no_page_is_wider_than_the_screen_and_the_header_keeps_its_words_whole(web, site, billed, viewport):
    seen = browsers(web, site, viewport)
    for who, path in every_page(billed):
        p = seen[who]
        open_drawn(p, path)
        width = p.page.evaluate("document.documentElement.scrollWidth")
        assert width <= viewport["width"], (path, width)
        assert all(lines == 1 for _, lines in p.page.evaluate(LINES_OF_HEADER_ITEMS)), (path, p.page.evaluate(LINES_OF_HEADER_ITEMS))
        if path.startswith("/dashboard?"):  # the wide tables scroll in their own box
            for table in ("tasks-table", "invoice-table"):
                box = p.page.evaluate(f"""() => {{ const box = document.querySelector('[data-testid={table}]').parentElement;
                    return [getComputedStyle(box).overflowX, box.clientWidth, box.scrollWidth]; }}""")
                assert box[0] == "auto" and box[1] <= viewport["width"], (table, box)
    assert all(p.problems == [] for p in seen.values()), [p.problems for p in seen.values()]


# a control that would upload the page's data, or link out: plotly's "Share chart..." (to Plotly Cloud),
# "Edit in Chart Studio", "Produced with Plotly" (its logo)
OFF_THE_MACHINE = re.compile(r"share|cloud|chart studio|plotly\.com|produced with plotly", re.I)
CONTROLS = """() => ({
  toolbar: Array.from(document.querySelectorAll('.modebar-btn')).map(b =>
    [b.getAttribute('data-title'), b.getAttribute('data-attr'), b.getAttribute('data-val'), b.getAttribute('href')].join(' ')),
  controls: Array.from(document.querySelectorAll('a, button, input[type=submit], [role=button]')).map(e =>
    [e.textContent, e.getAttribute('title'), e.getAttribute('data-title'), e.getAttribute('value')].join(' ')),
  targets: Array.from(document.querySelectorAll('a[href], form[action], link[href], script[src], img[src], iframe'))
    .map(e => e.href || e.action || e.src || '').filter(u => u && !u.startsWith('data:') && !u.startsWith('javascript:')),
})"""


def no_control_off_the_machine(page, origin: str, where: str) -> int:
    """Checks the page's controls and link targets; returns how many toolbar buttons its charts have."""
    found = page.evaluate(CONTROLS)
    for text in found["toolbar"] + found["controls"]:
        assert not OFF_THE_MACHINE.search(text), (where, text)
    for target in found["targets"]:
        assert target.startswith(origin), (where, target)
    return len(found["toolbar"])


def test_no_control_sends_data_off_the_machine_and_nothing_is_requested_elsewhere(web, site, billed, viewport,
                                                                                    tmp_path):
    seen = browsers(web, site, viewport)
    for who, path in every_page(billed):
        p = seen[who]
        open_drawn(p, path)
        charts = p.page.evaluate("document.querySelectorAll('.js-plotly-plot').length")
        buttons = no_control_off_the_machine(p.page, site.url + "/", path)
        assert charts == 0 or buttons >= charts, (path, charts, buttons)  # each chart has its toolbar: checked
    # the network logs: every request of every page went to the app (Page records any other)
    assert all(p.problems == [] for p in seen.values()), [p.problems for p in seen.values()]

    # the pricing report, as `pricing compare --html` writes it: the cost model by default, then one given
    requested: list[str] = []
    for given in (None, "pricing_books/cost-model.yaml"):
        report = tmp_path / f"pricing-{'default' if given is None else 'given'}.html"
        infermeter(site, "pricing", "compare", "--from", WINDOW["from"], "--to", WINDOW["to"],
                   "--price-book", "pricing_books/per-token.yaml", "--price-book", "pricing_books/gpu-hour.yaml",
                   *(["--cost-model", given] if given else []), "--html", str(report))
        text = report.read_text()
        assert str(EXAMPLE_COST_MODEL) not in text  # not this machine's path: the example's name, or the path given
        assert f"Cost model: {given or 'pricing_books/cost-model.yaml'}." in text
        context = p.context.browser.new_context(viewport=viewport)
        try:
            page = context.new_page()
            requested.clear()
            page.on("request", lambda r: requested.append(r.url))
            page.goto(report.as_uri())
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 5", timeout=30000)
            charts = page.evaluate("document.querySelectorAll('.js-plotly-plot').length")
            assert no_control_off_the_machine(page, "file://", "report") >= charts >= 5
            assert requested and {urllib.parse.urlsplit(u).scheme for u in requested} <= {"file", "data", "blob"}, requested
        finally:
            context.close()
