"""What each page shows, as plain data. A page renders it, its JSON endpoint returns it and its CSV
endpoint flattens it: the three come from one call, so they cannot disagree. The data comes from
the same query functions the JSON API and the CLI use (metering.queries, pricing_service), and for
the customer dashboard's charts metering.customer_dashboard_reads.

Amounts stay exact decimal strings (the charts convert them to numbers for drawing only).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Any

import psycopg

from infermeter.times import HOUR, TimeInputError, Window, floor_hour, parse_time, utc_text
from metering import customer_dashboard_reads, ops_reads, queries
from pricing.book import PriceBook
from pricing.rating import rate
from pricing.usage import Usage

MAX_WINDOW = timedelta(days=400)


# --- charts ------------------------------------------------------------------------------------


@dataclass
class Chart:
    """One chart: `rows` (its JSON and CSV) and how to draw them: x from `x`, one trace per series."""

    id: str
    title: str
    kind: str  # bar | stacked | line
    x: str
    series: list[tuple[str, str]]  # (label, key in each row)
    rows: list[dict]
    note: str = ""
    y_title: str = ""
    x_title: str = ""
    extra: dict = field(default_factory=dict)
    x_type: str = ""  # plotly's axis type; "" lets plotly guess (dates for hours), "category" for labels
    y_percent: bool = False  # the values are shares (0.25): the axis reads in percent (25%)

    def spec(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "kind": self.kind, "x": self.x,
                "series": [{"label": label, "key": key} for label, key in self.series],
                "rows": self.rows, "y_title": self.y_title, "x_title": self.x_title, "x_type": self.x_type,
                "y_percent": self.y_percent}

    def to_json(self) -> dict[str, Any]:
        return {"chart": self.id, "title": self.title, **self.extra, "rows": self.rows}

    @property
    def points(self) -> int:
        return sum(1 for row in self.rows for _, key in self.series if row.get(key) is not None)


# --- windows -----------------------------------------------------------------------------------


def ceil_hour(moment: datetime) -> datetime:
    floored = floor_hour(moment)
    return floored if floored == moment else floored + HOUR


def page_window(from_text: str | None, to_text: str | None, *, now: datetime, default: timedelta) -> Window:
    """The window a page shows: whole UTC hours (from floored, to rounded up), by default the
    `default` span ending at the end of the current hour. Raises TimeInputError for bad input."""
    end = ceil_hour(parse_time(to_text, "to")) if to_text else floor_hour(now) + HOUR
    start = floor_hour(parse_time(from_text, "from")) if from_text else end - default
    if end - start > MAX_WINDOW:
        raise TimeInputError(f"the window is longer than {MAX_WINDOW.days} days; choose a shorter one")
    return Window(start, end)


PICKED_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d(:\d\d)?")  # what a datetime-local picker sends


def picked_time(text: str | None) -> str | None:
    """A time from a page's date picker (`<input type="datetime-local">`: no zone) as UTC, which the
    pages' times are ("2026-11-02T10:00" -> "2026-11-02T10:00Z"); any other text as it is."""
    return f"{text}Z" if text and PICKED_TIME.fullmatch(text) else text


def picked_times(params: list[tuple[str, str]], names: tuple[str, ...]) -> list[tuple[str, str]]:
    """A page's query with the date pickers' fields (`names`) as UTC times (picked_time)."""
    return [(k, picked_time(v) if k in names else v) for k, v in params]


def bucket_for(window: Window) -> str:
    return "hour" if window.end - window.start <= timedelta(hours=72) else "day"


def window_json(window: Window) -> dict[str, str]:
    return {"from": utc_text(window.start), "to": utc_text(window.end)}


def _rate(part: int, whole: int) -> float | None:
    return None if not whole else round(part / whole, 6)


# --- the customer dashboard ----------------------------------------------------------------------


TOKEN_KEYS = queries.TOKEN_FIELDS  # requests, input, cached input, uncached input, output tokens


