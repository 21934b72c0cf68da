"""The `infermeter pricing ...` commands: compare, shadow, books import/list."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import psycopg
import typer
from rich.console import Console
from rich.table import Table

from infermeter.settings import get_settings
from infermeter.stack import StackError
from infermeter.stack.local import open_stack
from pricing.book import PriceBookError
from pricing.cost import CostModelError
from pricing.experiments import ExperimentError

app = typer.Typer(help="Price books, pricing experiments and shadow rating.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
books_app = typer.Typer(help="Price books stored in the database with effective dates.", no_args_is_help=True)
app.add_typer(books_app, name="books")

console = Console()
err = Console(stderr=True)

EXPECTED = (PriceBookError, CostModelError, ExperimentError, StackError, ValueError, OSError, psycopg.Error)


@contextmanager
def _clear_errors(*, one_line: bool = False) -> Iterator[None]:
    try:
        yield
    except EXPECTED as exc:
        message = str(exc).strip() or type(exc).__name__
        if one_line:  # a book with several problems, a YAML error with its context: one line all the same
            message = "; ".join(part.strip() for part in message.splitlines() if part.strip())
        err.print(f"[red]error:[/red] {message}", markup=True, highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def _database_url() -> str:
    settings = get_settings()
    with open_stack(settings, broker=False) as stack:
        return stack.database_url


@app.command("compare")
def compare_cmd(
    start: Annotated[str, typer.Option("--from", help="Window start, a whole UTC hour (e.g. 2026-11-02T00:00:00Z).")],
    end: Annotated[str, typer.Option("--to", help="Window end (exclusive), a whole hour.")],
    price_book: Annotated[list[str], typer.Option("--price-book", help="A price book YAML, or stored:<book id>; the first is the baseline. Repeat.")],
    cost_model: Annotated[Path | None, typer.Option("--cost-model", help="Cost model YAML (default: INFERMETER_PRICING_COST_MODEL or pricing_books/cost-model.yaml).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON instead of tables.")] = False,
    html_out: Annotated[Path | None, typer.Option("--html", help="Write the HTML report (charts) here.")] = None,
    csv_out: Annotated[Path | None, typer.Option("--csv", help="Write revenue/cost per book and customer as CSV here.")] = None,
) -> None:
    """Rate the same metered usage under each price book: revenue, cost, margin, risk, caching, retries."""
    from infermeter.times import parse_time
    from pricing_service.compare import run_comparison
    from pricing_service.comparison_report import render_console

    with _clear_errors():
        window = parse_time(start, "--from"), parse_time(end, "--to")
        cost_model = cost_model or get_settings().pricing_cost_model
        with err.status("Loading usage and rating it under each book...", spinner="dots"):
            report = run_comparison(_database_url(), window[0], window[1], [Path(p) if not p.startswith("stored:") else p for p in price_book], cost_model)
        if as_json:
            sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
        else:
            render_console(report, console)
        if html_out:
            from pricing_service.report_html import write_html

            written = write_html(report, html_out)
            err.print(f"HTML report: {written}")
        if csv_out:
            report.write_csv(csv_out)
            err.print(f"CSV: {csv_out}")


@app.command("recommend")
def recommend_cmd(
    price_book: Annotated[list[str], typer.Option("--price-book", help="A price book YAML, or stored:<book id>. Repeat for several.")],
    target_margin: Annotated[str, typer.Option("--target-margin", help="The margin to reach over the window, a share of revenue in (-1, 1) (0.25: 25%).")],
    risk: Annotated[str, typer.Option("--risk", help="The largest acceptable probability, in (0, 1), of a billing period with a negative margin.")],
    start: Annotated[str, typer.Option("--from", help="Window start, a whole UTC hour (e.g. 2026-11-01T00:00:00Z).")],
    end: Annotated[str, typer.Option("--to", help="Window end (exclusive), a whole hour; at least a day after --from.")],
    cost_model: Annotated[Path | None, typer.Option("--cost-model", help="Cost model YAML (default: INFERMETER_PRICING_COST_MODEL or pricing_books/cost-model.yaml).")] = None,
    draws: Annotated[int, typer.Option(min=1, max=100_000, help="Billing periods to bootstrap from the window's days.")] = 400,
    period_days: Annotated[int, typer.Option("--period-days", min=1, max=366, help="Days in a billing period.")] = 30,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap (the same seed, window and books give the same answer).")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print the recommendation as JSON instead of tables.")] = False,
    html_out: Annotated[Path | None, typer.Option("--html", help="Write the HTML page (margin distributions before and after) here.")] = None,
) -> None:
    """Scale a book's prices so that over the window the margin reaches --target-margin and a billing
    period loses money with probability at most --risk (docs/pricing.md, "Price recommendation")."""
    from infermeter.times import parse_time
    from pricing_service.recommend import check_inputs, render_console, run_recommendation

    with _clear_errors(one_line=True):
        window = parse_time(start, "--from"), parse_time(end, "--to")
        check_inputs(*window, price_book, target_margin, risk)  # before the database starts
        cost_model = cost_model or get_settings().pricing_cost_model
        with err.status("Loading usage and searching for the scale...", spinner="dots"):
            report = run_recommendation(_database_url(), window[0], window[1], price_book, cost_model,
                                        target=target_margin, risk=risk, draws=draws, period_days=period_days, seed=seed)
        if as_json:
            sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
        else:
            render_console(report, console)
        if html_out:
            from pricing_service.recommend_html import write_html

            err.print(f"HTML report: {write_html(report, html_out)}")


@app.command("shadow")
def shadow_cmd(
    customer: Annotated[str | None, typer.Option("--customer", help="Only this customer.")] = None,
    price_book: Annotated[list[Path] | None, typer.Option("--price-book", help="Candidate books (default: INFERMETER_PRICING_BOOKS).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    as_of: Annotated[str | None, typer.Option("--as-of", help="Rate the month of this time, up to the end of its hour (RFC 3339; default: now).")] = None,
) -> None:
    """Live running revenue of the current month under every candidate book, per customer."""
    from infermeter.times import parse_time
    from pricing_service.books import book_paths, read_cost_model, read_price_book
    from pricing_service.shadow import shadow_rating

    with _clear_errors():
        now = None if as_of is None else parse_time(as_of, "--as-of")
        settings = get_settings()
        books = [read_price_book(p) for p in (price_book or book_paths(settings.pricing_books))]
        cost_model = read_cost_model(settings.pricing_cost_model)
        report = shadow_rating(_database_url(), books, cost_model, now=now, customer_id=customer)
        if as_json:
            sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
            return
        table = Table(title=f"Running revenue {report.period_start:%Y-%m-%d %H:%M}Z .. now ({report.as_of:%Y-%m-%d %H:%M:%S}Z), live")
        table.add_column("customer")
        for b in books:
            table.add_column(f"{b.id} ({b.currency})", justify="right")
        by = {(x.customer_id, x.book_id): x for x in report.lines}
        for c in sorted({x.customer_id for x in report.lines}):
            table.add_row(c, *[str(by[(c, b.id)].revenue_to_date) for b in books])
        console.print(table)
        if not report.lines:
            console.print("No usage in the current period yet.")


@books_app.command("import")
def books_import(
    file: Annotated[Path, typer.Argument(help="Price book YAML.")],
    effective_from: Annotated[str, typer.Option("--effective-from", help="When this version comes into force (UTC time).")],
) -> None:
    """Validate a price book and store it as a version in force from --effective-from."""
    from infermeter.times import parse_time
    from pricing_service.books import import_book
    from pricing_service.source import connect

    with _clear_errors():
        at = parse_time(effective_from, "--effective-from")
        with connect(_database_url()) as conn:
            book, created = import_book(conn, file, at)
        state = "stored" if created else "already stored (same text)"
        console.print(f"{book.id} effective from {at.isoformat()}: {state}")


@books_app.command("list")
def books_list(
    book_id: Annotated[str | None, typer.Option("--id", help="Only this book.")] = None,
) -> None:
    """Stored price book versions and their effective dates."""
    from pricing_service.books import list_versions
    from pricing_service.source import connect

    with _clear_errors():
        with connect(_database_url()) as conn:
            versions = list_versions(conn, book_id)
        now = datetime.now(UTC)
        table = Table(title="Stored price books")
        for col in ("book", "effective from", "in force now", "sha256", "imported from"):
            table.add_column(col)
        current = {}
        for v in versions:
            if v.effective_from <= now:
                current[v.book_id] = v.effective_from
        for v in versions:
            table.add_row(v.book_id, v.effective_from.astimezone(UTC).isoformat(), "yes" if current.get(v.book_id) == v.effective_from else "",
                          v.sha256[:12], v.source_name)
        console.print(table)


cost_app = typer.Typer(help="What serving cost: the cost anatomy and failures by cause (docs/cost-model.md).",
                       no_args_is_help=True, pretty_exceptions_enable=False)


def _cost_model(path: Path | None):
    from pricing_service.books import read_cost_model

    return read_cost_model(path or get_settings().pricing_cost_model)


@cost_app.command("anatomy")
def anatomy_cmd(
    start: Annotated[str, typer.Option("--from", help="Window start, a whole UTC hour (e.g. 2026-11-02T00:00:00Z).")],
    end: Annotated[str, typer.Option("--to", help="Window end (exclusive), a whole hour.")],
    deployment: Annotated[str | None, typer.Option("--deployment", help="Only this deployment.")] = None,
    group_by: Annotated[str, typer.Option("--group-by", help="deployment, model or customer.")] = "deployment",
    cost_model: Annotated[Path | None, typer.Option("--cost-model", help="Cost model YAML (default: INFERMETER_PRICING_COST_MODEL).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The GPU cost of a window divided into new compute, context not reused, cache occupancy, queue
    and idle, and failure; the five parts add up to each row's total, to the cent."""
    from infermeter.times import parse_time
    from pricing.anatomy import GROUPS, TERMS
    from pricing_service.anatomy import cost_anatomy
    from pricing_service.source import connect

    with _clear_errors():
        if group_by not in GROUPS:
            raise ValueError(f"--group-by must be one of {', '.join(GROUPS)}, not {group_by!r}")
        window = parse_time(start, "--from"), parse_time(end, "--to")
        model = _cost_model(cost_model)
        with connect(_database_url()) as conn:
            result = cost_anatomy(conn, window[0], window[1], model, group_by=group_by, deployment=deployment)
        if as_json:
            data = result.to_json()
            data.pop("group_by")
            sys.stdout.write(json.dumps(data, indent=2) + "\n")
            return
        table = Table(title=f"Cost anatomy {start} .. {end} ({result.currency}), by {group_by}")
        table.add_column(group_by)
        for t in (*TERMS, "total"):
            table.add_column(t.replace("_", " "), justify="right")
        for r in result.rows:
            table.add_row(r.key or "(idle: platform)" if group_by == "customer" else r.key or "(idle)",
                          *[str(getattr(r, t)) for t in TERMS], str(r.total))
        table.add_row("TOTAL", *[str(result.term(t)) for t in TERMS], str(result.total))
        console.print(table)


