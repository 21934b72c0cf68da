"""Rate a whole period straight from the rollups: the path invoices and shadow rating take.

SQL sums each customer's quantities over the period (per model, and per deployment when a charge
names one), so Python sees one row per customer x model, not one per hour. The GPU time of each
deployment-hour is attributed in SQL by the cost model's method (docs/cost-model.md): shared by the
customers served in that hour in proportion to their weighted tokens; idle hours of a dedicated
deployment are its customer's. The SQL keeps 20 decimal places per deployment-hour share (numeric),
so its GPU-seconds agree with the exact pure `pricing.cost.attribute` to far below the 12-place
scale (tests/pricing_service/test_rate_period.py).
"""

from __future__ import annotations

import gc
import queue
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from decimal import Decimal

import psycopg

from pricing.book import GPU_METER, PriceBook
from pricing.cost import CostModel
from pricing.money import precise
from pricing.rating import Rating, rate
from pricing.usage import Usage, UsageKey
from pricing_service.source import check_window

# The request meters and the rollup sums they come from; only the meters a book prices are summed.
REQUEST_METER_SUMS = {
    "uncached_input_tokens": "sum(input_tokens - cached_input_tokens)::bigint",
    "cached_input_tokens": "sum(cached_input_tokens)::bigint",
    "output_tokens": "sum(output_tokens)::bigint",
    "requests": "sum(requests)::bigint",
}
# With cached input summed anyway, uncached input is the difference of two sums (PostgreSQL computes
# the shared sum(cached_input_tokens) once): one subtraction per group instead of one per row.
UNCACHED_FROM_SUMS = "(sum(input_tokens) - sum(cached_input_tokens))::bigint"
# The sums come in customer order, read from the primary key's index alone (it carries the summed
# columns, migration 0005): no hash table over every group, and a customer's sums are complete as
# soon as the next customer's rows start, so `rate_period` rates one customer while PostgreSQL sums
# the next. Settings for that query only (SET LOCAL): random_page_cost 1.1 because the rollups of a
# period being rated are in memory (at the default 4 the planner prefers a hash aggregate that emits
# nothing until it has read every row); no parallel workers, the other core rates; work_mem for the
# plans PostgreSQL falls back to when the index cannot be read alone (pages not yet vacuumed).
REQUEST_SUMS_SETTINGS = (("random_page_cost", "1.1"), ("max_parallel_workers_per_gather", "0"), ("work_mem", "64MB"))
REQUEST_TOTALS_SQL = """
SELECT customer_id, model, {deployment}, {sums}
FROM request_rollup_hourly WHERE hour >= %(start)s AND hour < %(end)s {only}
GROUP BY customer_id, model{group_deployment}
ORDER BY customer_id, model{group_deployment}
"""
# Rows per chunk handed from the reading thread to the caller, and chunks it may read ahead.
STREAM_CHUNK_ROWS = 1000
STREAM_CHUNKS_AHEAD = 64
TASK_TOTALS_SQL = """
SELECT o.customer_id, count(*) FILTER (WHERE o.outcome = 'succeeded'), count(*) FILTER (WHERE o.outcome = 'failed'),
       coalesce(sum((SELECT count(*) FROM task_attempts a WHERE a.customer_id = o.customer_id AND a.task_id = o.task_id)), 0)
FROM task_outcomes o WHERE o.finished_at >= %(start)s AND o.finished_at < %(end)s {only}
GROUP BY o.customer_id
"""
METER_TOTALS_SQL = """
SELECT customer_id, meter, sum(quantity) FROM usage_rollup_hourly
WHERE hour >= %(start)s AND hour < %(end)s {only} GROUP BY customer_id, meter
"""
# GPU-ms of each deployment-hour shared by weighted tokens; idle dedicated hours to their owner.
# With a customer, only the deployment-hours that customer was served in (or owns) are read.
# `weight` is what was served; `scenario` the same with prefix caching off for the models in %(off)s
# (their cached input counted as uncached; equal to `weight` when %(off)s is empty): a deployment-
# hour's GPU time grows by scenario / weight and is shared by scenario, i.e. each share is
# gpu_ms x scenario / total weight (pricing.cost.attribute, caching_off_for).
GPU_ATTRIBUTION_SQL = """
WITH hours AS (
    SELECT DISTINCT deployment_id, hour FROM gpu_ledger_hourly
    WHERE hour >= %(start)s AND hour < %(end)s {gpu_only}
), weights AS (
    SELECT r.customer_id, r.deployment_id, r.hour,
           sum(%(pw)s * (r.input_tokens - r.cached_input_tokens) + %(dw)s * r.output_tokens) AS weight,
           sum(%(pw)s * (r.input_tokens - CASE WHEN r.model = ANY(%(off)s::text[]) THEN 0 ELSE r.cached_input_tokens END)
               + %(dw)s * r.output_tokens) AS scenario
    FROM request_rollup_hourly r JOIN hours h ON h.deployment_id = r.deployment_id AND h.hour = r.hour
    GROUP BY r.customer_id, r.deployment_id, r.hour
), totals AS (
    SELECT deployment_id, hour, sum(weight) AS total FROM weights GROUP BY deployment_id, hour
), gpu AS (
    SELECT g.customer_id AS owner, g.deployment_id, g.gpu_type, g.hour, sum(g.gpu_ms) AS gpu_ms
    FROM gpu_ledger_hourly g JOIN hours h ON h.deployment_id = g.deployment_id AND h.hour = g.hour
    GROUP BY g.customer_id, g.deployment_id, g.gpu_type, g.hour
)
SELECT w.customer_id, g.deployment_id, g.gpu_type, sum((g.gpu_ms * w.scenario)::numeric(70, 20) / t.total)
FROM gpu g
JOIN totals t ON t.deployment_id = g.deployment_id AND t.hour = g.hour AND t.total > 0
JOIN weights w ON w.deployment_id = g.deployment_id AND w.hour = g.hour AND w.scenario > 0 {weights_only}
GROUP BY w.customer_id, g.deployment_id, g.gpu_type
UNION ALL
SELECT g.owner, g.deployment_id, g.gpu_type, sum(g.gpu_ms)
FROM gpu g LEFT JOIN totals t ON t.deployment_id = g.deployment_id AND t.hour = g.hour
WHERE g.owner <> '' AND coalesce(t.total, 0) = 0 {owner_only}
GROUP BY g.owner, g.deployment_id, g.gpu_type
"""
CUSTOMER_GPU_HOURS = """AND (customer_id = %(customer)s OR (deployment_id, hour) IN (
        SELECT deployment_id, hour FROM request_rollup_hourly
        WHERE customer_id = %(customer)s AND hour >= %(start)s AND hour < %(end)s))"""


