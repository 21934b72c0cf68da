"""An early scale-up signal from metered demand: the pure core (no I/O; numbers in, numbers out).

Per deployment, per UTC minute, from metered data only (request events and replica intervals):

- demand: arrivals/s, prompt tokens/s and output tokens/s of the minute (requests by event time,
  i.e. when they finished; rejected requests excluded), and a short-horizon forecast of each by
  Holt's linear exponential smoothing (`holt`, below);
- capacity: the tokens/s a replica sustains while busy, from its own intervals over a trailing
  window: sum(prompt + generation tokens) / sum(busy_seconds), pooled over the deployment's
  replicas (so a busy-time-weighted mean of the replicas' rates);
- the recommended replica count for a target utilisation U (INFERMETER_TARGET_UTILISATION, 0.7):

      need(D) = max(min_replicas, ceil(D / (capacity_per_replica x U)))
      D       = max(level, forecast at the horizon) of total tokens/s (prompt + output)

  The max() makes the signal scale ahead of growth but never ahead of a decline.
- hysteresis (`hold`): up at once; down only when, for `down_after_min` consecutive minutes
  (INFERMETER_CAPACITY_SCALE_DOWN_MIN, 5), even a 20% stricter target (U x 0.8) would need fewer
  replicas than recommended now; it then steps down to the largest of those minutes' needs (at the
  stricter target). A flat load whose noise crosses a replica boundary therefore moves the
  recommendation once (up) and then holds it; a real fall in demand brings it down after N minutes.
  The margin is wider than a minute's noise: on the synthetic replica of tests/capacity (60 minutes
  of flat Poisson load at 5 rates x 3 seeds) the unheld count changed up to 22 times an hour and the
  held one at most twice (one excursion), 0.1 still let it flap up to 7 times.

Holt's linear method (level + trend), step = one minute, for a series y_0 .. y_t:

      level_0 = y_0, trend_0 = y_1 - y_0 (0 for a single point)
      level_t = alpha y_t + (1 - alpha) (level_{t-1} + trend_{t-1})
      trend_t = beta (level_t - level_{t-1}) + (1 - beta) trend_{t-1}
      forecast(h) = max(0, level_t + h trend_t)

alpha = 0.5 (the level follows half of each minute's surprise: a minute of Poisson noise moves it
by half its size, a step change is 75% absorbed after two minutes) and beta = 0.3 (the trend needs
about three minutes of consistent growth to form, so one noisy minute does not look like a ramp).
Holt is linear in the series, so the forecast of prompt + output tokens is the sum of their
forecasts. The horizon (INFERMETER_CAPACITY_HORIZON_MIN, 3 minutes) should cover the time a new
replica takes to start serving.

Caveat on capacity: it is measured at the batch sizes the replica actually ran. vLLM batches, so a
replica serves more tokens per busy second under heavier load: a capacity measured at light load
underestimates what the replica can do and the recommendation errs on the side of more replicas.
Prompt tokens include cached ones (the engine's counter does), so the capacity also depends on the
traffic's cache-hit mix.

`serving.capacity_service` reads metering (metering.ops_reads) and feeds these functions; the HTTP
endpoint, the CLI and the gateway's Prometheus gauges all show its `report`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

ALPHA = 0.5
BETA = 0.3
MINUTE = timedelta(minutes=1)
MIN_BUSY_S = 10.0  # less busy time than this over the capacity window: capacity is not measured


# --- Holt's linear exponential smoothing --------------------------------------------------------


@dataclass(frozen=True)
class Holt:
    """The state after the last point: level and trend (per step)."""

    level: float
    trend: float

    def forecast(self, steps: float) -> float:
        return max(0.0, self.level + steps * self.trend)


def holt_path(series: Sequence[float], alpha: float = ALPHA, beta: float = BETA) -> list[Holt]:
    """Holt's state after each point of `series` (see the module docstring for the recurrence)."""
    if not 0 < alpha <= 1 or not 0 < beta <= 1:
        raise ValueError("alpha and beta must be in (0, 1]")
    if not series:
        return []
    level = float(series[0])
    trend = float(series[1]) - level if len(series) > 1 else 0.0
    path = [Holt(level, trend)]
    for y in series[1:]:
        previous = level
        level = alpha * float(y) + (1 - alpha) * (level + trend)
        trend = beta * (level - previous) + (1 - beta) * trend
        path.append(Holt(level, trend))
    return path


def holt(series: Sequence[float], alpha: float = ALPHA, beta: float = BETA) -> Holt:
    """Holt's state after the whole series (level 0, trend 0 for an empty one)."""
    path = holt_path(series, alpha, beta)
    return path[-1] if path else Holt(0.0, 0.0)


