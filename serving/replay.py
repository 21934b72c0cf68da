"""Real-traffic replay: the Mooncake trace, scaled to the tiny model, through the gateway.

The Mooncake conversation trace (FAST'25; data/traces/mooncake/) gives, per request, its arrival
`timestamp` (ms), `input_length`, `output_length` and `hash_ids`: one id per 512-token block of
the prompt, equal ids meaning equal content (so shared ids are shared prefixes). The replay turns
each hash id into a deterministic text block of exactly `block_tokens` tokens (31 words that are
one token each in the tiny model's vocabulary, plus a newline; default 32 tokens = one vLLM KV
block), so that requests sharing hash ids share token-aligned prefixes and real prefix-cache hits
happen in vLLM. Scaling:
- prompt: the first `max_blocks` hash ids (the tiny model's context is 2048 tokens);
- output: `output_length * block_tokens / 512`, at least 1, at most `max_output_tokens`;
- time: arrival times divided by `speedup`.

Requests are sent as streaming completions (`ignore_eos`, temperature 0) through the gateway (or
straight at vLLM with `direct=True`). `reconcile` then compares what metering recorded for the
replay's request ids with vLLM's own counters (`vllm:prompt_tokens_cached_total`, prompt and
generation tokens) over the same window: with nothing else running on the replicas they match
exactly.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from serving.tinymodel.make_corpus import ADJECTIVES, ADVERBS, NAMES, NOUNS, VERBS

MOONCAKE_BLOCK_TOKENS = 512
TRACE_PATHS = {
    "mooncake": (
        Path("data/traces/mooncake/conversation_trace.jsonl"),
        Path(__file__).resolve().parent.parent / "data/traces/mooncake/conversation_trace.jsonl",
    )
}
# Every one of these words is a single token (with its leading space) in the tiny model's vocabulary.
BLOCK_WORDS = tuple(NOUNS + ADJECTIVES + VERBS + ADVERBS + NAMES)
VLLM_COUNTERS = (
    "vllm:prompt_tokens_total",
    "vllm:prompt_tokens_cached_total",
    "vllm:generation_tokens_total",
)


class ReplayError(RuntimeError):
    """The trace cannot be read or the replay cannot run (the message says why)."""


@dataclass(frozen=True)
class TraceRequest:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True)
class ReplayRequest:
    index: int
    send_at_s: float
    prompt: str
    max_tokens: int
    blocks: int


@dataclass
class ReplayResult:
    index: int
    status: int
    request_id: str | None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    latency_s: float = 0.0
    error: str | None = None


@dataclass
class ReplayReport:
    results: list[ReplayResult]
    duration_s: float
    vllm_delta: dict[str, int] = field(default_factory=dict)
    metered: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> list[ReplayResult]:
        return [r for r in self.results if r.status == 200 and r.error is None]

    def client_totals(self) -> dict[str, int]:
        ok = self.ok
        return {
            "prompt_tokens": sum(r.prompt_tokens for r in ok),
            "cached_tokens": sum(r.cached_tokens for r in ok),
            "output_tokens": sum(r.output_tokens for r in ok),
        }


def trace_path(trace: str) -> Path:
    if trace in TRACE_PATHS:
        for candidate in TRACE_PATHS[trace]:
            if candidate.exists():
                return candidate
        raise ReplayError(
            f"the {trace} trace is not bundled (looked in {', '.join(map(str, TRACE_PATHS[trace]))})"
        )
    path = Path(trace)
    if not path.exists():
        raise ReplayError(f"no trace file at {path}")
    return path


def load_trace(path: Path, limit: int | None = None, offset: int = 0) -> list[TraceRequest]:
    requests: list[TraceRequest] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if number <= offset:
                continue
            if limit is not None and len(requests) >= limit:
                break
            try:
                row = json.loads(line)
                requests.append(
                    TraceRequest(
                        int(row["timestamp"]), int(row["input_length"]), int(row["output_length"]),
                        tuple(int(h) for h in row["hash_ids"]),
                    )
                )  # fmt: skip
            except (ValueError, KeyError, TypeError) as exc:
                raise ReplayError(f"{path}:{number}: not a Mooncake trace line ({exc})") from None
    if not requests:
        raise ReplayError(f"{path}: no requests in the selected range")
    return requests


def block_text(hash_id: int, block_tokens: int = 32) -> str:
    """The deterministic text of one hash block: `block_tokens - 1` one-token words and a newline."""
    rng = random.Random(f"mooncake-block-{hash_id}")
    return "".join(" " + rng.choice(BLOCK_WORDS) for _ in range(block_tokens - 1)) + "\n"


def scale_trace(
    trace: Iterable[TraceRequest],
    *,
    block_tokens: int = 32,
    max_blocks: int = 48,
    max_output_tokens: int = 64,
    speedup: float = 1.0,
) -> list[ReplayRequest]:
    trace = list(trace)
    start = trace[0].timestamp_ms
    scaled = []
    for index, request in enumerate(trace):
        hash_ids = request.hash_ids[:max_blocks]
        output = max(1, min(max_output_tokens, request.output_length * block_tokens // MOONCAKE_BLOCK_TOKENS))
        scaled.append(
            ReplayRequest(
                index=index,
                send_at_s=(request.timestamp_ms - start) / 1000.0 / speedup,
                prompt="".join(block_text(h, block_tokens) for h in hash_ids),
                max_tokens=output,
                blocks=len(hash_ids),
            )
        )
    return scaled


def vllm_counters(urls: Iterable[str]) -> dict[str, int]:
    """Sums of vLLM's token counters over replicas (integers: they count tokens)."""
    totals = dict.fromkeys(VLLM_COUNTERS, 0)
    for url in urls:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10) as response:
            text = response.read().decode()
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in totals:
                totals[name] += int(float(line.rsplit(" ", 1)[1]))
    return totals


