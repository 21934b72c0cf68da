"""`infermeter demo`: a month of usage built from the bundled Mooncake trace, through the real stack.

Events -> Kafka -> metering consumer -> Postgres, then a usage summary, the reconcile check
(events emitted == raw events == rollups), and the pricing comparison of the example books over
the month. run_demo's steps: generate -> _meter (+ ANALYZE) -> _usage_and_reconcile -> _pricing
-> summary.json; later steps take the same stack, month window and output folder.

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

import contextlib
import itertools
import json
import math
import random
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import psycopg
from rich.console import Console
from rich.table import Table

from infermeter.settings import Settings
from infermeter.stack.local import open_stack
from infermeter.stack.ports import check_listen_port
from infermeter.stack.postgres import to_libpq_url
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


def run_demo(settings: Settings, *, full: bool, limit: int | None, seed: int, out_dir: Path,
             console: Console, pricing: bool = True, serve: bool = False, host: str | None = None,
             port: int | None = None) -> dict:
    """The demo's steps, in order, on one stack: build the month's events, meter them, report usage
    and reconcile, compare the price books, bill the month; each step adds its part to `summary`
    (summary.json). Later steps take the same stack, the month [start, end) and out_dir. It ends with
    the dashboards' addresses, a demo customer's API key and the admin sign-in; `serve` keeps the API
    and the pages up on the same stack until Ctrl-C or SIGTERM (the caller handles the signals)."""
    bind = host or settings.api_host
    if serve:  # before the work: no development credentials off loopback, and a port free to serve on
        settings.check_listen_address(bind)
        check_listen_port(bind, port or settings.api_port, "--port" if port else "INFERMETER_API_PORT")
    limit = None if full else (limit or DEFAULT_REQUESTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    with console.status("reading the Mooncake trace and laying out the month…"):
        events, totals, (start, end) = generate(limit, seed)
    events_file = out_dir / "events.jsonl"
    events_file.write_bytes(b"\n".join(events) + b"\n")
    console.print(f"[bold]demo[/]: {start:%B %Y}: {totals.requests:,} requests in {totals.conversations:,} "
                  f"conversations, {totals.tasks:,} tasks, {totals.replica_intervals:,} replica intervals "
                  f"-> {len(events):,} events ({events_file})")

    with open_stack(settings) as stack, _metering(settings, stack) as metering_runs:
        counts = _meter(settings, stack, events, console, metering_runs)
        summary = {"window": [start.isoformat(), end.isoformat()], "counts": counts.as_dict()}
        agree = _usage_and_reconcile(stack.database_url, totals, start, end, console, summary)
        if pricing:
            summary["pricing"] = _pricing(stack.database_url, start, end, out_dir, console)
            summary["billing"] = _billing(stack.database_url, start, out_dir, console)
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        console.print(f"reports in {out_dir}")
        if not agree:
            raise RuntimeError("demo: metered usage does not match what was emitted (see above)")
        run_settings = stack.settings_for(settings)
        base = f"http://{bind}:{port or settings.api_port}"
        summary["dashboards"] = _dashboard_links(run_settings, stack.database_url, base, start, end, out_dir,
                                                 console, serve=serve)
        if serve:
            from app.api import create_app
            from infermeter.stack.signals import serve_http
            from metering.publisher import ack_mode

            run_settings = run_settings.model_copy(update={"ack": ack_mode(settings)})
            # the month was billed as of BILLING_AS_OF: the pages show billing figures as of then
            app = create_app(run_settings, stack.database_url, stack.kafka_bootstrap,
                             billing_clock=demo_billing_clock if pricing else None)
            serve_http(app, host=bind, port=port or settings.api_port, log_level="warning")
        return summary


DEMO_CUSTOMER = "cust-003"  # the customer with prepaid credit: its page shows spend against the balance


def demo_key(settings: Settings, database_url: str, out_dir: Path) -> str:
    """An API key of DEMO_CUSTOMER for the dashboards: the one an earlier run on this home kept in
    out_dir/demo-key.json (mode 0600) while it is still active, else a new one."""
    from infermeter.db import get_engine
    from serving.keys import KeyStore

    store = KeyStore(get_engine(database_url), settings=settings)
    return store.kept(DEMO_CUSTOMER, out_dir / "demo-key.json", project_id="demo")[1]


def _dashboard_links(settings: Settings, database_url: str, base: str, start: datetime, end: datetime,
                     out_dir: Path, console: Console, *, serve: bool) -> dict:
    """Print where the dashboards are, with a demo customer's key and the admin sign-in."""
    from urllib.parse import urlencode

    key = demo_key(settings, database_url, out_dir)
    month = urlencode({"from": f"{start:%Y-%m-%dT%H:%M:%SZ}", "to": f"{end:%Y-%m-%dT%H:%M:%SZ}"}, safe=":")
    period = f"{start:%Y-%m}"
    links = {
        "signin": f"{base}/signin", "dashboard": f"{base}/dashboard?{month}&period={period}",
        "admin_signin": f"{base}/admin/signin", "finance": f"{base}/admin/finance?period={period}",
        "pricing": f"{base}/admin/pricing?{month}", "ops": f"{base}/admin/ops?{month}",
    }
    if settings.admin_token_configured:
        admin = ["  with your INFERMETER_ADMIN_TOKEN"]
    else:  # a development token generated on this home (served on loopback only)
        admin = [f"  with the admin token (development, kept in {settings.credentials_file.resolve()}):",
                 f"  {settings.admin_token}"]
    where = ("serving until Ctrl-C" if serve else
             "`infermeter demo --serve` or `infermeter up` on this home serves them")
    lines = [
        f"[bold]dashboards[/] ({where}):",
        f"customer {DEMO_CUSTOMER}: sign in at {links['signin']} with its API key:",
        f"  {key}",
        "  then its month, invoices and spend:",
        f"  {links['dashboard']}",
        f"admin: sign in at {links['admin_signin']}",
        *admin,
        f"  finance    {links['finance']}",
        f"  pricing    {links['pricing']}",
        f"  operations {links['ops']}",
    ]
    for line in lines:  # long addresses stay whole (a terminal wraps them; copying still works)
        console.print(line, soft_wrap=True, highlight=False)
    return {**links, "customer_id": DEMO_CUSTOMER}


