"""Benchmark: the customer dashboard's data endpoints for one customer, next to the bare SQL each
needs, in one run (target: p95 <= 2x the bare SQL's p95 and <= 50 ms).

    python -m bench.dashboards [--customers 10000] [--models 5] [--active-hours 72] [--calls 200]
    DATABASE_URL=... python -m bench.dashboards --no-generate   # time again on an earlier run's data

Rows as in bench.rating (its `generate`: 10k customers x 5 models x 72 active hours of November 2026
= 3.6M request_rollup_hourly rows, written hour by hour, then VACUUM ANALYZE). On top, through
metering's write path (metering.writer.BatchWriter): for the measured customer (cust-00042) 600
tasks over the month with 1-3 attempts each and two dedicated deployments reporting a replica
interval every hour; for 200 other customers one dedicated deployment each, hourly. Then ANALYZE.

Endpoints are called in-process, in one event loop, for the month
(`?from=2026-11-01T00:00:00Z&to=2026-12-01T00:00:00Z`, daily buckets) with the customer's API key as
a bearer token, the async read pool the app's lifespan opens in a server (dashboards'
`open_read_pool`) opened in the same loop, two ways each call: straight into the API
app of app.api.create_app as an ASGI server (uvicorn) calls it once it has parsed a request (a fresh
scope; what is timed is the app: its middleware and routing, authentication, the query functions,
JSON encoding), then through httpx's ASGI client (the same plus the client building the request and
reading the response). --calls timed calls each after 5 warm-up calls, one after the other with the
bare SQL (one autocommit psycopg connection, binary rows) so all three see the same moments of the
machine's load. The target is judged on the app's own time ("p95 ratio", "target") and shown for the
httpx client too ("httpx p95 ratio", "httpx target").

The bare SQL of an endpoint is the cheapest statement (or statements) that return the data the
endpoint answers; where the endpoint's own statement is that, it is the same statement run bare:
usage charts (tokens, requests, cache_hit): the customer's rollups summed per day
(metering's `CUSTOMER_USAGE_BUCKETS_SQL`, the endpoints' statement); gpu: the GPU ledger's
GPU-ms per dedicated deployment and day (the endpoint's statement); tasks: the finished tasks per
day with their attempts (the endpoint's statement); summary: the rollups' sums per model (the usage
totals and the per-token book's rating input), the GPU ledger's one sum, the tasks' totals (one row)
and the customer's billing record (its book). docs/benchmarks.md lists them. Prints p50/p95 of each
and the ratios of the p95s.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import tempfile
import time
import urllib.parse
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from rich.console import Console
from rich.table import Table

from bench.rating import END, HOURS, START, generate
from infermeter.stack.postgres import remove_scratch, start_embedded_postgres, to_libpq_url
from metering.contract import REPLICA_V1, REQUEST_V1, TASK_V1, encode_event, make_event
from metering.customer_dashboard_reads import (
    CUSTOMER_USAGE_BUCKETS_SQL,
    _dedicated_gpu_sql,
    _task_summary_sql,
)
from metering.kafka_types import Message

CUSTOMER = "cust-00042"
QUERY = {"from": "2026-11-01T00:00:00Z", "to": "2026-12-01T00:00:00Z"}
ENDPOINTS = ("tokens", "requests", "cache_hit", "gpu", "tasks", "summary")

# The bare SQL of each endpoint: the cheapest statements that return the data the endpoint answers
# (docs/benchmarks.md lists them). Where the endpoint's own statement is that, it is run bare here.
DAY = "day"
USAGE_BUCKETS_SQL = CUSTOMER_USAGE_BUCKETS_SQL.format(bucket="date_trunc('day', hour)", only="")  # the endpoint's
GPU_SQL = _dedicated_gpu_sql(DAY)  # the endpoint's
TASKS_SQL = _task_summary_sql(DAY)  # the endpoint's
# the summary: usage totals, dedicated GPU-hours, task totals and the spend at the customer's prices.
# Least read: the customer's sums per model (the totals and the per-token book's rating input), the
# GPU ledger's one sum, the tasks' one row of totals, and whether billing knows the customer (its book).
SUMMARY_USAGE_SQL = """
SELECT model, sum(requests)::bigint, sum(input_tokens)::bigint, sum(cached_input_tokens)::bigint,
       sum(output_tokens)::bigint
