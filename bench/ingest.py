"""End-to-end ingest benchmark: Kafka -> metering consumer group -> Postgres.

    python -m bench.ingest --events 200000 --json
    python -m bench.ingest --events 200000 --processes 1,2 --backends confluent,kafka-python
    python -m bench.ingest --events 100000 --processes 1 --backends confluent --ack broker,metered
    python -m bench.ingest --events 200000 --processes 1 --backends confluent --totals on,off,on,off
    (options: --events N, --processes 1,2, --backends confluent,kafka-python, --partitions 8,
     --ack broker[,metered], --totals on[,off...], --json)

For each backend and each number of consumer processes, in one run:
1. produce N pre-generated request events (~330 bytes each) to a fresh topic;
2. raw consume-only rate: one plain consumer of the same client reads the N messages (no work);
3. metering rate: start P `infermeter metering run` processes in a fresh group on a fresh
   database and time from their start until the last event is committed in Postgres.
Prints `metering_events_per_s`, `raw_consume_events_per_s` and their `ratio` for every cell, and
the steady rate (first commit to last, without process start and group join) with its ratio.
Uses the embedded PostgreSQL and Tansu unless DATABASE_URL / KAFKA_BOOTSTRAP are set.

`--stored-keys N` (bench.ingest --stored-keys 20000000 --events 200000 --processes 1 --backends confluent):
ingest into a store that already holds N event keys against ingest into an empty one, in the same
run. The keys are preloaded with SQL (generate_series) into the event_keys partitions of the 12
UTC months before the current one (the retained months of INFERMETER_RETENTION_MONTHS=13); the
ingested events fall in the current month. The same produced topic is metered into each store in
turn (`--rounds` pairs, ABAB then BABA: the current month's partitions and every rollup are emptied
before each measurement); the report gives each arm's median and `ratio` = stored / empty (target
>= 0.9). Then, in-process and batch by batch in turn (bench.write_path's method, `--write-path-events`
each): the write path into the empty store, into the stored one, into the stored one with every
event also probed against every retained month's key (a design that catches an id reused in another
month: `probe_all_months`), and into a database with the schema before migration 0015 (one
unpartitioned key table, empty: `before_0015`); and the readers that look keys up without a time
(`metering.event_lookups.handled_event_keys`, 5,000 keys) on the stored store against the empty one.

`--ack broker,metered` measures both acknowledgement modes in one run (default: broker only).
broker: the events are produced straight from memory (what `events ingest` does with
INFERMETER_ACK=broker). metered: they are appended to an outbox spool (SQLite) and published from
it (`metering.ingest.spool_lines` + `publish_spooled`, what `events ingest` does by default with
the embedded broker), and while the metering processes run, a confirmer asks their database every
0.5 s which events are recorded and deletes those from the spool (the outbox's confirm round, the work
`infermeter up` does). Reported in addition: `spool_append_events_per_s`, and `confirmed_s_after`,
how long after the last event was metered the spool was empty.

`--totals on,off,...` compares ingest with the period totals kept (`on`, what metering does) and
without them (`off`: the writer's statement without the totals CTEs, no calendar lock, no task
statement), one cell per value in the order given (alternate them: on,off,on,off). Every cell's
database gives a third of the customers an Asia/Kolkata calendar (periods handed over as billing
does), so the period lookups find rows. Both variants then run through `consume` below (a
`metering run` whose writers may leave the totals out). The same run then measures the write floor
(bench.write_path's PostgreSQL rate, the old statement and the new one alternating batch by batch,
in-process), the same over the events as agent traffic (`with_tasks`: requests in tasks with
attempts, outcome events, so the task statement runs), each also as CPU time per event (the
PostgreSQL backend's and the writing thread's: what a busy shared machine disturbs least), the
calendar lock's own cost per batch, and prints `totals_ratio` (mean steady rate on / off) and
`floor_ratio` (mean steady rate on / the old statement's PostgreSQL rate).
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
from infermeter.settings import Settings, get_settings
from infermeter.stack.broker import start_tansu
from infermeter.stack.postgres import scratch_folder, start_embedded_postgres, to_libpq_url
from infermeter.times import add_months, month_start
from metering.contract import REQUEST_V1, encode_event, make_event
from metering.kafka import (
    create_topic,
    list_partitions,
    make_assigned_consumer,
    make_producer,
)
from metering.processor import INGEST_ID_HEADER

console = Console(stderr=True)


def generate(n: int, seed: int = 7, *, base: datetime | None = None, step_us: int = 18_000,
             prefix: str = "bench") -> list[tuple[bytes, bytes]]:
    """N request events from //bench/gateway with ids PREFIX-i, one every `step_us` from `base`
    (default 2026-11-02)."""
    import random

    rng = random.Random(seed)
    base = base or datetime(2026, 11, 2, tzinfo=UTC)
    out = []
    for i in range(n):
        customer = f"cust-{min(int(rng.paretovariate(1.2)), 50):03d}"
        finished = base + timedelta(microseconds=i * step_us)
        input_tokens = rng.randint(50, 8000)
        event = make_event(
            REQUEST_V1,
            source="//bench/gateway",
            subject=customer,
            event_id=f"{prefix}-{i}",
            time=finished,
            data={
                "request_id": f"{prefix}-{i}", "customer_id": customer, "model": rng.choice(("kimi-chat", "kimi-chat-lite")),
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


def produce_via_outbox(bootstrap: str, topic: str, events, ingest_id: str, spool_path: Path) -> tuple[float, float]:
    """`events ingest` with metered ack: spool, then publish from the spool. (append rate, produce rate)."""
    from metering.ingest import publish_spooled, spool_lines
    from metering.publisher import Outbox
    from metering.spool import Spool

    spool = Spool(spool_path)
    started = time.perf_counter()
    taken = spool_lines(spool, enumerate((value for _key, value in events), 1), ingest_id=ingest_id)
    appended = time.perf_counter()
    outbox = Outbox(spool, topic=topic, bootstrap=bootstrap, ack="metered", confirm=lambda keys, since: set(),
                    producer_factory=lambda b: make_producer(b, "confluent", linger_ms=20, idempotent=False))
    producer = make_producer(bootstrap, "confluent", linger_ms=20, idempotent=False)
    publish_spooled(outbox, producer, taken)
    producer.close()
    spool.close()
    elapsed = time.perf_counter() - started
    return len(events) / (appended - started), len(events) / elapsed


class Confirming:
    """The confirmer of metered ack against a cell's database, over a copy of the published spool."""

    def __init__(self, spool_path: Path, database_url: str) -> None:
        import shutil
        import threading

        from metering.confirmer import MeteringConfirmer
        from metering.publisher import Outbox
        from metering.spool import Spool

        copy = spool_path.with_name(f"{spool_path.stem}-{uuid.uuid4().hex[:6]}.sqlite3")
        shutil.copy(spool_path, copy)
        self.spool = Spool(copy)
        # The rows stay published for the whole measurement (no republishing: nothing is lost here).
        self.outbox = Outbox(self.spool, topic="unused", bootstrap=None, producer_factory=lambda b: None,
                             ack="metered", confirm=MeteringConfirmer(database_url), ack_timeout_s=3600)
        self.empty_at: float | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.cpu_s = self.wall_s = 0.0
        while not self.stop.wait(0.5):
            cpu, wall = time.thread_time(), time.perf_counter()
            self.outbox.confirm_round()
            self.cpu_s += time.thread_time() - cpu
            self.wall_s += time.perf_counter() - wall
            if self.spool.depth() == 0:
                self.empty_at = time.perf_counter()
                return

    def close(self, wait_s: float = 60) -> float | None:
        self.thread.join(wait_s)
        self.stop.set()
        self.thread.join()
        self.outbox.close()
        self.spool.close()
        return self.empty_at


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