def load_period_usages(
    conn: psycopg.Connection,
    start: datetime,
    end: datetime,
    cost_model: CostModel | None = None,
    *,
    by_deployment: bool = True,
    meters: Iterable[str] | None = None,
    customer_id: str | None = None,
    caching_off_for: Iterable[str] = (),
) -> dict[str, Usage]:
    """Each customer's usage of [start, end) (or one customer's). `by_deployment=False` sums request
    meters over deployments and `meters` limits the meters read (see `needs_deployment` and
    `priced_meters`: enough for books that name no deployment / do not price every meter). GPU time
    needs the cost model (its weights attribute the shared pool). `caching_off_for`: the usage as if
    prefix caching were off for these models (pricing experiments): their cached input tokens count
    as uncached, and GPU time is grown and attributed as `pricing.cost.attribute` does it."""
    start, end = check_window(start, end)
    wanted = None if meters is None else set(meters)
    off = sorted(set(caching_off_for))
    with _gc_paused():
        out = dict(request_sums(conn, start, end, by_deployment=by_deployment, meters=wanted, customer_id=customer_id))
        if off:
            _caching_off(out, frozenset(off))
        _add_other_meters(conn, out, start, end, cost_model, wanted, customer_id, off)
    return {c: Usage.trusted(c, start, end, q) for c, q in out.items()}


def _caching_off(out: dict[str, dict[UsageKey, object]], models: frozenset[str]) -> None:
    """Count the cached input tokens of `models` as uncached (both meters summed per key, so moved)."""
    for quantities in out.values():
        for key in [k for k in quantities if k.meter == "cached_input_tokens" and k.model in models]:
            cached = quantities[key]
            quantities[key] = 0
            uncached = key._replace(meter="uncached_input_tokens")
            quantities[uncached] = quantities.get(uncached, 0) + cached