# --- the recommendation -------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    target_utilisation: float = 0.7
    horizon_min: float = 3.0
    down_after_min: int = 5
    down_margin: float = 0.2  # scale down only if a target (1 - margin) x U would need fewer replicas too
    min_replicas: int = 1
    alpha: float = ALPHA
    beta: float = BETA

    def __post_init__(self) -> None:
        if not 0 < self.target_utilisation <= 1:
            raise ValueError("target utilisation must be in (0, 1]")
        if self.horizon_min < 0 or self.down_after_min < 1 or not 0 <= self.down_margin < 1 or self.min_replicas < 0:
            raise ValueError("horizon >= 0, down_after_min >= 1, 0 <= down_margin < 1, min_replicas >= 0")


def replicas_needed(demand_tokens_per_s: float, capacity_per_replica: float, target_utilisation: float,
                    min_replicas: int = 1) -> int:
    """ceil(demand / (capacity per replica x target)), at least `min_replicas`."""
    if capacity_per_replica <= 0:
        raise ValueError("capacity per replica must be positive")
    ratio = max(0.0, demand_tokens_per_s) / (capacity_per_replica * target_utilisation)
    return max(min_replicas, math.ceil(ratio - 1e-9))  # 1e-9: 2.0000000001 from float noise is 2


def hold(demand: Sequence[float], capacity_per_replica: float, policy: Policy) -> list[int]:
    """The recommendation after each minute of sizing demand (tokens/s), with the hysteresis rule of
    the module docstring: up at once; down after `down_after_min` consecutive minutes in which even a
    target of (1 - down_margin) x U needs fewer replicas, to the largest such need of those minutes."""
    strict = policy.target_utilisation * (1 - policy.down_margin)
    out: list[int] = []
    current: int | None = None
    lower: list[int] = []  # the strict needs of the current run of "could be fewer" minutes
    for d in demand:
        need = replicas_needed(d, capacity_per_replica, policy.target_utilisation, policy.min_replicas)
        strict_need = replicas_needed(d, capacity_per_replica, strict, policy.min_replicas)
        if current is None or need > current:
            current, lower = need, []
        elif strict_need < current:
            lower.append(strict_need)
            if len(lower) >= policy.down_after_min:
                current, lower = max(lower), []
        else:
            lower = []
        out.append(current)
    return out


# --- a deployment's minutes -> its plan ---------------------------------------------------------


@dataclass(frozen=True)
class Minute:
    """Metered demand of one deployment in one UTC minute [start, start + 1 min)."""

    start: datetime
    requests: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft_p90_s: float | None = None


def fill_minutes(rows: Sequence[Minute], start: datetime, end: datetime) -> list[Minute]:
    """One Minute per minute of [start, end) (both on whole minutes); minutes without rows are zeros."""
    by_start = {m.start: m for m in rows}
    out, t = [], start
    while t < end:
        out.append(by_start.get(t) or Minute(t))
        t += MINUTE
    return out


@dataclass(frozen=True)
class Step:
    """One minute of the plan: what was measured, forecast and recommended at its end."""

    minute: datetime
    arrivals_per_s: float
    prompt_tokens_per_s: float
    output_tokens_per_s: float
    tokens_per_s: float
    level_tokens_per_s: float
    trend_tokens_per_s_per_min: float
    forecast_tokens_per_s: float
    needed_replicas: int | None  # without hysteresis
    recommended_replicas: int | None
    ttft_p90_s: float | None


@dataclass(frozen=True)
class Plan:
    steps: list[Step]
    capacity_per_replica: float | None
    forecast: dict[str, float] = field(default_factory=dict)  # arrivals/prompt/output/tokens per s at the horizon
    level: dict[str, float] = field(default_factory=dict)

    @property
    def last(self) -> Step | None:
        return self.steps[-1] if self.steps else None


def plan(minutes: Sequence[Minute], capacity_per_replica: float | None, policy: Policy) -> Plan:
    """Holt over each demand series, then the held recommendation, minute by minute. `minutes` are
    consecutive (fill_minutes). Without a measured capacity the recommendation is None."""
    per_s = {
        "arrivals_per_s": [m.requests / 60 for m in minutes],
        "prompt_tokens_per_s": [m.prompt_tokens / 60 for m in minutes],
        "output_tokens_per_s": [m.output_tokens / 60 for m in minutes],
    }
    per_s["tokens_per_s"] = [p + o for p, o in zip(per_s["prompt_tokens_per_s"], per_s["output_tokens_per_s"], strict=True)]
    paths = {name: holt_path(series, policy.alpha, policy.beta) for name, series in per_s.items()}
    tokens = paths["tokens_per_s"]
    sizing = [max(h.level, h.forecast(policy.horizon_min)) for h in tokens]
    if capacity_per_replica:
        needed = [replicas_needed(d, capacity_per_replica, policy.target_utilisation, policy.min_replicas)
                  for d in sizing]
        held: list[int | None] = list(hold(sizing, capacity_per_replica, policy))
    else:
        needed = held = [None] * len(minutes)
    steps = [
        Step(minute=m.start, arrivals_per_s=per_s["arrivals_per_s"][i],
             prompt_tokens_per_s=per_s["prompt_tokens_per_s"][i], output_tokens_per_s=per_s["output_tokens_per_s"][i],
             tokens_per_s=per_s["tokens_per_s"][i], level_tokens_per_s=tokens[i].level,
             trend_tokens_per_s_per_min=tokens[i].trend, forecast_tokens_per_s=tokens[i].forecast(policy.horizon_min),
             needed_replicas=needed[i], recommended_replicas=held[i], ttft_p90_s=m.ttft_p90_s)
        for i, m in enumerate(minutes)
    ]
    forecast = {name: path[-1].forecast(policy.horizon_min) for name, path in paths.items() if path}
    level = {name: path[-1].level for name, path in paths.items() if path}
    return Plan(steps, capacity_per_replica, forecast, level)


