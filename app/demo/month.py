"""The demo's month: the bundled Mooncake trace laid out over November 2026 as events (`generate`).

How the trace becomes a month (seeded; docs/demo.md says the same, with the numbers):
- pool: the first N trace requests (default 4,000; --full all 12,031). The trace's second prompt
  block (`hash_ids[1]`; block 0 is a system prompt shared by every request) identifies a
  conversation.
- month: November 2026, [2026-11-01, 2026-12-01) UTC. Each hour weighs weekday factor (Mon-Thu 1.0,
  Fri 0.9, Sat 0.45, Sun 0.35) x daily curve 0.2 + 0.8 sin^2(pi (h - 3) / 24) (0.2 at 03:00, 1.0 at
  15:00 UTC) x the day's jitter uniform(0.85, 1.15).
- occurrences: the pool's conversations are dealt OCCURRENCES (3) times, each time in a fresh
  seeded shuffle; each occurrence starts at a time drawn from the hour weights (uniform within
  the hour) and keeps the trace's offsets between its turns; one that would end less than
  END_MARGIN before the month's end is moved back. The month holds exactly 3 x N requests,
  taken in time order for the rules below.
- time: a request takes input/8000 + output/40 seconds; the event time is `finished_at`.
- customer: each conversation (all its occurrences) belongs to one customer, drawn from 50
  customers with a Zipf(1.1) share (the top customer carries about a quarter).
- model: a customer uses `kimi-chat` (70% of customers) or `kimi-chat-lite`.
- deployment: `kimi-chat` -> shared `dep-kimi-a`, `kimi-chat-lite` -> shared `dep-kimi-b`, except
  `cust-001`, whose traffic runs on its dedicated `dep-cust-001`.
- cached input tokens: within a deployment, the longest run of leading prompt blocks already seen
  earlier counts as cached, 512 tokens a block, never the last prompt token (the unlimited-cache
  upper bound). Block 0 is the same content everywhere; other blocks are their occurrence's own
  (a recurring conversation is new content), so hits come from earlier turns, as in the trace.
- tasks: customers 2, 5, 8, ... (every third) are agent customers: their consecutive requests (month
  order) form tasks of 1-4 requests; 12% of tasks retry once and 4% twice (the request of a retry
  gets the next attempt number); outcome succeeded 85%, failed 10%, abandoned 5%, reported 2 s
  after the task's last request finished; each task also reports 1-5 `tool_calls`.
- status: 1% of requests `error` (no output), 0.5% `cancelled` (half the output).
- GPU time: replicas report one interval an hour starting on the hour (busy seconds and engine
  token counters are those of the requests finishing in the hour, shared by the replicas). The
  shared pools (dep-kimi-a, dep-kimi-b; one H100 a replica) are serverless: a GPU is up busy
  seconds / 0.6 in the hour (in as many replicas as that takes), none in an hour without traffic.
  The dedicated deployment dep-cust-001 (one L4, cust-001's own) runs on a schedule, Monday-Friday
  07:00-19:00 UTC, idle time included (what the GPU-hour book passes to its customer and the
  per-token book absorbs); outside it cust-001's traffic goes to the shared pools. (A fixed fleet
  sized for the trace's busiest hour, running all month, would cost ~400x the month's revenue: the
  demo's month has ~12k requests.)
- ids (deterministic per seed, unique): request `mooncake-<occurrence>-<trace index>`, task
  `task-<n>`, replica interval `<replica>/<interval start>`.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from metering.contract import encode_event, replica_event, request_event, task_event, usage_event
from serving.replay import TraceRequest, load_trace, trace_path

MONTH_START = datetime(2026, 11, 1, tzinfo=UTC)  # a Sunday
MONTH_END = datetime(2026, 12, 1, tzinfo=UTC)
BLOCK_TOKENS = 512
CUSTOMERS = 50
DEFAULT_REQUESTS = 4000  # the pool: the first N requests of the trace (about 20 minutes of it)
OCCURRENCES = 3  # each conversation of the pool occurs this many times in the month
WEEKDAY_WEIGHT = (1.0, 1.0, 1.0, 1.0, 0.9, 0.45, 0.35)  # Monday .. Sunday
DAY_JITTER = 0.15  # each day's weight x uniform(1 - DAY_JITTER, 1 + DAY_JITTER)
END_MARGIN = timedelta(minutes=1)  # every conversation (and its task outcome) ends this long before the month
INTERVAL = timedelta(hours=1)  # replica intervals
POOL_UTILISATION = "0.6"  # a shared pool's GPU is up busy seconds / this in an hour (serverless pool)
DEDICATED_CUSTOMER = "cust-001"
REPLICAS = {  # deployment -> (gpu type, dedicated customer); one GPU per replica
    "dep-kimi-a": ("H100", None),
    "dep-kimi-b": ("H100", None),
    "dep-cust-001": ("L4", DEDICATED_CUSTOMER),
}


def dedicated_hours(moment: datetime) -> bool:
    """The dedicated deployment's schedule: Monday-Friday, 07:00-19:00 UTC."""
    return moment.weekday() < 5 and 7 <= moment.hour < 19


