"""The worked example of docs/cost-model.md, as data (used by the tests that check its numbers)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from pricing.anatomy import AnatomyInputs, EngineRecord, RequestClassRecord
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
    kv_cache_share="0.25",
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


# The cost anatomy of the same hour (docs/cost-model.md, "Cost anatomy"): what dep-pool's engines
# did, and the classes of the requests the raw events record (they add up to the rollups above).
ENGINE = (EngineRecord("dep-pool", H0, Decimal(5_760_000), kv_cache_gpu_ms=2_880_000, queue_ms=1_000_000,
                       running_ms=6_000_000),
          EngineRecord("dep-a-dedicated", H0, Decimal(0)))


def _cls(customer: str, status: str, requests: int, uncached: int, output: int, **kw) -> RequestClassRecord:
    return RequestClassRecord(customer, "m", "dep-pool", H0, status, requests, uncached, output, **kw)


CLASSES = (
    _cls("cust-a", "ok", 4, 120_000, 60_000),
    _cls("cust-a", "ok", 1, 50_000, 5_000, prefix="other"),  # prefix served before, on another replica
    _cls("cust-a", "ok", 1, 20_000, 5_000, prefix="same"),  # ... on the same replica (evicted)
    _cls("cust-a", "error", 1, 60_000, 10_000, error="upstream_broken"),
    _cls("cust-a", "cancelled", 1, 40_000, 10_000, reason="client_disconnected"),
    _cls("cust-a", "ok", 1, 50_000, 5_000, wasted_attempt=True, task_cause="verifier"),  # t1's attempt 1
    _cls("cust-a", "ok", 1, 60_000, 5_000, failovers=2),  # served at the third upstream attempt
    _cls("cust-b", "ok", 2, 150_000, 25_000),
    _cls("cust-b", "rejected", 1, 0, 0, reason="budget_exceeded"),
    _cls("cust-b", "error", 1, 50_000, 0, error="queue_timeout"),
    _cls("cust-b", "ok", 1, 100_000, 25_000, wasted_attempt=True),  # t2 failed, no cause given
)
ANATOMY_INPUTS = AnatomyInputs(ENGINE, CLASSES)
