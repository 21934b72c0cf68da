"""The replica agent against a real HTTP /metrics endpoint serving real Prometheus text.

The endpoint is an aiohttp server on loopback whose body prometheus_client renders from vLLM's
metric names (a test against a real vLLM server belongs to the gateway suite).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from metering.contract import REPLICA_V1, ReplicaData, decode_event, encode_event, rfc3339
from metering.kafka import ensure_topics
from serving.emitter import Emitter
from serving.replica_agent import ReplicaAgent, VllmSample, counter_delta, parse_vllm_metrics
from tests.serving_control.kafka_helpers import read_events

T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


class FakeVllmMetrics:
    """vLLM's /metrics names, rendered by prometheus_client; counters can 'restart' from zero."""

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["engine", "model_name"]
        self.prompt = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=self.registry)
        self.generation = Counter("vllm:generation_tokens", "Number of generation tokens processed.", labels,
                                  registry=self.registry)
        self.running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", labels,
                             registry=self.registry)
        for gauge in (self.prompt, self.generation, self.running):
            gauge.labels(engine="0", model_name="tiny")
        Gauge("vllm:num_requests_waiting", "Waiting requests.", labels, registry=self.registry).labels(
            engine="0", model_name="tiny")

    def add(self, prompt: int = 0, generation: int = 0, running: int | None = None) -> None:
        self.prompt.labels(engine="0", model_name="tiny").inc(prompt)
        self.generation.labels(engine="0", model_name="tiny").inc(generation)
        if running is not None:
            self.running.labels(engine="0", model_name="tiny").set(running)

    async def handle(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), content_type="text/plain")


def test_parse_real_prometheus_text_sums_label_sets():
    fake = FakeVllmMetrics()
    fake.add(prompt=10, generation=4, running=2)
    fake.prompt.labels(engine="1", model_name="tiny").inc(5)
    sample = parse_vllm_metrics(generate_latest(fake.registry).decode(), T0)
    assert (sample.prompt_tokens, sample.generation_tokens, sample.running) == (15, 4, 2.0)


def test_parse_reads_its_families_among_the_many_vllm_exports():
    """vLLM's /metrics is mostly histograms the agent does not read (kept out before parsing)."""
    fake = FakeVllmMetrics()
    fake.add(prompt=10, generation=4, running=2)
    labels = ["engine", "model_name"]
    for name in ("vllm:request_prompt_tokens", "vllm:time_to_first_token_seconds", "vllm:prompt_tokens_cached"):
        Histogram(name, "noise", labels, registry=fake.registry).labels(engine="0", model_name="tiny").observe(3)
    Gauge("vllm:kv_cache_usage_perc", "KV-cache usage.", labels, registry=fake.registry).labels(
        engine="0", model_name="tiny").set(0.25)
    sample = parse_vllm_metrics(generate_latest(fake.registry).decode(), T0)
    assert (sample.prompt_tokens, sample.generation_tokens, sample.running, sample.waiting, sample.kv_cache_usage) == (
        10, 4, 2.0, 0.0, 0.25)


def test_counter_reset_counts_from_zero():
    assert counter_delta(100, 130) == 30
    assert counter_delta(100, 7) == 7


class ListSink:
    def __init__(self) -> None:
        self.events: list[dict] = []

    def emit(self, event: dict) -> None:
        self.events.append(event)


def test_interval_accounting_busy_time_tokens_and_reset():
    sink = ListSink()
    agent = ReplicaAgent("http://127.0.0.1:1", "dep-a", "cpu", 2, sink, customer_id="cust-1", replica_id="r0")
    at = lambda s: T0 + timedelta(seconds=s)  # noqa: E731
    agent.observe(VllmSample(at(0), 0, 1000, 500), at(0))     # baseline: earlier counts are not ours
    agent.observe(VllmSample(at(1), 0, 1000, 500), at(1))     # idle second
    agent.observe(VllmSample(at(2), 1, 1100, 520), at(2))     # busy (running and counters moved)
    agent.observe(VllmSample(at(3), 0, 1100, 540), at(3))     # busy (counters moved)
    agent.observe(None, at(4))                                # failed scrape: nothing known
    agent.observe(VllmSample(at(5), 0, 5, 2), at(5))          # engine restarted: counts from zero
    event = agent.close_interval(at(6))
    assert event["subject"] == "cust-1" and event["id"] == "r0/2026-11-29T10:00:00.000000Z"
    data = event["data"]
    assert (data["prompt_tokens"], data["generation_tokens"]) == (100 + 5, 20 + 20 + 2)
    # busy: [1,2) [2,3) and [3,5) (counters moved across the failed scrape) = 4 s
    assert data["busy_seconds"] == "4.000000"
    decoded = decode_event(encode_event(event), now=at(7))
    assert isinstance(decoded.data, ReplicaData)
    assert (decoded.data.interval_start, decoded.data.interval_end, decoded.data.gpu_count) == (at(0), at(6), 2)
    nxt = agent.close_interval(at(8))
    assert nxt["data"]["interval_start"] == rfc3339(at(6)) and nxt["data"]["busy_seconds"] == "0.000000"


