"""The metering write path in parts, in one run: where an event's time goes.

    python -m bench.write_path [--events 60000] [--region] [--json]

- `decode_events_per_s`: metering.processor.process (validation, staging rows), pure Python;
- `postgres_events_per_s`: one BatchWriter transaction per 5,000 events (COPY + the one
  statement + offsets + commit), on an already-decoded batch, one connection;
- `end_to_end_events_per_s`: both, as the consumer's writer does them (decode then write),
  without Kafka.
- with `--region`: `postgres_region_events_per_s`, the same events each carrying a `region` (two
  regions), so request_region_hourly is written too; alternating with the plain events, batch by
  batch, and their ratio (`region_write_ratio`).
The ratios tell which part bounds a consumer process; bench.ingest adds the broker.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from datetime import UTC, datetime

import psycopg

from bench.ingest import generate, new_database
from infermeter.stack.postgres import scratch_folder, start_embedded_postgres, to_libpq_url
from infermeter.stack.processes import process_cpu_s
from metering.kafka_types import Message
from metering.processor import process
from metering.writer import BatchWriter

BATCH = 5000


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--region", action="store_true", help="also measure events that carry a region")
    args = parser.parse_args(argv)
    with scratch_folder("infermeter-bench-") as folder:
        return _run(args, os.environ.get("DATABASE_URL") or start_embedded_postgres(folder / "pg"))


def _run(args: argparse.Namespace, server: str) -> dict:
    messages = [Message("events", i % 8, i // 8, key, value, {}, None)
                for i, (key, value) in enumerate(generate(args.events, seed=3))]
    batches = [messages[i:i + BATCH] for i in range(0, len(messages), BATCH)]
    now = datetime.now(UTC)

    started = time.perf_counter()
    prepared_batches = [process(b, now=now, max_bytes=65536, future_tolerance_s=300) for b in batches]
    decode_rate = len(messages) / (time.perf_counter() - started)
    del prepared_batches

    def timed_writes(prepare_inside: bool) -> float:
        writer = BatchWriter(to_libpq_url(new_database(server)), group_id=f"b{uuid.uuid4().hex[:6]}",
                             max_bytes=65536, future_tolerance_s=300)
        writer.write(writer.prepare(batches[0]))  # warm: partitions, temp tables, plans
        seconds = []
        for batch in batches[1:]:
            ready = None if prepare_inside else writer.prepare(batch)
            t = time.perf_counter()
            writer.write(writer.prepare(batch) if prepare_inside else ready)
            seconds.append(time.perf_counter() - t)
        writer.close()
        return BATCH / statistics.median(seconds)

    postgres_rate = timed_writes(prepare_inside=False)
    both_rate = timed_writes(prepare_inside=True)
    region_report = _region_rates(server, messages) if args.region else {}
    with psycopg.connect(to_libpq_url(server)) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
    report = {
        "benchmark": "write_path",
        "events": args.events,
        "batch": BATCH,
        "postgres": version,
        "decode_events_per_s": round(decode_rate),
        "postgres_events_per_s": round(postgres_rate),
        "end_to_end_events_per_s": round(both_rate),
        "postgres_share_of_time": round(both_rate / postgres_rate, 3),
        **region_report,
    }
    print(json.dumps(report, indent=None if args.json else 2))
    return report


def alternating_write_rates(targets: dict[str, tuple[str, list[Message]]], *, flip: bool = False,
                            setup=None, around=None) -> dict[str, float]:
    """Metering's BatchWriter rate (events/s, median over batches) for each name's (database URL,
    messages), written batch by batch in turn so all see the same minutes of this shared machine
    (`flip`: the order reverses every batch); the first batch of each warms partitions, temp tables
    and plans and is not timed. `setup(name, writer)` runs once per writer; `around(name)`, a context
    manager, wraps each of that name's writes (a variant of the write path)."""
    costs = alternating_write_costs(targets, flip=flip, setup=setup, around=around)
    return {name: cost["events_per_s"] for name, cost in costs.items()}


def alternating_write_costs(targets: dict[str, tuple[str, list[Message]]], *, flip: bool = False,
                            setup=None, around=None) -> dict[str, dict[str, float]]:
    """`alternating_write_rates` with, per name, the CPU time per event of its timed batches: its
    PostgreSQL backend's (/proc) and the writing thread's (`cpu_us_per_event`). CPU time is what a
    busy shared machine disturbs least: wall time there includes waiting for a core."""
    import contextlib

    writers = {name: BatchWriter(to_libpq_url(url), group_id=f"b{uuid.uuid4().hex[:6]}", max_bytes=65536,
                                 future_tolerance_s=300) for name, (url, _) in targets.items()}
    for name, writer in writers.items():
        if setup is not None:
            setup(name, writer)
    seconds: dict[str, list[float]] = {name: [] for name in targets}
    cpu = dict.fromkeys(targets, 0.0)
    events = dict.fromkeys(targets, 0)
    order = list(targets)
    try:
        for n, start in enumerate(range(0, len(next(iter(targets.values()))[1]), BATCH)):
            for name in reversed(order) if flip and n % 2 else order:
                batch = targets[name][1][start:start + BATCH]
                ready = writers[name].prepare(batch)
                with around(name) if around is not None else contextlib.nullcontext():
                    backend = writers[name].connection().info.backend_pid
                    t, thread, server = time.perf_counter(), time.thread_time(), process_cpu_s(backend)
                    writers[name].write(ready)
                    if n:
                        seconds[name].append(time.perf_counter() - t)
                        cpu[name] += time.thread_time() - thread + process_cpu_s(backend) - server
                        events[name] += len(batch)
    finally:
        for writer in writers.values():
            writer.close()
    return {name: {"events_per_s": BATCH / statistics.median(s), "cpu_us_per_event": cpu[name] / events[name] * 1e6}
            for name, s in seconds.items()}


def _region_rates(server: str, messages: list[Message]) -> dict:
    """Plain events and the same events with a `region`, written alternately batch by batch (each into
    its own database), so both see the same minutes of this shared machine."""
    import orjson

    def with_region(message: Message, n: int) -> Message:
        event = orjson.loads(message.value)
        event["data"]["region"] = ("eu-west", "us-east")[n % 2]
        return Message(message.topic, message.partition, message.offset, message.key, orjson.dumps(event), {}, None)

    regional = [with_region(m, n) for n, m in enumerate(messages)]
    rates = alternating_write_rates({"plain": (new_database(server), messages),
                                     "region": (new_database(server), regional)})
    plain, region = rates["plain"], rates["region"]
    return {"postgres_plain_events_per_s": round(plain), "postgres_region_events_per_s": round(region),
            "region_write_ratio": round(region / plain, 3)}


if __name__ == "__main__":
    main()
