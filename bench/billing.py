"""Benchmark: a billing run (drafts + finalization) for a month of hourly rollups, next to rating the
same month by the invoice path, in one run (target: billing <= 1.5x rating).

    python -m bench.billing [--customers 10000] [--models 5] [--active-hours 72]

Rows as in bench.rating (10k customers x 5 models x 72 active hours of November 2026 = 3.6M
request_rollup_hourly rows, written hour by hour, and the period totals of the same data, then VACUUM
ANALYZE). Every customer gets a
billing record (UTC, USD, anchor day 1) and the example per-token book from 2026-11-01. Then, in
the same run:
- rating: `pricing_service.rate_period.rate_period` over the month (every customer's lines);
- billing: billing_service's `billing_run` for 2026-11 with the clock past the grace window, so
  each customer's draft is created and finalized (gapless number, history, credits check): the
  bulk path (its own rating pass, `rate_billing_period` from the period totals, then batches of
  customers written with COPY).
Prints invoices/s and the ratio billing time / rating time (wall clock; and, with a local server,
the ratio of CPU seconds of this process and its PostgreSQL backend, which other load moves less).

Then, for scale, the write floor: the run's invoices and lines, already as COPY text (read back
untimed), copied into two bare tables of the same columns (no key, index, trigger or history) in
one transaction, timed the same way. rating + that floor is what any billing run that rates the
month and stores one row per line must spend; the bench prints billing / (rating + floor) next to
the target's ratio. And the Python side of that floor: this process's CPU to make the lines' COPY
text from the rating's values with the run's own writer (`_LineRows.add_rated`); rating + text +
floor is printed as a multiple of rating, with what it leaves of the 1.5x target for the rest of
the run.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from rich.console import Console

from bench.rating import END, START, generate
from billing_service.batch import _LineRows
from billing_service.customers import assign_plan, set_customer
from billing_service.run import billing_run
from infermeter.stack.postgres import remove_scratch, start_embedded_postgres, to_libpq_url
from infermeter.stack.processes import process_cpu_s
from pricing_service.books import EXAMPLE_BOOKS_DIR, read_price_book
from pricing_service.rate_period import rate_period

SETUP_AT = datetime(2026, 10, 20, tzinfo=UTC)


def backend_cpu(conn: psycopg.Connection) -> float | None:
    """CPU seconds (user + system) used so far by the connection's PostgreSQL backend process, when the
    server runs on this machine (the embedded one does); None otherwise."""
    return process_cpu_s(conn.info.backend_pid)
RUN_AT = datetime(2026, 12, 3, tzinfo=UTC)  # past the period end + the 24 h grace window


def line_text_floor(rated: dict, period: str) -> float:
    """This process's CPU seconds to make the COPY text of the month's lines from the rating's own
    values (the rating side's result, one invoice per customer), with the run's writer for a first
    invoice's lines (`_LineRows.add_rated`, the cheapest of the ways measured): what any billing run
    that stores its lines as rows pays in Python on top of the write floor, before any invoice logic."""
    writer = _LineRows()
    cpu = time.process_time()
    for customer_id, rating in rated.items():
        writer.add_rated(f"inv-{customer_id}", period, START, END, rating.lines)
    "".join(writer.parts)
    return time.process_time() - cpu


def write_floor(conn: psycopg.Connection, period: str) -> tuple[float, float, float | None]:
    """(wall s, this process's CPU s, the backend's CPU s or None) of writing the period's invoices and
    their lines, as COPY text read back from the billing tables (untimed), into bare tables of the same
    columns in one transaction; the tables are dropped afterwards."""
    scripts = {
        "bench_floor_invoices": ("billing_invoices", "SELECT * FROM billing_invoices WHERE period = %s"),
        "bench_floor_lines": (
            "billing_invoice_lines",
            "SELECT l.* FROM billing_invoice_lines l JOIN billing_invoices i ON i.id = l.invoice_id "
            "WHERE i.period = %s",
        ),
    }
    texts = {}
    for floor, (like, query) in scripts.items():
        conn.execute(f"CREATE TABLE {floor} (LIKE {like})")
        with conn.cursor().copy(f"COPY ({query}) TO STDOUT", (period,)) as copy:
            texts[floor] = b"".join(bytes(chunk) for chunk in copy)
    try:
        t, cpu, server = time.perf_counter(), time.process_time(), backend_cpu(conn)
        with conn.transaction():
            for floor, text in texts.items():
                with conn.cursor().copy(f"COPY {floor} FROM STDIN") as copy:
                    copy.write(text)
        wall, client = time.perf_counter() - t, time.process_time() - cpu
        return wall, client, None if server is None else backend_cpu(conn) - server
    finally:
        for floor in scripts:
            conn.execute(f"DROP TABLE {floor}")


def setup_customers(url: str, customers: int, console: Console) -> None:
    """Customer cust-00000 through the service (`set_customer`, `assign_plan`: the book is stored once),
    then the others copied from it in two INSERT ... SELECT (what those calls would write for each:
    same schedule, same plan), so that 10k customers take seconds, not minutes."""
    book_path = EXAMPLE_BOOKS_DIR / "per-token.yaml"
    text = book_path.read_text()
    with psycopg.connect(to_libpq_url(url), autocommit=True) as conn, console.status("customers and plans"):
        first = "cust-00000"
        set_customer(conn, first, now=SETUP_AT)
        assign_plan(conn, first, text, str(book_path), "2026-11-01", now=SETUP_AT)
        with conn.transaction():
            conn.execute(
                "INSERT INTO billing_customers (customer_id, name, email, timezone, currency, anchor_day, created_at, "
                "updated_at) SELECT format('cust-%%s', lpad(i::text, 5, '0')), name, email, timezone, currency, "
                "anchor_day, created_at, updated_at FROM billing_customers, generate_series(1, %s - 1) AS i "
                "WHERE customer_id = %s",
                (customers, first),
            )
            conn.execute(
                "INSERT INTO billing_plans (customer_id, from_date, effective_at, effective_period, book_sha256, "
                "assigned_at) SELECT c.customer_id, p.from_date, p.effective_at, p.effective_period, p.book_sha256, "
                "p.assigned_at FROM billing_plans p, billing_customers c WHERE p.customer_id = %s "
                "AND c.customer_id <> %s ORDER BY c.customer_id",
                (first, first),
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--customers", type=int, default=10_000)
    parser.add_argument("--models", type=int, default=5)
    parser.add_argument("--active-hours", type=int, default=72, help="active hours per customer x model (of 720)")
    args = parser.parse_args()
    console = Console()
    folder = None if os.environ.get("DATABASE_URL") else Path(tempfile.mkdtemp(prefix="bench-billing-"))
    url = os.environ.get("DATABASE_URL") or start_embedded_postgres(folder / "pg")
    try:
        t0 = time.perf_counter()
        rows = generate(url, args.customers, args.models, args.active_hours, console)
        setup_customers(url, args.customers, console)
        console.print(f"generated {rows:,} hourly rollup rows and {args.customers:,} customers with a plan "
                      f"in {time.perf_counter() - t0:.1f} s")
        book = read_price_book(EXAMPLE_BOOKS_DIR / "per-token.yaml")
        with psycopg.connect(to_libpq_url(url)) as conn:
            conn.execute("SET TIME ZONE 'UTC'")
            rate_period(conn, book, START, END)  # warm the cache for both sides
            t, cpu, server = time.perf_counter(), time.process_time(), backend_cpu(conn)
            rated = rate_period(conn, book, START, END)
            rating, rating_cpu = time.perf_counter() - t, time.process_time() - cpu
            rating_server = None if server is None else backend_cpu(conn) - server
            revenue = sum(r.total for r in rated.values())
            conn.commit()
            conn.autocommit = True  # as the CLI and the API call it: the run commits batch by batch
            t, cpu, server = time.perf_counter(), time.process_time(), backend_cpu(conn)
            result = billing_run(conn, "2026-11", now=RUN_AT)
            billing, billing_cpu = time.perf_counter() - t, time.process_time() - cpu
            billing_server = None if server is None else backend_cpu(conn) - server
            floor, floor_cpu, floor_server = write_floor(conn, "2026-11")
            text_cpu = line_text_floor(rated, "2026-11")
        finalized = [o for o in result.invoices if o.action == "finalized"]
        invoiced = sum(o.total for o in finalized)
        console.print(f"rating the month: {rating:.2f} s ({len(rated):,} customers, revenue {revenue} USD)")
        console.print(f"billing run: {billing:.2f} s, {len(finalized):,} invoices finalized "
                      f"({len(finalized) / billing:,.0f} invoices/s), invoiced {invoiced} USD; CPU time of this "
                      f"process meanwhile {billing_cpu:.2f} s (the rest: PostgreSQL, and waiting for a core)")
        if rating_server is not None and billing_server is not None:
            console.print(f"CPU seconds, this process + its PostgreSQL backend: rating {rating_cpu:.2f} + "
                          f"{rating_server:.2f}, billing {billing_cpu:.2f} + {billing_server:.2f}: ratio "
                          f"{(billing_cpu + billing_server) / (rating_cpu + rating_server):.2f}x (less sensitive "
                          "to other load on the machine than the wall-clock ratio below)")
        console.print(f"write floor (the run's invoices and lines into bare tables, one COPY each): {floor:.2f} s"
                      + ("" if floor_server is None else f", CPU {floor_cpu:.2f} + {floor_server:.2f} s"))
        if rating_server is not None and billing_server is not None and floor_server is not None:
            rated_cpu = rating_cpu + rating_server
            least = rated_cpu + floor_cpu + floor_server
            console.print(f"CPU ratio billing / (rating + write floor): {(billing_cpu + billing_server) / least:.2f}x "
                          f"(rating + floor = {least / rated_cpu:.2f}x rating)")
            console.print(f"the lines' COPY text made in Python (_LineRows.add_rated): {text_cpu:.2f} CPU-s; rating + "
                          f"text + write floor = [bold]{(least + text_cpu) / rated_cpu:.2f}x[/] rating, leaving "
                          f"{max(0.0, 1.5 * rated_cpu - least - text_cpu):.2f} CPU-s of the 1.5x target for everything "
                          "else a billing run does (periods, plans, credits, numbers, history, unbilled usage)")
        ratio = billing / rating
        verdict = "[green]within[/]" if ratio <= 1.5 else "[red]over[/]"
        console.print(f"ratio billing / rating: [bold]{ratio:.2f}x[/] ({verdict} the 1.5x target)")
        if invoiced != revenue:
            console.print(f"[red]invoiced {invoiced} != rated {revenue}[/]")
    finally:
        if folder is not None:
            remove_scratch(folder)


if __name__ == "__main__":
    main()
