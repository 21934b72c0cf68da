"""The HTML report opens in headless Chromium (Debian `chromium`, driven by Playwright) with no console
errors, and every chart renders (plotly.js is inlined: no network needed)."""

from __future__ import annotations

import shutil

from playwright.sync_api import sync_playwright

from pricing_service.books import EXAMPLE_BOOKS_DIR, EXAMPLE_COST_MODEL
from pricing_service.compare import run_comparison
from pricing_service.report_html import write_html
from tests.pricing_service.conftest import H0, H2

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def test_html_report_renders_in_chromium(synthetic_db, tmp_path):
    books = [EXAMPLE_BOOKS_DIR / n for n in ("per-token.yaml", "gpu-hour.yaml", "per-task.yaml")]
    report = run_comparison(synthetic_db, H0, H2, books, EXAMPLE_COST_MODEL)
    page_path = write_html(report, tmp_path / "report.html")
    html = page_path.read_text()
    assert "<script src=" not in html  # nothing fetched from a CDN
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("request", lambda r: problems.append(f"network: {r.url}") if not r.url.startswith(("file:", "data:", "blob:")) else None)
            page.goto(page_path.as_uri())
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 5", timeout=20000)
            charts = page.eval_on_selector_all(".js-plotly-plot", "els => els.map(e => e.id)")
            bars = page.eval_on_selector_all("#chart-overview .bars .point", "els => els.length")
            title = page.title()
        finally:
            browser.close()
    assert problems == []
    assert charts == ["chart-overview", "chart-customers", "chart-risk", "chart-caching", "chart-retries"]
    assert bars == 9  # revenue, cost, margin for three books
    assert title.startswith("Pricing experiment")
