"""Reads of a window from the hourly rollups: metering's SQL over its tables. `metering.period_usage`
sums a window this way for every customer whose billing period the window is not (its hourly path),
and pricing reads here what the period totals cannot hold (the shared pool's GPU time, each task's
reports under a book's trusted sources, the hourly records of experiments). Metering owns its tables,
so the statements that read them live here; callers get plain rows and do the pricing.

Windows are [start, end) of event time. The request, usage-meter and GPU reads sum whole UTC hours
(the rollups are hourly): pricing checks its windows (`pricing_service.source.check_window`);
`request_sums` and `meter_totals` read the parts of a window inside an hour from raw events.
With `customer_id`, a read is limited to that customer (and, for GPU time, to the deployment-hours it
was served in or owns); `among` / `excluding` limit the sums to those customers / to all but those.

- `request_sums`: per customer x model (x deployment), the request counts of the window (its partial
  hours from raw events), streamed in customer order by a reading thread (`metering.period_usage`'s
  hourly path).
- `task_totals`, `meter_totals`, `dedicated_gpu_ms`: tasks finished in the window by outcome (any
  window: finished_at is exact), usage-meter quantities (edges from raw events), the dedicated
  deployments' GPU-ms of the hours that start in the window.
- `task_reports`: the outcome reports (with their sources) from the given source prefixes of the
  tasks that may count in a window under a book that trusts only those (`pricing.task_outcomes`
  decides).
- `has_gpu_time`, `gpu_ms_attribution`: GPU-ms of each deployment-hour attributed by weighted tokens
  (the cost model's method, docs/cost-model.md).
- `hourly_requests`, `hourly_gpu`, `task_usage`, `task_attempts`, `hourly_meters`: the hourly
  records of the window (`pricing_service.source.load_dataset`).
"""

from __future__ import annotations

import heapq
import itertools
import queue
import threading
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from decimal import Decimal

import psycopg

from infermeter.times import Window, ceil_hour

# A request row's counts, in the order of `metering.period_usage.RequestTotals`: requests, uncached
# input, cached input and output tokens. Uncached input is the difference of two sums (PostgreSQL
# computes the shared sum(cached_input_tokens) once): one subtraction per group instead of one per row.
REQUEST_SUMS = ("sum(requests)::bigint, (sum(input_tokens) - sum(cached_input_tokens))::bigint, "
                "sum(cached_input_tokens)::bigint, sum(output_tokens)::bigint")
# The sums come in customer order, read from the primary key's index alone (it carries the summed
# columns, migration 0005): no hash table over every group, and a customer's sums are complete as
# soon as the next customer's rows start, so the caller rates one customer while PostgreSQL sums
# the next. Settings for that query only (SET LOCAL): random_page_cost 1.1 because the rollups of a
# period being rated are in memory (at the default 4 the planner prefers a hash aggregate that emits
# nothing until it has read every row); no parallel workers, the other core rates; work_mem for the
# plans PostgreSQL falls back to when the index cannot be read alone (pages not yet vacuumed).
REQUEST_SUMS_SETTINGS = (("random_page_cost", "1.1"), ("max_parallel_workers_per_gather", "0"), ("work_mem", "64MB"))
REQUEST_SUMS_SQL = """
SELECT customer_id, model, {deployment}{project}, """ + REQUEST_SUMS + """
FROM request_rollup_hourly WHERE hour >= %(start)s AND hour < %(end)s {only}
GROUP BY customer_id, model{group_deployment}{project}
ORDER BY customer_id, model{group_deployment}{project}
"""
# Rows per chunk handed from the reading thread to the caller, and chunks it may read ahead.
STREAM_CHUNK_ROWS = 1000
STREAM_CHUNKS_AHEAD = 64


def customer_filter(column: str = "customer_id", *, customer_id: str | None = None,
                    among: Collection[str] | None = None, excluding: Collection[str] = ()) -> tuple[str, dict]:
    """The condition (" AND ..." or "") and its parameters that limit a read to one customer, to the
    customers `among` and to all but the customers `excluding`."""
    sql, params = "", {}
    if customer_id is not None:
        sql += f" AND {column} = %(customer)s"
        params["customer"] = customer_id
    if among is not None:
        sql += f" AND {column} = ANY(%(among)s::text[])"
        params["among"] = sorted(among)
    if excluding:
        sql += f" AND {column} <> ALL(%(excluding)s::text[])"
        params["excluding"] = sorted(excluding)
    return sql, params


