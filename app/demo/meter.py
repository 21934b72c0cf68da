"""The demo's events through metering: a consumer for the whole run, publishing to Kafka, waiting
until metering has written them all, then ANALYZE."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator

import psycopg
from rich.console import Console

from app.demo.month import MONTH_END
from infermeter.settings import Settings
from infermeter.stack.postgres import to_libpq_url


@contextlib.contextmanager
def metering_consumer(settings: Settings, stack) -> Iterator[Callable[[], bool] | None]:
    """A metering consumer for the demo's whole run, `--serve` included (events posted to the served
    API are metered, as under `infermeter up`), when the demo's stack owns its broker; on `up`'s
    broker or a configured one, that stack's consumers meter. Yields "is it running" (None when not
    ours), for the waits. Its retention is judged from the end of the demo's month, which it meters as if
    just after it: on the real clock that month leaves the retention (INFERMETER_RETENTION_MONTHS) as
    the years pass, and its events would be dead-lettered as too_old."""
    from metering.consumer import MeteringConsumer, run_in_thread

    if not stack.owns_broker:
        yield None
        return
    consumer = MeteringConsumer(stack.settings_for(settings), stack.database_url, stack.kafka_bootstrap,
                                retention_clock=lambda: MONTH_END)
    thread = run_in_thread(consumer)
    try:
        yield thread.is_alive
    finally:
        consumer.stop()
        thread.join(30)


def meter(settings: Settings, stack, events: list[bytes], console: Console,
           metering_runs: Callable[[], bool] | None):
    """Publish the events to Kafka and wait until metering has written them all (`metering_runs`:
    whether our consumer still runs, None when another process meters)."""
    from rich.progress import Progress

    from metering.ingest import publish_lines, wait_for_receipt
    from metering.kafka import ensure_topics, make_producer

    ensure_topics(stack.kafka_bootstrap, settings)
    producer = make_producer(stack.kafka_bootstrap, settings.kafka_backend)
    ingest_id = f"demo-{uuid.uuid4().hex[:12]}"
    with Progress(console=console, transient=True) as progress:
        sent = progress.add_task("publishing to Kafka", total=len(events))
        publication = publish_lines(producer, settings.events_topic, enumerate(events, 1), ingest_id=ingest_id,
                                    on_progress=lambda n: progress.update(sent, completed=n))
        producer.close()
        metered = progress.add_task("metering into Postgres", total=publication.published)
        counts = wait_for_receipt(
            to_libpq_url(stack.database_url), ingest_id, publication.published, timeout_s=900,
            on_progress=lambda c: progress.update(metered, completed=c.total),
            still_running=metering_runs,
        )
    console.print(f"metered: accepted={counts.accepted:,} duplicates={counts.duplicates:,} "
                  f"rejected={counts.rejected:,}")
    analyze(stack.database_url)
    return counts


def analyze(database_url: str) -> None:
    """ANALYZE after the bulk load: until autovacuum gets to it, the planner's statistics describe
    empty rollups. The plans read from them: metering's `customers_with_usage` walks or reads the
    rollups by its row estimate, and the month's pricing queries join thousands of
    deployment-hours, which a planner without statistics may run as nested loops."""
    with psycopg.connect(to_libpq_url(database_url), autocommit=True) as conn:
        conn.execute("ANALYZE")