@contextlib.contextmanager
def _metering(settings: Settings, stack) -> Iterator[Callable[[], bool] | None]:
    """A metering consumer for the demo's whole run, `--serve` included (events posted to the served
    API are metered, as under `infermeter up`), when the demo's stack owns its broker; on `up`'s
    broker or a configured one, that stack's consumers meter. Yields "is it running" (None when not
    ours), for the waits."""
    from metering.consumer import MeteringConsumer, run_in_thread

    if not stack.owns_broker:
        yield None
        return
    consumer = MeteringConsumer(stack.settings_for(settings), stack.database_url, stack.kafka_bootstrap)
    thread = run_in_thread(consumer)
    try:
        yield thread.is_alive
    finally:
        consumer.stop()
        thread.join(30)


def _meter(settings: Settings, stack, events: list[bytes], console: Console,
           metering_runs: Callable[[], bool] | None):
    """Publish the events to Kafka and wait until metering has written them all (`metering_runs`:
    whether our consumer still runs, None when another process meters)."""
    from rich.progress import Progress

    from metering.ingest import publish_lines, wait_for_receipt
    from metering.kafka import ensure_topics, make_producer

    ensure_topics(stack.kafka_bootstrap, settings)
    producer = make_producer(stack.kafka_bootstrap, settings.kafka_backend)
    ingest_id = f"demo-{uuid.uuid4().hex[:12]}"
    with Progress(console=console, transient=True) as progress:
        sent = progress.add_task("publishing to Kafka", total=len(events))
        publication = publish_lines(producer, settings.events_topic, enumerate(events, 1), ingest_id=ingest_id,
                                    on_progress=lambda n: progress.update(sent, completed=n))
        producer.close()
        metered = progress.add_task("metering into Postgres", total=publication.published)
        counts = wait_for_receipt(
            to_libpq_url(stack.database_url), ingest_id, publication.published, timeout_s=900,
            on_progress=lambda c: progress.update(metered, completed=c.total),
            still_running=metering_runs,
        )
    console.print(f"metered: accepted={counts.accepted:,} duplicates={counts.duplicates:,} "
                  f"rejected={counts.rejected:,}")
    analyze(stack.database_url)
    return counts


def analyze(database_url: str) -> None:
    """ANALYZE after the bulk load: until autovacuum gets to it, the planner's statistics describe
    empty rollups. The plans read from them: metering's `customers_with_usage` walks or reads the
    rollups by its row estimate, and the month's pricing queries join thousands of
    deployment-hours, which a planner without statistics may run as nested loops."""
    with psycopg.connect(to_libpq_url(database_url), autocommit=True) as conn:
        conn.execute("ANALYZE")


