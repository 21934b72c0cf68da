"""The metering write path in parts, in one run: where an event's time goes.

    python -m bench.write_path --events 60000 --json

- `decode_events_per_s`: metering.processor.process (validation, staging rows), pure Python;
- `postgres_events_per_s`: one BatchWriter transaction per 5,000 events (COPY + the one
  statement + offsets + commit), on an already-decoded batch, one connection;
- `end_to_end_events_per_s`: both, as the consumer's writer does them (decode then write),
  without Kafka.
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
from infermeter.stack import scratch_folder, start_embedded_postgres, to_libpq_url
from metering.kafka import Message
from metering.processor import process
from metering.writer import BatchWriter

BATCH = 5000


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--json", action="store_true")
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
    }
    print(json.dumps(report, indent=None if args.json else 2))
    return report


if __name__ == "__main__":
    main()
