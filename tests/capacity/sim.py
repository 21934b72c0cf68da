"""A synthetic replica for the capacity tests: Poisson arrivals into ONE replica that batches like
vLLM (continuous batching), simulated engine step by engine step; the request events and the
replica intervals are generated from that simulation exactly as the gateway and the replica agent
would report them.

The engine model (a step-level queue, not a latency formula):
- at most `slots` (16) sequences run at once; arrivals wait FIFO for a free slot;
- each engine step admits waiting requests into free slots and prefills them in that step, then
  every running sequence gets one token; step time = 15 ms + 1.5 ms x running sequences + new
  prompt tokens / 8000 tokens/s (prefill). A request's first token is the end of the step that
  prefilled it; it finishes at the end of the step that produced its last token;
- prompts are U(100, 300) tokens, outputs U(5, 35) tokens.
So time-to-first-token = wait for a slot + the rest of the step in flight + its prefill step; it
grows with load because steps get longer as the batch fills and, near saturation, requests queue
for slots. Tokens per busy second also grow with the batch (about 290 tokens/s at one sequence,
several times that with a full batch), which is the caveat of serving/capacity.py: capacity
measured at light load is conservative.

Replica intervals (10 s) carry the busy seconds (time inside engine steps) and the tokens of those
steps (split by overlap when a step straddles two intervals), as the replica agent reports them
from vLLM's counters.
"""

from __future__ import annotations

import collections
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from metering.contract import replica_event, request_event

DEPLOYMENT = "dep-sim"
REPLICA = "dep-sim-0"
CUSTOMER = "cust-sim"


@dataclass
class Request:
    arrival: float
    prompt: int
    output: int
    start: float = 0.0
    prefill_end: float = 0.0
    first_token: float = 0.0
    finish: float = 0.0


def arrivals(rate: Callable[[float], float], rate_max: float, until_s: float, rng: random.Random) -> list[float]:
    """A non-homogeneous Poisson process with intensity rate(t) <= rate_max on [0, until_s) (thinning)."""
    out, t = [], 0.0
    while True:
        t += rng.expovariate(rate_max)
        if t >= until_s:
            return out
        if rng.random() * rate_max < rate(t):
            out.append(t)


def serve(times: list[float], rng: random.Random, *, slots: int = 16, step_s: float = 0.015,
          step_per_seq_s: float = 0.0015, prefill_tps: float = 8000.0) -> tuple[list[Request], list[tuple]]:
    """Run the engine over the arrival times: (requests with their timings, engine steps as
    (start, end, prompt_tokens, generated_tokens))."""
    requests = [Request(a, rng.randint(100, 300), rng.randint(5, 35)) for a in times]
    left = {id(r): r.output for r in requests}
    steps: list[tuple] = []
    queue = collections.deque(requests)
    running: list[Request] = []
    t = 0.0
    while queue or running:
        if not running and queue[0].arrival > t:
            t = queue[0].arrival  # idle until the next arrival
        new = []
        while queue and queue[0].arrival <= t and len(running) + len(new) < slots:
            new.append(queue.popleft())
        prompt = sum(r.prompt for r in new)
        batch = running + new
        end = t + step_s + step_per_seq_s * len(batch) + prompt / prefill_tps
        steps.append((t, end, prompt, len(batch)))
        for r in new:
            r.start, r.prefill_end, r.first_token = t, end, end
        still = []
        for r in batch:
            left[id(r)] -= 1
            if left[id(r)] == 0:
                r.finish = end
            else:
                still.append(r)
        running = still
        t = end
    return requests, steps


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def intervals(steps: list[tuple], until_s: float, interval_s: float = 10.0) -> list[tuple[float, float, float, int, int]]:
    """(start, end, busy_s, prompt_tokens, generation_tokens) per interval of [0, until_s); a step's
    tokens are split by overlap, then made integers by cumulative rounding (they add up exactly)."""
    n = math.ceil(until_s / interval_s)
    busy = [0.0] * n
    prompt = [0.0] * n
    gen = [0.0] * n
    for s0, s1, p, g in steps:
        for i in range(int(s0 // interval_s), min(n - 1, int(s1 // interval_s)) + 1):
            share = _overlap(s0, s1, i * interval_s, (i + 1) * interval_s)
            busy[i] += share
            prompt[i] += p * share / (s1 - s0)
            gen[i] += g * share / (s1 - s0)
    out, cum_p, cum_g, done_p, done_g = [], 0.0, 0.0, 0, 0
    for i in range(n):
        cum_p += prompt[i]
        cum_g += gen[i]
        p, g = round(cum_p) - done_p, round(cum_g) - done_g
        done_p, done_g = done_p + p, done_g + g
        out.append((i * interval_s, (i + 1) * interval_s, min(busy[i], interval_s), p, g))
    return out


def events(requests: list[Request], replica_intervals, base: datetime, *, deployment: str = DEPLOYMENT,
           replica: str = REPLICA) -> list[dict]:
    """The request events (the gateway's builder) and replica intervals (the agent's builder)."""
    at = lambda s: base + timedelta(microseconds=round(s * 1_000_000))  # noqa: E731
    out = [
        request_event(source="//test/sim-gateway", request_id=f"{deployment}-{i}", customer_id=CUSTOMER, model="sim-model",
                      deployment_id=deployment, replica_id=replica, status="ok", input_tokens=r.prompt,
                      cached_input_tokens=0, output_tokens=r.output, started_at=at(r.arrival),
                      first_token_at=at(r.first_token), finished_at=at(r.finish))
        for i, r in enumerate(requests)
    ]
    out += [
        replica_event(source="//test/sim-agent", replica_id=replica, deployment_id=deployment, customer_id=None,
                      gpu_type="sim", gpu_count=1, interval_start=at(a), interval_end=at(b),
                      busy_seconds=f"{busy:.6f}", prompt_tokens=p, generation_tokens=g)
        for a, b, busy, p, g in replica_intervals
    ]
    return out


def p90(values: list[float]) -> float:
    """The 90th percentile with linear interpolation (PostgreSQL's percentile_cont(0.9))."""
    s = sorted(values)
    k = 0.9 * (len(s) - 1)
    lo = math.floor(k)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (k - lo)
