"""`infermeter pricing compare`: load a window of metered usage, rate it under each book, cost it,
and report (console tables, JSON, CSV, HTML)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from pricing.book import PriceBook, PriceBookError
from pricing.cost import CostModel
from pricing.experiments import Comparison, ExperimentUsages, compare, experiment_buckets
from pricing.records import Dataset
from pricing.usage import Usage
from pricing_service.anatomy import load_anatomy_inputs
from pricing_service.books import book_in_force, read_cost_model, read_price_book
from pricing_service.rate_period import load_period_usages, usages_for_book
from pricing_service.source import check_window, connect, load_dataset

STORED_PREFIX = "stored:"


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _s(d: Decimal | None) -> str | None:
    return None if d is None else str(d)


@dataclass
class ComparisonReport:
    comparison: Comparison
    sources: list[str]
    cost_model_source: str
    generated_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    @property
    def books(self):
        return self.comparison.books

    def to_json(self) -> dict[str, Any]:
        """{"books": [{"id", "currency", "revenue", "cost", "margin", "customers": [{"customer_id",
        "revenue", "cost", ...}], ...}], ...}: amounts as decimal strings."""
        c = self.comparison
        books = []
        for source, b in zip(self.sources, c.books, strict=True):
            books.append(
                {
                    "id": b.book.id,
                    "currency": b.book.currency,
                    "revenue": str(b.revenue),
                    "cost": str(b.cost),
                    "margin": str(b.margin),
                    "customers": [
                        {
                            "customer_id": cr.customer_id,
                            "revenue": str(cr.revenue),
                            "cost": str(cr.cost),
                            "margin": str(cr.margin),
                            "versus_baseline": str(cr.versus_baseline),
                        }
                        for cr in b.customers
                    ],
                    "source": source,
                    "gross_margin_pct": _s(_pct(b.margin, b.revenue)),
                    "customers_paying_more_than_baseline": len(b.pays_more),
                    "customers_paying_less_than_baseline": len(b.pays_less),
                    "risk": {
                        "bucket": b.risk.bucket,
                        "margin_stdev": str(b.risk.margin_stdev),
                        "margin_min": _s(min(b.risk.margins, default=None)),
                        "margin_max": _s(max(b.risk.margins, default=None)),
                        "customer_margin_stdev": str(b.risk.customer_margin_stdev),
                        "loss_making_customers": b.risk.loss_making_customers,
                        "buckets": [
                            {"start": _iso(x.start), "revenue": str(x.revenue), "cost": str(x.cost), "margin": str(x.margin)}
                            for x in b.risk.buckets
                        ],
                    },
                    "caching": [
                        {
                            "model": g.model,
                            "cached_input_tokens": g.cached_input_tokens,
                            "cost_gain": str(g.cost_gain),
                            "passed_to_customers": str(g.passed_to_customers),
                            "kept_by_platform": str(g.kept_by_platform),
                            "cost_without_caching": str(g.cost_without_caching),
                            "revenue_without_caching": str(g.revenue_without_caching),
                        }
                        for g in b.caching
                    ],
                    "retries": None
                    if b.retries is None
                    else {
                        "retried_attempts": b.retries.retried_attempts,
                        "retried_cost": str(b.retries.retried_cost),
                        "revenue_from_retries": str(b.retries.revenue_from_retries),
                        "absorbed_by_platform": str(b.retries.absorbed_by_platform),
                        "paid_by": b.retries.paid_by,
                    },
                    "anatomy": [
                        {"term": e.term, "cost": str(e.cost), "billed_to_customers": str(e.billed_to_customers),
                         "carried_by_platform": str(e.carried_by_platform)}
                        for e in b.anatomy
                    ],
                }
            )
        return {
            "books": books,
            "window": {"from": _iso(c.start), "to": _iso(c.end)},
            "currency": c.currency,
            "usage": {k: format(v, "f") for k, v in c.usage_totals.items()},
            "cost_summary": {
                "total": str(c.cost_total_precise),
                "idle_shared_pool": str(c.idle_pool_cost),
                "by_model": {m: str(v) for m, v in c.cost_by_model.items()},
                "successful_tasks": c.successful_tasks,
                "cost_per_successful_task": _s(c.cost_per_successful_task),
                "anatomy": None if c.anatomy is None else c.anatomy.to_json(),
            },
            "cost_model": self.cost_model_source,
            "generated_at": _iso(self.generated_at),
        }

    def write_html(self, path: Path) -> Path:
        from pricing_service.report_html import write_html

        return write_html(self, path)

    def write_csv(self, path: Path) -> None:
        """One row per book x customer (plus a TOTAL row per book)."""
        with Path(path).open("w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(["book_id", "currency", "customer_id", "revenue", "cost", "margin", "versus_baseline"])
            for b in self.books:
                for cr in b.customers:
                    w.writerow([b.book.id, b.book.currency, cr.customer_id, cr.revenue, cr.cost, cr.margin, cr.versus_baseline])
                w.writerow([b.book.id, b.book.currency, "TOTAL", b.revenue, b.cost, b.margin, ""])


def _pct(part: Decimal, whole: Decimal) -> Decimal | None:
    if not whole:
        return None
    return (part * 100 / whole).quantize(Decimal("0.1"))


def default_book_paths() -> list[Path]:
    """The three example books, per-token first (the baseline), then GPU-hour and per-task."""
    from pricing_service.books import EXAMPLE_BOOKS_DIR

    return [EXAMPLE_BOOKS_DIR / n for n in ("per-token.yaml", "gpu-hour.yaml", "per-task.yaml")]


def resolve_books(conn, specs: list[str | Path], at: datetime) -> tuple[list[PriceBook], list[str]]:
    books, sources = [], []
    for spec in specs:
        spec_text = str(spec)
        if spec_text.startswith(STORED_PREFIX):
            book_id = spec_text[len(STORED_PREFIX):]
            book = book_in_force(conn, book_id, at)
            if book is None:
                raise PriceBookError(spec_text, [("", f"no stored version of {book_id!r} is in force at {_iso(at)}")])
        else:
            book = read_price_book(Path(spec))
        books.append(book)
        sources.append(spec_text)
    return books, sources


def run_comparison(
    database_url: str,
    start: datetime,
    end: datetime,
    book_paths: list[Path],
    cost_model_path: Path | None = None,
) -> ComparisonReport:
    """Rate [start, end) under each book (a path, or `stored:<book id>` for the stored version in force
    at `start`), the first being the baseline, and cost it with the cost model."""
    start, end = check_window(start, end)
    cost_model = read_cost_model(cost_model_path)
    with connect(database_url) as conn:
        books, sources = resolve_books(conn, list(book_paths), start)
        dataset = load_dataset(conn, start, end)
        usages = experiment_usages(conn, dataset, cost_model, books)
        anatomy_inputs = load_anatomy_inputs(conn, start, end)
    report = compare(dataset, books, cost_model, usages, anatomy_inputs)
    from pricing_service.books import EXAMPLE_COST_MODEL

    return ComparisonReport(report, sources, str(cost_model_path or EXAMPLE_COST_MODEL))


def experiment_usages(
    conn, dataset: Dataset, cost_model: CostModel, books: Sequence[PriceBook] = ()
) -> ExperimentUsages:
    """The usage an experiment rates, loaded as invoices load it (`load_period_usages`): the window,
    each risk bucket, and the window with prefix caching off for each model served in it. A book
    that trusts only some task outcome sources (`task_outcomes`) gets its own copy with the task
    meters counted its way (`usages_for_book`), as its invoices would count them."""
    start, end = dataset.start, dataset.end
    _, bounds = experiment_buckets(start, end)
    models = sorted({r.model for r in dataset.requests})
    shared = ExperimentUsages(
        _nonzero(load_period_usages(conn, start, end, cost_model)),
        [_nonzero(load_period_usages(conn, a, b, cost_model)) for a, b in bounds],
        {m: _nonzero(load_period_usages(conn, start, end, cost_model, caching_off_for=[m])) for m in models},
    )
    by_book = {}
    for position, book in enumerate(books):
        if book.task_outcomes is None:
            continue
        by_book[position] = ExperimentUsages(
            _nonzero(usages_for_book(conn, dict(shared.window), book, start, end)),
            [_nonzero(usages_for_book(conn, dict(u), book, a, b)) for u, (a, b) in zip(shared.buckets, bounds, strict=True)],
            {m: _nonzero(usages_for_book(conn, dict(u), book, start, end)) for m, u in shared.caching_off.items()},
        )
    return replace(shared, by_book=by_book) if by_book else shared


def _nonzero(usages: dict[str, Usage]) -> dict[str, Usage]:
    """Without zero quantities (SQL sums give 0 for, say, failed tasks of a customer with none): the
    experiment's usage totals list only meters with usage."""
    return {c: Usage.trusted(c, u.period_start, u.period_end, {k: q for k, q in u.quantities.items() if q})
            for c, u in usages.items()}


