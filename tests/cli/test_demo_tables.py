"""Every table `infermeter demo` prints stays readable in an 80-column terminal: rendered into a
rich Console(width=80), no heading or cell is cut ("…") and no line is wider than 80 columns.

The tables are filled with the demo's own month (default pool of 4,000 trace requests, and --full), rolled up
in Python as the metering rollups would be and priced with the example books (no database needed)."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime
from decimal import Decimal

import pytest
from rich.console import Console

from app.demo.month import DEFAULT_REQUESTS, generate
from app.demo.usage import usage_tables
from metering.queries import Window
from pricing.experiments import compare
from pricing.records import AttemptRecord, Dataset, GpuRecord, MeterRecord, RequestRecord, TaskRecord
from pricing_service.books import read_cost_model, read_price_book
from pricing_service.compare import default_book_paths
from pricing_service.comparison_report import ComparisonReport, render_console
from tests.pricing.usage_oracle import oracle_usages

WIDTH = 80


def _hour(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).replace(minute=0, second=0, microsecond=0)


@pytest.fixture(scope="module", params=[DEFAULT_REQUESTS, None], ids=["default", "full"])
def month(request):
    """The demo month (default pool and --full) as hourly records (what pricing reads) and as
    `queries.usage` rows by model."""
    events, _, (start, end) = generate(request.param, seed=7)
    requests = defaultdict(lambda: [0, 0, 0, 0])
    gpu = defaultdict(int)
    attempts = defaultdict(lambda: [0, 0, 0, 0])
    outcomes, task_usage, meters = {}, defaultdict(dict), defaultdict(Decimal)
    for raw in events:
        event = json.loads(raw)
        d = event["data"]
        kind = event["type"]
        if kind == "infermeter.request.v1":
            agg = requests[(d["customer_id"], d["model"], d["deployment_id"], _hour(d["finished_at"]))]
            for i, n in enumerate((1, d["input_tokens"], d["cached_input_tokens"], d["output_tokens"])):
                agg[i] += n
            if d["task_id"]:
                agg = attempts[(d["customer_id"], d["task_id"], d["attempt"])]
                for i, n in enumerate((1, d["input_tokens"], d["cached_input_tokens"], d["output_tokens"])):
                    agg[i] += n
        elif kind == "infermeter.replica.v1":
            ms = int((datetime.fromisoformat(d["interval_end"].replace("Z", "+00:00"))
                      - datetime.fromisoformat(d["interval_start"].replace("Z", "+00:00"))).total_seconds() * 1000)
            gpu[(d["customer_id"] or "", d["deployment_id"], d["gpu_type"], _hour(d["interval_start"]))] += ms * d["gpu_count"]
        elif kind == "infermeter.task.v1":
            outcomes[(d["customer_id"], d["task_id"])] = (d["outcome"], datetime.fromisoformat(d["finished_at"].replace("Z", "+00:00")))
        else:
            task_usage[(d["customer_id"], d["task_id"])][d["meter"]] = Decimal(d["quantity"])
            meters[(d["customer_id"], d["meter"], _hour(event["time"]))] += Decimal(d["quantity"])
    by_task = defaultdict(list)
    for (customer, task, attempt), (n, inp, cached, out) in sorted(attempts.items()):
        by_task[(customer, task)].append(AttemptRecord(attempt, n, inp, cached, out))
    dataset = Dataset(
        start, end,
        tuple(RequestRecord(*k, *v) for k, v in requests.items()),
        tuple(GpuRecord(*k, v) for k, v in gpu.items()),
        tuple(TaskRecord(c, t, o, f, tuple(by_task[(c, t)]), task_usage[(c, t)]) for (c, t), (o, f) in outcomes.items()),
        tuple(MeterRecord(*k, v) for k, v in meters.items()),
    )
    rows = defaultdict(lambda: defaultdict(int))
    for r in dataset.requests:
        row = rows[(r.customer_id, r.model)]
        row.update(customer_id=r.customer_id, model=r.model)
        row["requests"] += r.requests
        row["input_tokens"] += r.input_tokens
        row["cached_input_tokens"] += r.cached_input_tokens
        row["uncached_input_tokens"] += r.uncached_input_tokens
        row["output_tokens"] += r.output_tokens
    return dataset, [dict(r) for r in rows.values()]


def _rendered(draw) -> str:
    console = Console(width=WIDTH, record=True, file=open("/dev/null", "w"), color_system=None)  # noqa: SIM115
    draw(console)
    return console.export_text()


def _assert_fits(text: str) -> None:
    assert "…" not in text, "\n".join(line for line in text.splitlines() if "…" in line)
    assert max(len(line) for line in text.splitlines()) <= WIDTH


def test_usage_tables_fit_80_columns(month):
    dataset, rows = month
    tables = usage_tables(rows, Window(dataset.start, dataset.end))
    text = _rendered(lambda console: [console.print(t) for t in tables])
    _assert_fits(text)
    for heading in ("model", "requests", "uncached", "cached", "output", "cache hit", "customer", "share of"):
        assert heading in text
    assert "kimi-chat-lite" in text and "cust-001" in text


def test_pricing_comparison_fits_80_columns(month):
    dataset, _ = month
    cost_model = read_cost_model(None)
    books = [read_price_book(p) for p in default_book_paths()]
    comparison = compare(dataset, books, cost_model, oracle_usages(dataset, cost_model))
    report = ComparisonReport(comparison, [str(p) for p in default_book_paths()], "example")
    text = _rendered(lambda console: render_console(report, console))
    _assert_fits(text)
    for book in books:
        assert book.id in text
    for heading in ("revenue", "margin %", "pay more", "daily margin sd", "loss-making", "cached tokens",
                    "passed to", "kept by", "absorbed by", "paid by"):
        assert heading in text
