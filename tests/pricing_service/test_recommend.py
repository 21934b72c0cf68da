"""`infermeter pricing recommend` on a demo month written through metering's real write path into the
real PostgreSQL: the margin before is the one `pricing compare` reports, the scale found meets both
conditions, the answer is reproducible, the page renders offline with no control that sends data
away, and bad input gets one clear line and exit status 2."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright
from rich.console import Console

from bench.prediction import load_demo_month
from pricing_service.compare import default_book_paths, run_comparison
from pricing_service.recommend import render_console, run_recommendation
from pricing_service.recommend_html import PLOTLY_CONFIG, write_html
from tests.conftest import new_database
from tests.prediction_service.conftest import cli  # noqa: F401 - the `infermeter ...` fixture
from tests.pricing_service.test_html_report import CHROMIUM

MONTH = (datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC))
BOOKS = default_book_paths()


@pytest.fixture(scope="module")
def month_url(pg_server_url) -> str:
    """The demo's month from a pool of 1,000 trace requests (3,000 in the month), billed like the demo."""
    url = new_database(pg_server_url)
    load_demo_month(url, 1000)
    return url


@pytest.fixture(scope="module")
def report(month_url):
    return run_recommendation(month_url, *MONTH, BOOKS, target="0.25", risk="0.05", draws=300)


def test_the_margin_before_is_pricing_compares_and_after_it_meets_both_conditions(month_url, report):
    compared = run_comparison(month_url, *MONTH, BOOKS)
    for r, b in zip(report.recommendations, compared.books, strict=True):
        assert r.book.id == b.book.id
        assert (r.before.revenue, r.before.cost, r.before.margin) == (b.revenue, b.cost, b.margin)
        assert r.after.cost == r.before.cost
        assert r.after.margin >= Decimal("0.25") * r.after.revenue
        assert r.after.losses <= Decimal("0.05") * 300
        assert len(r.after.period_margins) == 300
    data = report.to_json()
    assert [b["id"] for b in data["books"]] == ["per-token-2026-11", "gpu-hour-2026-11", "per-task-2026-11"]
    assert data["window"] == {"from": "2026-11-01T00:00:00Z", "to": "2026-12-01T00:00:00Z"}
    first = data["books"][0]
    assert Decimal(first["after"]["margin_pct"]) >= 25 and first["before"]["scale"] == "1"
    assert first["book"]["charges"][0]["price"]["amount"] == first["prices"][0]["after"]
    assert set(first["after"]["period_margin"]) == {"mean", "min", "p5", "p10", "p50", "p90", "p95", "max"}


def test_the_same_inputs_give_the_same_recommendation(month_url, report):
    again = run_recommendation(month_url, *MONTH, BOOKS, target="0.25", risk="0.05", draws=300)
    one, two = report.to_json(), again.to_json()
    one.pop("generated_at"), two.pop("generated_at")
    assert one == two
    other = run_recommendation(month_url, *MONTH, BOOKS[:1], target="0.25", risk="0.05", draws=300, seed=2)
    assert other.to_json()["books"][0]["before"]["period_margin"] != one["books"][0]["before"]["period_margin"]


def test_the_tables_fit_80_columns(report):
    console = Console(width=80, record=True, file=open("/dev/null", "w"), color_system=None)  # noqa: SIM115
    render_console(report, console)
    text = console.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    for r in report.recommendations:
        assert r.book.id in text and str(r.scale) in text


def _open(path: Path, ready: str):
    """Load a page in headless Chromium: (problems, modebar buttons' titles, links in mode bars, charts)."""
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("request", lambda r: problems.append(f"network: {r.url}")
                    if not r.url.startswith(("file:", "data:", "blob:")) else None)
            page.goto(path.as_uri())
            page.wait_for_function(ready, timeout=30000)
            titles = page.eval_on_selector_all(".modebar-btn", "els => els.map(e => e.getAttribute('data-title'))")
            links = page.eval_on_selector_all(".modebar a[href]", "els => els.map(e => e.href)")
            charts = page.eval_on_selector_all(".js-plotly-plot", "els => els.map(e => e.id)")
        finally:
            browser.close()
    return problems, titles, links, charts


def test_the_page_renders_offline_and_no_chart_control_sends_data_away(report, tmp_path):
    page = write_html(report, tmp_path / "recommend.html")
    html = page.read_text()
    assert "<script src=" not in html
    for key in ("displaylogo", "showSendToCloud", "showEditInChartStudio", "showLink"):
        assert PLOTLY_CONFIG[key] is False and f'"{key}": false' in html
    problems, titles, links, charts = _open(page, "document.querySelectorAll('.js-plotly-plot .main-svg').length >= 9")
    assert problems == []
    assert charts == [f"chart-{i}-{k}" for i in range(3) for k in ("distribution", "quantiles", "window")]
    assert links == []  # no plotly logo linking away
    assert titles and "Download plot as a PNG" in titles
    assert not [t for t in titles if _sends_away(t)]


