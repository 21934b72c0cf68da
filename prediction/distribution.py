"""An amount's distribution as the forecasts and quotes give it: the mean and the 80% interval."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal


@dataclass(frozen=True)
class Distribution:
    """An amount's mean and its p10, p50, p90 (the 80% interval is [p10, p90])."""

    mean: Decimal
    p10: Decimal
    p50: Decimal
    p90: Decimal

    @classmethod
    def of(cls, samples: Sequence[Decimal]) -> Distribution:
        ordered = sorted(samples)
        n = len(ordered)
        pick = lambda q: ordered[min(n - 1, max(0, math.ceil(q * n) - 1))]  # noqa: E731
        return cls(sum(ordered, Decimal(0)) / n, pick(0.1), pick(0.5), pick(0.9))

    def to_json(self, quantize: Callable[[Decimal], Decimal] = lambda d: d) -> dict[str, str]:
        return {"expected": str(quantize(self.mean)), "low": str(quantize(self.p10)),
                "median": str(quantize(self.p50)), "high": str(quantize(self.p90))}
