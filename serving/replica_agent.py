"""The replica agent: scrapes one vLLM replica's /metrics and emits infermeter.replica.v1 intervals.

Public API:

    agent = ReplicaAgent(vllm_url, deployment_id, gpu_type, gpu_count, emitter,
                         customer_id=None, replica_id=None, interval_s=10, sample_s=1, region=None)
    await agent.run(stop_event)        # until stop_event is set; emits one event per interval
    await agent.sample()               # one scrape (tests)
    agent.close_interval(end) -> dict | None   # the event of the interval ending at `end`
    parse_vllm_metrics(text) -> VllmSample  # pure: Prometheus text -> counters we read

CLI: `infermeter serve replica-agent --vllm URL --deployment D --gpu-type T --gpu-count N
[--customer C] [--region R] [--interval-s S]` (serving.control_cli.replica_agent).

`region` (data residency; one of INFERMETER_REGIONS, checked by the CLI) rides on every interval
event as the optional `region` field.

Each interval [start, end) carries:
- gpu_seconds implied by (end - start) x gpu_count (metering derives it from the interval);
- busy_seconds: the agent samples /metrics every `sample_s` (INFERMETER_REPLICA_SAMPLE_S); the
  span between two consecutive samples counts as busy when either sample shows
  `vllm:num_requests_running > 0` or the prompt/generation token counters advanced between
  them. Resolution = sample_s; a request shorter than that between two idle samples is still
  seen through the counters. busy_seconds <= interval length by construction;
- prompt_tokens / generation_tokens: deltas of `vllm:prompt_tokens_total` and
  `vllm:generation_tokens_total` (summed over their label sets) in the interval. A counter
  that goes down means vLLM restarted: the delta is then the new value (counted from 0);
- the engine's state, when its /metrics has it: kv_cache_usage = the mean of
  `vllm:kv_cache_usage_perc` (a fraction 0..1; `vllm:gpu_cache_usage_perc` on older vLLM) over the
  interval's scrapes; requests_waiting / requests_running = `vllm:num_requests_waiting` /
  `vllm:num_requests_running` averaged over time (each span between two scrapes weighs its length,
  at the mean of its two ends; spans without two successful scrapes are left out).
With `customer_id` the deployment is dedicated and the event's subject/customer_id is that
customer; without, subject "shared-pool" and customer_id null. Event identity:
source `//replica-agent/<replica_id>`, id `<replica_id>/<interval_start>`, so a replayed
interval deduplicates. If a scrape fails the interval still carries its GPU time (the GPUs
were held) with busy time from the samples that succeeded; token deltas catch up at the next
successful scrape.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Protocol
from urllib.parse import urlparse

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from metering.contract import replica_event
from serving import metrics

log = logging.getLogger("serving.replica_agent")

PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # vLLM v1, then older names
# The families read, as the lines of the exposition start (a counter's TYPE/HELP lines name it without
# "_total"). vLLM's /metrics is ~50 kB of histograms the agent does not read: parsing all of it took
# ~19 ms a scrape on a loaded 2-core machine, the kept lines well under 1 ms.
_READ_FAMILIES = (
    PROMPT_TOKENS.removesuffix("_total"), GENERATION_TOKENS.removesuffix("_total"), RUNNING, WAITING, *KV_CACHE_USAGE,
)
_SIX = Decimal("0.000001")


class EventSink(Protocol):
    def emit(self, event: dict) -> None: ...


@dataclass(frozen=True)
class VllmSample:
    """What the agent reads from one scrape (counters summed over their label sets)."""

    at: datetime
    running: float
    prompt_tokens: int
    generation_tokens: int
    waiting: float | None = None  # None: the engine does not export it
    kv_cache_usage: float | None = None  # fraction 0..1, mean over the engine's label sets


def parse_vllm_metrics(text: str, at: datetime) -> VllmSample:
    running = waiting = 0.0
    prompt = generation = 0.0
    kv: dict[str, list[float]] = {name: [] for name in KV_CACHE_USAGE}
    found = set()
    read = [line for line in text.splitlines()
            if (line[7:] if line.startswith(("# TYPE ", "# HELP ")) else line).startswith(_READ_FAMILIES)]
    for family in text_string_to_metric_families("\n".join(read) + "\n"):
        for sample in family.samples:
            if sample.name == PROMPT_TOKENS:
                prompt += sample.value
            elif sample.name == GENERATION_TOKENS:
                generation += sample.value
            elif sample.name == RUNNING:
                running += sample.value
            elif sample.name == WAITING:
                waiting += sample.value
            elif sample.name in kv:
                kv[sample.name].append(sample.value)
            else:
                continue
            found.add(sample.name)
    missing = {PROMPT_TOKENS, GENERATION_TOKENS, RUNNING} - found
    if missing:
        raise ValueError(f"vLLM /metrics lacks {', '.join(sorted(missing))}")
    usage = next((values for values in kv.values() if values), None)
    return VllmSample(
        at, running, int(round(prompt)), int(round(generation)),
        waiting if WAITING in found else None,
        None if usage is None else min(1.0, max(0.0, sum(usage) / len(usage))),
    )


def counter_delta(previous: int, current: int) -> int:
    """Increase of a counter; a decrease means the engine restarted and counts from 0 again."""
    return current - previous if current >= previous else current


def _fraction(value: float) -> str:
    """A non-negative average as a decimal string with 6 places (the contract's DecimalString)."""
    return f"{Decimal(repr(max(0.0, value))).quantize(_SIX):f}"


def _micros(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


class ReplicaAgent:
    def __init__(
        self,
        vllm_url: str,
        deployment_id: str,
        gpu_type: str,
        gpu_count: int,
        emitter: EventSink,
        *,
        customer_id: str | None = None,
        replica_id: str | None = None,
        interval_s: float = 10.0,
        sample_s: float = 1.0,
        clock: Callable[[], datetime] | None = None,
        region: str | None = None,
    ) -> None:
        if gpu_count < 1:
            raise ValueError("gpu_count must be at least 1")
        if interval_s <= 0 or sample_s <= 0:
            raise ValueError("interval_s and sample_s must be positive")
        self.metrics_url = vllm_url.rstrip("/") + "/metrics"
        parsed = urlparse(vllm_url)
        self.deployment_id = deployment_id
        self.replica_id = replica_id or f"{deployment_id}@{parsed.hostname}:{parsed.port or 80}"
        self.gpu_type = gpu_type
        self.gpu_count = gpu_count
        self.customer_id = customer_id
        self.region = region
        self.emitter = emitter
        self.interval_s = interval_s
        self.sample_s = min(sample_s, interval_s)
        self.clock = clock or (lambda: datetime.now(UTC))
        self.interval_start: datetime | None = None
        self._last: VllmSample | None = None
        self._busy_us = 0
        self._prompt = 0
        self._generation = 0
        self._reset_engine_state()
        self._scrapes_ok = metrics.REPLICA_SCRAPES.labels(deployment=deployment_id, result="ok")
        self._scrapes_error = metrics.REPLICA_SCRAPES.labels(deployment=deployment_id, result="error")
        self._intervals = metrics.REPLICA_INTERVALS.labels(deployment=deployment_id)

    # --- accounting (pure given the samples) ------------------------------------------------------

    def _reset_engine_state(self) -> None:
        self._kv_sum = 0.0
        self._kv_n = 0
        self._waiting_us = self._running_us = 0.0  # request-microseconds
        self._waiting_cover_us = self._running_cover_us = 0

    def observe(self, sample: VllmSample | None, at: datetime) -> None:
        """Account one scrape made at `at` (None: it failed)."""
        if self.interval_start is None:
            self.interval_start = at
        if sample is None:
            return
        if sample.kv_cache_usage is not None:
            self._kv_sum += sample.kv_cache_usage
            self._kv_n += 1
        previous, self._last = self._last, sample
        if previous is None:
            return  # the baseline: counters before the agent started are not ours
        span = max(0, _micros(sample.at - max(previous.at, self.interval_start)))
        self._running_us += span * (previous.running + sample.running) / 2
        self._running_cover_us += span
        if previous.waiting is not None and sample.waiting is not None:
            self._waiting_us += span * (previous.waiting + sample.waiting) / 2
            self._waiting_cover_us += span
        prompt = counter_delta(previous.prompt_tokens, sample.prompt_tokens)
        generation = counter_delta(previous.generation_tokens, sample.generation_tokens)
        self._prompt += prompt
        self._generation += generation
        if previous.running > 0 or sample.running > 0 or prompt > 0 or generation > 0:
            since = max(previous.at, self.interval_start)
            self._busy_us += max(0, _micros(sample.at - since))

    def close_interval(self, end: datetime) -> dict | None:
        """The replica.v1 event of [interval_start, end), and a new interval from `end`."""
        start = self.interval_start
        if start is None or end <= start:
            return None
        length_us = _micros(end - start)
        busy_us = min(self._busy_us, length_us)
        prompt_tokens, generation_tokens = self._prompt, self._generation
        kv = None if not self._kv_n else _fraction(min(1.0, self._kv_sum / self._kv_n))
        waiting = None if not self._waiting_cover_us else _fraction(self._waiting_us / self._waiting_cover_us)
        running = None if not self._running_cover_us else _fraction(self._running_us / self._running_cover_us)
        self.interval_start = end
        self._busy_us = self._prompt = self._generation = 0
        self._reset_engine_state()
        return replica_event(
            source=f"//replica-agent/{self.replica_id}",
            replica_id=self.replica_id,
            deployment_id=self.deployment_id,
            customer_id=self.customer_id,
            gpu_type=self.gpu_type,
            gpu_count=self.gpu_count,
            interval_start=start,
            interval_end=end,
            busy_seconds=f"{Decimal(busy_us).scaleb(-6):f}",
            prompt_tokens=prompt_tokens,
            generation_tokens=generation_tokens,
            kv_cache_usage=kv,
            requests_waiting=waiting,
            requests_running=running,
            region=self.region,
        )

    # --- I/O ----------------------------------------------------------------------------------

    async def sample(self, session: aiohttp.ClientSession) -> VllmSample | None:
        try:
            async with session.get(self.metrics_url, timeout=aiohttp.ClientTimeout(total=max(1.0, self.sample_s))) as resp:
                resp.raise_for_status()
                body = await resp.text()
            at = self.clock()
            sample = parse_vllm_metrics(body, at)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            self._scrapes_error.inc()
            log.warning("replica agent: scrape of %s failed: %s", self.metrics_url, exc)
            self.observe(None, self.clock())
            return None
        self._scrapes_ok.inc()
        self.observe(sample, at)
        return sample

    def _emit(self, event: dict | None) -> None:
        if event is not None:
            self.emitter.emit(event)
            self._intervals.inc()

    async def run(self, stop: asyncio.Event, on_interval: Callable[[dict], None] | None = None) -> None:
        """Scrape every sample_s; emit one interval every interval_s; a last partial one at stop."""
        async with aiohttp.ClientSession() as session:
            await self.sample(session)
            while not stop.is_set():
                assert self.interval_start is not None
                close_at = self.interval_start + timedelta(seconds=self.interval_s)
                wait = min(self.sample_s, max(0.0, (close_at - self.clock()).total_seconds()))
                try:
                    await asyncio.wait_for(stop.wait(), timeout=wait)
                except TimeoutError:
                    pass
                sample = await self.sample(session)
                now = sample.at if sample else self.clock()
                if now >= close_at or stop.is_set():
                    event = self.close_interval(now)
                    self._emit(event)
                    if event and on_interval:
                        on_interval(event)