def request_sums(
    conn: psycopg.Connection,
    start: datetime,
    end: datetime,
    *,
    by_deployment: bool = True,
    meters: set[str] | None = None,
    customer_id: str | None = None,
    sql_template: str = REQUEST_TOTALS_SQL,
    chunk_rows: int = STREAM_CHUNK_ROWS,
    chunks_ahead: int = STREAM_CHUNKS_AHEAD,
) -> Iterator[tuple[str, dict[UsageKey, int]]]:
    """(customer, its request-meter quantities) for each customer served in [start, end), in customer
    order, each customer once and complete. A thread reads the rows, so PostgreSQL keeps summing the
    next customers while the caller works on this one; `conn` is the thread's until the iterator ends.
    `sql_template` (formatted with deployment, sums, group_deployment and only), `chunk_rows` (rows
    per chunk handed over) and `chunks_ahead` (chunks the thread may read ahead) default to the
    module's constants; tests pass others."""
    request_meters = [m for m in REQUEST_METER_SUMS if meters is None or m in meters]
    if not request_meters:
        return
    sums = {m: REQUEST_METER_SUMS[m] for m in request_meters}
    if "uncached_input_tokens" in sums and "cached_input_tokens" in sums:
        sums["uncached_input_tokens"] = UNCACHED_FROM_SUMS
    sql = sql_template.format(
        deployment="deployment_id" if by_deployment else "''",
        sums=", ".join(sums.values()),
        group_deployment=", deployment_id" if by_deployment else "",
        only="" if customer_id is None else "AND customer_id = %(customer)s",
    )
    keys: dict[tuple[str, str], tuple[UsageKey, ...]] = {}
    current: str | None = None
    quantities: dict[UsageKey, int] = {}
    params = {"start": start, "end": end, "customer": customer_id}
    for chunk in _read_ahead(conn, sql, params, chunk_rows=chunk_rows, chunks_ahead=chunks_ahead):
        for row in chunk:
            customer, model, deployment = row[0], row[1], row[2]
            if customer != current:
                if current is not None:
                    yield current, quantities
                current, quantities = customer, {}
            k = keys.get((model, deployment))
            if k is None:
                k = keys[(model, deployment)] = tuple(UsageKey(m, model, deployment) for m in request_meters)
            # (customer, model[, deployment]) is the GROUP BY key: each key arrives once
            for key, q in zip(k, row[3:], strict=True):
                quantities[key] = q
    if current is not None:
        yield current, quantities


_END = object()


def _read_ahead(
    conn: psycopg.Connection, sql: str, params: Mapping[str, object], *, chunk_rows: int, chunks_ahead: int
) -> Iterator[list[tuple]]:
    """The rows of `sql`, in chunks of `chunk_rows` read by a thread (up to `chunks_ahead` chunks ahead
    of the caller)."""
    chunks: queue.Queue = queue.Queue(maxsize=chunks_ahead)
    stop = threading.Event()

    def read() -> None:
        try:
            with conn.transaction(), conn.cursor() as cur:
                # SET LOCAL would outlive a savepoint in the caller's transaction: put them back after
                before = [(name, cur.execute("SELECT current_setting(%s)", (name,)).fetchone()[0])
                          for name, _ in REQUEST_SUMS_SETTINGS]
                for name, value in REQUEST_SUMS_SETTINGS:
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


