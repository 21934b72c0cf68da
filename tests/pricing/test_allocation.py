"""Allocations that add up: largest remainder on a fixed quantum (pricing.cost)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pricing.cost import CostModel, attribute, largest_remainder, split_amount, split_gpu_seconds
from pricing.records import Dataset, GpuRecord, RequestRecord
from tests.examples import examples

D = Decimal
H0 = datetime(2026, 11, 2, tzinfo=UTC)
weights = st.lists(st.decimals(min_value=0, max_value=10**9, places=3, allow_nan=False, allow_infinity=False),
                   min_size=1, max_size=30)


@given(st.integers(min_value=0, max_value=10**20), weights)
@settings(max_examples=examples(300), deadline=None)
def test_largest_remainder_parts_always_sum_to_the_whole(whole, ws):
    parts = largest_remainder(whole, ws)
    assert sum(parts) == whole
    assert all(p >= 0 for p in parts)
    total = sum(ws)
    if total:
        for p, w in zip(parts, ws, strict=True):  # each part within one quantum of its exact share
            assert abs(D(p) - D(whole) * w / total) < 1
        assert largest_remainder(whole, ws) == parts  # deterministic


def test_largest_remainder_gives_the_leftover_to_the_largest_remainders_then_the_earlier():
    assert largest_remainder(10, [1, 1, 1]) == [4, 3, 3]
    assert largest_remainder(100, [D("0.5"), D("0.3"), D("0.2")]) == [50, 30, 20]
    assert largest_remainder(7, [2, 5]) == [2, 5]
    assert largest_remainder(5, [0, 0]) == [5, 0]
    assert largest_remainder(2, [1, 3, 3]) == [0, 1, 1]  # remainders 2/7, 6/7, 6/7
    with pytest.raises(ValueError):
        largest_remainder(1, [])


def test_split_amount_on_cents():
    assert split_amount(D("10.00"), [1, 1, 1], D("0.01")) == [D("3.34"), D("3.33"), D("3.33")]
    with pytest.raises(ValueError):
        split_amount(D("10.001"), [1], D("0.01"))


@given(st.integers(min_value=1, max_value=10**10), weights.filter(lambda ws: sum(ws) > 0))
@settings(max_examples=examples(200), deadline=None)
def test_gpu_seconds_shares_add_up_to_the_hour(gpu_ms, ws):
    parts = split_gpu_seconds(gpu_ms, sum(ws), ws)
    assert sum(parts) == D(gpu_ms) / 1000
    assert all(p.as_tuple().exponent >= -12 for p in parts)


def test_an_hour_of_whole_gpu_seconds_stays_whole_among_many_customers():
    """The demo printed gpu_seconds 63359.999999999 for an hour of whole GPU-seconds: shares divided
    at high precision then truncated. Split by largest remainder, they add up to the hour."""
    requests = tuple(RequestRecord(f"c{i}", "m", "pool", H0, 1, 1000 + 7 * i, 3 * i, 13 + i) for i in range(37))
    gpu = tuple(GpuRecord("", "pool", "H100", H0, 3_600_000) for _ in range(17))  # 61,200 GPU-s
    dataset = Dataset(H0, H0.replace(hour=1), requests, gpu)
    model = CostModel(gpu_hour={"H100": "2.50"}, prefill_weight="1", decode_weight="6")
    att = attribute(dataset, model)
    assert sum(att.gpu_seconds.values()) == D(61_200)
    # 61,200 s x 2.50 / 3600 = 42.50 (each share's cost is exact to 80 digits: $/GPU-s is 2.50 / 3600)
    assert abs(att.total_cost - D("42.5")) < D("1e-70")
    off = attribute(dataset, model, caching_off_for=["m"])
    assert all(s.as_tuple().exponent >= -12 for s in off.gpu_seconds.values())
