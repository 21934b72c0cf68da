"""The operations page's arrival-time reads, with and without raw_events' BRIN index on received_at.

    python -m bench.arrival_reads [--events 200000] [--rows 3000000] [--json]

In one run, on the embedded PostgreSQL (or DATABASE_URL's server):
1. the write path's cost of the index: `--events` request events written by metering's BatchWriter in
   batches of 5,000 into two databases at head, one with the index dropped, alternating batch by batch
   (the order flips every batch); prints both medians as events/s and their ratio;
2. the reads: `--rows` raw events spread over November 2026, each received 2 s after its event time,
   then metering's `ingest_rate` + `metering_delay` reads for the month's last hour
   (what `/admin/ops` asks), median of 5, without the index and with it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import UTC, datetime, timedelta

import psycopg

from bench.ingest import generate, new_database
from bench.write_path import alternating_write_rates
from infermeter.stack.postgres import scratch_folder, start_embedded_postgres, to_libpq_url
from metering import ops_reads
from metering.kafka_types import Message

INDEX = "raw_events_received_brin"
MONTH_START, MONTH_S = datetime(2026, 11, 1, tzinfo=UTC), 30 * 86_400


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with scratch_folder("infermeter-bench-") as folder:
        report = _run(args, os.environ.get("DATABASE_URL") or start_embedded_postgres(folder / "pg"))
    print(json.dumps(report, indent=None if args.json else 2))
    return report


def _run(args: argparse.Namespace, server: str) -> dict:
    messages = [Message("events", 0, i, key, value, {}, None) for i, (key, value) in enumerate(generate(args.events))]
    urls = {"without": new_database(server), "with": new_database(server)}
    with psycopg.connect(to_libpq_url(urls["without"]), autocommit=True) as conn:
        conn.execute(f"DROP INDEX {INDEX}")
    rates = alternating_write_rates({name: (url, messages) for name, url in urls.items()}, flip=True)

    with psycopg.connect(to_libpq_url(urls["without"]), autocommit=True) as conn:
        conn.execute("TRUNCATE raw_events")
        conn.execute(
            "INSERT INTO raw_events (occurred_at, source, event_id, type, customer_id, received_at, payload)"
            " SELECT t, 'bench', g::text, 'infermeter.request.v1', 'cust-' || (g %% 1000), t + interval '2 seconds',"
            " '{\"data\": {}}'::jsonb FROM generate_series(1, %(n)s) AS g,"
            " LATERAL (SELECT %(start)s::timestamptz + make_interval(secs => g * %(step)s)) AS s(t)",
            {"n": args.rows, "start": MONTH_START, "step": (MONTH_S - 3600) / args.rows},
        )
        conn.execute("VACUUM ANALYZE raw_events")
        until = MONTH_START + timedelta(seconds=MONTH_S)
        since = until - timedelta(hours=1)

        def reads_ms() -> float:
            times = []
            for _ in range(5):
                t = time.perf_counter()
                ops_reads.ingest_rate(conn, since, until)
                ops_reads.metering_delay(conn, since, until)
                times.append(time.perf_counter() - t)
            return statistics.median(times) * 1000

        without_ms = reads_ms()
        conn.execute(f"CREATE INDEX {INDEX} ON raw_events USING brin (received_at)")
        conn.execute("ANALYZE raw_events")
        with_ms = reads_ms()
    return {
        "benchmark": "arrival_reads",
        "events": args.events,
        "rows": args.rows,
        "write_events_per_s_without_index": round(rates["without"]),
        "write_events_per_s_with_index": round(rates["with"]),
        "write_ratio_with_over_without": round(rates["with"] / rates["without"], 3),
        "ops_reads_ms_without_index": round(without_ms, 1),
        "ops_reads_ms_with_index": round(with_ms, 1),
    }


if __name__ == "__main__":
    main()