def copy_database(server_url: str, url: str) -> str:
    """A copy of the database at `url` (nobody may be connected to it), as a SQLAlchemy URL."""
    name = f"bench_{uuid.uuid4().hex[:10]}"
    head, _, query = url.partition("?")
    with psycopg.connect(to_libpq_url(server_url), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {head.rsplit('/', 1)[1]} STRATEGY file_copy")
    return head.rsplit("/", 1)[0] + f"/{name}" + (f"?{query}" if query else "")


def new_database(server_url: str, revision: str = "heads", *, calendars: bool = False) -> str:
    """A fresh database migrated to `revision`; with `calendars`, every third of generate()'s customers
    kept by Asia/Kolkata periods (anchor day 1), handed to metering as billing does."""
    name = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(to_libpq_url(server_url), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    head, _, query = server_url.partition("?")
    url = head.rsplit("/", 1)[0] + f"/{name}" + (f"?{query}" if query else "")
    upgrade(url, revision)
    if calendars:
        from billing.periods import periods_between
        from metering.calendars import SPAN, set_calendar

        with psycopg.connect(to_libpq_url(url)) as conn:
            for n in range(1, 51, 3):
                set_calendar(conn, f"cust-{n:03d}", "Asia/Kolkata", 1,
                             ((p.start, p.end) for p in periods_between(*SPAN, "Asia/Kolkata", 1)))
    return url


def consume(period_totals: bool) -> None:
    """`infermeter metering run --quiet` (configured by the environment), its writers keeping the
    period totals or not: the consumer of `--totals` cells."""
    import signal

    from metering.consumer import MeteringConsumer

    settings = get_settings()
    consumer = MeteringConsumer(settings, settings.database_url, settings.kafka_bootstrap)
    for writer in consumer.writers:
        writer.period_totals = period_totals
    signal.signal(signal.SIGTERM, lambda *_: consumer.stop())
    consumer.run()


def metering_rate(bootstrap: str, backend: str, topic_prefix: str, database_url: str, processes: int,
                  expected: int, ingest_id: str, spool_path: Path | None = None,
                  period_totals: bool | None = None) -> tuple[float, float, float | None]:
    """(rate from process start to the last commit, steady rate from the first commit to the last,
    with `spool_path` (metered ack): seconds from the last commit until the confirmer emptied the spool).
    `period_totals` True/False: the processes are `consume(period_totals)`; None: `infermeter metering run`."""
    confirming = Confirming(spool_path, database_url) if spool_path else None
    group = f"bench-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, DATABASE_URL=database_url, KAFKA_BOOTSTRAP=bootstrap, INFERMETER_KAFKA_BACKEND=backend,
               INFERMETER_TOPIC_PREFIX=topic_prefix, INFERMETER_CONSUMER_GROUP=group)
    dsn = to_libpq_url(database_url)
    started = time.perf_counter()
    command = [sys.executable, "-m", "app.cli", "metering", "run", "--quiet"] if period_totals is None else \
        [sys.executable, "-c", f"from bench.ingest import consume; consume({period_totals})"]
    workers = [subprocess.Popen(command, env=env) for _ in range(processes)]
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
                confirmed_after = None
                if confirming is not None:
                    empty_at = confirming.close()
                    console.print(f"confirmer: {confirming.cpu_s:.2f} s CPU, {confirming.wall_s:.2f} s in rounds")
                    confirming = None
                    confirmed_after = None if empty_at is None else max(0.0, empty_at - now)
                return expected / (now - started), steady, confirmed_after
            if any(w.poll() is not None for w in workers):
                raise RuntimeError("a metering process exited early")
            time.sleep(0.05)
        raise RuntimeError("metering did not finish in 600 s")
    finally:
        if confirming is not None:
            confirming.close(0)
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
    parser.add_argument("--ack", default="broker", help="comma-separated acknowledgement modes: broker,metered")
    parser.add_argument("--totals", default=None,
                        help="comma-separated on/off: ingest with the period totals kept or without, one cell each "
                             "(e.g. on,off,on,off), then the write floor and the ratios")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    parser.add_argument("--stored-keys", type=int, default=0,
                        help="the stored-keys mode: ingest with N event keys already stored vs an empty store")
    parser.add_argument("--rounds", type=int, default=2, help="stored-keys mode: measurement pairs per store")
    parser.add_argument("--write-path-events", type=int, default=60_000,
                        help="stored-keys mode: events per arm of the in-process write-path comparison")
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
        if args.stored_keys:
            return _stored_keys_run(args, server_url, bootstrap)
        console.print(f"generating {args.events} events…")
        events = generate(args.events)
        results = []
        variants = [None] if args.totals is None else [_on_off(v) for v in args.totals.split(",")]
        for backend in args.backends.split(","):
            for ack, period_totals in [(a, v) for a in args.ack.split(",") for v in variants]:
                if ack not in ("broker", "metered"):
                    raise SystemExit(f"--ack: broker or metered, not {ack!r}")
                prefix = f"bench{uuid.uuid4().hex[:6]}"
                topic = Settings(INFERMETER_TOPIC_PREFIX=prefix).events_topic
                create_topic(bootstrap, topic, args.partitions)
                ingest_id = uuid.uuid4().hex
                spool_path = append_rate = None
                if ack == "metered":
                    spool_path = workdir / f"spool-{prefix}.sqlite3"
                    append_rate, produce_rate = produce_via_outbox(bootstrap, topic, events, ingest_id, spool_path)
                else:
                    produce_rate = produce(bootstrap, topic, events, ingest_id)
                for processes in [int(p) for p in args.processes.split(",")]:
                    raw = raw_consume_rate(bootstrap, backend, topic, args.events)
                    database_url = new_database(server_url, calendars=period_totals is not None)
                    rate, steady, confirmed_after = metering_rate(
                        bootstrap, backend, prefix, database_url, processes, args.events, ingest_id, spool_path,
                        period_totals,
                    )
                    cell = {
                        "backend": backend,
                        "ack": ack,
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
                    if period_totals is not None:
                        cell["period_totals"] = "on" if period_totals else "off"
                    if ack == "metered":
                        cell["spool_append_events_per_s"] = round(append_rate)
                        cell["confirmed_s_after"] = None if confirmed_after is None else round(confirmed_after, 2)
                    results.append(cell)
                    console.print(cell)
        report = {"benchmark": "ingest", "results": results}
        if args.totals is not None:
            report["period_totals"] = totals_comparison(server_url, results)
        print(json.dumps(report, indent=None if args.json else 2))
        return report
    finally:
        for broker in owned:
            broker.stop()


# --- period totals kept or not (--totals) ---------------------------------------------------------


def _without_totals(name: str, writer) -> None:
    """`alternating_write_costs`' setup: the writer named "without" leaves the period totals out."""
    writer.period_totals = name != "without"


def _floor_figures(name: str, costs: dict[str, dict[str, float]]) -> dict:
    """Rates, CPU per event and their ratios (with the totals / without) of one floor measurement."""
    without, with_ = costs["without"], costs["with"]
    return {
        f"{name}_without_totals_events_per_s": round(without["events_per_s"]),
        f"{name}_with_totals_events_per_s": round(with_["events_per_s"]),
        f"{name}_totals_ratio": round(with_["events_per_s"] / without["events_per_s"], 3),
        f"{name}_without_totals_cpu_us_per_event": round(without["cpu_us_per_event"], 2),
        f"{name}_with_totals_cpu_us_per_event": round(with_["cpu_us_per_event"], 2),
        f"{name}_totals_cpu_ratio": round(with_["cpu_us_per_event"] / without["cpu_us_per_event"], 3),
    }


def _on_off(value: str) -> bool:
    if value not in ("on", "off"):
        raise SystemExit(f"--totals: on or off, not {value!r}")
    return value == "on"


def with_tasks(events: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The same request events as agent traffic: each customer's requests in tasks of up to 4 attempts
    (a new task every 8 of its requests), a task's outcome event after its last request (one in five
    failed), so every batch moves task period totals."""
    import orjson

    from metering.contract import TASK_V1

    out, seen = [], {}
    for key, value in events:
        event = orjson.loads(value)
        data = event["data"]
        n = seen[data["customer_id"]] = seen.get(data["customer_id"], -1) + 1
        data["task_id"], data["attempt"] = f"{data['customer_id']}-task-{n // 8}", 1 + n % 8 // 2
        out.append((key, orjson.dumps(event)))
        if n % 8 == 7:
            outcome = make_event(TASK_V1, source="//bench/agents", subject=data["customer_id"],
                                 event_id=f"{data['task_id']}/outcome", time=datetime.fromisoformat(event["time"]),
                                 data={"task_id": data["task_id"], "customer_id": data["customer_id"],
                                       "outcome": "failed" if n % 40 == 39 else "succeeded",
                                       "finished_at": datetime.fromisoformat(event["time"])})
            out.append((key, encode_event(outcome)))
    return out


def totals_comparison(server_url: str, results: list[dict], events: int = 60_000) -> dict:
    """The ratios of `--totals`: ingest on / off (mean steady rates of the cells), the write floor in
    the same run (bench.write_path's PostgreSQL rate: the old statement and the one with the totals,
    alternating batch by batch, each into its own database with the same calendars), ingest on / that
    floor, and the calendar lock's own cost (the shared lock's statement alone, per batch)."""
    import statistics

    from bench.write_path import BATCH, alternating_write_costs
    from metering.kafka_types import Message
    from metering.period_totals import LOCK_CALENDARS_SHARED

    def mean_steady(on: bool) -> float | None:
        rates = [r["metering_steady_events_per_s"] for r in results if r.get("period_totals") == ("on" if on else "off")]
        return statistics.fmean(rates) if rates else None

    console.print(f"write floor: {events} events, the old statement and the new one alternating…")
    generated = generate(events, seed=3)
    messages = [Message("events", i % 8, i // 8, key, value, {}, None) for i, (key, value) in enumerate(generated)]
    floor = alternating_write_costs({"without": (new_database(server_url, calendars=True), messages),
                                     "with": (new_database(server_url, calendars=True), messages)},
                                    flip=True, setup=_without_totals)
    tasks = [Message("events", i % 8, i // 8, key, value, {}, None) for i, (key, value) in enumerate(with_tasks(generated))]
    console.print(f"write floor with tasks: {len(tasks)} events…")
    task_floor = alternating_write_costs({"without": (new_database(server_url, calendars=True), tasks),
                                          "with": (new_database(server_url, calendars=True), tasks)},
                                         flip=True, setup=_without_totals)
    lock_s = []
    with psycopg.connect(to_libpq_url(new_database(server_url))) as conn:
        for _ in range(200):
            started = time.perf_counter()
            conn.execute(LOCK_CALENDARS_SHARED)
            lock_s.append(time.perf_counter() - started)
            conn.commit()
    on, off = mean_steady(True), mean_steady(False)
    out = {
        "ingest_steady_on_events_per_s": on and round(on), "ingest_steady_off_events_per_s": off and round(off),
        "totals_ratio": round(on / off, 3) if on and off else None,
        "floor_ratio": round(on / floor["without"]["events_per_s"], 3) if on else None,
        **_floor_figures("floor", floor),
        **_floor_figures("tasks_floor", task_floor),
        "calendar_lock_us": round(statistics.median(lock_s) * 1e6, 1),
        "calendar_lock_share_of_a_batch": round(statistics.median(lock_s) / (BATCH / floor["with"]["events_per_s"]), 5),
    }
    console.print(out)
    return out


# --- the stored-keys mode ------------------------------------------------------------------------

STORED_MONTHS = 12  # the retained months before the current one (INFERMETER_RETENTION_MONTHS=13)
METERING_STATE = ("request_rollup_hourly", "request_region_hourly", "task_attempts", "task_outcomes",
                  "task_outcome_reports", "task_usage", "usage_rollup_hourly", "gpu_ledger_hourly",
                  "ingest_receipts", "consumer_offsets", "dead_letters")


def current_month_events(n: int, now: datetime, prefix: str = "bench") -> list[tuple[bytes, bytes]]:
    """`generate`'s events, all inside the current UTC month and before `now`."""
    start = month_start(now)
    room_us = (now - start - timedelta(minutes=1)) // timedelta(microseconds=1)
    if room_us < n:
        raise SystemExit("the current UTC month is too young for the stored-keys mode; run it a few minutes later")
    return generate(n, base=start, step_us=min(18_000, room_us // n), prefix=prefix)


def preload_keys(url: str, keys: int, month: datetime) -> float:
    """`keys` event keys of //bench/gateway, spread evenly over the STORED_MONTHS months before `month`
    and over each month's time, written with SQL into the partitions the writer creates (raw_events'
    too, left empty); each month's key is built once its rows are in, then the partition is frozen
    and analyzed so that autovacuum keeps out of the measurement. Seconds taken."""
    started = time.perf_counter()
    per_month, extra = divmod(keys, STORED_MONTHS)
    first_id = 0
    with psycopg.connect(to_libpq_url(url), autocommit=True) as conn:
        for k in range(STORED_MONTHS):
            first = add_months(month, k - STORED_MONTHS)
            count = per_month + (k < extra)
            bounds = f"FOR VALUES FROM ('{first.isoformat()}') TO ('{add_months(first, 1).isoformat()}')"
            conn.execute(f"CREATE TABLE raw_events_{first:%Y_%m} PARTITION OF raw_events {bounds}")
            conn.execute(f"CREATE TABLE event_keys_{first:%Y_%m} PARTITION OF event_keys {bounds}")
            conn.execute(
                f"INSERT INTO event_keys_{first:%Y_%m} (source, event_id, occurred_at) "
                "SELECT '//bench/gateway', 'stored-' || g, %(first)s::timestamptz + make_interval(secs => "
                "(g - %(lo)s) * %(step)s) FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g",
                {"first": first, "lo": first_id, "hi": first_id + count - 1,
                 "step": (add_months(first, 1) - first).total_seconds() / max(count, 1)})
            conn.execute(f"ALTER TABLE event_keys_{first:%Y_%m} ADD PRIMARY KEY (source, event_id)")
            conn.execute(f"VACUUM (FREEZE, ANALYZE) event_keys_{first:%Y_%m}")
            first_id += count
            console.print(f"  {first:%Y-%m}: {count:,} keys ({time.perf_counter() - started:.0f} s)")
    return time.perf_counter() - started


def reset_current_month(url: str, month: datetime) -> None:
    """Empty what metering wrote into a store: the current month's partitions and every rollup."""
    with psycopg.connect(to_libpq_url(url), autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS raw_events_{month:%Y_%m}, event_keys_{month:%Y_%m}")
        conn.execute(f"TRUNCATE {', '.join(METERING_STATE)}")


def _stored_keys_run(args: argparse.Namespace, server_url: str, bootstrap: str) -> dict:
    import statistics

    now = datetime.now(UTC)
    month = month_start(now)
    events = current_month_events(args.events, now)
    urls = {"empty": new_database(server_url), "stored": new_database(server_url)}
    console.print(f"preloading {args.stored_keys:,} keys over the {STORED_MONTHS} months before {month:%Y-%m}…")
    preload_s = preload_keys(urls["stored"], args.stored_keys, month)
    backend = args.backends.split(",")[0]
    processes = int(args.processes.split(",")[0])
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    topic = Settings(INFERMETER_TOPIC_PREFIX=prefix).events_topic
    create_topic(bootstrap, topic, args.partitions)
    ingest_id = uuid.uuid4().hex
    produce(bootstrap, topic, events, ingest_id)
    runs = []
    for r in range(args.rounds):
        for store in ("empty", "stored") if r % 2 == 0 else ("stored", "empty"):
            reset_current_month(urls[store], month)
            rate, steady, _ = metering_rate(bootstrap, backend, prefix, urls[store], processes, args.events, ingest_id)
            runs.append({"store": store, "round": r, "metering_events_per_s": round(rate),
                         "metering_steady_events_per_s": round(steady)})
            console.print(runs[-1])

    def median(store: str, key: str) -> float:
        return statistics.median(run[key] for run in runs if run["store"] == store)

    for store in urls:
        reset_current_month(urls[store], month)
    report = {
        "benchmark": "ingest_stored_keys", "stored_keys": args.stored_keys, "preload_s": round(preload_s, 1),
        "events": args.events, "backend": backend, "processes": processes, "runs": runs,
        "empty_events_per_s": median("empty", "metering_events_per_s"),
        "stored_events_per_s": median("stored", "metering_events_per_s"),
        "ratio": round(median("stored", "metering_events_per_s") / median("empty", "metering_events_per_s"), 3),
        "steady_ratio": round(median("stored", "metering_steady_events_per_s")
                              / median("empty", "metering_steady_events_per_s"), 3),
        **_write_path_arms(server_url, urls, month, now, args.write_path_events),
    }
    print(json.dumps(report, indent=None if args.json else 2))
    return report


def _write_path_arms(server_url: str, urls: dict[str, str], month: datetime, now: datetime, n: int) -> dict:
    """The write path in-process (bench.write_path's alternation): empty store, stored store, stored
    store probing every month's key per event, the schema before migration 0015; then the readers by
    key alone."""
    import contextlib
    import statistics

    import metering.writer as writer_module
    from bench.write_path import alternating_write_rates
    from metering.event_lookups import handled_event_keys
    from metering.kafka_types import Message

    # A probe of every retained month's key per event, as a scalar subquery (one index probe per
    # partition and event: the plan a per-event check has, not a hash anti-join over all the keys).
    keys_insert = "SELECT source, event_id, occurred_at FROM stage\n    ORDER BY source, event_id"
    assert keys_insert in writer_module.WRITE_BATCH
    probing = writer_module.WRITE_BATCH.replace(keys_insert, (
        "SELECT source, event_id, occurred_at FROM stage s\n"
        "    WHERE (SELECT 1 FROM event_keys k WHERE k.source = s.source AND k.event_id = s.event_id LIMIT 1) IS NULL\n"
        "    ORDER BY source, event_id"))
    before = new_database(server_url, "0014")
    with psycopg.connect(to_libpq_url(before), autocommit=True) as conn:
        conn.execute(f"CREATE TABLE raw_events_{month:%Y_%m} PARTITION OF raw_events FOR VALUES FROM "
                     f"('{month.isoformat()}') TO ('{add_months(month, 1).isoformat()}')")

    def messages(prefix: str) -> list[Message]:
        return [Message("events", i % 8, i // 8, key, value, {}, None)
                for i, (key, value) in enumerate(current_month_events(n, now, prefix))]

    # each arm writes into a database of its own (the probing one into a copy of the stored store), so
    # that no arm's rows, rollup updates or index growth land in another's
    arms = {"empty": (urls["empty"], messages("wp-empty")), "stored": (urls["stored"], messages("wp-stored")),
            "probe_all_months": (copy_database(server_url, urls["stored"]), messages("wp-probe")),
            "before_0015": (before, messages("wp-before"))}

    def setup(name: str, writer) -> None:
        if name == "before_0015":  # its month's raw partition exists; 0014 knows no key partitions
            writer.connection()  # (a new connection forgets the partitions it made)
            writer._partitions.add(month)

    @contextlib.contextmanager
    def around(name: str):
        saved = writer_module.WRITE_BATCH
        writer_module.WRITE_BATCH = probing if name == "probe_all_months" else saved
        try:
            yield
        finally:
            writer_module.WRITE_BATCH = saved

    rates = alternating_write_rates(arms, flip=True, setup=setup, around=around)
    readers = {}
    for store, prefix in (("empty", "wp-empty"), ("stored", "wp-stored")):
        keys = [("//bench/gateway", f"{prefix}-{i}") for i in range(min(5000, n))]
        with psycopg.connect(to_libpq_url(urls[store])) as conn:
            seconds = []
            for _ in range(7):
                t = time.perf_counter()
                assert len(handled_event_keys(conn, keys)) == len(keys)
                seconds.append(time.perf_counter() - t)
        readers[store] = statistics.median(seconds)
    return {
        "write_path_events_per_s": {name: round(rate) for name, rate in rates.items()},
        "write_path_stored_ratio": round(rates["stored"] / rates["empty"], 3),
        "write_path_probe_all_months_ratio": round(rates["probe_all_months"] / rates["stored"], 3),
        "write_path_after_vs_before_0015": round(rates["empty"] / rates["before_0015"], 3),
        "handled_event_keys_5000_ms": {store: round(s * 1000, 1) for store, s in readers.items()},
    }


if __name__ == "__main__":
    main()