def customer_usage(conn: psycopg.Connection, window: Window, customer_id: str, model: str | None, *,
                   models: bool = True, totals_only: bool = False, project: str | None = None) -> dict[str, Any]:
    """Tokens, requests and cache-hit rate per hour (day for windows over 3 days), and totals, from
    `metering.customer_dashboard_reads.customer_usage_series`: `metering.queries.usage` (what GET
    /v1/usage answers) by model and bucket, summed per bucket by PostgreSQL. `models=False`: without
    the customer's model list (None; the page's filter needs it, the charts' JSON does not), one
    statement cheaper. `totals_only`: the totals (and models) alone, from the customer's sums per
    model (the summary; no series: bucket None). `project`: that project's requests only (None:
    every project)."""
    bucket = bucket_for(window)
    if not window.on_hours:  # pages' windows are whole hours; anything else reads raw events at its edges
        return usage_view(queries.usage(conn, window, customer_id=customer_id, group_by=["model", bucket],
                                        project=project), bucket, model)
    bucket = None if totals_only else bucket
    series, names = customer_dashboard_reads.customer_usage_series(conn, window, customer_id, bucket=bucket,
                                                                   model=model, models=models, project=project)
    return series_view(series, names, bucket)


async def customer_usage_async(conn: psycopg.AsyncConnection, window: Window, customer_id: str,
                               model: str | None, *, models: bool = True, totals_only: bool = False,
                               project: str | None = None) -> dict[str, Any]:
    """`customer_usage` on an async connection
    (`metering.customer_dashboard_reads.customer_usage_series_async`: the same statement)."""
    bucket = bucket_for(window)
    if not window.on_hours:
        rows = await queries.usage_async(conn, window, customer_id=customer_id, group_by=["model", bucket],
                                         project=project)
        return usage_view(rows, bucket, model)
    bucket = None if totals_only else bucket
    series, names = await customer_dashboard_reads.customer_usage_series_async(
        conn, window, customer_id, bucket=bucket, model=model, models=models, project=project)
    return series_view(series, names, bucket)


def series_view(series: list[dict], models: list[str] | None, bucket: str | None) -> dict[str, Any]:
    """`customer_usage` from `metering.customer_dashboard_reads.customer_usage_series`: each bucket's
    cache-hit rate added, and the totals (the buckets' sums)."""
    totals: dict[str, Any] = dict.fromkeys(TOKEN_KEYS, 0)
    for row in series:
        for key in TOKEN_KEYS:
            totals[key] += row[key]
        row["cache_hit_rate"] = _rate(row["cached_input_tokens"], row["input_tokens"])
    totals["cache_hit_rate"] = _rate(totals["cached_input_tokens"], totals["input_tokens"])
    return {"bucket": bucket, "models": models, "series": series, "totals": totals}


def usage_view(rows: list[dict], bucket: str, model: str | None) -> dict[str, Any]:
    """`customer_usage` from the rows of `metering.queries.usage` by model and `bucket` (a window not
    on whole hours)."""
    models = sorted({r["model"] for r in rows})
    if model:
        rows = [r for r in rows if r["model"] == model]
    # per bucket: [requests, input, cached input, uncached input, output] (TOKEN_KEYS' order)
    per_bucket: dict[str, list[int]] = {}
    for r in rows:
        sums = per_bucket.get(r[bucket])
        if sums is None:
            sums = per_bucket[r[bucket]] = [0, 0, 0, 0, 0]
        for i, key in enumerate(TOKEN_KEYS):
            sums[i] += r[key]
    series = [{bucket: t, **dict(zip(TOKEN_KEYS, v, strict=True)), "cache_hit_rate": _rate(v[2], v[1])}
              for t, v in sorted(per_bucket.items())]
    totals: dict[str, Any] = {key: sum(v[i] for v in per_bucket.values()) for i, key in enumerate(TOKEN_KEYS)}
    totals["cache_hit_rate"] = _rate(totals["cached_input_tokens"], totals["input_tokens"])
    return {"bucket": bucket, "models": models, "series": series, "totals": totals}


def customer_gpu(conn: psycopg.Connection, window: Window, customer_id: str, *,
                 totals_only: bool = False) -> dict[str, Any]:
    """GPU-hours of the customer's dedicated deployments (the GPU ledger rows it owns); `totals_only`:
    per deployment and in all, no series (the summary: bucket None)."""
    bucket = None if totals_only else bucket_for(window)
    return gpu_view(customer_dashboard_reads.dedicated_gpu_ms(conn, window, customer_id, bucket=bucket), bucket)


