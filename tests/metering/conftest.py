"""Helpers for metering tests: publish events, run the real consumer, snapshot the rollups."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import psycopg

from infermeter.settings import Settings
from infermeter.stack.postgres import to_libpq_url
from metering.consumer import MeteringConsumer, run_in_thread
from metering.contract import REQUEST_V1, TASK_V1, USAGE_V1, encode_event, make_event
from metering.ingest import IngestCounts, publish_lines, receipt, wait_for_receipt
from metering.kafka import ensure_topics, make_producer
from metering.processor import INGEST_ID_HEADER

ROLLUP_TABLES = {
    "request_rollup_hourly": "customer_id, model, deployment_id, hour, project",
    "request_region_hourly": "customer_id, model, deployment_id, region, hour",
    "task_attempts": "customer_id, task_id, attempt",
    "task_outcomes": "customer_id, task_id",
    "task_outcome_reports": "customer_id, task_id, source, event_id",
    "task_usage": "customer_id, task_id, meter",
    "usage_rollup_hourly": "customer_id, meter, hour",
    "gpu_ledger_hourly": "customer_id, deployment_id, replica_id, gpu_type, hour",
}

# The instant the retention (INFERMETER_RETENTION_MONTHS, 13 by default: 2025-12 to 2026-12 from here) is
# judged from by the consumers of tests whose usage is pinned to dates of 2026: on the real clock those
# months leave the retention (their events dead-lettered as too_old) as the years pass. The future
# tolerance stays on the real clock.
RETENTION_NOW = datetime(2026, 12, 1, tzinfo=UTC)


def retention_clock() -> datetime:
    return RETENTION_NOW


def dsn(settings: Settings) -> str:
    return to_libpq_url(settings.database_url)


def snapshot(settings: Settings) -> dict[str, list[tuple]]:
    """Every rollup and ledger row (without bookkeeping columns), sorted."""
    out = {}
    with psycopg.connect(dsn(settings)) as conn:
        for table, order in ROLLUP_TABLES.items():
            rows = conn.execute(f"SELECT * FROM {table} ORDER BY {order}").fetchall()
            out[table] = rows
        out["raw_events"] = conn.execute("SELECT count(*), count(DISTINCT (source, event_id)) FROM raw_events").fetchall()
    return out


def publish(settings: Settings, lines: Iterable[bytes], ingest_id: str | None = None, raw: Iterable[bytes] = ()):
    """Publish JSON lines the way `events ingest` does; `raw` messages go to the topic as they are
    (not even JSON), as a foreign producer might send them."""
    ensure_topics(settings.kafka_bootstrap, settings)
    producer = make_producer(settings.kafka_bootstrap, settings.kafka_backend)
    try:
        publication = publish_lines(producer, settings.events_topic, enumerate(lines, 1), ingest_id=ingest_id)
        for value in raw:
            producer.produce(settings.events_topic, value, headers={INGEST_ID_HEADER: publication.ingest_id.encode()})
            publication.published += 1
        assert producer.flush(30) == 0
        return publication
    finally:
        producer.close()


def meter(settings: Settings, lines: Iterable[bytes], timeout_s: float = 120, raw: Iterable[bytes] = ()) -> IngestCounts:
    """Publish lines and run an in-process consumer until metering has handled all of them."""
    publication = publish(settings, lines, raw=raw)
    consumer = MeteringConsumer(settings, settings.database_url, settings.kafka_bootstrap,
                                retention_clock=retention_clock)
    thread = run_in_thread(consumer)
    try:
        return wait_for_receipt(dsn(settings), publication.ingest_id, publication.published, timeout_s=timeout_s,
                                still_running=thread.is_alive)
    finally:
        consumer.stop()
        thread.join(30)


def request_event(i: int, *, customer: str = "cust-a", model: str = "m1", at: datetime | None = None,
                  input_tokens: int = 100, cached: int = 40, output: int = 10, task_id: str | None = None,
                  attempt: int = 1, source: str = "//test/gw", status: str = "ok", region: str | None = None,
                  project: str | None = None) -> bytes:
    at = at or datetime(2026, 11, 2, 10, 0, tzinfo=UTC) + timedelta(seconds=i)
    data = {"request_id": f"r-{i}", "customer_id": customer, "model": model, "deployment_id": "d1",
            "status": status, "input_tokens": input_tokens, "cached_input_tokens": cached,
            "output_tokens": output, "task_id": task_id, "attempt": attempt,
            "started_at": at - timedelta(seconds=1), "finished_at": at}
    if region is not None:
        data["region"] = region
    if project is not None:
        data["project"] = project
    return encode_event(make_event(REQUEST_V1, source=source, subject=customer, event_id=f"r-{i}", time=at, data=data))


def task_event(task_id: str, customer: str, outcome: str, at: datetime, *, source: str = "//test/agents") -> bytes:
    return encode_event(make_event(
        TASK_V1, source=source, subject=customer, event_id=f"{task_id}/outcome/{outcome}", time=at,
        data={"task_id": task_id, "customer_id": customer, "outcome": outcome, "finished_at": at},
    ))


def usage_event(i: int, customer: str, meter: str, quantity: str, at: datetime, task_id: str | None = None,
                *, source: str = "//test/tools") -> bytes:
    return encode_event(make_event(
        USAGE_V1, source=source, subject=customer, event_id=f"u-{i}", time=at,
        data={"customer_id": customer, "meter": meter, "quantity": quantity, "task_id": task_id},
    ))


def mixed_stream(n: int) -> list[bytes]:
    """Requests over several customers, hours and tasks, plus task outcomes and tool usage."""
    base = datetime(2026, 11, 2, 9, 30, tzinfo=UTC)
    lines = []
    for i in range(n):
        customer = f"cust-{i % 7}"
        task = f"task-{i // 5}" if i % 3 == 0 else None
        lines.append(request_event(i, customer=customer, model=("m1", "m2")[i % 2], at=base + timedelta(seconds=7 * i),
                                   input_tokens=100 + i, cached=i % 50, output=i % 17, task_id=task,
                                   attempt=1 + (i % 2 if task else 0),
                                   region=(None, "eu-west", "us-east")[i % 3]))
    for t in range(0, n // 5, 2):
        lines.append(task_event(f"task-{t}", f"cust-{(t * 5) % 7}", "succeeded", base + timedelta(hours=1, seconds=t)))
    for u in range(n // 10):
        lines.append(usage_event(u, f"cust-{u % 7}", "tool_calls", "2.5", base + timedelta(seconds=11 * u)))
    return lines


def subprocess_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "DATABASE_URL": settings.database_url, "KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "INFERMETER_TOPIC_PREFIX": settings.topic_prefix, "INFERMETER_CONSUMER_GROUP": settings.consumer_group,
        "INFERMETER_HOME": str(settings.home), "INFERMETER_KAFKA_BACKEND": settings.kafka_backend,
        "INFERMETER_BATCH_MAX_WAIT_MS": "50",
    })
    env.update(extra)
    return env


def start_consumer_process(settings: Settings, **extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", "metering", "run", "--quiet"],
        env=subprocess_env(settings, **extra), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def safe_receipt(settings: Settings, ingest_id: str) -> IngestCounts:
    try:
        return receipt(dsn(settings), ingest_id)
    except psycopg.OperationalError:
        return IngestCounts()