async def _send(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    model: str,
    request: ReplayRequest,
    t0: float,
) -> ReplayResult:
    delay = t0 + request.send_at_s - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    body = {
        "model": model,
        "prompt": request.prompt,
        "max_tokens": request.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.monotonic()
    result = ReplayResult(index=request.index, status=0, request_id=None)
    try:
        async with session.post(url, json=body, headers=headers) as response:
            result.status = response.status
            result.request_id = response.headers.get("x-request-id")
            if response.status != 200:
                result.error = (await response.text())[:300]
                return result
            async for line in response.content:
                if not line.startswith(b"data: {"):
                    continue
                chunk = json.loads(line[6:])
                usage = chunk.get("usage")
                if usage and not chunk.get("choices"):
                    result.prompt_tokens = usage.get("prompt_tokens", 0)
                    result.output_tokens = usage.get("completion_tokens", 0)
                    result.cached_tokens = (usage.get("prompt_tokens_details") or {}).get(
                        "cached_tokens", 0
                    ) or 0
                if "error" in chunk:
                    result.error = str(chunk["error"])[:300]
    except (TimeoutError, aiohttp.ClientError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    result.latency_s = time.monotonic() - started
    return result


async def replay_async(
    requests: list[ReplayRequest],
    *,
    base_url: str,
    model: str,
    api_key: str | None = None,
    on_done: Callable[[ReplayResult], None] | None = None,
) -> list[ReplayResult]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = base_url.rstrip("/") + "/v1/completions"
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=600)
    ) as session:
        t0 = time.monotonic()

        async def one(request: ReplayRequest) -> ReplayResult:
            result = await _send(session, url, headers, model, request, t0)
            if on_done is not None:
                on_done(result)
            return result

        return list(await asyncio.gather(*(one(r) for r in requests)))


def run_replay(
    requests: list[ReplayRequest],
    *,
    base_url: str,
    model: str,
    vllm_urls: list[str],
    api_key: str | None = None,
    on_done: Callable[[ReplayResult], None] | None = None,
) -> ReplayReport:
    before = vllm_counters(vllm_urls)
    started = time.monotonic()
    results = asyncio.run(
        replay_async(requests, base_url=base_url, model=model, api_key=api_key, on_done=on_done)
    )
    duration = time.monotonic() - started
    after = vllm_counters(vllm_urls)
    return ReplayReport(
        results=results,
        duration_s=duration,
        vllm_delta={name: after[name] - before[name] for name in VLLM_COUNTERS},
    )


def reconcile(report: ReplayReport, metered: dict[str, int]) -> dict[str, tuple[int, int]]:
    """(metered, vLLM) pairs for requests, prompt, cached and generated tokens; fills report.metered.

    `metered` is what metering recorded for the replay's request ids
    (`metering.event_lookups.request_event_totals`)."""
    report.metered = metered
    delta = report.vllm_delta
    return {
        "requests": (metered["events"], len(report.results)),
        "prompt_tokens": (metered["input_tokens"], delta["vllm:prompt_tokens_total"]),
        "cached_tokens": (metered["cached_input_tokens"], delta["vllm:prompt_tokens_cached_total"]),
        "output_tokens": (metered["output_tokens"], delta["vllm:generation_tokens_total"]),
    }


def reset_prefix_caches(urls: Iterable[str]) -> None:
    """Empty every replica's prefix cache (vLLM dev mode endpoint), so each policy starts cold."""
    for url in urls:
        for _ in range(50):
            request = urllib.request.Request(url.rstrip("/") + "/reset_prefix_cache", data=b"", method="POST")
            with urllib.request.urlopen(request, timeout=30) as response:
                body = response.read()
            if b"false" not in body:
                break
            time.sleep(0.2)


def per_replica_cached(urls: list[str], before: list[dict[str, int]]) -> dict[str, dict[str, int]]:
    after = [vllm_counters([url]) for url in urls]
    return {
        url: {name.split(":", 1)[1]: a[name] - b[name] for name in VLLM_COUNTERS}
        for url, a, b in zip(urls, after, before, strict=True)
    }
