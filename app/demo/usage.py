"""The demo's usage tables (by model, top customers) and the reconcile check (emitted == metered,
raw events == rollups)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

import psycopg
from rich.console import Console
from rich.table import Table

from app.demo.month import DemoTotals
from infermeter.stack.postgres import to_libpq_url


def usage_and_reconcile(database_url: str, totals: DemoTotals, start: datetime, end: datetime,
                         console: Console, summary: dict) -> bool:
    """Print usage by model and top customers; True if metered == emitted and raw events == rollups."""
    from metering import queries
    from metering.reconcile import reconcile

    window = queries.Window(start, end)
    with psycopg.connect(to_libpq_url(database_url)) as conn:
        rows = queries.usage(conn, window, group_by=["model"])
        check = reconcile(conn, window)
    for table in usage_tables(rows, window):
        console.print(table)
    pipeline = {
        "requests": sum(r["requests"] for r in rows),
        "input_tokens": sum(r["input_tokens"] for r in rows),
        "cached_input_tokens": sum(r["cached_input_tokens"] for r in rows),
        "output_tokens": sum(r["output_tokens"] for r in rows),
    }
    emitted = {"requests": totals.requests, "input_tokens": totals.input_tokens,
               "cached_input_tokens": totals.cached_input_tokens, "output_tokens": totals.output_tokens}
    agree = pipeline == emitted and check.ok
    # A second run on the same database finds everything already metered: rollups hold
    # every run's events once, so they match what this run emitted only on a fresh database.
    status = "[green]match[/]" if agree else "[red]MISMATCH[/]"
    console.print(f"emitted {emitted} | metered {pipeline} | raw vs rollups: "
                  f"{'ok' if check.ok else f'{len(check.differences)} differences'} -> {status}")
    summary.update(emitted=emitted, metered=pipeline, reconcile_ok=check.ok)
    return agree


def usage_tables(rows: list[dict], window) -> list[Table]:
    """Usage by model and the top 10 customers by tokens (fits 80 columns)."""
    by_customer = defaultdict(lambda: [0, 0, 0, 0])
    by_model = defaultdict(lambda: [0, 0, 0, 0])
    for r in rows:
        for agg in (by_customer[r["customer_id"]], by_model[r["model"]]):
            agg[0] += r["requests"]
            agg[1] += r["uncached_input_tokens"]
            agg[2] += r["cached_input_tokens"]
            agg[3] += r["output_tokens"]
    period = f"[{window.start:%Y-%m-%d %H:%M}, {window.end:%Y-%m-%d %H:%M}) UTC"
    table = Table("model", "requests", "uncached input", "cached input", "output", "cache hit",
                  title=f"usage by model {period}")
    for model, (n, unc, cac, out) in sorted(by_model.items()):
        table.add_row(model, f"{n:,}", f"{unc:,}", f"{cac:,}", f"{out:,}", f"{cac / max(unc + cac, 1):.1%}")
    tables = [table]
    table = Table("customer", "requests", "uncached input", "cached input", "output", "share of tokens",
                  title="top customers")
    total = sum(v[1] + v[2] + v[3] for v in by_customer.values()) or 1
    for customer, (n, unc, cac, out) in sorted(by_customer.items(), key=lambda kv: -sum(kv[1][1:]))[:10]:
        table.add_row(customer, f"{n:,}", f"{unc:,}", f"{cac:,}", f"{out:,}", f"{(unc + cac + out) / total:.1%}")
    tables.append(table)
    for table in tables:  # numbers are never cut: headings wrap instead
        for column in table.columns:
            label = column.header in ("model", "customer")
            column.justify = "left" if label else "right"
            column.no_wrap = label
            column.min_width = max((len(str(cell)) for cell in column.cells), default=0)
    return tables