async def customer_gpu_async(conn: psycopg.AsyncConnection, window: Window, customer_id: str, *,
                             totals_only: bool = False) -> dict[str, Any]:
    """`customer_gpu` on an async connection (`metering.customer_dashboard_reads.dedicated_gpu_ms_async`:
    the same statement)."""
    bucket = None if totals_only else bucket_for(window)
    return gpu_view(await customer_dashboard_reads.dedicated_gpu_ms_async(conn, window, customer_id, bucket=bucket),
                    bucket)


def gpu_view(rows: list[dict], bucket: str | None) -> dict[str, Any]:
    """`customer_gpu` from the rows of `metering.customer_dashboard_reads.dedicated_gpu_ms` per `bucket`
    (None: no series)."""
    deployments: dict[str, int] = defaultdict(int)
    per_bucket: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in rows:
        deployments[r["deployment_id"]] += r["gpu_ms"]
        if bucket is not None:
            per_bucket[r[bucket]][r["deployment_id"]] += r["gpu_ms"]
    names = sorted(deployments)
    series = [{bucket: t, **{d: _gpu_hours(v.get(d, 0)) for d in names}} for t, v in sorted(per_bucket.items())]
    return {"bucket": bucket, "deployments": [{"deployment_id": d, "gpu_hours": _gpu_hours(ms)} for d, ms in sorted(deployments.items())],
            "series": series, "total_gpu_hours": _gpu_hours(sum(deployments.values()))}


def _gpu_hours(ms: int) -> str:
    return str((Decimal(ms) / 3_600_000).quantize(Decimal("0.0001")))


TASK_KEYS = ("tasks", "succeeded", "failed", "other_outcomes", "attempts", "retried_attempts", "requests")


def customer_tasks(conn: psycopg.Connection, window: Window, customer_id: str) -> dict[str, Any]:
    """The customer's finished tasks per bucket, and totals: the sums of the buckets (each task finishes
    in one bucket, every column is a count), so one statement instead of two."""
    bucket = bucket_for(window)
    return tasks_view(customer_dashboard_reads.task_summary(conn, window, customer_id, bucket=bucket), bucket)


async def customer_tasks_async(conn: psycopg.AsyncConnection, window: Window, customer_id: str) -> dict[str, Any]:
    """`customer_tasks` on an async connection (`metering.customer_dashboard_reads.task_summary_async`: the
    same statement)."""
    bucket = bucket_for(window)
    return tasks_view(await customer_dashboard_reads.task_summary_async(conn, window, customer_id, bucket=bucket),
                      bucket)


def tasks_view(series: list[dict], bucket: str) -> dict[str, Any]:
    """`customer_tasks` from the rows of `metering.customer_dashboard_reads.task_summary` per `bucket`."""
    total: dict[str, Any] = {key: sum(row[key] for row in series) for key in TASK_KEYS}
    total["success_rate"] = _rate(total["succeeded"], total["tasks"])
    return {"bucket": bucket, "totals": total, "series": series}


def baseline_book(settings) -> PriceBook:
    """The book spend is rated under until billing registers the customer's own: the first candidate
    book (INFERMETER_PRICING_BOOKS), or the per-token example book when that is unset."""
    from pricing_service.books import book_paths

    paths = book_paths(settings.pricing_books) if settings.pricing_books else [Path(default_book_specs()[0])]
    return _read_book(str(paths[0]), _mtime(paths[0]))


def cost_model(settings):
    """The cost model of INFERMETER_PRICING_COST_MODEL (None: the example one), parsed once per file version."""
    from pricing_service.books import EXAMPLE_COST_MODEL

    path = settings.pricing_cost_model
    return _read_cost_model(None if path is None else str(path), _mtime(Path(path or EXAMPLE_COST_MODEL)))


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return -1  # the reader says what is wrong with the path


@lru_cache(maxsize=16)
def _read_book(path: str, _mtime_ns: int) -> PriceBook:
    """A book file parsed and validated once per version of the file (its modification time)."""
    from pricing_service.books import read_price_book

    return read_price_book(Path(path))


@lru_cache(maxsize=4)
def _read_cost_model(path: str | None, _mtime_ns: int):
    from pricing_service.books import read_cost_model

    return read_cost_model(None if path is None else Path(path))