def _add_other_meters(
    conn: psycopg.Connection,
    out: dict[str, dict[UsageKey, object]],
    start: datetime,
    end: datetime,
    cost_model: CostModel | None,
    wanted: set[str] | None,
    customer_id: str | None,
    caching_off_for: list[str] | None = None,
) -> None:
    """Add the task, usage-meter and GPU quantities of [start, end) to `out` (customer -> quantities)."""
    params: dict[str, object] = {"start": start, "end": end, "customer": customer_id}
    only = "" if customer_id is None else "AND customer_id = %(customer)s"

    def add(customer: str, key: UsageKey, q) -> None:
        quantities = out.get(customer)
        if quantities is None:
            quantities = out[customer] = {}
        quantities[key] = quantities.get(key, 0) + q

    with conn.cursor() as cur:
        if wanted is None or wanted & {"successful_tasks", "failed_tasks", "task_attempts"}:
            cur.execute(TASK_TOTALS_SQL.format(only=only.replace("customer_id", "o.customer_id")), params)
            for customer, ok, failed, attempts in cur:
                add(customer, UsageKey("successful_tasks"), ok)
                add(customer, UsageKey("failed_tasks"), failed)
                add(customer, UsageKey("task_attempts"), attempts)
        if wanted is None or any(m.startswith("usage:") for m in wanted):
            cur.execute(METER_TOTALS_SQL.format(only=only), params)
            for customer, meter, quantity in cur:
                add(customer, UsageKey("usage:" + meter), quantity)
        if wanted is None or GPU_METER in wanted:
            attributed = gpu_seconds(conn, start, end, cost_model, customer_id, caching_off_for=caching_off_for)
            for customer, deployment, gpu_type, seconds in attributed:
                add(customer, UsageKey(GPU_METER, "", deployment, gpu_type), seconds)


def gpu_seconds(
    conn: psycopg.Connection,
    start: datetime,
    end: datetime,
    cost_model: CostModel | None,
    customer_id: str | None = None,
    *,
    caching_off_for: list[str] | None = None,
) -> list[tuple[str, str, str, Decimal]]:
    """(customer, deployment, gpu_type, GPU-seconds) attributed over [start, end) (with prefix caching
    off for the models `caching_off_for`, as `pricing.cost.attribute` does)."""
    if cost_model is None:
        has_gpu = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM gpu_ledger_hourly WHERE hour >= %s AND hour < %s)", (start, end)
        ).fetchone()[0]
        if has_gpu:
            raise ValueError("GPU time in the period needs a cost model to attribute the shared pool")
        return []
    mine = customer_id is not None
    sql = GPU_ATTRIBUTION_SQL.format(
        gpu_only=CUSTOMER_GPU_HOURS if mine else "",
        weights_only="AND w.customer_id = %(customer)s" if mine else "",
        owner_only="AND g.owner = %(customer)s" if mine else "",
    )
    params = {"start": start, "end": end, "customer": customer_id, "off": list(caching_off_for or ()),
              "pw": cost_model.prefill_weight, "dw": cost_model.decode_weight}
    rows = conn.execute(sql, params).fetchall()
    return [(c, d, g, precise(Decimal(ms) / 1000)) for c, d, g, ms in rows if ms]


def priced_meters(*books: PriceBook) -> set[str]:
    return {c.meter for b in books for c in b.charges}


def needs_deployment(*books: PriceBook) -> bool:
    return any(c.deployment is not None for b in books for c in b.charges)


def rate_period(
    conn: psycopg.Connection, book: PriceBook, start: datetime, end: datetime, cost_model: CostModel | None = None
) -> dict[str, Rating]:
    """Every customer's rating of [start, end) under a book. The task, meter and GPU quantities are
    read first; then the request sums stream in customer order and each customer is rated as soon
    as its sums are complete, while PostgreSQL sums the next customers."""
    start, end = check_window(start, end)
    meters = priced_meters(book)
    others: dict[str, dict[UsageKey, object]] = {}
    ratings: dict[str, Rating] = {}
    with _gc_paused():
        _add_other_meters(conn, others, start, end, cost_model, meters - REQUEST_METER_SUMS.keys(), None)
        for customer, quantities in request_sums(conn, start, end, by_deployment=needs_deployment(book), meters=meters):
            more = others.pop(customer, None)
            if more:
                quantities.update(more)  # other meters: keys disjoint from the request meters
            ratings[customer] = rate(book, Usage.trusted(customer, start, end, quantities))
        for customer, quantities in others.items():
            ratings[customer] = rate(book, Usage.trusted(customer, start, end, quantities))
    return ratings


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Building 10^5 acyclic lines and usage dicts triggers many full-heap cyclic collections that find
    nothing (a fifth of the rating time); pause the collector for the bulk work, then restore it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
