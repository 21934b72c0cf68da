"""`infermeter pricing recommend`: load a window of metered history and find, per price book, the
smallest scale of its prices that meets a target margin with a bounded risk of a loss-making billing
period (`pricing.recommend` does the search, pure); the report as JSON and terminal tables. Its HTML
page is `pricing_service.recommend_html`.

What is loaded (docs/pricing.md, "Price recommendation"): each whole day of the window and the part
after the last whole day, each customer's usage of it as invoices load it
(`pricing_service.rate_period.load_period_usages`, once for every book; a book that trusts only some
task outcome sources gets its task meters counted its way, `usages_for_book`), and its cost under the
cost model (the window's dataset attributed once, `pricing.cost.attribute`, its hours summed per day,
usage meters at their unit cost), which is how `pricing compare` costs the same window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from infermeter.times import utc_now, utc_text
from pricing.book import PriceBook, price_book_to_data
from pricing.bootstrap import DRAWS
from pricing.cost import CostModel, attribute
from pricing.money import Currency
from pricing.recommend import PERIOD_DAYS, Chunk, History, Outcome, Recommendation, percent, recommend
from pricing_service.books import EXAMPLE_COST_MODEL, read_cost_model, read_price_book
from pricing_service.compare import STORED_PREFIX, resolve_books
from pricing_service.rate_period import load_period_usages, needs_deployment, priced_meters, usages_for_book
from pricing_service.source import check_window, connect, load_dataset

DAY = timedelta(days=1)
ZERO = Decimal(0)


def load_histories(conn, start: datetime, end: datetime, books: Sequence[PriceBook],
                   cost_model: CostModel) -> list[History]:
    """The window's history as each book rates it (one `History` per book, in order)."""
    start, end = check_window(start, end)
    bounds = []
    t = start
    while t + DAY <= end:
        bounds.append((t, t + DAY))
        t += DAY
    whole_days = len(bounds)
    if t < end:
        bounds.append((t, end))
    dataset = load_dataset(conn, start, end)
    attribution = attribute(dataset, cost_model)
    costs = [ZERO] * len(bounds)

    def chunk_of(hour: datetime) -> int:
        return min(len(bounds) - 1, int((hour - start) / DAY))

    for key, value in attribution.cost.items():
        costs[chunk_of(key.hour)] += value
    for m in dataset.meters:
        if start <= m.hour < end:
            costs[chunk_of(m.hour)] += cost_model.usage_cost(m.meter, m.quantity)
    # a minimum commitment bills customers whatever they used: then every meter is read, so that every
    # customer with usage in the window is rated, as `pricing compare` rates them
    meters = None if any(b.minimum is not None for b in books) else priced_meters(*books)
    shared = [load_period_usages(conn, a, b, cost_model, meters=meters, by_deployment=needs_deployment(*books))
              for a, b in bounds]
    attributed = {k.customer_id for k in attribution.cost if k.customer_id}
    out = []
    for book in books:
        usages = [usages_for_book(conn, dict(u), book, a, b) for u, (a, b) in zip(shared, bounds, strict=True)]
        chunks = [Chunk(a, b, u, c) for (a, b), u, c in zip(bounds, usages, costs, strict=True)]
        customers = sorted(attributed.union(*(u.keys() for u in usages)))
        out.append(History(start, end, cost_model.currency, chunks[:whole_days],
                           chunks[whole_days] if len(chunks) > whole_days else None, customers))
    return out


@dataclass
class RecommendationReport:
    start: datetime
    end: datetime
    recommendations: list[Recommendation]
    sources: list[str]
    cost_model_source: str
    generated_at: datetime = field(default_factory=utc_now)

    @property
    def currency(self) -> str:
        return self.recommendations[0].book.currency

    def to_json(self) -> dict[str, Any]:
        """{"window", "currency", "target_margin", "risk", "draws", "period_days", "seed", "books": [{"id",
        "scale", "change_pct", "binding", "before", "after", "prices", "book"}], ...}: amounts as decimal strings."""
        first = self.recommendations[0]
        return {
            "window": {"from": utc_text(self.start), "to": utc_text(self.end)},
            "currency": self.currency,
            "target_margin": str(first.target),
            "risk": str(first.risk),
            "draws": first.draws,
            "period_days": first.period_days,
            "seed": first.seed,
            "books": [_book_json(r, source) for r, source in zip(self.recommendations, self.sources, strict=True)],
            "cost_model": self.cost_model_source,
            "generated_at": utc_text(self.generated_at),
        }


def change_pct(scale: Decimal) -> str:
    """The price change a scale makes, in percent: 1.2345 -> +23.45."""
    change = (scale - 1) * 100
    return f"{'+' if change >= 0 else ''}{change.normalize():f}" if change else "0"