@dataclass
class DemoTotals:
    """What the demo emitted: the reference the pipeline must reproduce."""

    requests: int = 0
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    tasks: int = 0
    replica_intervals: int = 0
    tool_calls: int = 0
    conversations: int = 0


def hour_weight(hour: int) -> float:
    """The daily curve (UTC hour): 0.2 at 03:00, rising to 1.0 at 15:00 and back."""
    return 0.2 + 0.8 * math.sin(math.pi * (hour - 3) / 24) ** 2


def month_hour_weights(rng: random.Random) -> list[float]:
    """The weight of each hour of the month: weekday x daily curve x the day's jitter."""
    weights = []
    day = MONTH_START
    while day < MONTH_END:
        level = WEEKDAY_WEIGHT[day.weekday()] * rng.uniform(1 - DAY_JITTER, 1 + DAY_JITTER)
        weights.extend(level * hour_weight(h) for h in range(24))
        day += timedelta(days=1)
    return weights


def zipf_customer(rng: random.Random) -> str:
    weights = [1 / (k ** 1.1) for k in range(1, CUSTOMERS + 1)]
    return f"cust-{rng.choices(range(1, CUSTOMERS + 1), weights)[0]:03d}"


def latency_s(input_tokens: int, output_tokens: int) -> float:
    return input_tokens / 8000 + output_tokens / 40


@dataclass(frozen=True)
class MonthRequest:
    """One request of the month: trace row `index` in occurrence `occurrence` of its conversation."""

    started: datetime
    occurrence: int
    index: int
    row: TraceRequest
    conversation: int


def lay_out_month(trace: list[TraceRequest], seed: int) -> tuple[list[MonthRequest], int]:
    """The month's requests in time order, and how many conversation occurrences they form.

    The pool's conversations (requests sharing `hash_ids[1]`), in order of first appearance, are
    dealt OCCURRENCES times, each time in a fresh seeded shuffle; each occurrence starts at a time
    drawn from the month's hour weights (uniform within the hour) and keeps the trace's offsets
    between its turns. One that would end less than END_MARGIN before the month's end (last turn
    + its latency + 2 s for a task outcome) is moved back to end there."""
    rng = random.Random(f"{seed}/month")
    conversations: dict[int, list[tuple[int, TraceRequest]]] = defaultdict(list)
    for index, row in enumerate(trace):
        conversations[conversation_of(row)].append((index, row))
    weights = month_hour_weights(rng)
    cumulative = list(itertools.accumulate(weights))
    out: list[MonthRequest] = []
    occurrence = 0
    for _ in range(OCCURRENCES):
        order = list(conversations)
        rng.shuffle(order)
        for conversation in order:
            turns = conversations[conversation]
            first_ms = turns[0][1].timestamp_ms
            hour = rng.choices(range(len(weights)), cum_weights=cumulative)[0]
            start = MONTH_START + timedelta(hours=hour, milliseconds=rng.randrange(3_600_000))
            length = max(timedelta(milliseconds=row.timestamp_ms - first_ms)
                         + timedelta(seconds=latency_s(row.input_length, row.output_length) + 2)
                         for _, row in turns)
            start = min(start, MONTH_END - END_MARGIN - length)
            for index, row in turns:
                out.append(MonthRequest(start + timedelta(milliseconds=row.timestamp_ms - first_ms), occurrence,
                                        index, row, conversation))
            occurrence += 1
    out.sort(key=lambda r: (r.started, r.occurrence, r.index))
    return out, occurrence


