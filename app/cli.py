"""`infermeter`: one CLI for the whole project (`infermeter --help`).

Commands that need PostgreSQL or the broker use the configured ones (DATABASE_URL,
KAFKA_BOOTSTRAP), else the stack of a running `infermeter up`, else start the embedded parts for
their own duration. Errors print one clear line and exit with status 2 (1 for a failed check).
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated

import psycopg
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from infermeter.settings import get_settings, settings_table
from infermeter.stack import (
    StackError,
    Stopped,
    check_listen_port,
    clean_stale,
    embedded_pgdata,
    open_stack,
    pid_file_for,
    release_embedded_postgres,
    serve_http,
    stop_on_signals,
    to_libpq_url,
    wait_for_signal,
    write_stack_file,
)

console = Console()
err_console = Console(stderr=True)

app = typer.Typer(
    help="infermeter: token-and-task metering and billing for LLM inference.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
db_app = typer.Typer(help="Database migrations.", no_args_is_help=True)
events_app = typer.Typer(help="Publish events and inspect dead letters.", no_args_is_help=True)
metering_app = typer.Typer(help="The metering consumer.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(events_app, name="events")
app.add_typer(metering_app, name="metering")


class CliError(Exception):
    """An error to print as one line (exit 2)."""


def _print_json(payload: object) -> None:
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")


# --- stack -------------------------------------------------------------------------------------


@app.command()
def up(
    api: Annotated[bool, typer.Option(help="Serve the HTTP API too.")] = True,
    consumers: Annotated[int, typer.Option(min=0, help="Metering consumer threads to run.")] = 1,
    serving: Annotated[bool, typer.Option(
        "--serving", help="Also run the serving tier: vLLM CPU replicas of the tiny model, a replica agent "
        "each, the gateway; prints its base URL and a new customer key.")] = False,
    replicas: Annotated[int, typer.Option(min=1, max=16, help="With --serving: vLLM replicas to start.")] = 1,
    model: Annotated[str | None, typer.Option(
        help="With --serving: the model directory (default: the tiny Llama, built on first use).")] = None,
    customer: Annotated[str, typer.Option(help="With --serving: the customer the printed key acts for.")] = "local",
) -> None:
    """Run the whole local stack in the foreground until Ctrl-C, SIGTERM or SIGHUP: PostgreSQL, broker, metering, API.

    Stopping (any of those signals) stops the API, the consumers, the broker and the embedded
    PostgreSQL it started, then removes the stack file. The broker dies with this process even on
    `kill -9`; what such a kill leaves behind (PostgreSQL) is found and reused by the next `up`.

    With --serving it also starts N vLLM CPU replicas (--replicas), a replica agent for each and
    the gateway on INFERMETER_GATEWAY_PORT, and prints OPENAI_BASE_URL and OPENAI_API_KEY; a replica
    that dies is restarted (with backoff); they stop first, before the broker (docs/serving.md,
    "One command").
    """
    settings = get_settings()
    if not serving and (replicas != 1 or model is not None or customer != "local"):
        raise CliError("--replicas, --model and --customer go with --serving")
    with stop_on_signals() as guard:
        try:
            _run_up(settings, guard, api=api, consumers=consumers,
                    serving=dict(replicas=replicas, model=model, customer=customer) if serving else None)
        except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP: the clean-up already ran
            console.print(f"stopped ({exc})" if isinstance(exc, Stopped) else "stopped")
            return
    console.print("stopped")


def _run_up(settings, guard, *, api: bool, consumers: int, serving: dict | None = None) -> None:
    settings.home.mkdir(parents=True, exist_ok=True)
    if api:
        settings.check_listen_address(settings.api_host)  # no development credentials off loopback
    if serving is not None:
        settings.check_listen_address(settings.gateway_host)
    pid_file = pid_file_for(settings)
    for line in clean_stale(settings, pid_file):
        console.print(line, soft_wrap=True, highlight=False)
    _check_ports(settings, api=api, serving=serving is not None)  # before anything starts
    pid_file.start_run()
    try:
        with open_stack(settings, pid_file=pid_file) as stack:
            from metering.publisher import ack_mode, outbox_for

            # The acknowledgement mode follows what was configured, not the broker this stack filled in.
            ack = ack_mode(settings)
            run_settings = stack.settings_for(settings).model_copy(update={"ack": ack})
            from metering.consumer import MeteringConsumer, run_in_thread

            workers = [MeteringConsumer(run_settings, stack.database_url, stack.kafka_bootstrap)
                       for _ in range(consumers)]
            threads = [run_in_thread(w) for w in workers]
            retention = None
            if settings.archive_interval_h > 0:  # months that left the retention: archived, then dropped
                from metering.archive import RetentionJob, archive_dir

                retention = RetentionJob(
                    to_libpq_url(stack.database_url), retention_months=settings.retention_months,
                    directory=archive_dir(settings), interval_s=settings.archive_interval_h * 3600,
                    report=lambda line: console.print(line, soft_wrap=True, highlight=False)).start()
            # Metered ack: events that `events ingest` (and the API) spooled in this home and metering
            # has not confirmed are published (again) to this broker: what a killed stack had
            # acknowledged is metered after all. Fresh rows are left to the process publishing them.
            replayers = []
            if ack == "metered":
                for name in ("ingest", "api") if not api else ("ingest",):
                    replayers.append(outbox_for(run_settings, name, bootstrap=stack.kafka_bootstrap,
                                                database_url=stack.database_url, min_age_s=5.0).start())
            path = write_stack_file(
                settings, stack, api=f"http://{settings.api_host}:{settings.api_port}" if api else None
            )
            from prediction_service.schedule import RefitSchedule

            refits = RefitSchedule(run_settings, stack.database_url).start()  # INFERMETER_PREDICT_REFIT_INTERVAL_S
            from alerts.schedule import AlertSchedule

            alerting = AlertSchedule(run_settings, stack.database_url).start()  # INFERMETER_ALERT_INTERVAL_S
            serving_stack = None
            if serving is not None:  # after the stack file: the agents and the gateway find the stack by it
                from app.serving_stack import ServingStack

                serving_stack = ServingStack(settings, pid_file, console=err_console)
            try:
                if serving_stack is not None:
                    serving_stack.start(replicas=serving["replicas"], model=serving["model"],
                                        customer=serving["customer"])
                _serve_up(settings, stack, ack, path, api, run_settings, serving_stack, serving)
            finally:
                guard.stopping = True  # no signal may cut the clean-up short
                refits.stop()
                alerting.stop()
                if serving_stack is not None:  # before the broker stops: the gateway's last events go out
                    serving_stack.stop()
                if retention is not None:  # stops between two batches of a file: the month stays whole
                    retention.stop()
                for replayer in replayers:  # unconfirmed events stay spooled for the next up
                    replayer.close(2.0)
                    replayer.spool.close()
                for w in workers:
                    w.stop()
                for t in threads:
                    t.join(15)
                path.unlink(missing_ok=True)
        # leaving open_stack stopped the broker
    finally:
        guard.stopping = True
        if not settings.database_url:
            release_embedded_postgres(embedded_pgdata(settings))
        pid_file.remove()


def _check_ports(settings, *, api: bool, serving: bool) -> None:
    """The ports `up` will listen on are free (after `clean_stale`: a killed run's gateway may have held
    one), else one line naming the port and its setting."""
    ports = []
    if api:
        ports.append((settings.api_host, settings.api_port, "INFERMETER_API_PORT"))
    if serving:
        ports.append((settings.gateway_host, settings.gateway_port, "INFERMETER_GATEWAY_PORT"))
    if len(ports) == 2 and ports[0][1] == ports[1][1]:
        raise CliError(f"INFERMETER_API_PORT and INFERMETER_GATEWAY_PORT are both {settings.api_port}: "
                       "the API and the gateway need a port each")
    for host, port, setting in ports:
        check_listen_port(host, port, setting)


def _serve_up(settings, stack, ack, path, api, run_settings, serving_stack, serving) -> None:
    """Print what runs, then serve the API (or wait) until a signal."""
    table = Table(title="infermeter stack", show_header=False)
    table.add_row("PostgreSQL", stack.database_url)
    table.add_row("Kafka bootstrap", stack.kafka_bootstrap)
    table.add_row("events topic", settings.events_topic)
    table.add_row("consumer group", stack.consumer_group)
    table.add_row("acknowledgement", f"{ack} (INFERMETER_ACK)")
    table.add_row("stack file", str(path))
    if api:
        table.add_row("API", f"http://{settings.api_host}:{settings.api_port}")
        table.add_row("dashboards", f"http://{settings.api_host}:{settings.api_port}/dashboard")
        table.add_row("admin token", settings.credentials_note())
    if serving_stack is not None:
        table.add_row("gateway", serving_stack.base_url)
    console.print(table)
    if serving_stack is not None:  # plain lines, never wrapped: the key must be copyable (and parsable)
        for line in serving_stack.status_lines(serving["customer"]):
            console.print(line, soft_wrap=True, highlight=False)
    if api:
        from app.api import create_app

        api_app = create_app(run_settings, stack.database_url, stack.kafka_bootstrap)
        if serving_stack is not None:
            serving_stack.add_metrics_route(api_app)  # GET /metrics/serving: the replica restarts
        serve_http(api_app, host=settings.api_host, port=settings.api_port, log_level="warning")
    else:
        console.print("running; Ctrl-C stops")
        wait_for_signal()


@app.command("settings")
def show_settings() -> None:
    """Every setting: its environment variable, default and meaning."""
    table = Table("variable", "default", "meaning")
    for row in settings_table():
        table.add_row(*row)
    console.print(table)


@app.command("api")
def serve_api(
    host: Annotated[str | None, typer.Option(help="Bind address (INFERMETER_API_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (INFERMETER_API_PORT).")] = None,
) -> None:
    """Serve the HTTP API alone (events, usage, tasks, dead letters, pricing shadow)."""
    from app.api import create_app
    from metering.publisher import ack_mode

    settings = get_settings()
    settings.check_listen_address(host or settings.api_host)  # no development credentials off loopback
    err_console.print(f"admin token: {settings.credentials_note()}", highlight=False, soft_wrap=True)
    with stop_on_signals(), contextlib.suppress(KeyboardInterrupt), open_stack(settings) as stack:
        # SIGINT, SIGTERM, SIGHUP: uvicorn shuts down, then the broker this command started stops
        run_settings = stack.settings_for(settings).model_copy(update={"ack": ack_mode(settings)})
        serve_http(create_app(run_settings, stack.database_url, stack.kafka_bootstrap),
                   host=host or settings.api_host, port=port or settings.api_port, log_level="info")


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument(help="Target revision.")] = "heads") -> None:
    """Apply Alembic migrations (automatic for the embedded database)."""
    from infermeter.db import upgrade

    settings = get_settings()
    with open_stack(settings, broker=False, migrate=False) as stack:
        upgrade(stack.database_url, revision)
        console.print(f"database at {revision}")


@db_app.command("check")
def db_check() -> None:
    """Fail if the models and the migrations disagree (autogenerate would produce changes)."""
    from infermeter.db import drift
    from migrations.models import target_metadata

    settings = get_settings()
    with open_stack(settings, broker=False) as stack:
        changes = drift(stack.database_url, target_metadata())
    if changes:
        for change in changes:
            err_console.print(f"drift: {change}")
        raise typer.Exit(1)
    console.print("models and migrations agree")


# --- events ------------------------------------------------------------------------------------


@events_app.command("ingest")
def events_ingest(
    file: Annotated[Path, typer.Argument(
        help="JSON Lines file (one CloudEvent per line), or a raw-events archive (.parquet) of `metering archive`.")],
    wait: Annotated[bool, typer.Option(help="Return only when metering has handled every event.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print only {accepted, duplicates, rejected}.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait with --wait.")] = 900,
) -> None:
    """Publish a file of events to Kafka (keyed by customer).

    Lines that are not JSON are reported with their line number and counted as rejected; the rest
    of the file still goes through. A `.parquet` file is read as an archive of `infermeter metering
    archive` and its events are published as they were stored (replay: its months must be inside the
    retention of the consumer that meters them, e.g. INFERMETER_RETENTION_MONTHS=N for the replay). With --wait, the counts are metering's: accepted, duplicates
    (already metered), rejected (dead-lettered, plus bad lines). When this command had to start
    its own broker, it also runs the metering consumer and waits, since that broker dies with it.

    Exit status 1 when no event of the file is metered: with --wait, none accepted nor already
    metered (duplicates), i.e. every line rejected or the file empty; without it, none published.
    The counts are printed all the same, then one `error:` line.

    With metered acknowledgement (INFERMETER_ACK; the default with the embedded broker) the events
    go to INFERMETER_HOME/spool/ingest.sqlite3 first and stay there until metering has recorded
    them: if the stack dies with events its broker had acknowledged, the next `infermeter up`
    publishes them again.
    """
    from metering.consumer import MeteringConsumer, run_in_thread
    from metering.ingest import (
        IngestCounts,
        publish_lines,
        publish_spooled,
        read_events,
        spool_lines,
        wait_for_receipt,
    )
    from metering.kafka import ensure_topics, make_producer
    from metering.publisher import ack_mode, outbox_for
    from metering.spool import Spool, spool_dir

    if not file.is_file():
        raise CliError(f"{file}: no such file")
    settings = get_settings()
    ack = ack_mode(settings)
    spooled = None
    if ack == "metered":
        # Durable before anything else can fail (the broker, the stack): from here on the events
        # are metered whatever happens to this command, by it or by the next `infermeter up`.
        spool = Spool(spool_dir(settings) / "ingest.sqlite3", sync=settings.spool_sync)
        try:
            spooled = spool_lines(spool, read_events(file))
        finally:
            spool.close()
    with contextlib.ExitStack() as exit_stack:
        outbox = None
        try:
            stack = exit_stack.enter_context(open_stack(settings))
            run_settings = stack.settings_for(settings).model_copy(update={"ack": ack})
            ensure_topics(stack.kafka_bootstrap, settings)
            if spooled is not None:
                outbox = outbox_for(run_settings, "ingest", bootstrap=stack.kafka_bootstrap,
                                    database_url=stack.database_url)
                producer = make_producer(stack.kafka_bootstrap, settings.kafka_backend, idempotent=False,
                                         client_id="infermeter-ingest")
            else:
                producer = make_producer(stack.kafka_bootstrap, settings.kafka_backend)
        except Exception as exc:
            if spooled is None:
                raise
            raise CliError(f"{exc}; the {spooled.spooled} events are spooled in {spool.path}: "
                           "`infermeter up` publishes them") from None
        try:
            with _progress(as_json) as progress:
                task = progress.add_task("publishing", total=None)
                if outbox is not None:
                    publication = spooled
                    try:
                        publish_spooled(outbox, producer, publication,
                                        on_progress=lambda n: progress.update(task, completed=n))
                    except RuntimeError as exc:
                        raise CliError(f"{exc} ({publication.spooled} events spooled)") from None
                else:
                    publication = publish_lines(
                        producer, settings.events_topic, read_events(file),
                        on_progress=lambda n: progress.update(task, completed=n),
                    )
        finally:
            producer.close()
        for bad in publication.bad_lines[:20]:
            err_console.print(f"{file}:{bad.line}: [yellow]rejected[/]: {bad.reason}", soft_wrap=True, highlight=False)
        if len(publication.bad_lines) > 20:
            err_console.print(f"… and {len(publication.bad_lines) - 20} more bad lines")
        counts = IngestCounts()
        try:
            if wait or stack.owns_broker:
                consumer = thread = None
                if stack.owns_broker:
                    consumer = MeteringConsumer(run_settings, stack.database_url, stack.kafka_bootstrap)
                    thread = run_in_thread(consumer)
                try:
                    with _progress(as_json) as progress:
                        task = progress.add_task("metering", total=publication.published)
                        counts = wait_for_receipt(
                            to_libpq_url(stack.database_url), publication.ingest_id, publication.published,
                            timeout_s=timeout,
                            on_progress=lambda c: progress.update(task, completed=c.total),
                            still_running=(thread.is_alive if thread else None),
                        )
                    if outbox is not None:  # metering has every event: forget them here and now
                        outbox.confirm_round(full=True)
                finally:
                    if consumer is not None:
                        consumer.stop()
                        thread.join(30)
        finally:
            if outbox is not None:
                outbox.close()
                outbox.spool.close()
        counts.rejected += len(publication.bad_lines)
        result = counts.as_dict()
        if not (wait or stack.owns_broker):
            result = {"published": publication.published, "rejected": len(publication.bad_lines),
                      "ingest_id": publication.ingest_id}
    if as_json:
        _print_json(result)
    else:
        console.print(" ".join(f"{k}={v}" for k, v in result.items()))
    metered = result["accepted"] + result["duplicates"] if "accepted" in result else result["published"]
    if metered == 0:
        err_console.print(f"[red]error:[/] no event of the file was {'metered' if 'accepted' in result else 'published'} "
                          f"({result['rejected']} rejected): see the lines above and `infermeter events dead-letters`",
                          soft_wrap=True, highlight=False)
        raise typer.Exit(1)


@events_app.command("dead-letters")
def events_dead_letters(
    limit: Annotated[int, typer.Option(min=1, help="Newest N.")] = 20,
    reason: Annotated[str | None, typer.Option(help="Only this reason code.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The newest dead-lettered events with their reasons."""
    from metering.ops_reads import dead_letters

    with open_stack(get_settings(), broker=False) as stack, psycopg.connect(to_libpq_url(stack.database_url)) as conn:
        rows = dead_letters(conn, limit=limit, reason=reason)
    if as_json:
        _print_json({"dead_letters": rows})
        return
    table = Table("id", "received_at", "reason", "detail", "event id", "bytes")
    for row in rows:
        table.add_row(str(row["id"]), row["received_at"], row["reason"], row["detail"][:80],
                      str(row["event_id"]), str(row["payload_bytes"]))
    console.print(table)