def _usage_and_reconcile(database_url: str, totals: DemoTotals, start: datetime, end: datetime,
                         console: Console, summary: dict) -> bool:
    """Print usage by model and top customers; True if metered == emitted and raw events == rollups."""
    from metering import queries
    from metering.reconcile import reconcile

    window = queries.Window(start, end)
    with psycopg.connect(to_libpq_url(database_url)) as conn:
        rows = queries.usage(conn, window, group_by=["model"])
        check = reconcile(conn, window)
    for table in usage_tables(rows, window):
        console.print(table)
    pipeline = {
        "requests": sum(r["requests"] for r in rows),
        "input_tokens": sum(r["input_tokens"] for r in rows),
        "cached_input_tokens": sum(r["cached_input_tokens"] for r in rows),
        "output_tokens": sum(r["output_tokens"] for r in rows),
    }
    emitted = {"requests": totals.requests, "input_tokens": totals.input_tokens,
               "cached_input_tokens": totals.cached_input_tokens, "output_tokens": totals.output_tokens}
    agree = pipeline == emitted and check.ok
    # A second run on the same database finds everything already metered: rollups hold
    # every run's events once, so they match what this run emitted only on a fresh database.
    status = "[green]match[/]" if agree else "[red]MISMATCH[/]"
    console.print(f"emitted {emitted} | metered {pipeline} | raw vs rollups: "
                  f"{'ok' if check.ok else f'{len(check.differences)} differences'} -> {status}")
    summary.update(emitted=emitted, metered=pipeline, reconcile_ok=check.ok)
    return agree


def usage_tables(rows: list[dict], window) -> list[Table]:
    """Usage by model and the top 10 customers by tokens (fits 80 columns)."""
    by_customer = defaultdict(lambda: [0, 0, 0, 0])
    by_model = defaultdict(lambda: [0, 0, 0, 0])
    for r in rows:
        for agg in (by_customer[r["customer_id"]], by_model[r["model"]]):
            agg[0] += r["requests"]
            agg[1] += r["uncached_input_tokens"]
            agg[2] += r["cached_input_tokens"]
            agg[3] += r["output_tokens"]
    period = f"[{window.start:%Y-%m-%d %H:%M}, {window.end:%Y-%m-%d %H:%M}) UTC"
    table = Table("model", "requests", "uncached input", "cached input", "output", "cache hit",
                  title=f"usage by model {period}")
    for model, (n, unc, cac, out) in sorted(by_model.items()):
        table.add_row(model, f"{n:,}", f"{unc:,}", f"{cac:,}", f"{out:,}", f"{cac / max(unc + cac, 1):.1%}")
    tables = [table]
    table = Table("customer", "requests", "uncached input", "cached input", "output", "share of tokens",
                  title="top customers")
    total = sum(v[1] + v[2] + v[3] for v in by_customer.values()) or 1
    for customer, (n, unc, cac, out) in sorted(by_customer.items(), key=lambda kv: -sum(kv[1][1:]))[:10]:
        table.add_row(customer, f"{n:,}", f"{unc:,}", f"{cac:,}", f"{out:,}", f"{(unc + cac + out) / total:.1%}")
    tables.append(table)
    for table in tables:  # numbers are never cut: headings wrap instead
        for column in table.columns:
            label = column.header in ("model", "customer")
            column.justify = "left" if label else "right"
            column.no_wrap = label
            column.min_width = max((len(str(cell)) for cell in column.cells), default=0)
    return tables


# Billing runs as of this instant: after the month and its 24 h grace window, so invoices finalize.
BILLING_AS_OF = datetime(2026, 12, 3, tzinfo=UTC)
BILLING_SETUP_AT = datetime(2026, 10, 25, tzinfo=UTC)
NON_UTC_CUSTOMER = ("cust-002", "Asia/Kolkata")  # its November is [Oct 31 18:30Z, Nov 30 18:30Z)
PREPAID_CUSTOMER = ("cust-003", "10.00")  # USD of prepaid credit, granted before the month


def demo_billing_clock() -> datetime:
    """The instant the served dashboards show billing figures (current-period preview, credit balance)
    as of: BILLING_AS_OF while the clock is earlier, else now. The month is billed as of BILLING_AS_OF,
    so with a clock before it the pages would show cust-003's prepaid credit as not yet used while the
    demo's own invoice table shows it applied."""
    return max(datetime.now(UTC), BILLING_AS_OF)