def edges(start: datetime, end: datetime) -> tuple[tuple[datetime, datetime] | None, list[tuple[datetime, datetime]]]:
    """[start, end) as (its whole UTC hours, None without one; the parts inside an hour, read from raw events)."""
    hours = Window(start, end).whole_hours
    if hours is None:
        return None, [(start, end)]
    return hours, [(a, b) for a, b in ((start, hours[0]), (hours[1], end)) if a < b]


def request_sums(
    conn: psycopg.Connection,
    start: datetime,
    end: datetime,
    *,
    by_deployment: bool = True,
    by_project: bool = False,
    customer_id: str | None = None,
    among: Collection[str] | None = None,
    excluding: Collection[str] = (),
    chunk_rows: int = STREAM_CHUNK_ROWS,
    chunks_ahead: int = STREAM_CHUNKS_AHEAD,
) -> Iterator[tuple[str, list[tuple]]]:
    """(customer, its rows) for each customer served in [start, end), in customer order, each customer
    once and complete: the whole UTC hours from the rollups, the parts of hours at the window's edges
    from raw events (`edges`). A row is (customer, model, deployment, requests, uncached input, cached
    input, output tokens): one row per model (and deployment; deployment '' with `by_deployment=False`);
    with `by_project`, per project too, the row then (customer, model, deployment, project, counts...)
    with project '' for the requests without one. `among` / `excluding`: only those customers / every
    customer but those. A thread reads the rows (`read_ahead`: `chunk_rows` a chunk, up to
    `chunks_ahead` chunks ahead), so PostgreSQL keeps summing the next customers while the caller works
    on this one; `conn` is the thread's until the iterator ends (one customer's few rows are read at
    once, without the thread and its planner settings: ~10 round trips fewer for a dashboard's spend)."""
    only, params = customer_filter(customer_id=customer_id, among=among, excluding=excluding)
    shape = {"deployment": "deployment_id" if by_deployment else "''",
             "group_deployment": ", deployment_id" if by_deployment else "",
             "project": ", project" if by_project else "", "only": only}
    hours, parts = edges(start, end)
    edge_rows: dict[str, list[tuple]] = {}
    if parts:
        for i, (a, b) in enumerate(parts):
            params.update({f"a{i}": a, f"b{i}": b})
        between = " OR ".join(f"occurred_at >= %(a{i})s AND occurred_at < %(b{i})s" for i in range(len(parts)))
        for row in conn.execute(EDGE_REQUESTS_SQL.format(edges=between, **shape), params):
            edge_rows.setdefault(row[0], []).append(row)
    chunks: Iterator[list[tuple]] = iter(())
    if hours is not None:
        sql = REQUEST_SUMS_SQL.format(**shape)
        params.update(start=hours[0], end=hours[1])
        if customer_id is not None:
            chunks = iter([conn.execute(sql, params).fetchall()])
        else:
            chunks = read_ahead(conn, sql, params, chunk_rows=chunk_rows, chunks_ahead=chunks_ahead)
    key_width = 4 if by_project else 3  # customer, model, deployment[, project]
    try:
        streams = heapq.merge(_by_customer(chunks), sorted(edge_rows.items()), key=lambda item: item[0])
        for customer, same in itertools.groupby(streams, key=lambda item: item[0]):
            found = [rows for _, rows in same]
            yield customer, found[0] if len(found) == 1 else _summed(found, key_width)
    finally:
        if hasattr(chunks, "close"):
            chunks.close()  # the caller stopped early: stop the reading thread now


def _by_customer(chunks: Iterator[list[tuple]]) -> Iterator[tuple[str, list[tuple]]]:
    current: str | None = None
    rows: list[tuple] = []
    for chunk in chunks:
        for row in chunk:
            if row[0] != current:
                if current is not None:
                    yield current, rows
                current, rows = row[0], []
            rows.append(row)
    if current is not None:
        yield current, rows


def _summed(found: list[list[tuple]], key_width: int) -> list[tuple]:
    """A customer's rows of the whole hours and of the edges, summed per key, in key order."""
    summed: dict[tuple, tuple] = {}
    for rows in found:
        for row in rows:
            key = row[:key_width]
            before = summed.get(key)
            summed[key] = row if before is None else (*key, *(a + b for a, b in zip(before[key_width:],
                                                                                  row[key_width:], strict=True)))
    return [summed[key] for key in sorted(summed)]


