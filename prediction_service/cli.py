"""`infermeter predict fit|status|backtest|eval|forecast` and `infermeter quote` (docs/prediction.md).

Errors print one line (`error: ...`) and exit 2.
"""

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
from infermeter.stack.postgres import to_libpq_url
from infermeter.times import parse_time

app = typer.Typer(help="Predictors learned from metered history: fit, status, backtest, eval, forecast.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
console = Console()
err = Console(stderr=True)


@contextmanager
def _clear_errors() -> Iterator[None]:
    from prediction_service.quotes import QuoteRefused
    from prediction_service.store import NotFitted

    try:
        yield
    except (QuoteRefused, NotFitted, StackError, ValueError, LookupError, OSError, psycopg.Error) as exc:
        message = (str(exc).strip() or type(exc).__name__).splitlines()[0]
        err.print(f"[red]error:[/red] {message}", markup=True, highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


@contextmanager
def _connection() -> Iterator[psycopg.Connection]:
    with open_stack(get_settings(), broker=False) as stack, psycopg.connect(to_libpq_url(stack.database_url)) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        yield conn


def _print_json(payload: object) -> None:
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")


def _window(start: str | None, end: str | None) -> tuple[datetime, datetime]:
    from prediction_service.schedule import default_window

    if (start is None) != (end is None):
        raise ValueError("give both --from and --to, or neither (the last INFERMETER_PREDICT_WINDOW_DAYS days)")
    if start is None:
        return default_window(datetime.now(UTC), get_settings().predict_window_days)
    return parse_time(start, "--from"), parse_time(end, "--to")


def _cost_model(path: Path | None):
    from pricing_service.books import read_cost_model

    return read_cost_model(path or get_settings().pricing_cost_model)


FROM = Annotated[str, typer.Option("--from", help="Start, inclusive (ISO 8601, e.g. 2026-11-01T00:00:00Z).")]
TO = Annotated[str, typer.Option("--to", help="End, exclusive.")]
AS_JSON = Annotated[bool, typer.Option("--json", help="Print JSON.")]


@app.command("fit")
def fit_cmd(
    start: Annotated[str | None, typer.Option("--from", help="Start of the history to learn from (default: "
                                              "INFERMETER_PREDICT_WINDOW_DAYS before the current hour).")] = None,
    end: Annotated[str | None, typer.Option("--to", help="End, exclusive (default: the current hour).")] = None,
    as_json: AS_JSON = False,
) -> None:
    """Fit the predictors on metered history and keep them as the next version."""
    from prediction_service.store import fit

    with _clear_errors():
        window = _window(start, end)
        with _connection() as conn:
            info = fit(conn, *window, now=datetime.now(UTC), trigger="cli")
    if as_json:
        _print_json(info.to_json())
        return
    console.print(f"fitted version {info.version} on {info.requests:,} requests and {info.tasks:,} tasks of "
                  f"[{window[0]:%Y-%m-%d %H:%M}, {window[1]:%Y-%m-%d %H:%M}) UTC in {info.fit_cpu_ms / 1000:.2f} CPU-s",
                  highlight=False)


@app.command("status")
def status_cmd(as_json: AS_JSON = False) -> None:
    """What is fitted: the version in force, its window, when, how many rows, and the fits before it."""
    from prediction_service.store import status

    with _clear_errors(), _connection() as conn:
        result = status(conn)
    if as_json:
        _print_json(result)
        return
    if not result["fitted"]:
        console.print(result["message"], highlight=False)
        return
    console.print(f"version {result['version']}: fitted {result['fitted_at']} ({result['trigger']}) on "
                  f"[{result['window']['from']}, {result['window']['to']}): {result['requests']:,} requests, "
                  f"{result['tasks']:,} tasks; {result['request_cells']:,} request cells, models "
                  f"{', '.join(result['models']) or '-'}, {result['customers']:,} customers", highlight=False)
    table = Table("version", "fitted at", "window", "requests", "tasks", "CPU s", "trigger", title="fits")
    for f in result["fits"]:
        table.add_row(str(f["version"]), f["fitted_at"], f"{f['window']['from']} .. {f['window']['to']}",
                      f"{f['requests']:,}", f"{f['tasks']:,}", f"{f['fit_cpu_ms'] / 1000:.2f}", f["trigger"])
    console.print(table)


@app.command("backtest")
def backtest_cmd(start: FROM, end: TO, as_json: AS_JSON = False,
                 warmup_days: Annotated[int, typer.Option(min=0, help="Days of history before --from the replay "
                                                          "starts with.")] = 28) -> None:
    """Replay the window's requests in time order, each predicted from only what was metered before it."""
    from prediction.scoring import Scored, score
    from prediction_service.evaluate import backtest_window

    with _clear_errors():
        window = parse_time(start, "--from"), parse_time(end, "--to")
        with _connection() as conn:
            rows = backtest_window(conn, *window, warmup_days=warmup_days)
    if as_json:
        sys.stdout.write(json.dumps({"predictions": [r.to_json() for r in rows]}) + "\n")
        return
    overall = score(Scored(r.request.customer_id, r.request.model, r.request.status, r.request.output_tokens,
                           r.request.cached_fraction, r.request.failed, r.prediction, r.baseline_p50)
                    for r in rows)["all"]
    console.print(f"{len(rows):,} requests predicted; p90 covers {overall.get('coverage_p90', 0):.1%}, p99 "
                  f"{overall.get('coverage_p99', 0):.1%}; --json prints every prediction", highlight=False)


def _metrics_table(title: str, rows: list[dict]) -> Table:
    table = Table("customer", "model", "requests", "MAE p50", "median MAE", "pinball p90", "pinball p99",
                  "cov p90", "cov p99", "cached MAE", "failure Brier", title=title)
    for r in rows:
        if not r.get("requests"):
            continue
        table.add_row(r.get("customer_id", "all"), r.get("model", ""), f"{r['requests']:,}", f"{r['mae_p50']:.1f}",
                      f"{r['baseline_mae_p50']:.1f}", f"{r['pinball_p90']:.2f}", f"{r['pinball_p99']:.2f}",
                      f"{r['coverage_p90']:.1%}", f"{r['coverage_p99']:.1%}", f"{r['cached_fraction_mae']:.3f}",
                      f"{r['failure_brier']:.4f}")
    return table


def _admission_table(title: str, rows: list[dict]) -> Table:
    table = Table("customer", "model", "requests", "MAE p50", "pinball p90", "pinball p99", "cov p90", "cov p99",
                  "cached MAE", "failure Brier", title=title)
    for r in rows:
        if r.get("requests"):
            table.add_row(r.get("customer_id", "all"), r.get("model", ""), f"{r['requests']:,}", f"{r['mae_p50']:.1f}",
                          f"{r['pinball_p90']:.2f}", f"{r['pinball_p99']:.2f}", f"{r['coverage_p90']:.1%}",
                          f"{r['coverage_p99']:.1%}", f"{r['cached_fraction_mae']:.3f}", f"{r['failure_brier']:.4f}")
    return table


@app.command("eval")
def eval_cmd(
    start: FROM, end: TO, as_json: AS_JSON = False,
    predictions: Annotated[str, typer.Option(help="Score the backtest's predictions, or those the gateway "
                                             "recorded at admission (admission).")] = "backtest",
    spend: Annotated[bool, typer.Option(help="Also check the 80% spend interval at each period's middle.")] = True,
    cost_model: Annotated[Path | None, typer.Option(help="Cost model YAML (GPU time for GPU-hour books).")] = None,
) -> None:
    """Score predictions against what happened: MAE of p50, pinball loss and coverage of p90/p99, by customer
    and model, beside an online per-(customer, model) median; the predictions made at admission as metering
    scored them at ingest; and the 80% spend interval's calibration."""
    from prediction_service.evaluate import evaluate

    with _clear_errors():
        window = parse_time(start, "--from"), parse_time(end, "--to")
        with _connection() as conn:
            result = evaluate(conn, *window, predictions=predictions, spend=spend, cost_model=_cost_model(cost_model))
    if as_json:
        _print_json(result)
        return
    console.print(_metrics_table(f"predictions ({predictions}) [{start}, {end})", [result["all"]]))
    console.print(_metrics_table("by customer and model", result["groups"]))
    if result["unscored"]:
        console.print(f"{result['unscored']:,} requests carried no admission-time prediction", highlight=False)
    admission = result["admission"]
    hours = f"[{admission['hours']['from']}, {admission['hours']['to']})"
    if admission["all"]["requests"]:
        console.print(_admission_table(f"as predicted at admission, scored at ingest {hours}",
                                       [admission["all"], *admission["groups"]]))
    else:
        console.print(f"no request in {hours} carried a prediction made at admission", highlight=False, soft_wrap=True)
    if spend and result["spend"]["periods"]:
        s = result["spend"]
        console.print(f"spend forecast at mid-period: the actual fell inside the 80% interval for {s['inside']} of "
                      f"{s['periods']} customer-periods ({s['coverage']:.0%})", highlight=False)


@app.command("forecast")
def forecast_cmd(
    customer: Annotated[list[str] | None, typer.Option(help="Only this customer (repeat).")] = None,
    as_of: Annotated[str | None, typer.Option("--as-of", help="Forecast as of this instant (default now).")] = None,
    platform: Annotated[bool, typer.Option(help="Also the platform's month: revenue, cost, margin per book.")] = False,
    price_book: Annotated[list[Path] | None, typer.Option("--price-book", help="Books for --platform (repeat; "
                                                         "default INFERMETER_PRICING_BOOKS).")] = None,
    cost_model: Annotated[Path | None, typer.Option(help="Cost model YAML.")] = None,
    as_json: AS_JSON = False,
) -> None:
    """Each customer's spend at the end of its billing period with an 80% interval, when its prepaid credit
    or monthly budget runs out; with --platform the month's revenue, cost and margin under each book."""
    from prediction_service.budgets import ServingBudgets
    from prediction_service.forecast import customer_forecasts, platform_forecasts
    from pricing_service.books import book_paths, read_price_book

    with _clear_errors():
        settings = get_settings()
        moment = parse_time(as_of, "--as-of") if as_of else datetime.now(UTC)
        model = _cost_model(cost_model)
        with open_stack(settings, broker=False) as stack, psycopg.connect(to_libpq_url(stack.database_url)) as conn:
            conn.execute("SET TIME ZONE 'UTC'")
            with ServingBudgets(stack.database_url, stack.settings_for(settings)) as budgets:
                rows = customer_forecasts(conn, moment, cost_model=model, customer_ids=customer or None,
                                          budgets=budgets)
            result: dict = {"customers": rows}
            if platform:
                books = [read_price_book(p) for p in (price_book or book_paths(settings.pricing_books))]
                result["platform"] = platform_forecasts(conn, moment, books, model)
    if as_json:
        _print_json(result)
        return
    table = Table("customer", "period", "to date", "expected", "80% interval", "credit runs out", "budget runs out",
                  title=f"spend at period end (as of {moment:%Y-%m-%d %H:%M} UTC)")
    for r in rows:
        if not r["available"]:
            table.add_row(r["customer_id"], r.get("period", ""), r["message"], "", "", "", "")
            continue
        f = r["forecast"]
        table.add_row(r["customer_id"], r["period"], r["spend_to_date"], f["expected"] if f else "-",
                      f"{f['low']} .. {f['high']}" if f else "-",
                      (r.get("credit") or {}).get("runs_out_at") or "", (r.get("budget") or {}).get("runs_out_at") or "")
    console.print(table)
    if platform:
        p = result["platform"]
        table = Table("book", "revenue", "cost", "margin", "margin 80% interval", title=f"month {p['month']['from']}")
        for b in p["books"]:
            table.add_row(b["price_book"], b["revenue"]["expected"], b["cost"]["expected"], b["margin"]["expected"],
                          f"{b['margin']['low']} .. {b['margin']['high']}")
        console.print(table)


def quote_command(
    customer: Annotated[str, typer.Option(help="The customer quoted (its plan's price book).")],
    model: Annotated[str, typer.Option(help="The model.")],
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", help="Prompt tokens of a request.")],
    task_steps: Annotated[int | None, typer.Option("--task-steps", help="Requests in a task's attempt (default: the "
                                                   "customer's typical task).")] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", help="The request's max_tokens.")] = None,
    at: Annotated[str | None, typer.Option("--at", help="Price under the plan in force then (default now).")] = None,
    as_json: AS_JSON = False,
) -> None:
    """Expected cost of a request and of a successful task under the customer's price book, with an 80% interval."""
    from prediction_service.quotes import quote

    with _clear_errors():
        moment = parse_time(at, "--at") if at else datetime.now(UTC)
        with _connection() as conn:
            result = quote(conn, customer, model, prompt_tokens, at=moment, task_steps=task_steps,
                           max_tokens=max_tokens)
    if as_json:
        _print_json(result)
        return
    r, t, c = result["request"], result["task"], result["currency"]
    p = r["prediction"]
    console.print(f"{customer} on {model}, {prompt_tokens:,} prompt tokens, under {result['price_book']} ({c}, list "
                  "price):", highlight=False)
    console.print(f"  per request: {r['expected']} expected, 80% interval {r['low']} .. {r['high']} (output p50 "
                  f"{p['output_tokens_p50']:,}, p90 {p['output_tokens_p90']:,}, cached {p['cached_fraction']:.0%}, "
                  f"failure {p['failure_probability']:.1%}; from {p['basis']})", highlight=False)
    console.print(f"  per successful task of {t['steps']} steps: {t['expected']} expected, 80% interval {t['low']} .. "
                  f"{t['high']} (success {t['history']['success_probability']:.0%} of "
                  f"{t['history']['tasks']:,} tasks)", highlight=False)
    if result["not_quoted"]:
        console.print(f"  not quoted: {', '.join(result['not_quoted'])}", highlight=False)
