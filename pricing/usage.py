"""Usage aggregates: what rating consumes. Pure values built by adapters (pricing_service) from the
metering rollups, or by tests by hand.

A `Usage` is the quantity of each meter for one customer over one half-open period [start, end),
split by the dimensions a charge may select on: model and deployment (request meters), deployment
and gpu_type (gpu_seconds). Task and usage meters have no dimension. Request meters may also be split
by project (the API key's, '' for none): adapters read it only for a book that lays its invoice lines
out by project (`PriceBook.lines_by_project`); no charge selects on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import NamedTuple

from pricing.meters import GPU_METER, REQUEST_METERS
from pricing.money import EXACT


class UsageKey(NamedTuple):
    """What a quantity is of: a meter, split by the dimensions charges select on ('' = none)."""

    meter: str
    model: str = ""
    deployment: str = ""
    gpu_type: str = ""
    project: str = ""  # request meters only, read for books that split lines by project

    @property
    def group(self) -> str:
        """The line dimension: the model for request meters, the GPU type for GPU time, else ''."""
        if self.meter in REQUEST_METERS:
            return self.model
        if self.meter == GPU_METER:
            return self.gpu_type
        return ""


def _check_period(start: datetime, end: datetime) -> None:
    if start.tzinfo is None or end.tzinfo is None:
        raise ValueError("period bounds must be timezone-aware (UTC)")
    if end < start:
        raise ValueError(f"period end {end.isoformat()} is before its start {start.isoformat()}")


@dataclass(frozen=True)
class Usage:
    customer_id: str
    period_start: datetime
    period_end: datetime
    quantities: Mapping[UsageKey, Decimal] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_period(self.period_start, self.period_end)
        for key, quantity in self.quantities.items():
            if not isinstance(quantity, Decimal | int) or isinstance(quantity, bool):
                raise TypeError(f"quantity of {key} must be Decimal or int, got {type(quantity).__name__}")
            if quantity < 0:
                raise ValueError(f"quantity of {key} is negative: {quantity}")

    @classmethod
    def build(
        cls,
        customer_id: str,
        period_start: datetime,
        period_end: datetime,
        rows: Iterable[tuple[UsageKey, Decimal | int]],
    ) -> Usage:
        totals: dict[UsageKey, Decimal] = {}
        for key, quantity in rows:
            if quantity:
                totals[key] = EXACT.add(totals.get(key, Decimal(0)), Decimal(quantity))
        return cls(customer_id, period_start, period_end, totals)

    @classmethod
    def trusted(
        cls, customer_id: str, period_start: datetime, period_end: datetime, quantities: dict[UsageKey, Decimal | int]
    ) -> Usage:
        """Without the per-quantity checks: for adapters whose quantities come from non-negative
        integer and NUMERIC sums (rating a period for every customer reads its usages this way)."""
        usage = object.__new__(cls)
        object.__setattr__(usage, "customer_id", customer_id)
        object.__setattr__(usage, "period_start", period_start)
        object.__setattr__(usage, "period_end", period_end)
        object.__setattr__(usage, "quantities", quantities)
        return usage

    def then(self, later: Usage) -> Usage:
        """This usage followed by the usage of the adjacent later period: [a, b) + [b, c) = [a, c)."""
        if later.customer_id != self.customer_id:
            raise ValueError("cannot join usage of different customers")
        if later.period_start != self.period_end:
            raise ValueError("periods are not adjacent")
        return Usage.build(
            self.customer_id,
            self.period_start,
            later.period_end,
            [*self.quantities.items(), *later.quantities.items()],
        )

    def total(self, meter: str) -> Decimal:
        total = Decimal(0)
        for key, quantity in self.quantities.items():
            if key.meter == meter:
                total = EXACT.add(total, quantity)
        return total

    def empty_before(self) -> Usage:
        """No usage over the empty period [start, start): the prior of the first progressive rating."""
        return Usage(self.customer_id, self.period_start, self.period_start, {})