FROM request_rollup_hourly WHERE customer_id = %(customer)s AND hour >= %(start)s AND hour < %(end)s
GROUP BY model
"""
SUMMARY_GPU_SQL = """
SELECT sum(gpu_ms)::bigint FROM gpu_ledger_hourly
WHERE customer_id = %(customer)s AND hour >= %(start)s AND hour < %(end)s
"""
SUMMARY_TASKS_SQL = _task_summary_sql(None)
SUMMARY_CUSTOMER_SQL = "SELECT timezone, anchor_day FROM billing_customers WHERE customer_id = %(customer)s"
BARE = {"tokens": [USAGE_BUCKETS_SQL], "requests": [USAGE_BUCKETS_SQL], "cache_hit": [USAGE_BUCKETS_SQL],
        "gpu": [GPU_SQL], "tasks": [TASKS_SQL],
        "summary": [SUMMARY_USAGE_SQL, SUMMARY_GPU_SQL, SUMMARY_TASKS_SQL, SUMMARY_CUSTOMER_SQL]}


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


def asgi_scope(path: str, query: dict[str, str], headers: dict[str, str]) -> dict:
    """The HTTP scope an ASGI server (uvicorn) hands the app for GET `path`?`query` with `headers`."""
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": urllib.parse.urlencode(query).encode("ascii"), "root_path": "",
            "headers": [(b"host", b"bench")] + [(k.lower().encode("latin-1"), v.encode("latin-1"))
                                                 for k, v in headers.items()],
            "server": ("bench", 80), "client": ("127.0.0.1", 50000), "state": {}}


async def call_asgi(app, scope: dict) -> tuple[int, bytes]:
    """The app's answer to one request, called as a server calls it (a fresh scope each time)."""
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(dict(scope, headers=list(scope["headers"]), state={}), receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


async def time_pair(app, client, key: str, name: str, conn: psycopg.Connection, calls: int) -> tuple[list, list, list]:
    """`calls` timed calls of the endpoint (straight into the app as an ASGI server calls it, then through
    httpx's ASGI client) and of its bare SQL, one after the other call by call (so all three see the same
    moments of the machine's load), after 5 untimed calls of each."""
    headers = {"Authorization": f"Bearer {key}"}
    url = f"/dashboard/data/{name}.json"
    params = {"customer": CUSTOMER, "start": START, "end": END}
    scope = asgi_scope(url, QUERY, headers)
    endpoint, through_httpx, bare = [], [], []
    for i in range(calls + 5):
        t = time.perf_counter()
        status, body = await call_asgi(app, scope)
        spent = time.perf_counter() - t
        assert status == 200, (name, status, body)
        t = time.perf_counter()
        response = await client.get(url, params=QUERY, headers=headers)
        spent_httpx = time.perf_counter() - t
        assert response.status_code == 200, (name, response.status_code, response.text)
        if i == 0:
            assert response.content == body, name  # one answer, however it is called
        t = time.perf_counter()
        for sql in BARE[name]:
            with conn.cursor(binary=True) as cur:  # binary rows: bigint and timestamptz parse faster
                cur.execute(sql, params)
                cur.fetchall()
        if i >= 5:
            endpoint.append(spent)
            through_httpx.append(spent_httpx)
            bare.append(time.perf_counter() - t)
    return endpoint, through_httpx, bare


async def time_all(app, key: str, url: str, calls: int) -> dict[str, tuple[list, list, list]]:
    import httpx

    from dashboards.web.read_pool import close_read_pool, open_read_pool

    out = {}
    transport = httpx.ASGITransport(app=app)
    await open_read_pool(app)  # what the app's lifespan does in a server (the ASGI transport runs no lifespan)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            with psycopg.connect(to_libpq_url(url), autocommit=True) as conn:
                conn.execute("SET TIME ZONE 'UTC'")
                for name in ENDPOINTS:
                    out[name] = await time_pair(app, client, key, name, conn, calls)
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
    console = Console(width=170)

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
        store = KeyStore(get_engine(url), settings=settings)
        app = create_app(settings, url, None, keys=store)
        _, key = store.create(CUSTOMER)
        load_at_start = os.getloadavg()
        results = {name: (percentiles(e), percentiles(h), percentiles(b))
                   for name, (e, h, b) in asyncio.run(time_all(app, key, url, args.calls)).items()}
        table = Table("endpoint", "p50 ms", "p95 ms", "httpx p50", "httpx p95", "bare SQL p50", "bare SQL p95",
                      "p95 ratio", "target", "httpx p95 ratio", "httpx target",
                      title=f"customer dashboard data endpoints, {CUSTOMER}, November (daily), {args.calls} calls "
                            "each, in-process (load average at the start: "
                            f"{' '.join(f'{x:.2f}' for x in load_at_start)})")
        for name, ((p50, p95), (h50, h95), (b50, b95)) in results.items():
            verdicts = ["[green]met[/]" if ratio <= 2 and p <= 50 else "[red]missed[/]"
                        for ratio, p in ((p95 / b95, p95), (h95 / b95, h95))]
            table.add_row(f"{name}.json", f"{p50:.2f}", f"{p95:.2f}", f"{h50:.2f}", f"{h95:.2f}", f"{b50:.2f}",
                          f"{b95:.2f}", f"{p95 / b95:.2f}x", verdicts[0], f"{h95 / b95:.2f}x", verdicts[1])
        console.print(table)
        console.print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        if app is not None:
            app.state.pool.close()
        remove_scratch(folder)


if __name__ == "__main__":
    main()
