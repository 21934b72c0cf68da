"""Usage as rating's quantities, and rating a period: the pricing side of metering's one period-usage
read (`metering.period_usage.period_usages`: a window or a customer's period in, typed rows out;
metering decides per customer whether its period totals answer the window or the hourly rollups
must be summed).

- `totals_quantities` turns a customer's rows (`PeriodUsage`) into rating's quantities, the one
  conversion of every reader; `usage_beyond_totals` reads, as rating's quantities too, what the
  period totals do not hold (below).
- `load_period_usages`: every customer's (or one customer's) usage of a window on whole UTC hours, for
  shadow rating, `pricing compare` and experiments, `pricing recommend`, the dashboards' spend and the
  forecasts; billing's per-customer read is `billing_service.usage.period_usage`.
- `rate_billing_period`: every customer's own billing period of a label ("2026-11": each customer's
  calendar, the UTC month without one) rated from the period totals (the bulk run).
- `rate_period`: every customer's rating of a window on whole hours, read the same way;
  `from_totals=False` reads the hourly rollups for every customer: the hourly reference the
  benchmarks (`bench.rating`) and tests measure the totals against.
- What the totals cannot hold is read from the hourly reads (`metering.period_reads`), for every
  reader (`usage_beyond_totals`): GPU time, attributed per deployment-hour by the cost model's method
  (docs/cost-model.md): SQL reads each deployment-hour's GPU-ms and the weights of what it served (the
  customers' weighted tokens; idle hours of a dedicated deployment are its customer's), Python splits
  it with `pricing.cost.split_gpu_seconds` (largest remainder on 10^-12 s), the function the pure
  `pricing.cost.attribute` uses, so the two give the same GPU-seconds and every hour's shares add up
  to its GPU time exactly (tests/pricing_service/test_rate_period.py); the task meters of a book
  that trusts only some outcome sources (`billed_task_totals`, `usages_for_book`); usage with prefix
  caching off (experiments).
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from decimal import Decimal

import psycopg

from infermeter.times import ceil_hour
from metering import period_reads, period_usage
from pricing.book import PriceBook, TaskOutcomeTrust
from pricing.cost import CostModel, split_gpu_seconds
from pricing.meters import (
    CACHED_INPUT_TOKENS,
    GPU_METER,
    REQUEST_METERS,
    TASK_METERS,
    UNCACHED_INPUT_TOKENS,
    USAGE_PREFIX,
    is_usage_meter,
    usage_meter,
)
from pricing.money import precise
from pricing.rating import Rating, rate
from pricing.task_outcomes import task_quantities, tasks_from_rows
from pricing.usage import Usage, UsageKey
from pricing_service.source import check_window

ZERO = Decimal(0)
TASK_KEYS = tuple(UsageKey(m) for m in TASK_METERS)  # successful tasks, failed tasks, their attempts
Quantities = dict[UsageKey, object]
TotalsKeys = dict[tuple[str, str, str], tuple[tuple[UsageKey, int], ...]]  # (model, deployment, project) -> keys


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
    task_outcomes: TaskOutcomeTrust | None = None,
) -> dict[str, Usage]:
    """Each customer's usage of [start, end) (or one customer's) as rating's quantities, read by
    metering's period-usage read (`metering.period_usage.period_usages` of the window: the period
    totals of a customer whose billing period the window is, the hourly rollups of every other one)
    and turned by `totals_quantities`. `by_deployment=False` sums request meters over deployments and
    `meters` limits the meters read (see `needs_deployment` and `priced_meters`: enough for books that
    name no deployment / do not price every meter). GPU time needs the cost model (its weights
    attribute the shared pool, per deployment-hour: `gpu_seconds`). `caching_off_for`: the usage as if
    prefix caching were off for these models (pricing experiments): their cached input tokens count
    as uncached, and GPU time is grown and attributed as `pricing.cost.attribute` does it.
    `task_outcomes`: the book's trusted outcome sources (`PriceBook.task_outcomes`; None: every
    outcome counts), see `billed_task_totals`."""
    start, end = check_window(start, end)
    wanted = None if meters is None else set(meters)
    off = sorted(set(caching_off_for))
    request_meters = [m for m in REQUEST_METERS if wanted is None or m in wanted]
    usage_meters = None if wanted is None or any(map(is_usage_meter, wanted)) else ()
    tasks = wanted is None or bool(wanted & set(TASK_METERS))
    out: dict[str, Quantities] = {}
    keys: TotalsKeys = {}
    with gc_paused():
        for usage in period_usage.period_usages(
            conn, window=(start, end), customer_id=customer_id, requests=bool(request_meters),
            by_deployment=by_deployment, usage_meters=usage_meters, tasks=tasks and task_outcomes is None, gpu=False,
        ):
            out[usage.customer_id] = totals_quantities(usage, request_meters, keys)
        if off:
            _caching_off(out, frozenset(off))
        beyond = usage_beyond_totals(conn, start, end, cost_model, gpu=wanted is None or GPU_METER in wanted,
                                     trust=task_outcomes if tasks else None, customer_id=customer_id,
                                     caching_off_for=off)
        for customer, more in beyond.items():
            out.setdefault(customer, {}).update(more)  # keys disjoint from the rows'
    return {c: Usage.trusted(c, start, end, q) for c, q in out.items()}


def _caching_off(out: dict[str, Quantities], models: frozenset[str]) -> None:
    """Count the cached input tokens of `models` as uncached (both meters summed per key, so moved)."""
    for quantities in out.values():
        for key in [k for k in quantities if k.meter == CACHED_INPUT_TOKENS and k.model in models]:
            cached = quantities[key]
            quantities[key] = 0
            uncached = key._replace(meter=UNCACHED_INPUT_TOKENS)
            quantities[uncached] = quantities.get(uncached, 0) + cached


def usage_beyond_totals(
    conn: psycopg.Connection,
    start: datetime,
    end: datetime,
    cost_model: CostModel | None,
    *,
    gpu: bool,
    trust: TaskOutcomeTrust | None,
    customer_id: str | None = None,
    caching_off_for: Iterable[str] = (),
) -> dict[str, Quantities]:
    """What the period totals do not hold, of [start, end), per customer with any (or of one customer),
    as rating's quantities: with `gpu`, GPU time of the UTC hours that START in the window (billing's
    edge-hour rule; every hour for a window on whole hours), attributed per deployment-hour
    (`gpu_seconds`, with prefix caching off for the models `caching_off_for`); with `trust` (a book's
    trusted outcome sources), the task meters as that book counts them (`billed_task_totals`). The
    keys are disjoint from those `totals_quantities` gives."""
    out: dict[str, Quantities] = {}

    def add(customer: str, key: UsageKey, q) -> None:
        quantities = out.get(customer)
        if quantities is None:
            quantities = out[customer] = {}
        quantities[key] = quantities.get(key, 0) + q

    hours = (ceil_hour(start), ceil_hour(end))
    if gpu and hours[0] < hours[1]:
        attributed = gpu_seconds(conn, *hours, cost_model, customer_id, caching_off_for=list(caching_off_for))
        for customer, deployment, gpu_type, seconds in attributed:
            add(customer, UsageKey(GPU_METER, "", deployment, gpu_type), seconds)
    if trust is not None:
        for customer, *counted in billed_task_totals(conn, start, end, customer_id, trust):
            for key, q in zip(TASK_KEYS, counted, strict=True):
                add(customer, key, q)
    return out


def billed_task_totals(
    conn: psycopg.Connection,
    start: datetime,
    end: datetime,
    customer_id: str | None,
    task_outcomes: TaskOutcomeTrust,
) -> list[tuple[str, int, int, int]]:
    """(customer, successful tasks, failed tasks, their attempts) billed in [start, end) by a book that
    trusts only some outcome sources (`task_outcomes`), per customer with any: only outcomes from the
    sources the book trusts, and a task without one within its timeout is billed by the book's rule at
    its deadline (`pricing.task_outcomes`, on the reports `metering.period_reads.task_reports` reads).
    The window need not be whole hours. (When every outcome counts, `period_usages` reads the tasks.)"""
    rows = period_reads.task_reports(conn, start, end, timedelta(seconds=task_outcomes.task_timeout),
                                     task_outcomes.trusted_sources, customer_id)
    counted = task_quantities(tasks_from_rows(rows), task_outcomes, start, end)
    return [(customer, *quantities) for customer, quantities in sorted(counted.items())]


def usages_for_book(
    conn: psycopg.Connection,
    usages: dict[str, Usage],
    book: PriceBook,
    start: datetime,
    end: datetime,
    customer_id: str | None = None,
) -> dict[str, Usage]:
    """`usages` (loaded for every outcome, as `load_period_usages` does without `task_outcomes`) with
    the task meters counted as `book` counts them: the same dict when the book trusts every outcome
    source or prices no task meter, else a copy whose task quantities are `billed_task_totals` under the
    book's `task_outcomes` (shadow rating and experiments load usage once for several books)."""
    trust = book.task_outcomes
    if trust is None or not priced_meters(book) & set(TASK_METERS):
        return usages
    counted = {row[0]: row[1:] for row in billed_task_totals(conn, start, end, customer_id, trust)}
    out: dict[str, Usage] = {}
    for customer in sorted(set(usages) | set(counted)):
        before = usages.get(customer)
        quantities = {k: q for k, q in (before.quantities.items() if before else ()) if k not in TASK_KEYS}
        for key, q in zip(TASK_KEYS, counted.get(customer, (0, 0, 0)), strict=True):
            if q:
                quantities[key] = q
        out[customer] = Usage.trusted(customer, start, end, quantities)
    return out


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
        if period_reads.has_gpu_time(conn, start, end):
            raise ValueError("GPU time in the period needs a cost model to attribute the shared pool")
        return []
    rows = period_reads.gpu_ms_attribution(
        conn, start, end, prefill_weight=cost_model.prefill_weight, decode_weight=cost_model.decode_weight,
        customer_id=customer_id, caching_off_for=caching_off_for or (),
    )
    return attributed_seconds(rows, customer_id)