def _billing(database_url: str, start: datetime, out_dir: Path, console: Console) -> dict:
    """Customers and plans (the per-token book from the month's first day; one customer in
    Asia/Kolkata, one with prepaid credit), the month's billing run as of BILLING_AS_OF (drafts,
    then finalized with gapless numbers), the invoices, money reconciled, the finance exports."""
    from billing_service.credits import grant_credits
    from billing_service.customers import assign_plan, set_customer
    from billing_service.exports import export
    from billing_service.invoices import list_invoices
    from billing_service.reconcile import reconcile_money
    from billing_service.run import billing_run
    from billing_service.store import get_customer, money_text
    from pricing_service.books import EXAMPLE_BOOKS_DIR

    period = f"{start:%Y-%m}"
    book = EXAMPLE_BOOKS_DIR / "per-token.yaml"
    text = book.read_text()
    with psycopg.connect(to_libpq_url(database_url)) as conn:
        for k in range(1, CUSTOMERS + 1):
            customer = f"cust-{k:03d}"
            if get_customer(conn, customer) is not None:
                continue  # set up by an earlier demo run on this home: its invoices are final
            zone = NON_UTC_CUSTOMER[1] if customer == NON_UTC_CUSTOMER[0] else None
            set_customer(conn, customer, now=BILLING_SETUP_AT, name=f"Demo customer {k}", timezone=zone)
            assign_plan(conn, customer, text, str(book), f"{start:%Y-%m-%d}", now=BILLING_SETUP_AT)
            if customer == PREPAID_CUSTOMER[0]:
                grant_credits(conn, customer, PREPAID_CUSTOMER[1], now=BILLING_SETUP_AT, reason="demo top-up")
            conn.commit()
        result = billing_run(conn, period, now=BILLING_AS_OF)
        conn.commit()
        check = reconcile_money(conn, period)
        files = {}
        for kind, fmt in (("invoices", "csv"), ("lines", "csv"), ("revenue", "csv"), ("revenue", "parquet")):
            path = out_dir / f"{kind}-{period}.{fmt}"
            path.write_bytes(export(conn, kind, period, fmt))
            files[f"{kind}.{fmt}"] = str(path)
        # the period's invoices as stored (a rerun finds them final and changes nothing)
        invoices = list_invoices(conn, period=period)
    table = Table(title=f"Invoices for {period} (as of {BILLING_AS_OF:%Y-%m-%d}; top 8 by total)")
    for column in ("number", "customer", "status", "subtotal", "credits", "total"):
        table.add_column(column, justify="right" if column in ("subtotal", "credits", "total") else "left")
    for o in sorted(invoices, key=lambda o: (-Decimal(o["total"]), o["customer_id"]))[:8]:
        table.add_row(o["number"] or "-", o["customer_id"], o["status"], o["subtotal"], o["credits_applied"], o["total"])
    console.print(table)
    total = money_text(sum((Decimal(o["total"]) for o in invoices), Decimal(0)), "USD")
    credits = money_text(sum((Decimal(o["credits_applied"]) for o in invoices), Decimal(0)), "USD")
    status = "[green]ok[/]" if check.ok else f"[red]{len(check.differences)} differences[/]"
    console.print(f"{len(invoices)} invoices, {total} USD to collect after {credits} USD of prepaid credit; "
                  f"{NON_UTC_CUSTOMER[0]} is billed on {NON_UTC_CUSTOMER[1]} days; money reconcile {status}; "
                  f"exports in {out_dir}")
    if not check.ok:
        raise RuntimeError("demo: invoices do not reconcile with rated usage (see above)")
    return {"period": period, "invoices": len(invoices), "total": total, "credits_applied": credits,
            "finalized": sum(1 for o in invoices if o["status"] == "open"), "reconcile_ok": check.ok,
            "unbilled": [u.customer_id for u in result.unbilled], "exports": files}


# The price recommendation the pricing step ends with: a 25% margin, a loss-making month at most 5% likely.
RECOMMEND_TARGET, RECOMMEND_RISK = "0.25", "0.05"


def _pricing(database_url: str, start: datetime, end: datetime, out_dir: Path, console: Console) -> dict | None:
    """The pricing comparison of the example books, then how far to scale each book's prices to reach
    a 25% margin with a loss-making month at most 5% likely (pricing_service)."""
    from pricing_service import recommend, recommend_html
    from pricing_service.compare import default_book_paths, run_comparison
    from pricing_service.comparison_report import render_console
    from pricing_service.report_html import write_html

    report = run_comparison(database_url, start, end, default_book_paths())
    render_console(report, console)
    html = out_dir / "pricing.html"
    write_html(report, html)
    console.print(f"pricing report: {html}")
    advice = recommend.run_recommendation(database_url, start, end, default_book_paths(), target=RECOMMEND_TARGET,
                                          risk=RECOMMEND_RISK)
    recommend.render_console(advice, console)
    console.print(f"price recommendation: {recommend_html.write_html(advice, out_dir / 'recommend.html')}")
    return {**report.to_json(), "recommendation": advice.to_json()}
