"""Benchmark: the customer dashboard's data endpoints for one customer, next to the bare SQL each
needs, in one run (target: p95 <= 2x the bare SQL's p95 and <= 50 ms).

    python -m bench.dashboards [--customers 10000] [--models 5] [--active-hours 72] [--calls 200]

Rows as in bench.rating (its `generate`: 10k customers x 5 models x 72 active hours of November 2026
= 3.6M request_rollup_hourly rows, written hour by hour, then VACUUM ANALYZE). On top, through
metering's write path (metering.writer.BatchWriter): for the measured customer (cust-00042) 600
tasks over the month with 1-3 attempts each and two dedicated deployments reporting a replica
interval every hour; for 200 other customers one dedicated deployment each, hourly. Then ANALYZE.

Endpoints are called in-process (the API app of app.api.create_app through httpx's ASGI transport
in one event loop: routing, authentication with the customer's API key as a bearer token, the
query functions and JSON encoding, no network; the async read pool the app's lifespan opens in a
server, `dashboards.web.open_read_pool`, is opened in the same loop) for the month (`?from=2026-11-01T00:00:00Z&to=2026-12-01T00:00:00Z`,
daily buckets), --calls times each after 5 warm-up calls, alternating with the bare SQL (run on one
autocommit psycopg connection) so both see the same moments of the machine's load. The bare SQL: for each endpoint the statements a hand-written minimal version needs (one
GROUP BY per data set: the customer's rollups by model and day, its GPU ledger by deployment and
day, its finished tasks by day; the summary needs all three; spend is rated in Python from the
per-model sums). Prints p50/p95 of both and the ratio of the p95s.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from rich.console import Console
from rich.table import Table

from bench.rating import END, HOURS, START, generate
from infermeter.stack import remove_scratch, start_embedded_postgres, to_libpq_url
from metering.contract import REPLICA_V1, REQUEST_V1, TASK_V1, encode_event, make_event
from metering.kafka import Message
from metering.queries import TASK_SUMMARY_SQL

CUSTOMER = "cust-00042"
QUERY = {"from": "2026-11-01T00:00:00Z", "to": "2026-12-01T00:00:00Z"}
ENDPOINTS = ("tokens", "requests", "cache_hit", "gpu", "tasks", "summary")

USAGE_SQL = """
SELECT model, date_trunc('day', hour) AS day, sum(requests), sum(input_tokens), sum(cached_input_tokens),
       sum(output_tokens)