def attributed_seconds(rows: Iterable[tuple], customer_id: str | None = None) -> list[tuple[str, str, str, Decimal]]:
    """(customer, deployment, gpu_type, GPU-seconds) from the rows of `period_reads.gpu_ms_attribution`:
    each deployment-hour split by `pricing.cost.split_gpu_seconds` (largest remainder on a fixed
    quantum, the shares in (customer, model) order, as `pricing.cost.attribute` does), summed."""
    hours: dict[tuple, tuple[int, Decimal, list[tuple[tuple[str, str], Decimal]]]] = {}
    out: dict[tuple[str, str, str], Decimal] = {}
    for owner, deployment, gpu_type, hour, gpu_ms, total, customer, model, weight in rows:
        if hour is None:  # a dedicated deployment's idle hours: its owner's
            if gpu_ms and (customer_id is None or owner == customer_id):
                key = (owner, deployment, gpu_type)
                out[key] = out.get(key, ZERO) + Decimal(gpu_ms) / 1000
            continue
        slot = hours.get((owner, deployment, gpu_type, hour))
        if slot is None:
            slot = hours[(owner, deployment, gpu_type, hour)] = (gpu_ms, total, [])
        slot[2].append(((customer, model), weight))
    for (_, deployment, gpu_type, _), (gpu_ms, total, shares) in hours.items():
        shares.sort()
        parts = split_gpu_seconds(gpu_ms, total, [w for _, w in shares])
        for ((customer, _), _), part in zip(shares, parts, strict=True):
            if customer_id is not None and customer != customer_id:
                continue
            key = (customer, deployment, gpu_type)
            out[key] = out.get(key, ZERO) + part
    return [(c, d, g, precise(s)) for (c, d, g), s in out.items() if s]


