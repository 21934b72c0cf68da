"""The capacity signal's pure core (serving/capacity.py): Holt's method on hand-checked series, the
replica arithmetic, the hysteresis, and the lead it gives on the synthetic replica (tests/capacity/sim.py)."""

from __future__ import annotations

import ast
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from serving import capacity
from serving.capacity import Holt, Minute, Policy, hold, holt, holt_path, plan, replicas_needed
from tests.capacity import sim

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def minutes(tokens_per_s: list[float]) -> list[Minute]:
    """Minutes whose demand is `tokens_per_s` (all prompt tokens, one request per 100 tokens)."""
    return [Minute(T0 + timedelta(minutes=i), round(t * 60 / 100), round(t * 60), 0) for i, t in enumerate(tokens_per_s)]


# --- Holt ----------------------------------------------------------------------------------------


def test_holt_on_hand_checked_series():
    # alpha = beta = 0.5 on 10, 14, 12:
    #   l0 = 10, b0 = 14 - 10 = 4
    #   l1 = .5*14 + .5*(10 + 4) = 14,   b1 = .5*(14 - 10) + .5*4 = 4
    #   l2 = .5*12 + .5*(14 + 4) = 15,   b2 = .5*(15 - 14) + .5*4 = 2.5      forecast(2) = 15 + 2*2.5 = 20
    assert holt_path([10, 14, 12], alpha=0.5, beta=0.5) == [Holt(10, 4), Holt(14, 4), Holt(15, 2.5)]
    assert holt([10, 14, 12], alpha=0.5, beta=0.5).forecast(2) == 20
    # the defaults (alpha 0.5, beta 0.3) on 100, 100, 130:
    #   l0 = 100, b0 = 0;  l1 = 100, b1 = 0
    #   l2 = .5*130 + .5*100 = 115,  b2 = .3*15 + .7*0 = 4.5                  forecast(3) = 115 + 13.5 = 128.5
    state = holt([100, 100, 130])
    assert (state.level, state.trend) == pytest.approx((115, 4.5))
    assert state.forecast(3) == pytest.approx(128.5)
    # a straight line is followed exactly, whatever alpha and beta
    assert holt([10, 12, 14, 16, 18], alpha=0.2, beta=0.9).forecast(3) == pytest.approx(24)
    # a falling forecast stops at zero; one point has no trend; none has nothing
    assert holt([100, 50, 0]).forecast(10) == 0
    assert holt([7]) == Holt(7, 0) and holt([]) == Holt(0, 0)
    with pytest.raises(ValueError):
        holt([1, 2], alpha=0)


# --- the recommendation ----------------------------------------------------------------------------


def test_replicas_needed():
    # 1000 tokens/s on replicas of 500 tokens/s at 70%: 1000 / 350 = 2.86 -> 3
    assert replicas_needed(1000, 500, 0.7) == 3
    assert replicas_needed(700, 500, 0.7) == 2  # exactly 2.0 (within float noise) stays 2
    assert replicas_needed(700.001, 500, 0.7) == 3
    assert replicas_needed(0, 500, 0.7) == 1  # the floor
    assert replicas_needed(0, 500, 0.7, min_replicas=0) == 0
    with pytest.raises(ValueError):
        replicas_needed(10, 0, 0.7)


def test_the_plan_sizes_on_the_larger_of_level_and_forecast():
    # steady 350 tokens/s on 500 tokens/s replicas at 0.7 -> exactly 1 replica; growing -> ahead of it
    steady = plan(minutes([350] * 10), 500, Policy()).last
    assert steady.needed_replicas == 1 and steady.recommended_replicas == 1
    growing = plan(minutes([100, 150, 200, 250, 300, 350]), 500, Policy()).last
    # the trend is +50 tokens/s per minute: the 3-minute forecast (~500) needs 2 replicas already
    assert growing.forecast_tokens_per_s > 450 and growing.recommended_replicas == 2
    falling = plan(minutes([700, 600, 500, 400, 300]), 500, Policy()).last
    assert falling.forecast_tokens_per_s < falling.level_tokens_per_s  # sized on the level, not the forecast
    assert plan(minutes([350] * 3), None, Policy()).last.recommended_replicas is None  # no capacity, no answer


def test_hysteresis_up_at_once_down_after_n_minutes_with_a_margin():
    policy = Policy(target_utilisation=0.5, down_after_min=3, down_margin=0.2)  # 100 tokens/s replicas: 50 each
    # 140 needs 3; 90 needs 2 (and 2 at the stricter 0.4 target too: 90/40 = 2.25 -> 3, so it holds 3)
    assert hold([140, 90, 90, 90, 90, 90], 100, policy) == [3, 3, 3, 3, 3, 3]
    # 70 needs 2 at 0.5 and 2 at 0.4 (70/40 = 1.75): after 3 minutes down to 2
    assert hold([140, 70, 70, 70, 70], 100, policy) == [3, 3, 3, 2, 2]
    # a minute back above the strict line restarts the count
    assert hold([140, 70, 70, 100, 70, 70, 70], 100, policy) == [3, 3, 3, 3, 3, 3, 2]
    # up is immediate
    assert hold([40, 40, 160], 100, policy) == [1, 1, 4]