FROM request_rollup_hourly WHERE customer_id = %(customer)s AND hour >= %(start)s AND hour < %(end)s
GROUP BY 1, 2 ORDER BY 1, 2
"""
GPU_SQL = """
SELECT deployment_id, gpu_type, date_trunc('day', hour) AS day, sum(gpu_ms), count(DISTINCT replica_id)
FROM gpu_ledger_hourly WHERE customer_id = %(customer)s AND hour >= %(start)s AND hour < %(end)s
GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
"""
TASKS_SQL = TASK_SUMMARY_SQL.format(bucket_cols="date_trunc('day', f.finished_at) AS day,",
                                    group_by="GROUP BY 1 ORDER BY 1")
BARE = {"tokens": [USAGE_SQL], "requests": [USAGE_SQL], "cache_hit": [USAGE_SQL], "gpu": [GPU_SQL],
        "tasks": [TASKS_SQL], "summary": [USAGE_SQL, GPU_SQL, TASKS_SQL]}


def _events(customers: int) -> list[dict]:
    """Tasks and dedicated GPU intervals (see the module doc)."""
    events: list[dict] = []
    ids = itertools.count(1)
    for t in range(600):
        at = START + timedelta(minutes=72 * t + 5)
        attempts = 1 + t % 3
        for attempt in range(1, attempts + 1):
            i = next(ids)
            events.append(make_event(REQUEST_V1, source="//bench/gw", subject=CUSTOMER, event_id=f"r-{i}",
                                     time=at + timedelta(seconds=attempt), data={
                                         "request_id": f"r-{i}", "customer_id": CUSTOMER, "model": "kimi-chat",
                                         "deployment_id": "dep-a", "status": "ok", "input_tokens": 2000,
                                         "cached_input_tokens": 500, "output_tokens": 300, "task_id": f"task-{t}",
                                         "attempt": attempt, "started_at": at, "finished_at": at}))
        outcome = "succeeded" if t % 5 else "failed"
        events.append(make_event(TASK_V1, source="//bench/agents", subject=CUSTOMER, event_id=f"task-{t}",
                                 time=at + timedelta(minutes=1), data={
                                     "task_id": f"task-{t}", "customer_id": CUSTOMER, "outcome": outcome,
                                     "finished_at": at + timedelta(minutes=1)}))
    owners = [(CUSTOMER, f"ded-{CUSTOMER}-{d}") for d in range(2)]
    owners += [(f"cust-{c:05d}", f"ded-cust-{c:05d}") for c in range(100, min(customers, 100 + 200 * 7), 7)]
    for customer, deployment in owners:
        for h in range(HOURS):
            start = START + timedelta(hours=h)
            events.append(make_event(REPLICA_V1, source="//bench/agent", subject=customer,
                                     event_id=f"{deployment}/{h}", time=start + timedelta(hours=1), data={
                                         "replica_id": f"{deployment}-0", "deployment_id": deployment,
                                         "customer_id": customer, "gpu_type": "L4", "gpu_count": 1,
                                         "interval_start": start, "interval_end": start + timedelta(hours=1),
                                         "busy_seconds": str(600 + h % 3000), "prompt_tokens": 100_000 + h,
                                         "generation_tokens": 20_000 + h}))
    return events


def write_extra(url: str, customers: int) -> int:
    from metering.writer import BatchWriter

    events = _events(customers)
    writer = BatchWriter(to_libpq_url(url), group_id="bench-dashboards", max_bytes=65536, future_tolerance_s=300,
                         clock=lambda: datetime(2030, 1, 1, tzinfo=UTC))
    try:
        for offset in range(0, len(events), 5000):
            chunk = events[offset:offset + 5000]
            messages = [Message("events", 0, offset + i, None, encode_event(e), {}, None) for i, e in enumerate(chunk)]
            result = writer.write(messages)
            assert result.accepted == len(chunk), result
    finally:
        writer.close()
    with psycopg.connect(to_libpq_url(url), autocommit=True) as conn:
        conn.execute("ANALYZE")
    return len(events)


def percentiles(samples: list[float]) -> tuple[float, float]:
    """(p50, p95) in milliseconds."""
    cuts = statistics.quantiles(samples, n=20, method="inclusive")
    return statistics.median(samples) * 1000, cuts[18] * 1000


async def time_pair(client, key: str, name: str, conn: psycopg.Connection, calls: int) -> tuple[list, list]:
    """`calls` timed calls of the endpoint and of its bare SQL, alternating (so both see the same
    moments of the machine's load), after 5 untimed calls of each."""
    headers = {"Authorization": f"Bearer {key}"}
    url = f"/dashboard/data/{name}.json"
    params = {"customer": CUSTOMER, "start": START, "end": END}
    endpoint, bare = [], []
    for i in range(calls + 5):
        t = time.perf_counter()
        response = await client.get(url, params=QUERY, headers=headers)
        spent = time.perf_counter() - t
        assert response.status_code == 200, (name, response.status_code, response.text)
        t = time.perf_counter()
        for sql in BARE[name]:
            conn.execute(sql, params).fetchall()
        if i >= 5:
            endpoint.append(spent)
            bare.append(time.perf_counter() - t)
    return endpoint, bare


async def time_all(app, key: str, url: str, calls: int) -> dict[str, tuple[list, list]]:
    import httpx

    from dashboards.web import close_read_pool, open_read_pool

    out = {}
    transport = httpx.ASGITransport(app=app)
    await open_read_pool(app)  # what the app's lifespan does in a server (the ASGI transport runs no lifespan)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            with psycopg.connect(to_libpq_url(url), autocommit=True) as conn:
                conn.execute("SET TIME ZONE 'UTC'")
                for name in ENDPOINTS:
                    out[name] = await time_pair(client, key, name, conn, calls)
    finally:
        await close_read_pool(app)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--customers", type=int, default=10_000)
    parser.add_argument("--models", type=int, default=5)
    parser.add_argument("--active-hours", type=int, default=72, help="active hours per customer x model (of 720)")
    parser.add_argument("--calls", type=int, default=200, help="timed calls of each endpoint and of each bare query")
    parser.add_argument("--no-generate", action="store_true",
                        help="DATABASE_URL already holds this benchmark's rows (from an earlier run): time only")
    args = parser.parse_args()
    console = Console()

    from app.api import create_app
    from infermeter.db import get_engine
    from infermeter.settings import Settings
    from serving.keys import KeyStore

    folder = Path(tempfile.mkdtemp(prefix="bench-dashboards-"))
    url = os.environ.get("DATABASE_URL") or start_embedded_postgres(folder / "pg")
    app = None
    try:
        if not (args.no_generate and os.environ.get("DATABASE_URL")):
            t0 = time.perf_counter()
            rows = generate(url, args.customers, args.models, args.active_hours, console)
            extra = write_extra(url, args.customers)
            console.print(f"generated {rows:,} hourly rollup rows and wrote {extra:,} task and replica events "
                          f"in {time.perf_counter() - t0:.1f} s")
        settings = Settings(INFERMETER_HOME=folder / "home", DATABASE_URL=url,
                            INFERMETER_ADMIN_TOKEN="bench-admin-token-0123456789",
                            INFERMETER_PRODUCER_TOKEN="bench-producer-token-0123456789")
        app = create_app(settings, url, None)
        store = KeyStore(get_engine(url), settings=settings)
        app.state.keys = store
        _, key = store.create(CUSTOMER)
        results = {name: (percentiles(e), percentiles(b))
                   for name, (e, b) in asyncio.run(time_all(app, key, url, args.calls)).items()}
        table = Table("endpoint", "p50 ms", "p95 ms", "bare SQL p50 ms", "bare SQL p95 ms", "p95 ratio", "target",
                      title=f"customer dashboard data endpoints, {CUSTOMER}, November (daily), {args.calls} calls "
                            "each, in-process")
        for name, ((p50, p95), (b50, b95)) in results.items():
            ratio = p95 / b95
            ok = ratio <= 2 and p95 <= 50
            table.add_row(f"{name}.json", f"{p50:.2f}", f"{p95:.2f}", f"{b50:.2f}", f"{b95:.2f}", f"{ratio:.2f}x",
                          "[green]met[/]" if ok else "[red]missed[/]")
        console.print(table)
    finally:
        if app is not None:
            app.state.pool.close()
        remove_scratch(folder)


if __name__ == "__main__":
    main()
