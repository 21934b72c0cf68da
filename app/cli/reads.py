"""`infermeter usage|tasks|reconcile`: metering's reads and the reconcile checks."""

from __future__ import annotations

from typing import Annotated

import psycopg
import typer
from rich.table import Table

from app.cli.common import console, err_console, print_json
from infermeter.settings import get_settings
from infermeter.stack.local import open_stack
from infermeter.stack.postgres import to_libpq_url


def usage(
    from_: Annotated[str, typer.Option("--from", help="Start, inclusive (ISO 8601, e.g. 2026-11-02T00:00:00Z).")],
    to: Annotated[str, typer.Option("--to", help="End, exclusive.")],
    customer: Annotated[str | None, typer.Option(help="One customer only.")] = None,
    group_by: Annotated[str | None, typer.Option(
        help="model, deployment, project, region, day or hour (comma-separated).")] = None,
    project: Annotated[str | None, typer.Option(
        help="One project only (the API key's; \"\" for the requests made without one).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print {\"rows\": [...]} with integers.")] = False,
) -> None:
    """Request usage per customer over [from, to) on event time."""
    from metering import queries

    window = queries.Window(queries.parse_time(from_, "--from"), queries.parse_time(to, "--to"))
    dims = queries.parse_group_by(group_by)
    with open_stack(get_settings(), broker=False) as stack, psycopg.connect(to_libpq_url(stack.database_url)) as conn:
        rows = queries.usage(conn, window, customer_id=customer, group_by=dims, project=project)
    if as_json:
        print_json({"rows": rows})
        return
    columns = [k for k in (rows[0].keys() if rows else ["customer_id", *queries.TOKEN_FIELDS])]
    table = Table(*columns, title=f"usage [{window.start:%Y-%m-%d %H:%M}, {window.end:%Y-%m-%d %H:%M}) UTC")
    for row in rows:
        table.add_row(*[f"{v:,}" if isinstance(v, int) else str(v) for v in row.values()])
    console.print(table)


def tasks(
    customer: Annotated[str, typer.Option(help="The customer whose tasks to list.")],
    task: Annotated[str | None, typer.Option(help="One task only.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Tasks with attempts, tokens and outcome."""
    from metering import task_reads

    with open_stack(get_settings(), broker=False) as stack, psycopg.connect(to_libpq_url(stack.database_url)) as conn:
        rows = task_reads.tasks(conn, customer, task_id=task)
    if as_json:
        print_json({"tasks": rows})
        return
    table = Table("task", "outcome", "attempts", "requests", "input", "cached", "output", "finished_at")
    for r in rows:
        table.add_row(r["task_id"], r["outcome"], str(r["attempts"]), str(r["requests"]), f"{r['input_tokens']:,}",
                      f"{r['cached_input_tokens']:,}", f"{r['output_tokens']:,}", str(r["finished_at"] or ""))
    console.print(table)


def reconcile(
    from_: Annotated[str, typer.Option("--from", help="Start, on the hour.")],
    to: Annotated[str, typer.Option("--to", help="End, on the hour (exclusive).")],
    period: Annotated[list[str] | None, typer.Option(
        "--period", help="Also check the money of this billing period YYYY-MM (repeat). Default: the periods of "
        "the invoices overlapping the window, if there are any.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Compare raw events with rollups per customer and meter, and invoices with rated usage; exit 1 on any difference.

    The money check is `infermeter billing reconcile` for each billing period: the invoices' quantities
    equal metering's usage and their amounts the period's rating (late usage not yet on an invoice is a
    difference), and invoice and credit note numbers have no gaps."""
    from metering import queries
    from metering.reconcile import reconcile as run_reconcile

    window = queries.Window(queries.parse_time(from_, "--from"), queries.parse_time(to, "--to"))
    settings = get_settings()
    with open_stack(settings, broker=False) as stack, psycopg.connect(to_libpq_url(stack.database_url)) as conn:
        result = run_reconcile(conn, window)
        money = _reconcile_money(conn, window, period, settings)
    money_ok = all(report.ok for report in money)
    if as_json:
        print_json({
            "ok": result.ok and money_ok, "checked": result.checked,
            "totals": {k: str(v) for k, v in result.totals.items()},
            "differences": [{"customer_id": d.customer_id, "meter": d.meter, "raw": str(d.raw), "rollup": str(d.rollup)}
                            for d in result.differences],
            "money": [report.to_json() for report in money],
        })
    else:
        for d in result.differences:
            err_console.print(f"[red]difference[/] {d.customer_id} {d.meter}: raw={d.raw} rollup={d.rollup}")
        status = "[green]ok[/]" if result.ok else f"[red]{len(result.differences)} differences[/]"
        console.print(f"reconcile {status}: {result.checked} customer x meter pairs checked")
        for report in money:
            for d in report.differences:
                err_console.print(f"[red]money difference[/] {d.customer_id} {d.period} {d.what}: expected "
                                  f"{d.expected}, found {d.found}", highlight=False, soft_wrap=True)
            for gap in report.number_gaps:
                err_console.print(f"[red]number gap[/]: {gap} is missing", highlight=False)
            for u in report.unbilled:
                err_console.print(f"unbilled usage: {u.customer_id} {u.period}: {u.reason}", highlight=False,
                                  soft_wrap=True)
            state = "[green]ok[/]" if report.ok else f"[red]{len(report.differences) + len(report.number_gaps)} differences[/]"
            console.print(f"money {report.period}: {state}: {len(report.checked)} customer invoices checked")
    if not (result.ok and money_ok):
        raise typer.Exit(1)


def _reconcile_money(conn: psycopg.Connection, window, periods: list[str] | None, settings) -> list:
    """billing's money reconciliation for the given periods, or for those of the invoices overlapping the window."""
    from billing.periods import parse_label
    from billing_service.reconcile import reconcile_money
    from pricing_service.books import read_cost_model

    if periods:
        labels = list(dict.fromkeys(periods))
        for label in labels:
            parse_label(label)
    else:
        labels = [r[0] for r in conn.execute(
            "SELECT DISTINCT period FROM billing_invoices WHERE period_start < %s AND period_end > %s ORDER BY period",
            (window.end, window.start))]
    if not labels:
        return []
    cost_model = read_cost_model(settings.pricing_cost_model)
    return [reconcile_money(conn, label, cost_model=cost_model) for label in labels]