@cost_app.command("failures")
def failures_cmd(
    start: Annotated[str, typer.Option("--from", help="Window start, a whole UTC hour.")],
    end: Annotated[str, typer.Option("--to", help="Window end (exclusive), a whole hour.")],
    cost_model: Annotated[Path | None, typer.Option("--cost-model", help="Cost model YAML.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Failed and wasted work by cause (runtime, capacity, routing, client, model, verifier), model and
    customer: cost and count, and the cause that grew most against the previous window of equal length."""
    from infermeter.times import parse_time
    from pricing_service.anatomy import failure_report
    from pricing_service.source import connect

    with _clear_errors():
        window = parse_time(start, "--from"), parse_time(end, "--to")
        model = _cost_model(cost_model)
        with connect(_database_url()) as conn:
            report = failure_report(conn, window[0], window[1], model)
        data = report.to_json()
        if as_json:
            sys.stdout.write(json.dumps(data, indent=2) + "\n")
            return
        table = Table(title=f"Failures by cause {start} .. {end} ({data['currency']})")
        for col in ("cause", "cost", "count", "previous cost", "previous count"):
            table.add_column(col, justify="left" if col == "cause" else "right")
        for now, before in zip(data["by_cause"], data["previous_by_cause"], strict=True):
            table.add_row(now["cause"], now["cost"], str(now["count"]), before["cost"], str(before["count"]))
        console.print(table)
        table = Table(title="By cause, kind, model and customer")
        for col in ("cause", "kind", "model", "customer", "cost", "count"):
            table.add_column(col, justify="right" if col in ("cost", "count") else "left")
        for r in data["rows"]:
            table.add_row(r["cause"], r["kind"], r["model"], r["customer_id"], r["cost"], str(r["count"]))
        console.print(table)
        grew = data["grew_most"]
        console.print("No cause grew against the previous window." if grew is None else
                      f"Grew most against the previous window: [bold]{grew['cause']}[/bold] (+{grew['by']} {data['currency']}).")