def conversation_of(row: TraceRequest) -> int:
    return row.hash_ids[1] if len(row.hash_ids) > 1 else -1


def generate(limit: int | None, seed: int) -> tuple[list[bytes], DemoTotals, tuple[datetime, datetime]]:
    """The month's events (shuffled), what they add up to, and the month [start, end)."""
    rng = random.Random(seed)
    trace = load_trace(trace_path("mooncake"), limit=limit)
    month, occurrences = lay_out_month(trace, seed)
    owner: dict[int, str] = {}
    for row in trace:  # conversations -> customers, in order of first appearance in the trace
        conversation = conversation_of(row)
        if conversation not in owner:
            owner[conversation] = zipf_customer(rng)
    model_of = {f"cust-{k:03d}": ("kimi-chat" if random.Random(seed * 1000 + k).random() < 0.7 else "kimi-chat-lite")
                for k in range(1, CUSTOMERS + 1)}
    model_of["cust-001"] = "kimi-chat"
    agents = {f"cust-{k:03d}" for k in range(2, CUSTOMERS + 1, 3)}
    seen_blocks: dict[str, set] = defaultdict(set)
    open_task: dict[str, dict] = {}
    events: list[bytes] = []
    totals = DemoTotals(conversations=occurrences)
    served = defaultdict(list)  # deployment -> [(finished_at, busy_s, prompt, generation)]
    task_counter = 0

    def close_task(customer: str, task: dict) -> None:
        roll = rng.random()
        outcome = "succeeded" if roll < 0.85 else "failed" if roll < 0.95 else "abandoned"
        finished = task["last_finished"] + timedelta(seconds=2)
        events.append(encode_event(task_event(
            source="//demo/agents", customer_id=customer, task_id=task["id"], outcome=outcome,
            finished_at=finished, event_id=f"{task['id']}/outcome",
        )))
        calls = rng.randint(1, 5)
        events.append(encode_event(usage_event(
            source="//demo/agents", customer_id=customer, meter="tool_calls", quantity=str(calls),
            task_id=task["id"], occurred_at=finished, event_id=f"{task['id']}/tools",
        )))
        totals.tasks += 1
        totals.tool_calls += calls

    for request in month:
        row = request.row
        customer = owner[request.conversation]
        model = model_of[customer]
        if customer == DEDICATED_CUSTOMER and dedicated_hours(request.started):
            deployment = "dep-cust-001"
        else:
            deployment = "dep-kimi-a" if model == "kimi-chat" else "dep-kimi-b"
        # the shared system prompt (block 0) is the same text in every conversation; every other
        # block is this occurrence's own (a conversation that recurs is new content)
        blocks = [row.hash_ids[0], *((request.occurrence, b) for b in row.hash_ids[1:])] if row.hash_ids else []
        cache = seen_blocks[deployment]
        leading = 0
        for block in blocks:
            if block not in cache:
                break
            leading += 1
        cache.update(blocks)
        input_tokens = row.input_length
        cached = min(leading * BLOCK_TOKENS, max(input_tokens - 1, 0)) // BLOCK_TOKENS * BLOCK_TOKENS
        output = row.output_length
        roll = rng.random()
        status = "error" if roll < 0.01 else "cancelled" if roll < 0.015 else "ok"
        if status == "error":
            output = 0
        elif status == "cancelled":
            output //= 2
        started = request.started
        busy = latency_s(input_tokens, output)
        finished = started + timedelta(seconds=round(busy, 3))
        task_id = attempt = None
        if customer in agents:
            task = open_task.get(customer)
            if task is None or task["left"] == 0:
                if task is not None:
                    close_task(customer, task)
                task_counter += 1
                retries = 2 if rng.random() < 0.04 else 1 if rng.random() < 0.125 else 0
                task = {"id": f"task-{task_counter:06d}", "left": rng.randint(1, 4) + retries, "attempt": 1,
                        "retries": retries}
                open_task[customer] = task
            if task["retries"] and task["left"] <= task["retries"]:
                task["attempt"] += 1
                task["retries"] -= 1
            task_id, attempt = task["id"], task["attempt"]
            task["left"] -= 1
            task["last_finished"] = max(finished, task.get("last_finished", finished))
        events.append(encode_event(request_event(
            source="//demo/gateway", request_id=f"mooncake-{request.occurrence:06d}-{request.index:05d}",
            customer_id=customer, api_key_id=f"key-{customer}", model=model, deployment_id=deployment,
            status=status, input_tokens=input_tokens, cached_input_tokens=cached, output_tokens=output,
            task_id=task_id, attempt=attempt or 1, started_at=started,
            first_token_at=started + timedelta(seconds=round(input_tokens / 8000, 3)), finished_at=finished,
            tags={"trace": "mooncake"},
        )))
        served[deployment].append((finished, busy, input_tokens - cached, output))
        totals.requests += 1
        totals.input_tokens += input_tokens
        totals.cached_input_tokens += cached
        totals.output_tokens += output
    for customer, task in open_task.items():
        close_task(customer, task)

    slots = int((MONTH_END - MONTH_START) / INTERVAL)
    hour_s = INTERVAL.total_seconds()
    for deployment, (gpu_type, dedicated) in REPLICAS.items():
        buckets = defaultdict(lambda: [0.0, 0, 0])
        for finished, busy, prompt, generation in served[deployment]:
            bucket = buckets[int((finished - MONTH_START) / INTERVAL)]
            bucket[0] += busy
            bucket[1] += prompt
            bucket[2] += generation
        for slot in range(slots):
            busy, prompt, generation = buckets.get(slot, [0.0, 0, 0])
            start = MONTH_START + slot * INTERVAL
            if dedicated:  # up for its whole schedule, idle or not
                if not dedicated_hours(start):
                    continue
                replicas, up_ms = 1, int(hour_s * 1000)
            else:  # up while serving (at the pool's utilisation), in as many replicas as that takes
                if busy <= 0:
                    continue
                up_ms = int(Decimal(f"{busy:.3f}") * 1000 / Decimal(POOL_UTILISATION))
                replicas = math.ceil(up_ms / (hour_s * 1000))
            for replica in range(replicas):
                replica_id = f"{deployment}-{replica}"
                length_ms = min(up_ms - replica * int(hour_s * 1000), int(hour_s * 1000))
                share_busy = min(Decimal(f"{busy:.3f}") / replicas, Decimal(length_ms) / 1000)
                events.append(encode_event(replica_event(
                    source=f"//demo/replica-agent/{replica_id}", replica_id=replica_id, deployment_id=deployment,
                    customer_id=dedicated, gpu_type=gpu_type, gpu_count=1, interval_start=start,
                    interval_end=start + timedelta(milliseconds=length_ms), busy_seconds=f"{share_busy:.3f}",
                    prompt_tokens=prompt // replicas, generation_tokens=generation // replicas,
                )))
                totals.replica_intervals += 1
    rng.shuffle(events)  # the bus does not keep global order; neither does the demo
    return events, totals, (MONTH_START, MONTH_END)