# --- metering ----------------------------------------------------------------------------------


@metering_app.command("run")
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


@metering_app.command("rebuild-totals")
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
        with _progress(as_json) as progress:
            task = progress.add_task("rebuilding period totals", total=len(names))
            for name in names:
                results.append(rebuild(conn, name))
                conn.commit()
                progress.update(task, advance=1)
    rows = sum(r.rows for r in results)
    if as_json:
        _print_json({"customers": [r.as_dict() for r in results], "rows": rows})
        return
    table = Table("customer", "request rows", "usage rows", "task rows", "gpu rows",
                  title=f"period totals rebuilt: {len(results):,} customers, {rows:,} rows")
    for r in results[:50]:
        table.add_row(r.customer_id, f"{r.request_rows:,}", f"{r.usage_rows:,}", f"{r.task_rows:,}", f"{r.gpu_rows:,}")
    console.print(table)
    if len(results) > 50:
        console.print(f"… and {len(results) - 50:,} more customers (--json lists them all)")


@metering_app.command("archive")
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
    with open_stack(settings, broker=False) as stack, _progress(as_json) as progress:
        tasks: dict = {}

        def on_progress(m, done: int, total: int | None) -> None:
            if m not in tasks:
                tasks[m] = progress.add_task(f"archiving {m:%Y-%m}", total=total)
            progress.update(tasks[m], completed=done, total=total)

        done = archive_before(to_libpq_url(stack.database_url), month, directory=folder, now=now,
                              retention_months=settings.retention_months, on_progress=on_progress)
    if as_json:
        _print_json({"before": f"{month:%Y-%m}", "archived": [m.to_json() for m in done]})
        return
    for m in done:
        console.print(f"archived {m.month:%Y-%m}: {m.events:,} events -> {m.file} (verified; raw_events and "
                      "event_keys partitions dropped)", soft_wrap=True, highlight=False)
    if not done:
        console.print(f"nothing to archive before {month:%Y-%m}", highlight=False)