def priced_meters(*books: PriceBook) -> set[str]:
    return {c.meter for b in books for c in b.charges}


def needs_deployment(*books: PriceBook) -> bool:
    return any(c.deployment is not None for b in books for c in b.charges)


# ---------------------------------------------------------------- rating from metering's one read

# RequestTotals' field of each request meter (its counts are named after them)
_REQUEST_FIELD = {m: period_usage.RequestTotals._fields.index(m) for m in REQUEST_METERS}


def totals_quantities(
    usage: period_usage.PeriodUsage, request_meters: Iterable[str] = REQUEST_METERS, keys: TotalsKeys | None = None,
) -> Quantities:
    """A customer's rows of `period_usages` (its period totals, or a window's hourly sums) as rating's
    quantities: each request row's `request_meters` by (model, deployment, project) as read, each usage
    meter as `usage:<meter>`, and the task meters when the tasks were read (successful tasks, failed
    tasks, task attempts: the attempts of the succeeded and failed tasks). Zero quantities are kept
    (`Usage.build` drops them; rating treats both alike). The dedicated GPU totals are not among them:
    GPU time is attributed per deployment-hour (`usage_beyond_totals`). `keys`: a cache of the request
    rows' keys for these `request_meters`, for a caller that turns many customers' rows (one cache
    per `request_meters`)."""
    if keys is None:
        keys = {}
    quantities: Quantities = {}
    for row in usage.requests:
        k = keys.get(row[:3])
        if k is None:
            model, deployment, project = row[:3]
            k = keys[row[:3]] = tuple((UsageKey(m, model, deployment, "", project), _REQUEST_FIELD[m])
                                      for m in request_meters)
        for key, i in k:
            quantities[key] = row[i]
    for meter in usage.meters:
        quantities[UsageKey(usage_meter(meter.meter))] = meter.quantity
    if usage.tasks is not None:
        for key, q in zip(TASK_KEYS, (usage.tasks.succeeded, usage.tasks.failed, usage.tasks.attempts), strict=True):
            quantities[key] = q
    return quantities


