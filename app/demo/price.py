"""The demo's pricing: the comparison of the example books over the month, then the price recommendation."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from rich.console import Console

# The price recommendation the pricing step ends with: a 25% margin, a loss-making month at most 5% likely.
RECOMMEND_TARGET, RECOMMEND_RISK = "0.25", "0.05"


def compare_prices(database_url: str, start: datetime, end: datetime, out_dir: Path, console: Console) -> dict | None:
    """The pricing comparison of the example books, then how far to scale each book's prices to reach
    a 25% margin with a loss-making month at most 5% likely (pricing_service)."""
    from pricing_service import recommend, recommend_html
    from pricing_service.compare import default_book_paths, run_comparison
    from pricing_service.comparison_report import render_console
    from pricing_service.report_html import write_html

    report = run_comparison(database_url, start, end, default_book_paths())
    render_console(report, console)
    html = out_dir / "pricing.html"
    write_html(report, html)
    console.print(f"pricing report: {html}")
    advice = recommend.run_recommendation(database_url, start, end, default_book_paths(), target=RECOMMEND_TARGET,
                                          risk=RECOMMEND_RISK)
    recommend.render_console(advice, console)
    console.print(f"price recommendation: {recommend_html.write_html(advice, out_dir / 'recommend.html')}")
    return {**report.to_json(), "recommendation": advice.to_json()}
