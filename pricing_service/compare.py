"""`infermeter pricing compare`: load a window of metered usage, rate it under each book and cost it
(`run_comparison`). The report it returns, and its renderings, are `pricing_service.comparison_report`
(console tables, JSON, CSV) and `pricing_service.report_html` (HTML)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from infermeter.times import utc_text
from pricing.book import PriceBook, PriceBookError
from pricing.cost import CostModel
from pricing.experiments import ExperimentUsages, compare, experiment_buckets
from pricing.records import Dataset
from pricing.usage import Usage
from pricing_service.anatomy import load_anatomy_inputs
from pricing_service.books import book_in_force, read_cost_model, read_price_book
from pricing_service.comparison_report import ComparisonReport
from pricing_service.rate_period import load_period_usages, usages_for_book
from pricing_service.source import check_window, connect, load_dataset

STORED_PREFIX = "stored:"


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
                raise PriceBookError(spec_text, [("", f"no stored version of {book_id!r} is in force at {utc_text(at)}")])
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