def test_a_flat_noisy_load_does_not_flap_over_an_hour():
    """60 minutes of +-15% noise around a replica boundary: the unheld count flips all the time, the
    recommendation moves once (up) and holds."""
    rng = random.Random(3)
    capacity_per_replica, policy = 1000.0, Policy()
    demand = [700 * (1 + rng.uniform(-0.15, 0.15)) for _ in range(60)]  # 700 = exactly 1 replica at 0.7
    steps = plan(minutes(demand), capacity_per_replica, policy).steps
    needed = [s.needed_replicas for s in steps]
    held = [s.recommended_replicas for s in steps]
    flips = sum(a != b for a, b in zip(needed, needed[1:], strict=False))
    changes = sum(a != b for a, b in zip(held, held[1:], strict=False))
    assert flips >= 10, needed  # the noise does cross the boundary
    assert changes <= 1 and held == sorted(held), held  # at most one step, and never down
    assert set(held[10:]) == {held[-1]}  # after ten minutes it holds still


def test_doubling_demand_raises_the_recommendation():
    demand = [100.0] * 10 + [100.0 * 2 ** k for k in range(1, 7)]  # flat, then doubling every minute
    steps = plan(minutes(demand), 500, Policy()).steps
    held = [s.recommended_replicas for s in steps]
    assert held[:10] == [1] * 10
    assert held == sorted(held) and held[-1] >= replicas_needed(6400, 500, 0.7)  # 19
    # and the forecast gets there earlier than the level alone would
    level_only = [s.recommended_replicas for s in plan(minutes(demand), 500, Policy(horizon_min=0)).steps]
    first = lambda xs: next(i for i, x in enumerate(xs) if x > 1)  # noqa: E731
    assert first(held) < first(level_only)


def test_the_report_without_capacity_says_so():
    r = capacity.report("d", T0 + timedelta(minutes=3), minutes([100, 100, 100]), [], [], Policy())
    assert r["recommended_replicas"] is None and r["capacity"]["tokens_per_busy_s"] is None and "note" in r
    assert r["demand"]["tokens_per_s"] == 100 and r["as_of"] == "2026-01-01T00:03:00Z"


def test_the_core_is_pure():
    tree = ast.parse(Path(capacity.__file__).read_text())
    imported = {n.names[0].name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "math", "collections", "dataclasses", "datetime"}, imported


# --- the lead on the synthetic replica, without the database (8 seeds) ----------------------------


def _run(seed: int, horizon_min: float) -> tuple[int | None, int | None, float]:
    """(minute whose end first recommends > 1 replica, minute whose end first shows p90 TTFT >= 2x the
    warm-up's, warm-up p90) for 15 minutes at 0.3 requests/s then doubling every minute."""
    warm, lam0 = 15 * 60, 0.3
    rate = lambda t: lam0 if t < warm else lam0 * 2 ** ((t - warm) / 60)  # noqa: E731
    until = warm + 7 * 60
    rng = random.Random(seed)
    requests, steps = sim.serve(sim.arrivals(rate, rate(until), until, rng), rng)
    intervals = sim.intervals(steps, max(r.finish for r in requests) + 10)
    base = sim.p90([r.first_token - r.arrival for r in requests if r.finish < warm])
    per_minute: dict[int, list[sim.Request]] = {}
    for r in requests:
        per_minute.setdefault(int(r.finish // 60), []).append(r)
    rise = doubled = None
    for k in range(15, 24):
        mins = [Minute(T0 + timedelta(minutes=m), len(rs := per_minute.get(m, [])), sum(r.prompt for r in rs),
                       sum(r.output for r in rs), sim.p90([r.first_token - r.arrival for r in rs]) if rs else None)
                for m in range(k + 1)]
        cap = capacity.capacity_per_replica([{"busy_s": b, "prompt_tokens": p, "generation_tokens": g}
                                             for _, end, b, p, g in intervals if end <= (k + 1) * 60])
        last = plan(mins, cap, Policy(horizon_min=horizon_min)).last
        if rise is None and last.recommended_replicas > 1:
            rise = k + 1
        if doubled is None and last.ttft_p90_s is not None and last.ttft_p90_s >= 2 * base:
            doubled = k + 1
    return rise, doubled, base


def test_on_the_synthetic_replica_the_signal_leads_ttft(capsys):
    leads, leads_level_only = [], []
    for seed in range(1, 9):
        rise, doubled, _ = _run(seed, 3.0)
        rise0, doubled0, _ = _run(seed, 0.0)
        assert rise is not None and doubled is not None and rise < doubled, (seed, rise, doubled)
        leads.append(doubled - rise)
        leads_level_only.append(doubled0 - rise0)
    with capsys.disabled():
        print(f"\ncapacity lead over p90 TTFT doubling (minutes, 8 seeds): forecast {leads}, "
              f"level only {leads_level_only}")
    assert min(leads) >= 1 and sum(leads) > sum(leads_level_only)