async def _run_agent(fake: FakeVllmMetrics, emitter: Emitter, customer: str | None) -> list[dict]:
    app = web.Application()
    app.router.add_get("/metrics", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    intervals: list[dict] = []
    agent = ReplicaAgent(f"http://127.0.0.1:{port}", "dep-e2e", "cpu", 4, emitter, customer_id=customer,
                         interval_s=1.0, sample_s=0.1)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop, on_interval=intervals.append))
    try:
        await asyncio.sleep(0.45)
        fake.add(prompt=100, generation=50, running=2)
        await asyncio.sleep(1.0)
        fake.add(generation=30, running=0)
        await asyncio.sleep(0.8)
        fake.restart()            # vLLM restarted: counters from zero
        fake.add(prompt=7, generation=3)
        await asyncio.sleep(1.0)
    finally:
        stop.set()
        await task
        await runner.cleanup()
    return intervals


def test_agent_emits_contiguous_valid_intervals_through_the_emitter(settings, kafka_bootstrap, tmp_path):
    ensure_topics(kafka_bootstrap, settings)
    fake = FakeVllmMetrics()
    fake.add(prompt=5000, generation=900)  # before the agent starts: not attributed
    with Emitter(tmp_path / "spool", kafka_bootstrap, settings, name="agent") as emitter:
        intervals = asyncio.run(_run_agent(fake, emitter, "cust-dedicated"))
        assert emitter.wait_drained(20)
    assert len(intervals) >= 3
    records = read_events(kafka_bootstrap, settings.events_topic, len(intervals))
    events = sorted((decode_event(v, now=datetime.now(UTC)) for _, v in records), key=lambda e: e.data.interval_start)
    assert len(events) == len(intervals) and all(e.type == REPLICA_V1 for e in events)
    assert all(e.subject == "cust-dedicated" and e.data.customer_id == "cust-dedicated" for e in events)
    for before, after in zip(events, events[1:], strict=False):
        assert before.data.interval_end == after.data.interval_start  # GPU time tiles, no gaps
    for event in events:
        length = (event.data.interval_end - event.data.interval_start).total_seconds()
        assert 0 <= Decimal(event.data.busy_seconds) <= Decimal(str(length))
        assert event.data.gpu_count == 4 and event.data.gpu_type == "cpu"
    assert sum(e.data.prompt_tokens for e in events) == 107
    assert sum(e.data.generation_tokens for e in events) == 83
    busy = sum(Decimal(e.data.busy_seconds) for e in events)
    total = sum(Decimal(str((e.data.interval_end - e.data.interval_start).total_seconds())) for e in events)
    assert Decimal("0.8") <= busy < total  # ~1 s running, plus the samples where counters moved


