"""Builders of observations for the pure prediction tests."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from prediction.request import RequestObservation

T0 = datetime(2026, 11, 2, tzinfo=UTC)


def obs(i: int, *, customer: str = "c1", model: str = "m1", output: int = 100, prompt: int = 500, cached: int = 0,
        status: str = "ok", started: datetime | None = None, seconds: float = 10.0, prefix_seen: bool | None = None,
        task_id: str | None = None, attempt: int = 1, source: str = "//test/gw") -> RequestObservation:
    started = started or T0 + timedelta(minutes=i)
    return RequestObservation(source, f"r-{i}", customer, model, status, prompt, cached, output, started,
                              started + timedelta(seconds=seconds), task_id, attempt, None, prefix_seen)


def random_history(seed: int, n: int) -> list[RequestObservation]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = rng.choice([200, 900, 1500, 3000, 9000, 70000])
        cached = rng.randrange(prompt)
        out.append(obs(i, customer=rng.choice(["c1", "c2", "c3"]), model=rng.choice(["m1", "m2"]),
                       output=int(rng.lognormvariate(5, 1)), prompt=prompt, cached=cached,
                       status=rng.choices(["ok", "error", "cancelled", "rejected"], [90, 4, 3, 3])[0],
                       prefix_seen=rng.choice([None, True, False])))
    return out
