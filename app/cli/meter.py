"""`infermeter metering run|rebuild-totals|archive`: the consumer, period totals, the archive."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Annotated

import psycopg
import typer
from rich.table import Table

from app.cli.common import CliError, console, err_console, print_json, progress_display
from infermeter.settings import get_settings
from infermeter.stack.local import open_stack
from infermeter.stack.postgres import to_libpq_url

app = typer.Typer(help="The metering consumer.", no_args_is_help=True)


@app.command("run")
def metering_run(
    quiet: Annotated[bool, typer.Option(help="No progress output.")] = False,
    idle_exit: Annotated[float | None, typer.Option(help="Exit after this many seconds without events.")] = None,
) -> None:
    """Run one metering consumer (a member of the consumer group) until Ctrl-C."""
    from metering.consumer import MeteringConsumer

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = get_settings()
    with open_stack(settings) as stack:
        consumer = MeteringConsumer(stack.settings_for(settings), stack.database_url, stack.kafka_bootstrap)
        signal.signal(signal.SIGTERM, lambda *_: consumer.stop())
        reporter = None
        if not quiet:
            def report() -> None:
                while not consumer.stop_event.wait(5):
                    s = consumer.stats
                    err_console.print(f"accepted={s.accepted} duplicates={s.duplicates} rejected={s.rejected} "
                                      f"batches={s.batches} db_retries={s.db_retries}")
            reporter = threading.Thread(target=report, daemon=True)
            reporter.start()
        try:
            consumer.run(idle_timeout_s=idle_exit)
        except KeyboardInterrupt:
            consumer.stop()
        s = consumer.stats
        if not quiet:
            console.print(f"stopped: accepted={s.accepted} duplicates={s.duplicates} rejected={s.rejected}")


@app.command("rebuild-totals")
def metering_rebuild_totals(
    customer: Annotated[list[str] | None, typer.Option(help="A customer whose period totals to rebuild (repeatable).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every customer metering holds anything of.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print {\"customers\": [...], \"rows\": N}.")] = False,
) -> None:
    """Recompute customers' period totals from what metering stored, under their current calendars.

    One transaction per customer, holding the calendar lock exclusive (ingest waits for it). A customer
    metering never saw is rebuilt to 0 rows."""
    from metering.period_totals import customers_to_rebuild, rebuild

    if bool(customer) == all_:
        raise CliError("name the customers to rebuild with --customer C (repeatable), or give --all")
    with open_stack(get_settings(), broker=False) as stack, psycopg.connect(to_libpq_url(stack.database_url)) as conn:
        names = customers_to_rebuild(conn) if all_ else list(dict.fromkeys(customer))
        conn.commit()
        results = []
        with progress_display(as_json) as progress:
            task = progress.add_task("rebuilding period totals", total=len(names))
            for name in names:
                results.append(rebuild(conn, name))
                conn.commit()
                progress.update(task, advance=1)
    rows = sum(r.rows for r in results)
    if as_json:
        print_json({"customers": [r.as_dict() for r in results], "rows": rows})
        return
    table = Table("customer", "request rows", "usage rows", "task rows", "gpu rows",
                  title=f"period totals rebuilt: {len(results):,} customers, {rows:,} rows")
    for r in results[:50]:
        table.add_row(r.customer_id, f"{r.request_rows:,}", f"{r.usage_rows:,}", f"{r.task_rows:,}", f"{r.gpu_rows:,}")
    console.print(table)
    if len(results) > 50:
        console.print(f"… and {len(results) - 50:,} more customers (--json lists them all)")


@app.command("archive")
def metering_archive(
    before: Annotated[str, typer.Option(help="Archive every month before this one (YYYY-MM, UTC) that still has "
                                             "partitions; it may not be later than the oldest retained month.")],
    directory: Annotated[Path | None, typer.Option(
        "--dir", help="Folder of the Parquet files (default INFERMETER_ARCHIVE_DIR, else INFERMETER_HOME/archive).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only {\"before\": \"YYYY-MM\", \"archived\": [{month, file, events, key_checksum}]}.")] = False,
) -> None:
    """Archive the months that left the retention: raw events to Parquet, verified, then their partitions dropped.

    For each month before --before that still has raw_events or event_keys partitions: its raw events
    are written to DIR/raw_events_YYYY_MM.parquet (temporary name, fsync, rename), the file is read
    back and its row count and checksum of every (source, id) compared with the partition's, and only
    then the month's raw_events and event_keys partitions are dropped (one transaction per month).
    A month inside the retention (INFERMETER_RETENTION_MONTHS) is refused: its keys still catch
    duplicates. A second run finds nothing to do; after a crash the next run writes the file again.
    Rollups, ledgers, invoices and their history are kept. `infermeter up` runs this daily
    (INFERMETER_ARCHIVE_INTERVAL_H); `events ingest FILE.parquet` replays an archive.
    """
    from datetime import UTC, datetime

    from metering.archive import archive_before, archive_dir, check_outside_retention, parse_month

    settings = get_settings()
    month = parse_month(before)
    now = datetime.now(UTC)
    check_outside_retention(month, now=now, retention_months=settings.retention_months)  # before anything starts
    folder = directory or archive_dir(settings)
    with open_stack(settings, broker=False) as stack, progress_display(as_json) as progress:
        tasks: dict = {}

        def on_progress(m, done: int, total: int | None) -> None:
            if m not in tasks:
                tasks[m] = progress.add_task(f"archiving {m:%Y-%m}", total=total)
            progress.update(tasks[m], completed=done, total=total)

        done = archive_before(to_libpq_url(stack.database_url), month, directory=folder, now=now,
                              retention_months=settings.retention_months, on_progress=on_progress)
    if as_json:
        print_json({"before": f"{month:%Y-%m}", "archived": [m.to_json() for m in done]})
        return
    for m in done:
        console.print(f"archived {m.month:%Y-%m}: {m.events:,} events -> {m.file} (verified; raw_events and "
                      "event_keys partitions dropped)", soft_wrap=True, highlight=False)
    if not done:
        console.print(f"nothing to archive before {month:%Y-%m}", highlight=False)
