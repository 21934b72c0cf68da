"""Periods that did not happen, made of days that did: the day bootstrap shared by the invoice forecast
(`prediction.periods`: the rest of a billing period) and the price recommendation (`pricing.recommend`:
whole billing periods). Pure and seeded: the same days, slots and seed give the same draws.

Each slot of a period is a day (or part of one) filled by an observed day drawn with replacement:
weekdays from the observed weekdays and weekend days from the observed weekend days when each kind
has MIN_STRATUM days, else from all of them. Each draw first resamples the observed days themselves
(a two-stage bootstrap): a fortnight of days estimates the daily rate with an error of its own, and
drawing straight from the observed days would leave that error out (docs/prediction.md, "Per period").
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal

DRAWS = 400
MIN_STRATUM = 2


def is_weekend(moment: datetime) -> bool:
    return moment.weekday() >= 5


def day_draws(days: Sequence[datetime], slots: Sequence[tuple[bool, Decimal]], *, draws: int = DRAWS,
              seed: str = "periods") -> list[list[tuple[int, Decimal]]]:
    """For each draw, the observed day (an index into `days`, given by their start) standing in for
    each slot, with the slot's fraction of a day. No observed day: no draws."""
    if not days:
        return []
    rng = random.Random(seed)
    weekend = [i for i, d in enumerate(days) if is_weekend(d)]
    weekday = [i for i, d in enumerate(days) if not is_weekend(d)]
    every = list(range(len(days)))
    stratified = len(weekend) >= MIN_STRATUM and len(weekday) >= MIN_STRATUM
    out = []
    for _ in range(draws):
        # first the days themselves are resampled (the observed days are a sample too: their mean is
        # uncertain), then the rest of the period is drawn from that resample
        pools = {kind: [pool[rng.randrange(len(pool))] for _ in pool]
                 for kind, pool in ((True, weekend), (False, weekday), (None, every)) if pool}
        row = []
        for slot_weekend, fraction in slots:
            pool = pools[slot_weekend] if stratified else pools[None]
            row.append((pool[rng.randrange(len(pool))], fraction))
        out.append(row)
    return out