def _outcome_json(o: Outcome, money: Currency) -> dict[str, Any]:
    share = o.margin_share
    return {
        "scale": str(o.scale),
        "revenue": str(o.revenue),
        "cost": str(o.cost),
        "margin": str(o.margin),
        "margin_pct": None if share is None else percent(share).rstrip("%"),
        "loss_probability": str(o.loss_probability),
        "losing_periods": o.losses,
        "period_margin": {k: str(v) for k, v in o.quantiles(money).items()},
    }


def _book_json(r: Recommendation, source: str) -> dict[str, Any]:
    money = r.book.money
    return {
        "id": r.book.id,
        "source": source,
        "scale": str(r.scale),
        "change_pct": change_pct(r.scale),
        "binding": r.binding,
        "precision": r.places,
        "before": _outcome_json(r.before, money),
        "after": _outcome_json(r.after, money),
        "prices": [{"where": c.where, "charge": c.charge, "before": str(c.before), "after": str(c.after)}
                   for c in r.changes],
        "book": price_book_to_data(r.scaled),
    }


def check_inputs(start: datetime, end: datetime, book_specs: Sequence[str | Path], target: object,
                 risk: object) -> tuple[datetime, datetime, Decimal, Decimal]:
    """Everything that can be checked before the database is touched: the target and the risk, the window
    (whole hours, not empty) and that each book file reads and validates. One error, saying what is wrong."""
    from pricing.recommend import check_risk, check_target

    target, risk = check_target(target), check_risk(risk)
    start, end = check_window(start, end)
    for spec in book_specs:
        if not str(spec).startswith(STORED_PREFIX):
            read_price_book(Path(spec))
    return start, end, target, risk


def run_recommendation(database_url: str, start: datetime, end: datetime, book_specs: Sequence[str | Path],
                       cost_model_path: Path | None = None, *, target: object, risk: object, draws: int = DRAWS,
                       period_days: int = PERIOD_DAYS, seed: int = 1) -> RecommendationReport:
    """Recommend a scale for each book (a path, or `stored:<book id>` for the stored version in force at
    `start`) over [start, end) (see the module doc)."""
    start, end, target, risk = check_inputs(start, end, book_specs, target, risk)
    cost_model = read_cost_model(cost_model_path)
    with connect(database_url) as conn:
        books, sources = resolve_books(conn, list(book_specs), start)
        histories = load_histories(conn, start, end, books, cost_model)
    results = [recommend(b, h, target=target, risk=risk, draws=draws, period_days=period_days, seed=seed)
               for b, h in zip(books, histories, strict=True)]
    return RecommendationReport(start, end, results, sources, str(cost_model_path or EXAMPLE_COST_MODEL))


def render_console(report: RecommendationReport, console: Console) -> None:
    """The recommendation as terminal tables, each readable in 80 columns: each cell shows the book as
    it is above the book at the recommended scale."""
    first = report.recommendations[0]
    cur = report.currency
    console.print(
        f"[bold]Price recommendation[/bold] {utc_text(report.start)} .. {utc_text(report.end)} ({cur}): a margin of "
        f"at least {percent(first.target)} of revenue, and a loss-making {first.period_days}-day billing period at "
        f"most {percent(first.risk)} likely ({first.draws} periods drawn from the window's days, seed {first.seed})",
        highlight=False,
    )
    t = Table(title="Scale each book's prices by (cells: as it is / at the scale)")
    for col in ("book", "scale", "change", "margin", "margin %", "P(loss)"):
        t.add_column(col, justify="left" if col == "book" else "right", no_wrap=True)
    for r in report.recommendations:
        t.add_row(r.book.id, str(r.scale), f"{change_pct(r.scale)}%", f"{r.before.margin}\n{r.after.margin}",
                  f"{percent(r.before.margin_share)}\n{percent(r.after.margin_share)}",
                  f"{percent(r.before.loss_probability)}\n{percent(r.after.loss_probability)}")
    console.print(t)
    t = Table(title=f"Margin per {first.period_days}-day billing period ({cur}): as it is / at the scale")
    for col in ("book", "p5", "p50", "p95", "mean"):
        t.add_column(col, justify="left" if col == "book" else "right", no_wrap=True)
    for r in report.recommendations:
        q0, q1 = r.before.quantiles(r.book.money), r.after.quantiles(r.book.money)
        t.add_row(r.book.id, *[f"{q0[k]}\n{q1[k]}" for k in ("p5", "p50", "p95", "mean")])
    console.print(t)
    for r in report.recommendations:
        t = Table(title=f"{r.book.id}: prices x {r.scale}, rounded up to {r.places} decimals")
        for col in ("charge", "price", "at the scale"):
            t.add_column(col, justify="left" if col == "charge" else "right")
        for c in r.changes:
            t.add_row(c.charge + (c.where[c.where.index(".tiers"):] if ".tiers" in c.where else "") or c.where,
                      str(c.before), str(c.after))
        console.print(t)
        why = {"target": "the target margin", "risk": "the loss risk", "both": "both conditions"}[r.binding]
        console.print(f"{r.book.id}: {why} sets the scale.", highlight=False)
