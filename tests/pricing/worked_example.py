"""The worked example of docs/cost-model.md, as data (used by the tests that check its numbers)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from pricing.book import price_book_from_data
from pricing.cost import CostModel
from pricing.records import AttemptRecord, Dataset, GpuRecord, MeterRecord, RequestRecord, TaskRecord

H0 = datetime(2026, 11, 2, 0, tzinfo=UTC)
H1 = datetime(2026, 11, 2, 1, tzinfo=UTC)

COST_MODEL = CostModel(
    currency="USD",
    gpu_hour={"H100": "4.00"},
    prefill_weight="1",
    decode_weight="2",
    usage_unit_cost={"verification_runs": "0.05"},
)

DATASET = Dataset(
    H0,
    H1,
    requests=(
        RequestRecord("cust-a", "m", "dep-pool", H0, 10, 1_000_000, 600_000, 100_000),
        RequestRecord("cust-b", "m", "dep-pool", H0, 5, 300_000, 0, 50_000),
    ),
    gpu=(
        GpuRecord("", "dep-pool", "H100", H0, 3_600_000),  # replica 1
        GpuRecord("", "dep-pool", "H100", H0, 3_600_000),  # replica 2
        GpuRecord("cust-a", "dep-a-dedicated", "H100", H0, 3_600_000),  # idle all hour
    ),
    tasks=(
        TaskRecord(
            "cust-a", "t1", "succeeded", datetime(2026, 11, 2, 0, 40, tzinfo=UTC),
            (AttemptRecord(1, 2, 100_000, 0, 10_000), AttemptRecord(2, 1, 50_000, 0, 5_000)),
            {"verification_runs": Decimal(2)},
        ),
        TaskRecord("cust-b", "t2", "failed", datetime(2026, 11, 2, 0, 50, tzinfo=UTC),
                   (AttemptRecord(1, 1, 20_000, 0, 10_000),)),
    ),
    meters=(MeterRecord("cust-a", "verification_runs", H0, Decimal(2)),),
)


def book(id_: str, charges: list[dict]) -> object:
    return price_book_from_data({"id": id_, "currency": "USD", "charges": charges})


PER_TOKEN = book(
    "per-token",
    [
        {"meter": "uncached_input_tokens", "price": {"type": "unit", "amount": "2", "per": 1000000}},
        {"meter": "cached_input_tokens", "price": {"type": "unit", "amount": "0.50", "per": 1000000}},
        {"meter": "output_tokens", "price": {"type": "unit", "amount": "8", "per": 1000000}},
    ],
)
GPU_HOUR = book("gpu-hour", [{"meter": "gpu_seconds", "gpu_type": "H100", "price": {"type": "unit", "amount": "6", "per": 3600}}])
PER_TASK = book("per-task", [{"meter": "successful_tasks", "price": {"type": "unit", "amount": "3", "per": 1}}])
