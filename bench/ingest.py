"""End-to-end ingest benchmark: Kafka -> metering consumer group -> Postgres.

    python -m bench.ingest --events 200000 --json
    python -m bench.ingest --events 200000 --processes 1,2 --backends confluent,kafka-python

For each backend and each number of consumer processes, in one run:
1. produce N pre-generated request events (~330 bytes each) to a fresh topic;
2. raw consume-only rate: one plain consumer of the same client reads the N messages (no work);
3. metering rate: start P `infermeter metering run` processes in a fresh group on a fresh
   database and time from their start until the last event is committed in Postgres.
Prints `metering_events_per_s`, `raw_consume_events_per_s` and their `ratio` for every cell, and
the steady rate (first commit to last, without process start and group join) with its ratio.
Uses the embedded PostgreSQL and Tansu unless DATABASE_URL / KAFKA_BOOTSTRAP are set.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from rich.console import Console

from infermeter.db import upgrade
from infermeter.settings import Settings
from infermeter.stack import scratch_folder, start_embedded_postgres, start_tansu, to_libpq_url
from metering.contract import REQUEST_V1, encode_event, make_event
from metering.kafka import (
    create_topic,
    list_partitions,
    make_assigned_consumer,
    make_producer,
)
from metering.processor import INGEST_ID_HEADER

console = Console(stderr=True)


def generate(n: int, seed: int = 7) -> list[tuple[bytes, bytes]]:
    import random

    rng = random.Random(seed)
    base = datetime(2026, 11, 2, tzinfo=UTC)
    out = []
    for i in range(n):
        customer = f"cust-{min(int(rng.paretovariate(1.2)), 50):03d}"
        finished = base + timedelta(microseconds=i * 18_000)
        input_tokens = rng.randint(50, 8000)
        event = make_event(
            REQUEST_V1,
            source="//bench/gateway",
            subject=customer,
            event_id=f"bench-{i}",
            time=finished,
            data={
                "request_id": f"bench-{i}", "customer_id": customer, "model": rng.choice(("kimi-chat", "kimi-chat-lite")),
                "deployment_id": rng.choice(("dep-a", "dep-b")), "replica_id": f"r{rng.randint(0, 7)}",
                "status": "ok", "input_tokens": input_tokens, "cached_input_tokens": input_tokens // 2,
                "output_tokens": rng.randint(1, 500), "attempt": 1,
                "started_at": finished - timedelta(seconds=1), "finished_at": finished,
            },
        )
        out.append((customer.encode(), encode_event(event)))
    return out


def produce(bootstrap: str, topic: str, events, ingest_id: str) -> float:
    producer = make_producer(bootstrap, "confluent", linger_ms=20)
    headers = {INGEST_ID_HEADER: ingest_id.encode()}
    started = time.perf_counter()
    for i, (key, value) in enumerate(events):
        producer.produce(topic, value, key=key, headers=headers)
        if i % 20000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0, "broker did not ack every event"
    producer.close()
    return len(events) / (time.perf_counter() - started)


def raw_consume_rate(bootstrap: str, backend: str, topic: str, expected: int) -> float:
    partitions = list_partitions(bootstrap, topic, backend="confluent")
    consumer = make_assigned_consumer(bootstrap, backend=backend, offsets={tp: 0 for tp in partitions})
    seen = 0
    started = time.perf_counter()
    deadline = started + 300
    while seen < expected and time.perf_counter() < deadline:
        seen += len(consumer.poll_batch(5000, 0.5))
    elapsed = time.perf_counter() - started
    consumer.close()
    if seen < expected:
        raise RuntimeError(f"raw consumer saw {seen} of {expected}")
    return expected / elapsed


def new_database(server_url: str) -> str:
    name = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(to_libpq_url(server_url), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    head, _, query = server_url.partition("?")
    url = head.rsplit("/", 1)[0] + f"/{name}" + (f"?{query}" if query else "")
    upgrade(url)
    return url


def metering_rate(bootstrap: str, backend: str, topic_prefix: str, database_url: str, processes: int,
                  expected: int, ingest_id: str) -> tuple[float, float]:
    """(rate from process start to the last commit, steady rate from the first commit to the last)."""
    group = f"bench-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, DATABASE_URL=database_url, KAFKA_BOOTSTRAP=bootstrap, INFERMETER_KAFKA_BACKEND=backend,
               INFERMETER_TOPIC_PREFIX=topic_prefix, INFERMETER_CONSUMER_GROUP=group)
    dsn = to_libpq_url(database_url)
    started = time.perf_counter()
    workers = [
        subprocess.Popen([sys.executable, "-m", "app.cli", "metering", "run", "--quiet"], env=env)
        for _ in range(processes)
    ]
    try:
        deadline = started + 600
        first: tuple[float, int] | None = None
        while time.perf_counter() < deadline:
            with psycopg.connect(dsn) as conn:
                row = conn.execute("SELECT accepted + duplicates + rejected FROM ingest_receipts WHERE ingest_id = %s",
                                   (ingest_id,)).fetchone()
            done = row[0] if row else 0
            now = time.perf_counter()
            if done and first is None:
                first = (now, done)
            if done >= expected:
                steady = (expected - first[1]) / (now - first[0]) if now > first[0] else float("nan")
                return expected / (now - started), steady
            if any(w.poll() is not None for w in workers):
                raise RuntimeError("a metering process exited early")
            time.sleep(0.05)
        raise RuntimeError("metering did not finish in 600 s")
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(30)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--processes", default="1,2", help="comma-separated consumer process counts")
    parser.add_argument("--backends", default="confluent,kafka-python")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    args = parser.parse_args(argv)

    with scratch_folder("infermeter-bench-") as workdir:
        return _run(args, workdir)


def _run(args: argparse.Namespace, workdir: Path) -> dict:
    owned = []
    server_url = os.environ.get("DATABASE_URL") or start_embedded_postgres(workdir / "pg")
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if not bootstrap:
        broker = start_tansu(log_path=workdir / "tansu.log")
        owned.append(broker)
        bootstrap = broker.bootstrap
    try:
        console.print(f"generating {args.events} events…")
        events = generate(args.events)
        results = []
        for backend in args.backends.split(","):
            prefix = f"bench{uuid.uuid4().hex[:6]}"
            topic = Settings(INFERMETER_TOPIC_PREFIX=prefix).events_topic
            create_topic(bootstrap, topic, args.partitions)
            ingest_id = uuid.uuid4().hex
            produce_rate = produce(bootstrap, topic, events, ingest_id)
            for processes in [int(p) for p in args.processes.split(",")]:
                raw = raw_consume_rate(bootstrap, backend, topic, args.events)
                database_url = new_database(server_url)
                rate, steady = metering_rate(bootstrap, backend, prefix, database_url, processes, args.events, ingest_id)
                cell = {
                    "backend": backend,
                    "processes": processes,
                    "events": args.events,
                    "produce_events_per_s": round(produce_rate),
                    "metering_events_per_s": round(rate),
                    "raw_consume_events_per_s": round(raw),
                    "ratio": round(rate / raw, 3),
                    # Without the start-up (process start + consumer-group join, ~3-5 s on Tansu):
                    "metering_steady_events_per_s": round(steady),
                    "steady_ratio": round(steady / raw, 3),
                }
                results.append(cell)
                console.print(cell)
        report = {"benchmark": "ingest", "results": results}
        print(json.dumps(report, indent=None if args.json else 2))
        return report
    finally:
        for broker in owned:
            broker.stop()


if __name__ == "__main__":
    main()
