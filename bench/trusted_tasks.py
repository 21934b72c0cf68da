"""Benchmark: a month of tasks rated under a per-task book that trusts every outcome source (metering's
latest outcome per task, summed in SQL) and under one that trusts a verifier only (every report of
each candidate task read with its source, the rule applied in Python), in the same run.

    python -m bench.trusted_tasks [--tasks 200000] [--customers 1000] [--repeat 3]

Rows: --tasks tasks in November 2026 spread over --customers customers, 1 to 3 attempts each
(task_attempts); every task has the customer's own report (`//customer/<id>`, "failed") and 70% a
verifier's (`//verifier/checks`, "succeeded", an hour after the first request); task_outcomes holds the
latest of each. Written with COPY into a real PostgreSQL (DATABASE_URL, else a fresh embedded one in a
temporary folder), then VACUUM ANALYZE (no period totals are filled). Timed:
`pricing_service.rate_period.rate_period(..., from_totals=False)` (the hourly reads) under each book
(best of --repeat). No target: the number says what trusting only some sources costs.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from rich.console import Console

from infermeter.db import upgrade
from infermeter.stack.postgres import remove_scratch, start_embedded_postgres, to_libpq_url
from pricing.book import parse_price_book
from pricing_service.rate_period import rate_period

START = datetime(2026, 11, 1, tzinfo=UTC)
END = datetime(2026, 12, 1, tzinfo=UTC)
NAIVE = """\
id: per-task-everyone
currency: USD
charges:
  - meter: successful_tasks
    price: {type: unit, amount: "0.20", per: 1}
  - meter: failed_tasks
    price: {type: unit, amount: "0.02", per: 1}
  - meter: task_attempts
    price: {type: unit, amount: "0.001", per: 1}
"""
VERIFIED = NAIVE.replace("per-task-everyone", "per-task-verified") + """\
task_outcomes:
  trusted_sources: ["//verifier/"]
  task_timeout: 24h
  untrusted_outcome: bill_as_success
"""


def generate(url: str, tasks: int, customers: int) -> int:
    upgrade(url, "heads")
    span = int((END - START - timedelta(days=2)).total_seconds())
    reports = 0
    with psycopg.connect(to_libpq_url(url)) as conn:
        conn.execute("TRUNCATE task_attempts, task_outcomes, task_outcome_reports")
        with conn.cursor().copy("COPY task_attempts (customer_id, task_id, attempt, requests, first_request_at, "
                                "last_request_at) FROM STDIN") as copy:
            for t in range(tasks):
                first = START + timedelta(seconds=(t * 7919) % span)
                for attempt in range(1, 2 + t % 3):
                    at = first + timedelta(minutes=5 * (attempt - 1))
                    copy.write_row((f"cust-{t % customers:05d}", f"task-{t}", attempt, 1, at, at))
        with conn.cursor().copy("COPY task_outcome_reports (customer_id, task_id, source, event_id, outcome, "
                                "finished_at) FROM STDIN") as copy:
            for t in range(tasks):
                customer, first = f"cust-{t % customers:05d}", START + timedelta(seconds=(t * 7919) % span)
                copy.write_row((customer, f"task-{t}", f"//customer/{customer}", f"o-{t}", "failed",
                                first + timedelta(hours=2)))
                reports += 1
                if t % 10 < 7:
                    copy.write_row((customer, f"task-{t}", "//verifier/checks", f"v-{t}", "succeeded",
                                    first + timedelta(hours=1)))
                    reports += 1
        conn.execute("INSERT INTO task_outcomes (customer_id, task_id, outcome, finished_at, source, event_id) "
                     "SELECT DISTINCT ON (customer_id, task_id) customer_id, task_id, outcome, finished_at, source, "
                     "event_id FROM task_outcome_reports "
                     "ORDER BY customer_id, task_id, finished_at DESC, source DESC, event_id DESC")
        conn.commit()
    with psycopg.connect(to_libpq_url(url), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE task_attempts, task_outcomes, task_outcome_reports")
    return reports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=200_000)
    parser.add_argument("--customers", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    console = Console()
    folder = None if os.environ.get("DATABASE_URL") else Path(tempfile.mkdtemp(prefix="bench-trusted-"))
    url = os.environ.get("DATABASE_URL") or start_embedded_postgres(folder / "pg")
    try:
        t0 = time.perf_counter()
        reports = generate(url, args.tasks, args.customers)
        console.print(f"generated {args.tasks:,} tasks and {reports:,} outcome reports in {time.perf_counter() - t0:.1f} s")
        books = {"everyone": parse_price_book(NAIVE), "verifier": parse_price_book(VERIFIED)}
        best: dict[str, float] = {}
        counted: dict[str, tuple[int, int, int]] = {}
        with psycopg.connect(to_libpq_url(url)) as conn:
            conn.execute("SET TIME ZONE 'UTC'")
            rate_period(conn, books["everyone"], START, END, from_totals=False)  # warm the cache for both sides
            for _ in range(args.repeat):
                for name, book in books.items():
                    t = time.perf_counter()
                    rated = rate_period(conn, book, START, END, from_totals=False)
                    best[name] = min(best.get(name, float("inf")), time.perf_counter() - t)
                    q = {m: sum(line.quantity for r in rated.values() for line in r.lines if line.meter == m)
                         for m in ("successful_tasks", "failed_tasks", "task_attempts")}
                    counted[name] = (q["successful_tasks"], q["failed_tasks"], q["task_attempts"])
        for name in books:
            ok, failed, attempts = counted[name]
            console.print(f"trusting {name}: {best[name]:.3f} s (best of {args.repeat}); "
                          f"{ok:,} successful, {failed:,} failed tasks, {attempts:,} attempts")
        console.print(f"ratio verifier-only / every source: [bold]{best['verifier'] / best['everyone']:.2f}x[/]; "
                      f"{args.tasks / best['verifier']:,.0f} tasks/s under the verifier-only book")
    finally:
        if folder is not None:
            remove_scratch(folder)


if __name__ == "__main__":
    main()