def customer_spend(conn: psycopg.Connection, window: Window, customer_id: str, book: PriceBook, cost_model,
                   succeeded: int) -> dict[str, Any]:
    """What the customer's usage of the window comes to at its own prices (`book`), rated as
    invoices rate it, and that divided by its successful tasks. Only the customer's price: no cost."""
    return spend_view(book, rated_spend(conn, window, customer_id, book, cost_model), succeeded)


def rated_spend(conn: psycopg.Connection, window: Window, customer_id: str, book: PriceBook, cost_model) -> Decimal:
    """The customer's usage of the window rated under `book` as invoices rate it (`customer_spend`)."""
    from pricing_service.rate_period import load_period_usages, needs_deployment, priced_meters

    usages = load_period_usages(conn, window.start, window.end, cost_model, by_deployment=needs_deployment(book),
                                meters=priced_meters(book), customer_id=customer_id,
                                task_outcomes=book.task_outcomes)
    usage = usages.get(customer_id) or Usage(customer_id, window.start, window.end, {})
    return rate(book, usage).usage_total


def spend_view(book: PriceBook, spend: Decimal, succeeded: int) -> dict[str, Any]:
    """`customer_spend` from the rated spend and the successful tasks."""
    per_task = (spend / succeeded).quantize(Decimal("0.0001")) if succeeded else None
    return {"book_id": book.id, "currency": book.currency, "spend": str(spend),
            "successful_tasks": succeeded, "spend_per_successful_task": None if per_task is None else str(per_task)}


def customer_charts(usage: dict, gpu: dict, tasks: dict) -> list[Chart]:
    return usage_charts(usage) + [gpu_chart(gpu), tasks_chart(tasks)]


def usage_charts(usage: dict) -> list[Chart]:
    b = usage["bucket"]
    return [
        Chart("tokens", "Tokens", "stacked", b,
              [("uncached input", "uncached_input_tokens"), ("cached input", "cached_input_tokens"),
               ("output", "output_tokens")], usage["series"], y_title="tokens", x_title=b,
              note="Input tokens split into uncached and cached (prefix-cache hits), and output tokens, per " + b + "."),
        Chart("requests", "Requests", "bar", b, [("requests", "requests")], usage["series"], y_title="requests",
              x_title=b),
        Chart("cache_hit", "Cache-hit rate", "line", b, [("cached / all input tokens", "cache_hit_rate")],
              usage["series"], y_title="cache-hit rate (%)", x_title=b, y_percent=True,
              note="Cached input tokens divided by all input tokens, in percent."),
    ]


def gpu_chart(gpu: dict) -> Chart:
    return Chart("gpu", "GPU-hours of your dedicated deployments", "stacked", gpu["bucket"],
                 [(d["deployment_id"], d["deployment_id"]) for d in gpu["deployments"]], gpu["series"],
                 y_title="GPU-hours", x_title=gpu["bucket"],
                 note="From the replica intervals of deployments dedicated to you (shared capacity is not shown).")


def tasks_chart(tasks: dict) -> Chart:
    return Chart("tasks", "Tasks finished", "stacked", tasks["bucket"],
                 [("succeeded", "succeeded"), ("failed", "failed"), ("other outcomes", "other_outcomes")],
                 tasks["series"], y_title="tasks", x_title=tasks["bucket"],
                 note="Tasks by the time their outcome was reported; attempts and retries are in the table.")


# --- pricing experiments -------------------------------------------------------------------------


def book_choices(conn: psycopg.Connection, settings) -> list[tuple[str, str]]:
    """(spec, label) of every book the pricing page offers: the example books, the candidate books
    (INFERMETER_PRICING_BOOKS) and every stored book (its version in force at the window start)."""
    from pricing_service.books import book_paths, list_versions
    from pricing_service.compare import STORED_PREFIX, default_book_paths

    out: dict[str, str] = {}
    for p in default_book_paths():
        out[str(p)] = f"example: {p.name}"
    for p in book_paths(settings.pricing_books):
        out.setdefault(str(p), f"candidate: {p.name}")
    for v in list_versions(conn):
        out.setdefault(f"{STORED_PREFIX}{v.book_id}", f"stored: {v.book_id}")
    return list(out.items())


