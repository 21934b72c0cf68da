"""`infermeter events ingest|dead-letters`: publish a file of events, inspect dead letters."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import psycopg
import typer
from rich.table import Table

from app.cli.common import CliError, console, err_console, print_json, progress_display
from infermeter.settings import get_settings
from infermeter.stack.local import open_stack
from infermeter.stack.postgres import to_libpq_url

app = typer.Typer(help="Publish events and inspect dead letters.", no_args_is_help=True)


@app.command("ingest")
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
            with progress_display(as_json) as progress:
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
                    with progress_display(as_json) as progress:
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
        print_json(result)
    else:
        console.print(" ".join(f"{k}={v}" for k, v in result.items()))
    metered = result["accepted"] + result["duplicates"] if "accepted" in result else result["published"]
    if metered == 0:
        err_console.print(f"[red]error:[/] no event of the file was {'metered' if 'accepted' in result else 'published'} "
                          f"({result['rejected']} rejected): see the lines above and `infermeter events dead-letters`",
                          soft_wrap=True, highlight=False)
        raise typer.Exit(1)


@app.command("dead-letters")
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
        print_json({"dead_letters": rows})
        return
    table = Table("id", "received_at", "reason", "detail", "event id", "bytes")
    for row in rows:
        table.add_row(str(row["id"]), row["received_at"], row["reason"], row["detail"][:80],
                      str(row["event_id"]), str(row["payload_bytes"]))
    console.print(table)
