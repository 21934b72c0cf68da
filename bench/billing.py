"""Benchmark: a billing run (drafts + finalization) for a month of usage, next to rating the same month
from the same source, in one run (target: billing CPU <= 1.5x rating + the lines' COPY text + the write
floor; 100k customers <= 11x the 10k run).

    python -m bench.billing [--customers 10000[,100000]] [--models 5] [--active-hours 72]

Rows as in bench.rating (10k customers x 5 models x 72 active hours of November 2026 = 3.6M
request_rollup_hourly rows, written hour by hour, and the period totals of the same data, then VACUUM
ANALYZE). Every customer gets a billing record (UTC, USD, anchor day 1) and the example per-token book
from 2026-11-01. Then, in the same run:
- rating: `pricing_service.rate_period.rate_billing_period` for 2026-11 (every customer's billing
  period from the period totals, after one warm-up): what the billing run rates, read from the same
  source (the hourly rollups stay: the run's unbilled-usage check walks their key);
- billing: billing_service's `billing_run` for 2026-11 with the clock past the grace window, so
  each customer's draft is created and finalized (gapless number, history, credits check): the
  bulk path (its own rating pass from the period totals, then batches of customers written with COPY).
Prints invoices/s, wall clock and the CPU seconds of this process and its PostgreSQL backend (with a
local server; other load moves them less than the wall clock).

Then, for scale, the write floor: the run's invoices and lines, already as COPY text (read back
untimed), copied into two bare tables of the same columns (no key, index, trigger or history) in
one transaction, timed the same way; and the Python side of it: this process's CPU to make the lines'
COPY text from the rating's values with the run's own writer (`_LineRows.add_rated`). rating + text +
floor is what any billing run that rates the month and stores one row per line must spend; the bench
prints billing / (rating + text + floor) against the 1.5x target.

Several sizes (`--customers 10000,100000`) are measured in turn, each on its own fresh embedded server
(removed before the next size is generated), and each later size's billing CPU is compared with the
first's (linearity: at most 1.1x the ratio of the sizes), with the CPU per customer of both.
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

from bench.rating import END, LABEL, START, generate
from billing_service.batch import _LineRows
from billing_service.customers import assign_plan, set_customer
from billing_service.run import billing_run
from infermeter.stack.postgres import remove_scratch, start_embedded_postgres, to_libpq_url
from infermeter.stack.processes import process_cpu_s
from pricing_service.books import EXAMPLE_BOOKS_DIR, read_price_book
from pricing_service.rate_period import rate_billing_period

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


def measure(url: str, customers: int, models: int, active_hours: int, console: Console) -> dict[str, float]:
    """Generate one size's month on the (empty) database at `url`, then rate it and bill it in one run:
    what `main` prints, as numbers (wall s, CPU s of this process and of its PostgreSQL backend)."""
    t0 = time.perf_counter()
    rows = generate(url, customers, models, active_hours, console)
    setup_customers(url, customers, console)
    console.print(f"generated {rows:,} hourly rollup rows and {customers:,} customers with a plan "
                  f"in {time.perf_counter() - t0:.1f} s")
    book = read_price_book(EXAMPLE_BOOKS_DIR / "per-token.yaml")
    with psycopg.connect(to_libpq_url(url)) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        rate_billing_period(conn, book, LABEL)  # warm the cache for both sides
        t, cpu, server = time.perf_counter(), time.process_time(), backend_cpu(conn)
        rated = rate_billing_period(conn, book, LABEL)  # what the billing run rates, from the same totals
        rating, rating_cpu = time.perf_counter() - t, time.process_time() - cpu
        rating_server = None if server is None else backend_cpu(conn) - server
        revenue = sum(r.total for r in rated.values())
        conn.commit()
        conn.autocommit = True  # as the CLI and the API call it: the run commits batch by batch
        t, cpu, server = time.perf_counter(), time.process_time(), backend_cpu(conn)
        result = billing_run(conn, LABEL, now=RUN_AT)
        billing, billing_cpu = time.perf_counter() - t, time.process_time() - cpu
        billing_server = None if server is None else backend_cpu(conn) - server
        floor, floor_cpu, floor_server = write_floor(conn, LABEL)
        text_cpu = line_text_floor(rated, LABEL)
    finalized = [o for o in result.invoices if o.action == "finalized"]
    invoiced = sum(o.total for o in finalized)
    console.print(f"rating the month from the period totals: {rating:.2f} s ({len(rated):,} customers, revenue "
                  f"{revenue} USD)")
    console.print(f"billing run: {billing:.2f} s, {len(finalized):,} invoices finalized "
                  f"({len(finalized) / billing:,.0f} invoices/s), invoiced {invoiced} USD; CPU time of this "
                  f"process meanwhile {billing_cpu:.2f} s (the rest: PostgreSQL, and waiting for a core)")
    console.print(f"write floor (the run's invoices and lines into bare tables, one COPY each): {floor:.2f} s"
                  + ("" if floor_server is None else f", CPU {floor_cpu:.2f} + {floor_server:.2f} s"))
    out = {"customers": customers, "rating_s": rating, "billing_s": billing, "rating_cpu": rating_cpu,
           "billing_cpu": billing_cpu, "text_cpu": text_cpu}
    if rating_server is not None and billing_server is not None and floor_server is not None:
        rated_cpu = rating_cpu + rating_server
        billed_cpu = billing_cpu + billing_server
        least = rated_cpu + floor_cpu + floor_server + text_cpu
        console.print(f"CPU seconds, this process + its PostgreSQL backend: rating {rating_cpu:.2f} + "
                      f"{rating_server:.2f}, billing {billing_cpu:.2f} + {billing_server:.2f}: ratio "
                      f"{billed_cpu / rated_cpu:.2f}x (less sensitive to other load on the machine than the "
                      "wall-clock ratio below)")
        console.print(f"the lines' COPY text made in Python (_LineRows.add_rated): {text_cpu:.2f} CPU-s; rating + "
                      f"text + write floor = {least:.2f} CPU-s = {least / rated_cpu:.2f}x rating")
        verdict = "[green]within[/]" if billed_cpu <= 1.5 * least else "[red]over[/]"
        console.print(f"CPU ratio billing / (rating + text + write floor): [bold]{billed_cpu / least:.2f}x[/] "
                      f"({verdict} the 1.5x target); {billed_cpu / customers * 1e6:.0f} CPU-µs a customer")
        out.update(rating_server=rating_server, billing_server=billing_server, floor_cpu=floor_cpu + floor_server,
                   billing_total=billed_cpu, least=least)
    console.print(f"ratio billing / rating, wall clock: {billing / rating:.2f}x")
    if invoiced != revenue:
        console.print(f"[red]invoiced {invoiced} != rated {revenue}[/]")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--customers", default="10000",
                        help="customers, or several sizes comma-separated (e.g. 10000,100000), each measured in "
                             "turn on its own fresh server, then compared (linearity)")
    parser.add_argument("--models", type=int, default=5)
    parser.add_argument("--active-hours", type=int, default=72, help="active hours per customer x model (of 720)")
    args = parser.parse_args()
    sizes = [int(n) for n in args.customers.split(",")]
    console = Console()
    if os.environ.get("DATABASE_URL") and len(sizes) > 1:
        raise SystemExit("several sizes need a fresh server each: leave DATABASE_URL unset")
    runs = []
    for customers in sizes:
        console.rule(f"{customers:,} customers")
        folder = None if os.environ.get("DATABASE_URL") else Path(tempfile.mkdtemp(prefix="bench-billing-"))
        url = os.environ.get("DATABASE_URL") or start_embedded_postgres(folder / "pg")
        try:
            runs.append(measure(url, customers, args.models, args.active_hours, console))
        finally:
            if folder is not None:
                remove_scratch(folder)
    if len(runs) > 1 and all("billing_total" in r for r in runs):
        first = runs[0]
        for run in runs[1:]:
            size, cpu = run["customers"] / first["customers"], run["billing_total"] / first["billing_total"]
            limit = 1.1 * size
            verdict = "[green]within[/]" if cpu <= limit else "[red]over[/]"
            console.print(
                f"linearity: {run['customers']:,} customers cost [bold]{cpu:.2f}x[/] the billing CPU of "
                f"{first['customers']:,} ({size:g}x the customers; {verdict} {limit:g}x): "
                f"{first['billing_total'] / first['customers'] * 1e6:.0f} vs "
                f"{run['billing_total'] / run['customers'] * 1e6:.0f} CPU-µs a customer")


if __name__ == "__main__":
    main()