def _reads_for(book: PriceBook) -> dict[str, object]:
    """What `period_usages` reads for a book: the meters it prices, by deployment if a charge names
    one, by project if its lines are split so; the tasks when every outcome counts (else
    `usage_beyond_totals`); GPU time never (attributed per deployment-hour)."""
    meters = priced_meters(book)
    return {"requests": bool(meters & set(REQUEST_METERS)), "by_deployment": needs_deployment(book),
            "by_project": book.lines_by_project,
            "usage_meters": {m.removeprefix(USAGE_PREFIX) for m in meters if is_usage_meter(m)},
            "tasks": bool(meters & set(TASK_METERS)) and book.task_outcomes is None, "gpu": False}


def _beyond_for(book: PriceBook) -> dict[str, object]:
    """What `usage_beyond_totals` reads for a book: GPU time if priced, the task meters if priced
    under trusted outcome sources."""
    meters = priced_meters(book)
    return {"gpu": GPU_METER in meters, "trust": book.task_outcomes if meters & set(TASK_METERS) else None}


def _rate_rows(book: PriceBook, rows: Iterable[period_usage.PeriodUsage], beyond: dict[str, Quantities],
               period_of) -> dict[str, Rating]:
    """Each customer's rating of its rows (`totals_quantities`) and of what `beyond` holds for it,
    rated as its rows arrive; the customers with only `beyond` over `period_of(customer)`."""
    request_meters = [m for m in REQUEST_METERS if m in priced_meters(book)]
    keys: TotalsKeys = {}
    ratings: dict[str, Rating] = {}
    for usage in rows:
        quantities = totals_quantities(usage, request_meters, keys)
        more = beyond.pop(usage.customer_id, None)
        if more:
            quantities.update(more)  # GPU time, trusted tasks: keys disjoint from the rows'
        ratings[usage.customer_id] = rate(
            book, Usage.trusted(usage.customer_id, usage.period_start, usage.period_end, quantities))
    for customer, quantities in beyond.items():
        start, end = period_of(customer)
        ratings[customer] = rate(book, Usage.trusted(customer, start, end, quantities))
    return ratings