def render_console(report: ComparisonReport, console: Console) -> None:
    """The comparison as terminal tables, each readable in 80 columns: figures that do not depend on
    the book (cached tokens, what caching and retries cost) are printed once, not per book."""
    c = report.comparison
    cur = c.currency
    baseline = c.books[0]
    console.print(
        f"[bold]Pricing comparison[/bold] {_iso(c.start)} .. {_iso(c.end)} ({cur}); "
        f"baseline: [bold]{baseline.book.id}[/bold]"
    )
    if not baseline.customers:
        console.print(
            "[yellow]No metered usage in this window[/yellow] (request, task, usage or GPU rollups): "
            "check --from/--to against `infermeter usage`."
        )
    t = Table(title="Revenue, cost and gross margin per book")
    for col in ("book", "revenue", "cost", "margin", "margin %"):
        t.add_column(col, justify="left" if col == "book" else "right", no_wrap=col == "book")
    for b in c.books:
        pct = _pct(b.margin, b.revenue)
        t.add_row(b.book.id, str(b.revenue), str(b.cost), str(b.margin), "-" if pct is None else f"{pct}%")
    console.print(t)

    per = {"day": "daily", "hour": "hourly"}.get(baseline.risk.bucket, f"per {baseline.risk.bucket}")
    t = Table(title="Customers versus the baseline, and margin risk")
    for col in ("book", "pay more", "pay less", f"{per} margin sd", "loss-making customers"):
        t.add_column(col, justify="left" if col == "book" else "right", no_wrap=col == "book")
    for b in c.books:
        t.add_row(b.book.id, str(len(b.pays_more)), str(len(b.pays_less)),
                  str(b.risk.margin_stdev.quantize(Decimal("0.01"))), str(b.risk.loss_making_customers))
    console.print(t)

    t = Table(title="Top customers by baseline revenue: revenue under each book (change versus the baseline)")
    t.add_column("customer", no_wrap=True)
    for b in c.books:
        t.add_column(b.book.name or b.book.id, justify="right")
    t.add_column("cost", justify="right")
    for cr in sorted(baseline.customers, key=lambda x: x.revenue, reverse=True)[:10]:
        row = [cr.customer_id]
        for b in c.books:
            other = next(x for x in b.customers if x.customer_id == cr.customer_id)
            delta = other.versus_baseline
            row.append(f"{other.revenue}" + ("" if b is baseline else f"\n({'+' if delta >= 0 else ''}{delta})"))
        row.append(str(cr.cost))
        t.add_row(*row)
    console.print(t)
    console.print("columns: " + "; ".join(f"{b.book.name or b.book.id} = {b.book.id}" for b in c.books))

    t = Table(title="Prefix caching: the cost it saved per model")
    for col in ("model", "cached tokens", "cost saved"):
        t.add_column(col, justify="left" if col == "model" else "right", no_wrap=col == "model")
    for g in baseline.caching:
        t.add_row(g.model, f"{g.cached_input_tokens:,}", str(g.cost_gain))
    console.print(t)
    t = Table(title="Prefix caching: who gets the gain")
    for col in ("book", "model", "passed to customers", "kept by platform"):
        t.add_column(col, justify="left" if col in ("book", "model") else "right", no_wrap=col in ("book", "model"))
    for b in c.books:
        for g in b.caching:
            t.add_row(b.book.id, g.model, str(g.passed_to_customers), str(g.kept_by_platform))
    console.print(t)

    r0 = baseline.retries
    if r0 is not None:
        console.print(f"Retried task attempts: {r0.retried_attempts} costing {r0.retried_cost} {cur}.")
    t = Table(title="Retried task attempts: who pays")
    for col in ("book", "revenue from retries", "absorbed by platform", "paid by"):
        t.add_column(col, justify="left" if col in ("book", "paid by") else "right", no_wrap=col == "book")
    for b in c.books:
        r = b.retries
        t.add_row(b.book.id, *(["-", "-", "-"] if r is None else
                               [str(r.revenue_from_retries), str(r.absorbed_by_platform), r.paid_by]))
    console.print(t)
    if c.anatomy is not None:
        terms = ("new_compute", "context_not_reused", "cache_occupancy", "queue_and_idle", "failure")
        t = Table(title="Cost anatomy: the GPU cost's five parts (the same under every book)")
        for col in ("part", "cost"):
            t.add_column(col, justify="left" if col == "part" else "right")
        for x in terms:
            t.add_row(x.replace("_", " "), str(c.anatomy.term(x)))
        console.print(t)
        t = Table(title="Idle loss and failure cost: billed to customers or carried by the platform")
        for col in ("book", "margin", "idle billed", "idle carried", "failure billed", "failure carried"):
            t.add_column(col, justify="left" if col == "book" else "right", no_wrap=col == "book")
        for b in c.books:
            e = {x.term: x for x in b.anatomy}
            t.add_row(b.book.id, str(b.margin),
                      *[str(v) for x in ("queue_and_idle", "failure")
                        for v in (e[x].billed_to_customers, e[x].carried_by_platform)])
        console.print(t)
    cpt = c.cost_per_successful_task
    console.print(
        f"Cost {c.cost_total_precise.quantize(Decimal('0.01'))} {cur} (idle shared pool {c.idle_pool_cost}); "
        f"{c.successful_tasks} successful tasks, cost per successful task "
        f"{'-' if cpt is None else cpt.quantize(Decimal('0.0001'))} {cur}."
    )