# --- capacity and utilisation from replica intervals --------------------------------------------


def capacity_per_replica(replicas: Sequence[dict], min_busy_s: float = MIN_BUSY_S) -> float | None:
    """Pooled tokens per busy second over the given replica sums (metering.ops_reads.replica_interval_sums
    rows): sum(prompt + generation tokens) / sum(busy_s); None below `min_busy_s` of busy time."""
    busy = sum(r["busy_s"] for r in replicas)
    tokens = sum(r["prompt_tokens"] + r["generation_tokens"] for r in replicas)
    if busy < min_busy_s or tokens <= 0:
        return None
    return tokens / busy


def utilisation(replicas: Sequence[dict]) -> float | None:
    """Busy share of the replicas' interval time: sum(busy_s) / sum(interval_s)."""
    total = sum(r["interval_s"] for r in replicas)
    return sum(r["busy_s"] for r in replicas) / total if total > 0 else None


def report(deployment_id: str, as_of: datetime, minutes: Sequence[Minute], capacity_rows: Sequence[dict],
           recent_rows: Sequence[dict], policy: Policy, *, history: bool = False) -> dict:
    """The capacity report of one deployment as of `as_of` (the end of its last complete minute):
    `minutes` cover the trailing history (consecutive, oldest first), `capacity_rows` the replica sums
    over the capacity window, `recent_rows` those over the last few minutes (live replicas and
    measured utilisation). JSON-ready (floats rounded to 3 decimals, times as RFC 3339)."""
    capacity = capacity_per_replica(capacity_rows)
    result = plan(minutes, capacity, policy)
    last = result.last
    live = [r for r in recent_rows if r["intervals"] > 0]
    per_replica = {r["replica_id"]: r for r in capacity_rows}
    demand_utilisation = None
    if last is not None and capacity and live:
        demand_utilisation = last.level_tokens_per_s / (capacity * len(live))
    out = {
        "deployment_id": deployment_id,
        "as_of": _rfc3339(as_of),
        "target_utilisation": policy.target_utilisation,
        "horizon_min": policy.horizon_min,
        "demand": _rounded({
            "minute": _rfc3339(last.minute) if last else None,
            "arrivals_per_s": last.arrivals_per_s if last else 0.0,
            "prompt_tokens_per_s": last.prompt_tokens_per_s if last else 0.0,
            "output_tokens_per_s": last.output_tokens_per_s if last else 0.0,
            "tokens_per_s": last.tokens_per_s if last else 0.0,
            "ttft_p90_s": last.ttft_p90_s if last else None,
        }),
        "level": _rounded(result.level),
        "trend_per_min": _rounded({"tokens_per_s": last.trend_tokens_per_s_per_min if last else 0.0}),
        "forecast": _rounded(result.forecast),
        "capacity": _rounded({
            "tokens_per_busy_s": capacity,
            "busy_s": sum(r["busy_s"] for r in capacity_rows),
            "replicas": [
                _rounded({"replica_id": rid, "busy_s": r["busy_s"], "tokens_per_busy_s":
                          (r["prompt_tokens"] + r["generation_tokens"]) / r["busy_s"] if r["busy_s"] > 0 else None})
                for rid, r in sorted(per_replica.items())
            ],
        }),
        "replicas": len(live),
        "utilisation": _rounded({"measured": utilisation(live), "demand": demand_utilisation}),
        "needed_replicas": last.needed_replicas if last else None,
        "recommended_replicas": last.recommended_replicas if last else None,
        "rule": (f"ceil(max(level, forecast {policy.horizon_min:g} min) tokens/s / (capacity x {policy.target_utilisation:g})); "
                 f"down only after {policy.down_after_min} min below a {1 - policy.down_margin:g} x target"),
    }
    if capacity is None:
        out["note"] = "no replica busy time measured in the capacity window: no recommendation"
    if history:
        out["history"] = [
            _rounded({"minute": _rfc3339(s.minute), "arrivals_per_s": s.arrivals_per_s, "tokens_per_s": s.tokens_per_s,
                      "level_tokens_per_s": s.level_tokens_per_s, "forecast_tokens_per_s": s.forecast_tokens_per_s,
                      "needed_replicas": s.needed_replicas, "recommended_replicas": s.recommended_replicas,
                      "ttft_p90_s": s.ttft_p90_s})
            for s in result.steps
        ]
    return out


def _rounded(values: dict) -> dict:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in values.items()}


def _rfc3339(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")