def rate_period(
    conn: psycopg.Connection,
    book: PriceBook,
    start: datetime,
    end: datetime,
    cost_model: CostModel | None = None,
    *,
    from_totals: bool = True,
) -> dict[str, Rating]:
    """Every customer's rating of the window [start, end) (whole UTC hours) under a book, read by
    `metering.period_usage.period_usages` of the window (metering decides per customer: the totals of
    a customer whose billing period the window is, the hourly rollups of every other one;
    `from_totals=False`: the hourly rollups for every customer, the hourly reference of the
    benchmarks and tests) and what the totals do not hold (`usage_beyond_totals`). The request rows
    stream in customer order and each customer is rated as soon as its rows are complete, while
    PostgreSQL reads the next customers."""
    start, end = check_window(start, end)
    with gc_paused():
        beyond = usage_beyond_totals(conn, start, end, cost_model, **_beyond_for(book))
        rows = period_usage.period_usages(conn, window=(start, end), from_totals=from_totals, **_reads_for(book))
        return _rate_rows(book, rows, beyond, lambda _: (start, end))


def rate_billing_period(
    conn: psycopg.Connection,
    book: PriceBook,
    label: str,
    cost_model: CostModel | None = None,
    *,
    customer_id: str | None = None,
    periods: period_usage.Periods | None = None,
) -> dict[str, Rating]:
    """Every customer's rating of its own billing period labelled `label` (its calendar's, or the UTC
    month for a customer without one; or one customer's) under a book, from the period totals metering
    keeps at ingest (`metering.period_usage`): one row per customer x model (x deployment x project),
    meter and the customer's tasks, streamed in customer order, instead of the hours behind them. Each
    customer is rated as soon as its rows arrive. The same ratings, to the cent and line by line, as
    rating each customer's period from the hourly rollups and the raw events at its edges
    (`billing_service.usage.period_usage`; for periods on whole UTC hours, `rate_period` with
    `from_totals=False`): tests/pricing_service/test_rate_from_totals.py.

    What the totals do not hold (`usage_beyond_totals`: GPU time, the task meters of a book that
    trusts only some outcome sources) is read once per distinct period window of the customers (the
    UTC month and each schedule's period). Pricing experiments' prefix caching off is not served here
    (`load_period_usages(caching_off_for=...)`). `periods`: the customers' periods of `label` when the
    caller has read them (`metering.period_usage.label_periods`)."""
    if periods is None:
        periods = period_usage.label_periods(conn, label, customer_id)
    windows = [periods.of(customer_id)] if customer_id is not None else sorted(periods.windows())
    with gc_paused():
        beyond: dict[str, Quantities] = {}
        for window in windows:
            found = usage_beyond_totals(conn, *window, cost_model, customer_id=customer_id, **_beyond_for(book))
            beyond.update((c, q) for c, q in found.items() if periods.of(c) == window)
        rows = period_usage.period_usages(conn, label, customer_id=customer_id, periods=periods, **_reads_for(book))
        return _rate_rows(book, rows, beyond, periods.of)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Rating builds 10^5 acyclic lines and usage dicts, the cost anatomy millions of acyclic parts: the
    cyclic collector's full-heap passes over them find nothing and cost a fifth of rating's time and
    several times the anatomy's building (bench.rating, bench.anatomy). Pause it for the bulk work,
    then restore it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