def _sends_away(title: str) -> bool:
    """A mode-bar button that leaves the machine: plotly.js 4's "Share chart..." (sends the chart to Chart
    Studio), "Edit in Chart Studio" of older versions, the "Produced with Plotly.js" logo link."""
    return any(word in title.lower() for word in ("share", "cloud", "chart studio", "plotly"))


def test_plotlys_defaults_would_show_a_send_to_cloud_button(tmp_path):
    """The control for the test above: the same plotly.js with only displaylogo off (the defaults otherwise)
    shows "Share chart...", the button that sends the chart to Chart Studio, which the check above catches."""
    import plotly.graph_objects as go

    page = tmp_path / "default.html"
    page.write_text(go.Figure(go.Bar(x=["a"], y=[1])).to_html(full_html=True, include_plotlyjs=True,
                                                                config={"displaylogo": False}))
    _, titles, _, _ = _open(page, "document.querySelectorAll('.js-plotly-plot .main-svg').length >= 1")
    assert [t for t in titles if _sends_away(t)] == ["Share chart..."]


# --- the command ------------------------------------------------------------------------------------

ARGS = ["pricing", "recommend", "--from", "2026-11-01T00:00:00Z", "--to", "2026-12-01T00:00:00Z"]


def test_the_command_prints_json_and_writes_the_page(cli, month_url, tmp_path):  # noqa: F811
    page = tmp_path / "r.html"
    result = cli(month_url, *ARGS, "--price-book", str(BOOKS[0]), "--target-margin", "0.25", "--risk", "0.05",
                 "--draws", "200", "--json", "--html", str(page))
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert data["target_margin"] == "0.25" and data["risk"] == "0.05" and data["draws"] == 200
    assert data["books"][0]["id"] == "per-token-2026-11" and Decimal(data["books"][0]["scale"]) > 1
    assert page.stat().st_size > 10_000
    table = cli(month_url, *ARGS, "--price-book", str(BOOKS[0]), "--target-margin", "0.25", "--risk", "0.05",
                "--draws", "200")
    assert table.code == 0 and "Scale each book's prices by" in table.out and data["books"][0]["scale"] in table.out


@pytest.mark.parametrize(("args", "says"), [
    (["--target-margin", "1", "--risk", "0.05"], "--target-margin must be greater than -1 and less than 1"),
    (["--target-margin", "-1", "--risk", "0.05"], "--target-margin must be greater than -1 and less than 1"),
    (["--target-margin", "1.5", "--risk", "0.05"], "--target-margin must be greater than -1 and less than 1"),
    (["--target-margin", "lots", "--risk", "0.05"], "--target-margin must be a decimal number"),
    (["--target-margin", "0.25", "--risk", "0"], "--risk must be greater than 0 and less than 1"),
    (["--target-margin", "0.25", "--risk", "1"], "--risk must be greater than 0 and less than 1"),
    (["--target-margin", "0.25", "--risk", "-0.05"], "--risk must be greater than 0 and less than 1"),
])
def test_a_target_or_risk_out_of_range_is_one_clear_line(cli, month_url, args, says):  # noqa: F811
    result = cli(month_url, *ARGS, "--price-book", str(BOOKS[0]), *args)
    assert result.code == 2 and result.out == ""
    assert len(result.err.strip().splitlines()) == 1 and says in result.err, result.err


def test_an_unreadable_book_and_an_empty_window_are_one_clear_line(cli, month_url, tmp_path):  # noqa: F811
    bad = tmp_path / "bad.yaml"
    bad.write_text("id: x\ncurrency: USD\ncharges:\n  - meter: [\n")
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("id: x\ncurrency: XXX\ncharges:\n  - meter: nothing\n    price: {type: unit, amount: 1.5}\n")
    cases = [
        (["--price-book", str(tmp_path / "missing.yaml")], "cannot read the file"),
        (["--price-book", str(bad)], "not valid YAML"),
        (["--price-book", str(wrong)], "unknown currency"),
        (["--price-book", str(BOOKS[0]), "--from", "2026-11-01T00:00:00Z", "--to", "2026-11-01T00:00:00Z"], "to must be after from"),
        (["--price-book", str(BOOKS[0]), "--from", "2026-11-02T00:00:00Z", "--to", "2026-11-01T00:00:00Z"], "to must be after from"),
        (["--price-book", str(BOOKS[0]), "--from", "2025-01-01T00:00:00Z", "--to", "2025-02-01T00:00:00Z"],
         "no metered usage"),
        (["--price-book", str(BOOKS[0]), "--from", "2026-11-01T00:00:00Z", "--to", "2026-11-01T06:00:00Z"],
         "no whole day"),
    ]
    for extra, says in cases:
        window = [] if "--from" in extra else ARGS[2:]
        result = cli(month_url, *ARGS[:2], *window, *extra, "--target-margin", "0.25", "--risk", "0.05")
        assert result.code == 2 and result.out == "", (extra, result.err)
        assert len(result.err.strip().splitlines()) == 1 and says in result.err, (extra, result.err)
