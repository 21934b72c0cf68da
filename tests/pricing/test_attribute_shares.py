"""`pricing.cost.attribute` on a ledger worked by hand: rollup rows of the same customer and model
summed, a deployment-hour whose GPU time two owners report (the pool and a dedicated customer), and
an idle deployment-hour with two owners, each keeping its own idle share."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from pricing.cost import CostKey, CostModel, attribute
from pricing.records import Dataset, GpuRecord
from pricing.records import RequestRecord as R

D = Decimal
H = datetime(2026, 2, 1, 10, tzinfo=UTC)
MODEL = CostModel(gpu_hour={"h100": D("3.60")})  # $0.001 a GPU-second


def test_shares_summed_over_rows_and_owners_and_idle_owners_kept_apart():
    ds = Dataset(
        H, datetime(2026, 2, 1, 11, tzinfo=UTC),
        # a: 150k + 150k weighted tokens over two rows (20 requests); b: 100k (5 requests)
        requests=(R("a", "m", "d1", H, 10, 200_000, 100_000, 50_000), R("a", "m", "d1", H, 10, 100_000, 0, 50_000),
                  R("b", "m", "d1", H, 5, 100_000, 0, 0)),
        # d1: 1,800 GPU-s of the pool and 1,800 of x's, each shared 3:1 between a and b; d2 idle, two owners
        gpu=(GpuRecord("", "d1", "h100", H, 1_800_000), GpuRecord("x", "d1", "h100", H, 1_800_000),
             GpuRecord("", "d2", "h100", H, 500_000), GpuRecord("y", "d2", "h100", H, 250_000)),
    )
    att = attribute(ds, MODEL)
    assert att.weighted_tokens == {("a", "m"): D(300_000), ("b", "m"): D(100_000)}
    assert att.requests == {("a", "m"): 20, ("b", "m"): 5}
    a, b = CostKey("a", "m", "d1", "h100", H), CostKey("b", "m", "d1", "h100", H)
    pool_idle, y_idle = CostKey("", "", "d2", "h100", H), CostKey("y", "", "d2", "h100", H)
    assert att.gpu_seconds == {a: D(2700), b: D(900), pool_idle: D(500), y_idle: D(250)}
    assert att.cost == {a: D("2.70"), b: D("0.90"), pool_idle: D("0.50"), y_idle: D("0.25")}