# The request events of a window's partial hours ({edges}), summed as REQUEST_SUMS_SQL sums the hours
# (the rollup's columns named after the event's fields, project '' for an event without one).
EDGE_REQUESTS_SQL = """
SELECT customer_id, model, {deployment}{project}, """ + REQUEST_SUMS + """
FROM (SELECT customer_id, payload->'data'->>'model' AS model, payload->'data'->>'deployment_id' AS deployment_id,
             coalesce(payload->'data'->>'project', '') AS project, 1 AS requests,
             (payload->'data'->>'input_tokens')::bigint AS input_tokens,
             (payload->'data'->>'cached_input_tokens')::bigint AS cached_input_tokens,
             (payload->'data'->>'output_tokens')::bigint AS output_tokens
      FROM raw_events WHERE type = 'infermeter.request.v1' AND ({edges}) {only}) AS r
GROUP BY customer_id, model{group_deployment}{project}
ORDER BY customer_id, model{group_deployment}{project}
"""


_END = object()


def read_ahead(
    conn: psycopg.Connection, sql: str, params: Mapping[str, object], *, chunk_rows: int, chunks_ahead: int,
    settings: Sequence[tuple[str, str]] = REQUEST_SUMS_SETTINGS,
) -> Iterator[list[tuple]]:
    """The rows of `sql`, in chunks of `chunk_rows` read by a thread (up to `chunks_ahead` chunks ahead
    of the caller), under `settings` for that statement only (put back after it). Also the stream of
    `metering.period_usage`."""
    chunks: queue.Queue = queue.Queue(maxsize=chunks_ahead)
    stop = threading.Event()

    def read() -> None:
        try:
            with conn.transaction(), conn.cursor() as cur:
                # SET LOCAL would outlive a savepoint in the caller's transaction: put them back after
                before = [(name, cur.execute("SELECT current_setting(%s)", (name,)).fetchone()[0])
                          for name, _ in settings]
                for name, value in settings:
                    cur.execute("SELECT set_config(%s, %s, true)", (name, value))
                chunk: list[tuple] = []
                rows = cur.stream(sql, params, size=chunk_rows)
                for row in rows:
                    chunk.append(row)
                    if len(chunk) == chunk_rows:
                        chunks.put(chunk)
                        chunk = []
                        if stop.is_set():  # the caller stopped reading: end the query
                            break
                rows.close()
                for name, value in before:
                    cur.execute("SELECT set_config(%s, %s, true)", (name, value))
                if not stop.is_set():
                    chunks.put(chunk)
            chunks.put(_END)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, raised there
            chunks.put(exc)

    reader = threading.Thread(target=read, name="request-sums", daemon=True)
    reader.start()
    try:
        while (item := chunks.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while reader.is_alive():  # unblock a reader waiting on a full queue
            try:
                chunks.get(timeout=0.05)
            except queue.Empty:
                pass
        reader.join()


# Tasks by the outcome whose finished_at is in the window, and the attempts of the succeeded and failed
# ones (an abandoned task's attempts are billed by no meter).
TASK_TOTALS_SQL = """
SELECT o.customer_id, count(*) FILTER (WHERE o.outcome = 'succeeded'), count(*) FILTER (WHERE o.outcome = 'failed'),
       count(*) FILTER (WHERE o.outcome = 'abandoned'),
       coalesce(sum(a.n) FILTER (WHERE o.outcome = 'succeeded'), 0)::bigint,
       coalesce(sum(a.n) FILTER (WHERE o.outcome = 'failed'), 0)::bigint
FROM task_outcomes o
CROSS JOIN LATERAL (SELECT count(*) AS n FROM task_attempts a WHERE a.customer_id = o.customer_id AND a.task_id = o.task_id) a
WHERE o.finished_at >= %(start)s AND o.finished_at < %(end)s {only}
GROUP BY o.customer_id ORDER BY o.customer_id
"""
# A window's usage meters: whole hours from the rollups, its partial hours from raw events ({edges}).
METER_TOTALS_SQL = """
SELECT customer_id, meter, sum(quantity), sum(events)::bigint FROM (
    SELECT customer_id, meter, quantity, events FROM usage_rollup_hourly
    WHERE hour >= %(start)s AND hour < %(end)s {only}
    {edges}
) AS u GROUP BY customer_id, meter ORDER BY customer_id, meter
"""
EDGE_METERS_SQL = """UNION ALL
    SELECT customer_id, payload->'data'->>'meter', (payload->'data'->>'quantity')::numeric, 1 FROM raw_events
    WHERE type = 'infermeter.usage.v1' AND occurred_at >= %(a{i})s AND occurred_at < %(b{i})s {only}"""


def task_totals(
    conn: psycopg.Connection, start: datetime, end: datetime, customer_id: str | None = None, *,
    among: Collection[str] | None = None, excluding: Collection[str] = (),
) -> list[tuple[str, int, int, int, int, int]]:
    """(customer, tasks succeeded, failed, abandoned, the attempts of the succeeded ones, of the failed
    ones) of the tasks whose outcome finished in [start, end), in customer order, per customer with
    any. An abandoned task's attempts are not counted (as `pricing.task_outcomes` bills them).
    finished_at is exact, so the window need not be whole hours."""
    only, params = customer_filter("o.customer_id", customer_id=customer_id, among=among, excluding=excluding)
    return conn.execute(TASK_TOTALS_SQL.format(only=only), {**params, "start": start, "end": end}).fetchall()


# The tasks whose billed outcome may fall in [start, end) under a book that trusts only some outcome
# sources (pricing.task_outcomes): those with a report from one of those sources in the window, and those
# whose deadline (first request + timeout) may be in it; with every report of each from those sources.
# Pricing applies the rule (latest trusted report before the deadline, else the book's rule).
TASK_REPORTS_SQL = """
WITH reports AS NOT MATERIALIZED (
    SELECT * FROM task_outcome_reports
    WHERE EXISTS (SELECT 1 FROM unnest(%(sources)s::text[]) AS p(prefix) WHERE starts_with(source, p.prefix))
), candidates AS (
    SELECT customer_id, task_id FROM reports
    WHERE finished_at >= %(start)s AND finished_at < %(end)s {only}
    UNION
    SELECT customer_id, task_id FROM task_attempts
    WHERE first_request_at >= %(start)s - %(timeout)s AND first_request_at < %(end)s - %(timeout)s {only}
), started AS (
    SELECT a.customer_id, a.task_id, min(a.first_request_at) AS first_at, count(*) AS attempts
    FROM task_attempts a JOIN candidates c ON c.customer_id = a.customer_id AND c.task_id = a.task_id
    GROUP BY a.customer_id, a.task_id
)
SELECT c.customer_id, c.task_id, s.first_at, coalesce(s.attempts, 0), r.source, r.event_id, r.outcome, r.finished_at
FROM candidates c
LEFT JOIN started s ON s.customer_id = c.customer_id AND s.task_id = c.task_id
LEFT JOIN reports r ON r.customer_id = c.customer_id AND r.task_id = c.task_id
ORDER BY c.customer_id, c.task_id, r.finished_at, r.source, r.event_id
"""


def task_reports(
    conn: psycopg.Connection,
    start: datetime,
    end: datetime,
    timeout: timedelta,
    sources: Sequence[str],
    customer_id: str | None = None,
) -> list[tuple]:
    """The tasks that may count in [start, end) when each task has until its first request +
    `timeout` for an outcome from a source starting with one of `sources`: those with such a report
    with finished_at in the window, and those whose first request is in [start - timeout,
    end - timeout). One row per such report, in (customer, task, finished_at, source, event_id) order:
    (customer, task, first request (None without attempts), attempts, source, event_id, outcome,
    finished_at); a task without one has a single row with the last four None. `start`/`end` need not
    be whole hours (outcome times are exact)."""
    only = "" if customer_id is None else "AND customer_id = %(customer)s"
    params = {"start": start, "end": end, "timeout": timeout, "customer": customer_id, "sources": list(sources)}
    return conn.execute(TASK_REPORTS_SQL.format(only=only), params).fetchall()


def meter_totals(
    conn: psycopg.Connection, start: datetime, end: datetime, customer_id: str | None = None, *,
    among: Collection[str] | None = None, excluding: Collection[str] = (),
) -> list[tuple[str, str, Decimal, int]]:
    """(customer, meter, quantity, events) of the usage meters (infermeter.usage.v1) in [start, end), in
    customer and meter order: whole hours from the hourly rollups, the partial hours from raw events."""
    hours, parts = edges(start, end)
    only, params = customer_filter(customer_id=customer_id, among=among, excluding=excluding)
    params["start"], params["end"] = hours or (start, start)  # no whole hour: no rollup row
    for i, (a, b) in enumerate(parts):
        params.update({f"a{i}": a, f"b{i}": b})
    more = "\n    ".join(EDGE_METERS_SQL.format(i=i, only=only) for i in range(len(parts)))
    return conn.execute(METER_TOTALS_SQL.format(only=only, edges=more), params).fetchall()


DEDICATED_GPU_SQL = """
SELECT customer_id, deployment_id, gpu_type, sum(gpu_ms)::bigint FROM gpu_ledger_hourly
WHERE customer_id <> '' AND hour >= %(start)s AND hour < %(end)s {only}
GROUP BY customer_id, deployment_id, gpu_type ORDER BY customer_id, deployment_id, gpu_type
"""


def dedicated_gpu_ms(
    conn: psycopg.Connection, start: datetime, end: datetime, customer_id: str | None = None, *,
    among: Collection[str] | None = None, excluding: Collection[str] = (),
) -> list[tuple[str, str, str, int]]:
    """(customer, deployment, gpu_type, GPU-ms) of the dedicated deployments (those a customer owns) in the
    UTC hours that START in [start, end) (billing's edge-hour rule: docs/billing.md, "GPU time at edges"),
    in that order."""
    only, params = customer_filter(customer_id=customer_id, among=among, excluding=excluding)
    params.update(start=ceil_hour(start), end=ceil_hour(end))
    return conn.execute(DEDICATED_GPU_SQL.format(only=only), params).fetchall()


# The weights that share each deployment-hour's GPU-ms, and the idle hours of dedicated deployments.
# With a customer, only the deployment-hours that customer was served in (or owns) are read, with
# every customer's weight in them (the split of an hour needs all its shares).
# `weight` is what was served; `scenario` the same with prefix caching off for the models in %(off)s
# (their cached input counted as uncached; equal to `weight` when %(off)s is empty). Rows:
# (owner, deployment, gpu_type, hour, gpu_ms, total weight, customer, model, scenario weight) for each
# (customer, model) served in a deployment-hour with GPU time and weight, then
# (owner, deployment, gpu_type, NULL, idle gpu_ms, 0, owner, '', NULL) per dedicated deployment's idle
# hours. The split itself (largest remainder on a fixed quantum) is pricing.cost.split_gpu_seconds,
# applied by the caller: the same function as the pure attribution.
GPU_ATTRIBUTION_SQL = """
WITH hours AS (
    SELECT DISTINCT deployment_id, hour FROM gpu_ledger_hourly
    WHERE hour >= %(start)s AND hour < %(end)s {gpu_only}
), weights AS (
    SELECT r.customer_id, r.model, r.deployment_id, r.hour,
           sum(%(pw)s * (r.input_tokens - r.cached_input_tokens) + %(dw)s * r.output_tokens) AS weight,
           sum(%(pw)s * (r.input_tokens - CASE WHEN r.model = ANY(%(off)s::text[]) THEN 0 ELSE r.cached_input_tokens END)
               + %(dw)s * r.output_tokens) AS scenario
    FROM request_rollup_hourly r JOIN hours h ON h.deployment_id = r.deployment_id AND h.hour = r.hour
    GROUP BY r.customer_id, r.model, r.deployment_id, r.hour
), totals AS (
    SELECT deployment_id, hour, sum(weight) AS total FROM weights GROUP BY deployment_id, hour
), gpu AS (
    SELECT g.customer_id AS owner, g.deployment_id, g.gpu_type, g.hour, sum(g.gpu_ms) AS gpu_ms
    FROM gpu_ledger_hourly g JOIN hours h ON h.deployment_id = g.deployment_id AND h.hour = g.hour
    GROUP BY g.customer_id, g.deployment_id, g.gpu_type, g.hour
)
SELECT g.owner, g.deployment_id, g.gpu_type, g.hour, g.gpu_ms::bigint, t.total, w.customer_id, w.model, w.scenario
FROM gpu g
JOIN totals t ON t.deployment_id = g.deployment_id AND t.hour = g.hour AND t.total > 0
JOIN weights w ON w.deployment_id = g.deployment_id AND w.hour = g.hour AND w.scenario > 0
UNION ALL
SELECT g.owner, g.deployment_id, g.gpu_type, NULL, sum(g.gpu_ms)::bigint, 0, g.owner, '', NULL
FROM gpu g LEFT JOIN totals t ON t.deployment_id = g.deployment_id AND t.hour = g.hour
WHERE g.owner <> '' AND coalesce(t.total, 0) = 0 {owner_only}
GROUP BY g.owner, g.deployment_id, g.gpu_type
"""
CUSTOMER_GPU_HOURS = """AND (customer_id = %(customer)s OR (deployment_id, hour) IN (
        SELECT deployment_id, hour FROM request_rollup_hourly
        WHERE customer_id = %(customer)s AND hour >= %(start)s AND hour < %(end)s))"""
HAS_GPU_SQL = "SELECT EXISTS (SELECT 1 FROM gpu_ledger_hourly WHERE hour >= %s AND hour < %s)"


def has_gpu_time(conn: psycopg.Connection, start: datetime, end: datetime) -> bool:
    """Whether the GPU ledger has any hour in [start, end)."""
    return conn.execute(HAS_GPU_SQL, (start, end)).fetchone()[0]


def gpu_ms_attribution(
    conn: psycopg.Connection,
    start: datetime,
    end: datetime,
    *,
    prefill_weight: object,
    decode_weight: object,
    customer_id: str | None = None,
    caching_off_for: Iterable[str] = (),
) -> list[tuple]:
    """What shares the GPU time of [start, end) (rows described at GPU_ATTRIBUTION_SQL): for each
    deployment-hour with GPU time and weighted tokens, one row per (customer, model) served in it with
    its weight prefill_weight x uncached input + decode_weight x output tokens (with prefix caching
    off for the models `caching_off_for`) and the hour's total weight; and the idle GPU-ms of each
    dedicated deployment (hour NULL). With a customer: the hours it was served in or owns."""
    mine = customer_id is not None
    sql = GPU_ATTRIBUTION_SQL.format(
        gpu_only=CUSTOMER_GPU_HOURS if mine else "",
        owner_only="AND g.owner = %(customer)s" if mine else "",
    )
    params = {"start": start, "end": end, "customer": customer_id, "off": list(caching_off_for),
              "pw": prefill_weight, "dw": decode_weight}
    return conn.execute(sql, params).fetchall()


# The hourly records of a window. With a customer: its own rows, plus every row of the deployment-
# hours it was served in (the shared pool's GPU time is attributed across everyone served in the same
# deployment-hour).
# (summed over the rollup's projects: one row per customer x model x deployment x hour, adjacent in its key)
REQUESTS_SQL = """
SELECT customer_id, model, deployment_id, hour, sum(requests)::bigint, sum(input_tokens)::bigint,
       sum(cached_input_tokens)::bigint, sum(output_tokens)::bigint
FROM request_rollup_hourly WHERE hour >= %(start)s AND hour < %(end)s
GROUP BY customer_id, model, deployment_id, hour
"""
GPU_SQL = """
SELECT customer_id, deployment_id, gpu_type, hour, sum(gpu_ms)::bigint
FROM gpu_ledger_hourly WHERE hour >= %(start)s AND hour < %(end)s
GROUP BY customer_id, deployment_id, gpu_type, hour
"""
TASKS_SQL = """
SELECT o.customer_id, o.task_id, o.outcome, o.finished_at,
       a.attempt, a.requests, a.input_tokens, a.cached_input_tokens, a.output_tokens
FROM task_outcomes o LEFT JOIN task_attempts a ON a.customer_id = o.customer_id AND a.task_id = o.task_id
WHERE o.finished_at >= %(start)s AND o.finished_at < %(end)s
ORDER BY o.customer_id, o.task_id, a.attempt
"""
TASK_USAGE_SQL = """
SELECT u.customer_id, u.task_id, u.meter, u.quantity
FROM task_usage u JOIN task_outcomes o ON o.customer_id = u.customer_id AND o.task_id = u.task_id
WHERE o.finished_at >= %(start)s AND o.finished_at < %(end)s
"""
METERS_SQL = """
SELECT customer_id, meter, hour, quantity FROM usage_rollup_hourly WHERE hour >= %(start)s AND hour < %(end)s
"""
CUSTOMER_REQUESTS_SQL = """
WITH mine AS (
    SELECT DISTINCT deployment_id, hour FROM request_rollup_hourly
    WHERE customer_id = %(customer)s AND hour >= %(start)s AND hour < %(end)s
)
SELECT r.customer_id, r.model, r.deployment_id, r.hour, sum(r.requests)::bigint, sum(r.input_tokens)::bigint,
       sum(r.cached_input_tokens)::bigint, sum(r.output_tokens)::bigint
FROM request_rollup_hourly r JOIN mine m ON m.deployment_id = r.deployment_id AND m.hour = r.hour
GROUP BY r.customer_id, r.model, r.deployment_id, r.hour
"""
CUSTOMER_GPU_SQL = """
WITH mine AS (
    SELECT DISTINCT deployment_id, hour FROM request_rollup_hourly
    WHERE customer_id = %(customer)s AND hour >= %(start)s AND hour < %(end)s
)
SELECT g.customer_id, g.deployment_id, g.gpu_type, g.hour, sum(g.gpu_ms)::bigint
FROM gpu_ledger_hourly g
WHERE g.hour >= %(start)s AND g.hour < %(end)s
  AND (g.customer_id = %(customer)s OR (g.deployment_id, g.hour) IN (SELECT deployment_id, hour FROM mine))
GROUP BY g.customer_id, g.deployment_id, g.gpu_type, g.hour
"""


def _only(sql: str, alias: str) -> str:
    return sql.replace("WHERE ", f"WHERE {alias}customer_id = %(customer)s AND ", 1)


def _rows(conn: psycopg.Connection, sql: str, start: datetime, end: datetime, customer_id: str | None) -> Iterator[tuple]:
    with conn.cursor() as cur:
        cur.execute(sql, {"start": start, "end": end, "customer": customer_id})
        yield from cur


def hourly_requests(
    conn: psycopg.Connection, start: datetime, end: datetime, customer_id: str | None = None
) -> Iterator[tuple]:
    """request_rollup_hourly rows of [start, end): (customer, model, deployment, hour, requests,
    input_tokens, cached_input_tokens, output_tokens); with a customer, the rows of the
    deployment-hours it was served in (its own and the others')."""
    return _rows(conn, CUSTOMER_REQUESTS_SQL if customer_id is not None else REQUESTS_SQL, start, end, customer_id)


def hourly_gpu(
    conn: psycopg.Connection, start: datetime, end: datetime, customer_id: str | None = None
) -> Iterator[tuple]:
    """(customer ('' = shared pool), deployment, gpu_type, hour, gpu_ms summed over replicas) of
    [start, end); with a customer, its own rows and those of the deployment-hours it was served in."""
    return _rows(conn, CUSTOMER_GPU_SQL if customer_id is not None else GPU_SQL, start, end, customer_id)


def task_usage(
    conn: psycopg.Connection, start: datetime, end: datetime, customer_id: str | None = None
) -> Iterator[tuple]:
    """(customer, task, meter, quantity) of the tasks that finished in [start, end)."""
    return _rows(conn, _only(TASK_USAGE_SQL, "u.") if customer_id is not None else TASK_USAGE_SQL,
                 start, end, customer_id)


def task_attempts(
    conn: psycopg.Connection, start: datetime, end: datetime, customer_id: str | None = None
) -> Iterator[tuple]:
    """The tasks that finished in [start, end), one row per attempt in (customer, task, attempt) order:
    (customer, task, outcome, finished_at, attempt, requests, input_tokens, cached_input_tokens,
    output_tokens); a task with no attempt has one row with attempt and its counts None."""
    return _rows(conn, _only(TASKS_SQL, "o.") if customer_id is not None else TASKS_SQL, start, end, customer_id)


def hourly_meters(
    conn: psycopg.Connection, start: datetime, end: datetime, customer_id: str | None = None
) -> Iterator[tuple]:
    """usage_rollup_hourly rows of [start, end): (customer, meter, hour, quantity)."""
    return _rows(conn, _only(METERS_SQL, "") if customer_id is not None else METERS_SQL, start, end, customer_id)