def test_replica_agent_command_runs_until_sigint(settings, kafka_bootstrap, tmp_path):
    """`infermeter serve replica-agent` as a real process: intervals reach the topic; Ctrl-C stops it."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time
    from pathlib import Path

    ensure_topics(kafka_bootstrap, settings)
    fake = FakeVllmMetrics()
    ready = threading.Event()
    box: dict = {}

    def serve() -> None:
        async def main() -> None:
            app = web.Application()
            app.router.add_get("/metrics", fake.handle)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            box["port"] = site._server.sockets[0].getsockname()[1]
            box["stop"] = asyncio.Event()
            ready.set()
            await box["stop"].wait()
            await runner.cleanup()

        box["loop"] = asyncio.new_event_loop()
        box["loop"].run_until_complete(main())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    env = {**os.environ, "KAFKA_BOOTSTRAP": kafka_bootstrap, "INFERMETER_TOPIC_PREFIX": settings.topic_prefix,
           "INFERMETER_HOME": str(tmp_path / "home")}
    command = [str(Path(sys.executable).parent / "infermeter"), "serve", "replica-agent",
               "--vllm", f"http://127.0.0.1:{box['port']}", "--deployment", "dep-cli", "--gpu-type", "cpu",
               "--gpu-count", "1", "--interval-s", "1", "--sample-s", "0.2"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 30
        while not any("busy" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.05)  # the first interval is out: the agent runs
        fake.add(prompt=11, generation=5)
        time.sleep(1.2)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(30)
        reader.join(10)
        box["loop"].call_soon_threadsafe(box["stop"].set)
    stderr = "".join(lines)
    assert process.returncode == 0, stderr
    assert "replica agent:" in stderr and "shared pool" in stderr and "Traceback" not in stderr
    shown = [line for line in stderr.splitlines() if "busy" in line]
    assert len(shown) >= 2
    records = read_events(kafka_bootstrap, settings.events_topic, len(shown), timeout_s=20)
    events = [decode_event(v, now=datetime.now(UTC)) for _, v in records]
    assert len(events) == len(shown)
    assert all(e.subject == "shared-pool" and e.data.customer_id is None for e in events)
    assert sum(e.data.prompt_tokens for e in events) == 11


def test_engine_state_kv_cache_mean_of_scrapes_and_time_averaged_queue():
    """kv_cache_usage: the mean of the interval's scrapes; requests waiting / running: averaged over
    time (each span between two scrapes at the mean of its ends), from real Prometheus text."""
    fake = FakeVllmMetrics()
    kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", ["engine", "model_name"],
               registry=fake.registry)
    waiting = fake.registry._names_to_collectors["vllm:num_requests_waiting"]
    sink = ListSink()
    agent = ReplicaAgent("http://127.0.0.1:1", "dep-a", "H100", 8, sink, replica_id="r0")
    at = lambda s: T0 + timedelta(seconds=s)  # noqa: E731

    def scrape(t: float, usage: float, queued: int, running: int) -> None:
        kv.labels(engine="0", model_name="tiny").set(usage)
        waiting.labels(engine="0", model_name="tiny").set(queued)
        fake.add(running=running)
        agent.observe(parse_vllm_metrics(generate_latest(fake.registry).decode(), at(t)), at(t))

    scrape(0, 0.2, 0, 0)
    scrape(2, 0.6, 4, 8)    # [0,2): waiting (0+4)/2 = 2, running 4
    scrape(4, 1.0, 0, 8)    # [2,4): waiting 2, running 8
    agent.observe(None, at(5))  # a failed scrape: [4,6) is measured between the scrapes at 4 and 6
    scrape(6, 0.2, 0, 0)    # [4,6): waiting 0, running 4
    data = agent.close_interval(at(6))["data"]
    assert data["kv_cache_usage"] == "0.500000"  # (0.2 + 0.6 + 1.0 + 0.2) / 4
    assert data["requests_waiting"] == "1.333333"  # (2x2 + 2x2 + 0x2) / 6 s
    assert data["requests_running"] == "5.333333"  # (4x2 + 8x2 + 4x2) / 6 s
    decoded = decode_event(encode_event(sink_event(data, at)), now=at(7))
    assert decoded.data.kv_cache_usage == "0.500000"
    # without the gauges (an older engine): the fields are left out, the event stays valid v1
    plain = ReplicaAgent("http://127.0.0.1:1", "dep-a", "H100", 1, sink, replica_id="r1")
    plain.observe(VllmSample(at(0), 0, 0, 0), at(0))
    plain.observe(VllmSample(at(1), 0, 0, 0), at(1))
    event = plain.close_interval(at(1))
    assert "kv_cache_usage" not in event["data"] and "requests_waiting" not in event["data"]
    assert event["data"]["requests_running"] == "0.000000"
    assert decode_event(encode_event(event), now=at(2)).data.kv_cache_usage is None


def sink_event(data: dict, at) -> dict:
    from metering.contract import make_event

    return make_event(REPLICA_V1, source="//t", subject="shared-pool", data=data, event_id="x", time=at(6))


def test_engine_state_splits_exactly_at_hour_boundaries():
    """The processor shares the engine state out over the hours an interval spans, exactly."""
    from metering.contract import replica_event
    from metering.processor import split_interval

    start = datetime(2026, 11, 2, 0, 59, 30, tzinfo=UTC)
    event = replica_event(source="//t", replica_id="r0", deployment_id="d", customer_id=None, gpu_type="H100",
                          gpu_count=8, interval_start=start, interval_end=start + timedelta(seconds=60),
                          busy_seconds="60", prompt_tokens=0, generation_tokens=0, kv_cache_usage="0.5",
                          requests_waiting="2.25", requests_running="10")
    data = decode_event(encode_event(event), now=start + timedelta(hours=1)).data
    first, second = split_interval(data)
    assert (first.wall_ms, second.wall_ms) == (30_000, 30_000)
    assert first.kv_cache_gpu_ms + second.kv_cache_gpu_ms == 240_000  # 60 s x 8 GPUs x 0.5
    assert (first.queue_ms, second.queue_ms) == (67_500, 67_500)  # 60 s x 2.25 requests
    assert first.running_ms + second.running_ms == 600_000