# --- queries -----------------------------------------------------------------------------------


@app.command()
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
        _print_json({"rows": rows})
        return
    columns = [k for k in (rows[0].keys() if rows else ["customer_id", *queries.TOKEN_FIELDS])]
    table = Table(*columns, title=f"usage [{window.start:%Y-%m-%d %H:%M}, {window.end:%Y-%m-%d %H:%M}) UTC")
    for row in rows:
        table.add_row(*[f"{v:,}" if isinstance(v, int) else str(v) for v in row.values()])
    console.print(table)


@app.command()
def tasks(
    customer: Annotated[str, typer.Option(help="The customer whose tasks to list.")],
    task: Annotated[str | None, typer.Option(help="One task only.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Tasks with attempts, tokens and outcome."""
    from metering import queries

    with open_stack(get_settings(), broker=False) as stack, psycopg.connect(to_libpq_url(stack.database_url)) as conn:
        rows = queries.tasks(conn, customer, task_id=task)
    if as_json:
        _print_json({"tasks": rows})
        return
    table = Table("task", "outcome", "attempts", "requests", "input", "cached", "output", "finished_at")
    for r in rows:
        table.add_row(r["task_id"], r["outcome"], str(r["attempts"]), str(r["requests"]), f"{r['input_tokens']:,}",
                      f"{r['cached_input_tokens']:,}", f"{r['output_tokens']:,}", str(r["finished_at"] or ""))
    console.print(table)


@app.command()
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
        _print_json({
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


@app.command()
def demo(
    full: Annotated[bool, typer.Option(help="Build the month from the whole trace (12,031 requests, each conversation 3 times).")] = False,
    requests: Annotated[int | None, typer.Option(help="Build the month from the first N requests of the trace (default 4,000; the month holds 3 x N).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of customer, task and retry assignment.")] = 7,
    out: Annotated[Path | None, typer.Option(help="Folder for the demo's reports (default INFERMETER_HOME/demo).")] = None,
    serve: Annotated[bool, typer.Option(help="Then keep the API and the dashboards up until Ctrl-C (or SIGTERM).")] = False,
    host: Annotated[str | None, typer.Option(help="With --serve: bind address (INFERMETER_API_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="With --serve: port (INFERMETER_API_PORT).")] = None,
) -> None:
    """The main job: a month built from the bundled Mooncake trace, metered through the full local stack, priced and
    invoiced; ends with the dashboards' addresses, a demo customer's API key and the admin sign-in."""
    from app.demo import run_demo

    settings = get_settings()
    out_dir = out or settings.home / "demo"
    if not serve:
        run_demo(settings, full=full, limit=requests, seed=seed, out_dir=out_dir, console=console)
        return
    # SIGINT, SIGTERM, SIGHUP: uvicorn shuts down, then the stack this command started stops
    with stop_on_signals(), contextlib.suppress(KeyboardInterrupt):
        run_demo(settings, full=full, limit=requests, seed=seed, out_dir=out_dir, console=console, serve=True,
                 host=host, port=port)


# --- plumbing ----------------------------------------------------------------------------------


class _NoProgress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def add_task(self, *a, **k):
        return 0

    def update(self, *a, **k):
        pass


def _progress(quiet: bool):
    if quiet:
        return _NoProgress()
    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,}"),
                    TimeElapsedColumn(), console=err_console, transient=True)


def _mount_optional_apps() -> None:
    """The other packages' command groups (imported here, not at module load, to keep start-up light)."""
    if getattr(_mount_optional_apps, "done", False):
        return
    from alerts.cli import app as alerts_cli
    from app.replay import replay_app
    from billing_service.cli import APPS as billing_apps
    from prediction_service.cli import app as predict_cli
    from prediction_service.cli import quote_command
    from pricing_service.cli import app as pricing_cli
    from pricing_service.cli import cost_app
    from serving.capacity_api import capacity_command
    from serving.cli import bench_app, serve_app
    from serving.control_cli import budgets_app, keys_app
    from serving.residency_api import residency_command

    app.add_typer(pricing_cli, name="pricing")
    app.add_typer(predict_cli, name="predict")
    app.add_typer(alerts_cli, name="alerts")
    app.command("quote")(quote_command)
    app.add_typer(cost_app, name="cost")
    app.add_typer(serve_app, name="serve")
    app.add_typer(replay_app, name="replay")
    app.add_typer(bench_app, name="bench")
    app.add_typer(keys_app, name="keys")
    app.add_typer(budgets_app, name="budgets")
    app.command("capacity")(capacity_command)
    # customers, plans, billing, invoices, invoice, credits, stripe (sync, status), export (finance exports)
    for name, billing_group in billing_apps.items():
        app.add_typer(billing_group, name=name)
    # `customers residency`: the store is serving's (the gateway reads it), the group billing's
    billing_apps["customers"].command("residency")(residency_command)
    serve_app.command("dashboards")(_serve_dashboards())
    _mount_optional_apps.done = True


def _serve_dashboards():
    """`infermeter serve dashboards`, with the serving key store dashboards may not import itself."""
    from dashboards.cli import serve_command

    def key_store(settings, database_url):
        from infermeter.db import get_engine
        from serving.keys import KeyStore

        return KeyStore(get_engine(database_url), settings=settings)

    def billing(settings, database_url):  # billing's sections of the pages
        from app.api import dashboard_billing

        return dashboard_billing(settings, database_url)

    return serve_command(key_store, billing)


def main() -> None:
    from metering.kafka_types import KafkaError
    from metering.queries import QueryError

    _mount_optional_apps()
    from alembic.util.exc import CommandError

    known = (CliError, StackError, KafkaError, QueryError, CommandError, psycopg.OperationalError, FileNotFoundError,
             TimeoutError, RuntimeError, ValueError)
    try:
        app()
    except known as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        err_console.print(f"[red]error:[/] {message}", soft_wrap=True, highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()

