"""Every page, in Chromium at a laptop's and a phone's size (1280x800, 390x844): the layout fits the
screen. Pages: sign-in (customer and admin), the customer dashboard with its billing, an invoice,
operations, pricing experiments and finance, on the site's metered and billed data."""

from __future__ import annotations

from tests.dashboards.conftest import PERIOD, WINDOW

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