def default_book_specs() -> list[str]:
    from pricing_service.compare import default_book_paths

    return [str(p) for p in default_book_paths()]


def pricing_comparison(database_url: str, window: Window, specs: list[str], cost_model_path: Path | None) -> dict:
    """`infermeter pricing compare --json` for the window and books (the first is the baseline)."""
    from pricing_service.compare import STORED_PREFIX, run_comparison

    paths = [s if s.startswith(STORED_PREFIX) else Path(s) for s in specs]
    return run_comparison(database_url, window.start, window.end, paths, cost_model_path).to_json()


def pricing_charts(report: dict, shadow: dict | None) -> list[Chart]:
    books = report["books"]
    baseline = books[0]["id"] if books else ""
    overview = [{"book": b["id"], "currency": b["currency"], "revenue": b["revenue"], "cost": b["cost"],
                 "margin": b["margin"], "gross_margin_pct": b["gross_margin_pct"]} for b in books]
    deltas: dict[str, dict[str, str]] = defaultdict(dict)
    for b in books[1:]:
        for c in b["customers"]:
            deltas[c["customer_id"]][b["id"]] = c["versus_baseline"]
    top = sorted(deltas, key=lambda c: max((abs(Decimal(v)) for v in deltas[c].values()), default=0), reverse=True)[:25]
    customers = [{"customer_id": c, **deltas[c]} for c in sorted(top)]
    more_less = [{"book": b["id"], "pay_more": b["customers_paying_more_than_baseline"],
                  "pay_less": b["customers_paying_less_than_baseline"]} for b in books[1:]]
    caching = [{"book": b["id"], "model": g["model"], "book_model": f"{b['id']} / {g['model']}",
                "cached_input_tokens": g["cached_input_tokens"], "cost_gain": g["cost_gain"],
                "passed_to_customers": g["passed_to_customers"], "kept_by_platform": g["kept_by_platform"]}
               for b in books for g in b["caching"]]
    retries = [{"book": b["id"], **(b["retries"] or {})} for b in books]
    charts = [
        Chart("overview", "Revenue, cost and gross margin per book", "bar", "book",
              [("revenue", "revenue"), ("cost", "cost"), ("gross margin", "margin")], overview,
              y_title=report["currency"], note="Revenue: what customers would be invoiced under each book for the "
              "window; cost: GPU time at the cost model's $/GPU-hour plus usage unit costs; margin = revenue - cost."),
        Chart("customers", f"Customers who pay more or less than under {baseline}", "bar", "customer_id",
              [(f"{b['id']} - {baseline}", b["id"]) for b in books[1:]], customers, y_title=report["currency"],
              note="Each customer's invoice under a book minus its invoice under the baseline (top 25 by the "
              "largest change).", extra={"baseline": baseline, "pay_more_or_less": more_less}),
        Chart("caching", "Prefix-caching gain: kept by the platform or passed on", "stacked", "book_model",
              [("passed to customers", "passed_to_customers"), ("kept by the platform", "kept_by_platform")],
              caching, y_title=report["currency"], note="The cost prefix caching saved, split into what customers "
              "paid less and what the platform kept as margin."),
        Chart("retries", "Retried task attempts: cost, and revenue they bring", "bar", "book",
              [("cost of retried attempts", "retried_cost"), ("revenue from retried attempts", "revenue_from_retries")],
              retries, y_title=report["currency"]),
    ]
    if shadow is not None:
        charts.append(Chart("shadow", "Live shadow rating: the running month under each candidate book", "bar",
                            "book", [("revenue to date", "revenue_to_date"),
                                     ("with commitments", "total_with_commitments")],
                            shadow_totals(shadow), y_title="amount",
                            note=f"Period {shadow['period']['from']} .. now ({shadow['as_of']}), every customer, live "
                            "from the hourly rollups.", extra={"period": shadow["period"], "as_of": shadow["as_of"]}))
    for chart in charts:
        chart.extra = {"window": report["window"], **chart.extra}
    return charts


def shadow_totals(shadow: dict) -> list[dict]:
    totals: dict[str, dict[str, Any]] = {}
    for c in shadow["customers"]:
        for b in c["books"]:
            t = totals.setdefault(b["id"], {"book": b["id"], "currency": b["currency"], "customers": 0,
                                            "revenue_to_date": Decimal(0), "total_with_commitments": Decimal(0)})
            t["customers"] += 1
            t["revenue_to_date"] += Decimal(b["revenue_to_date"])
            t["total_with_commitments"] += Decimal(b["total_with_commitments"])
    return [{**t, "revenue_to_date": str(t["revenue_to_date"]),
             "total_with_commitments": str(t["total_with_commitments"])} for t in totals.values()]


def live_shadow(conn: psycopg.Connection, settings, now: datetime) -> dict:
    from pricing_service.books import book_paths, read_cost_model, read_price_book
    from pricing_service.shadow import shadow_rating_on

    books = [read_price_book(p) for p in book_paths(settings.pricing_books)]
    conn.execute("SET TIME ZONE 'UTC'")
    return shadow_rating_on(conn, books, read_cost_model(settings.pricing_cost_model), now=now).to_json()


# --- operations ----------------------------------------------------------------------------------


def ops_ingest(conn: psycopg.Connection, now: datetime, minutes: int = 60) -> dict[str, Any]:
    since = now.replace(second=0, microsecond=0) - timedelta(minutes=minutes - 1)
    found = {r["minute"]: r for r in ops_reads.ingest_rate(conn, since, now)}
    minutes_ = [utc_text(since + timedelta(minutes=m)) for m in range(minutes)]
    rows = [found.get(m) or {"minute": m, "events": 0, "dead_letters": 0} for m in minutes_]
    return {"since": utc_text(since), "until": utc_text(now), "rows": rows,
            "events": sum(r["events"] for r in rows), "dead_letters": sum(r["dead_letters"] for r in rows),
            "delay": ops_reads.metering_delay(conn, now - timedelta(minutes=15), now),
            "consumers": ops_reads.consumer_progress(conn)}


def ops_dead_letters(conn: psycopg.Connection, samples: int = 3) -> list[dict]:
    out = []
    for r in ops_reads.dead_letter_reasons(conn):
        rows = ops_reads.dead_letters(conn, limit=samples, reason=r["reason"]) if len(out) < 20 else []
        out.append({**r, "samples": rows})
    return out


def ops_deployments(conn: psycopg.Connection, window: Window) -> list[dict]:
    """Per deployment (and owner, GPU type): GPU-seconds, busy fraction and tokens per GPU-second,
    from the replica intervals in the GPU ledger."""
    out = []
    for r in ops_reads.gpu_usage(conn, window):
        gpu_s = Decimal(r["gpu_ms"]) / 1000
        tokens = r["prompt_tokens"] + r["generation_tokens"]
        out.append({
            "deployment_id": r["deployment_id"], "owner": r["customer_id"] or "(shared pool)",
            "gpu_type": r["gpu_type"], "replicas": r["replicas"], "gpu_seconds": str(gpu_s),
            "busy_seconds": str(Decimal(r["busy_ms"]) / 1000),
            "busy_fraction": None if not r["gpu_ms"] else round(r["busy_ms"] / r["gpu_ms"], 4),
            "prompt_tokens": r["prompt_tokens"], "generation_tokens": r["generation_tokens"],
            "tokens_per_gpu_second": None if not r["gpu_ms"] else round(tokens * 1000 / r["gpu_ms"], 2),
        })
    return out


def ops_charts(ingest: dict, deployments: list[dict], dead: list[dict]) -> list[Chart]:
    return [
        Chart("ingest", "Events written per minute (last hour)", "line", "minute",
              [("events", "events"), ("dead letters", "dead_letters")], ingest["rows"], y_title="per minute",
              note="From raw_events.received_at (the write transaction's time) and dead_letters.received_at.",
              extra={"since": ingest["since"], "until": ingest["until"]}),
        Chart("deployments", "Busy fraction per deployment", "bar", "deployment_id",
              [("busy fraction", "busy_fraction")], deployments, y_title="busy GPU time / GPU time"),
        Chart("dead_letters", "Dead letters by reason", "bar", "reason", [("dead letters", "count")],
              [{k: v for k, v in d.items() if k != "samples"} for d in dead], y_title="events"),
    ]


def duration_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.2f} s"


def now_utc() -> datetime:
    return datetime.now(UTC)
