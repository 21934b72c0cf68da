"""Operating points of a deployment: aggregate output throughput vs per-request output speed.

`infermeter bench pareto --upstream URL` sweeps client concurrency against a vLLM (or gateway)
endpoint. At each level it keeps that many streaming completions in flight for a while and
measures:
- aggregate output tokens/s (all requests together: what the GPU-hour produces);
- per-request output tokens/s (median over requests of output tokens / request time, first
  byte to last: what one user sees), plus median time to first token;
- $ per 1M output tokens implied by INFERMETER_GPU_HOUR_PRICE x gpu_count at that throughput:
  price_per_hour * gpus / (aggregate tok/s * 3600) * 1e6 (Decimal arithmetic).
Raising concurrency trades per-request speed for aggregate throughput; the points that no other
point beats on both axes form the Pareto frontier. Pricing per token is then a choice of where
on this curve the deployment runs. Output: a table, a JSON file and an interactive plotly HTML
plot (no PNG: that would need kaleido/Chrome; the HTML opens anywhere).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import aiohttp

PROMPT_WORD = " ledger"  # one token in the tiny model's vocabulary


@dataclass
class OperatingPoint:
    concurrency: int
    requests: int
    errors: int
    output_tokens: int
    seconds: float
    aggregate_tok_s: float
    per_request_tok_s: float
    ttft_p50_s: float
    usd_per_million_output: str  # Decimal as a string
    on_frontier: bool = False


def cost_per_million(gpu_hour_price: Decimal, gpu_count: int, aggregate_tok_s: float) -> Decimal:
    """$ per 1M output tokens at this throughput (exact Decimal; throughput rounded to 1e-3 tok/s)."""
    throughput = Decimal(str(round(aggregate_tok_s, 3)))
    if throughput <= 0:
        return Decimal("Infinity")
    per_second = gpu_hour_price * gpu_count / Decimal(3600)
    return (per_second / throughput * Decimal(1_000_000)).quantize(Decimal("0.0001"), rounding=ROUND_HALF_UP)


def mark_frontier(points: list[OperatingPoint]) -> None:
    for point in points:
        point.on_frontier = not any(
            other is not point
            and other.aggregate_tok_s >= point.aggregate_tok_s
            and other.per_request_tok_s >= point.per_request_tok_s
            and (
                other.aggregate_tok_s > point.aggregate_tok_s
                or other.per_request_tok_s > point.per_request_tok_s
            )
            for other in points
        )


async def _stream_one(session, url: str, headers: dict, body: dict) -> tuple[int, float, float, float] | None:
    """(output tokens, start, first token, end) of one streamed completion, or None on error."""
    start = time.perf_counter()
    first = None
    tokens = 0
    try:
        async with session.post(url, json=body, headers=headers) as response:
            if response.status != 200:
                await response.read()
                return None
            async for line in response.content:
                if not line.startswith(b"data: {"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and first is None:
                    first = time.perf_counter()
                usage = chunk.get("usage")
                if usage and not chunk.get("choices"):
                    tokens = usage.get("completion_tokens", 0)
    except (TimeoutError, aiohttp.ClientError):
        return None
    end = time.perf_counter()
    return tokens, start, first or end, end


async def measure_point(
    url: str, headers: dict, body: dict, concurrency: int, duration_s: float
) -> tuple[list[tuple[int, float, float, float]], int, float]:
    results: list[tuple[int, float, float, float]] = []
    errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        started = time.perf_counter()
        stop_at = started + duration_s

        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < stop_at:
                outcome = await _stream_one(session, url, headers, body)
                if outcome is None:
                    errors += 1
                else:
                    results.append(outcome)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return results, errors, seconds


def sweep(
    upstream: str,
    *,
    model: str,
    levels: list[int],
    duration_s: float,
    max_tokens: int,
    prompt_tokens: int,
    gpu_hour_price: Decimal,
    gpu_count: int = 1,
    api_key: str | None = None,
    on_point: Callable[[OperatingPoint], None] | None = None,
) -> list[OperatingPoint]:
    url = upstream.rstrip("/")
    url = (url if url.endswith("/v1") else url + "/v1") + "/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {
        "model": model,
        "prompt": PROMPT_WORD * prompt_tokens,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    points = []
    for concurrency in levels:
        results, errors, seconds = asyncio.run(measure_point(url, headers, body, concurrency, duration_s))
        # Count only what finished inside the window's wall time (requests finish past it: fine,
        # their tokens and the extra seconds are both counted).
        output = sum(r[0] for r in results)
        wall = max((r[3] for r in results), default=time.perf_counter()) - min(
            (r[1] for r in results), default=0.0
        )
        aggregate = output / wall if results and wall > 0 else 0.0
        # Per request: output tokens over the whole request time (what one user waits for). The
        # time after the first token alone is not usable: under load vLLM flushes several tokens
        # per SSE chunk, so first-to-last chunk can be ~0 s.
        speeds = [r[0] / (r[3] - r[1]) for r in results if r[0] > 0 and r[3] > r[1]]
        point = OperatingPoint(
            concurrency=concurrency,
            requests=len(results),
            errors=errors,
            output_tokens=output,
            seconds=round(wall, 3),
            aggregate_tok_s=round(aggregate, 1),
            per_request_tok_s=round(statistics.median(speeds), 1) if speeds else 0.0,
            ttft_p50_s=round(statistics.median(r[2] - r[1] for r in results), 4) if results else 0.0,
            usd_per_million_output=str(cost_per_million(gpu_hour_price, gpu_count, aggregate)),
        )
        points.append(point)
        if on_point is not None:
            on_point(point)
    mark_frontier(points)
    return points


def write_plot(points: list[OperatingPoint], path: Path, *, title: str) -> Path:
    import plotly.graph_objects as go

    frontier = sorted((p for p in points if p.on_frontier), key=lambda p: p.aggregate_tok_s)
    figure = go.Figure()
    figure.add_trace(
        go.Scatter(
            x=[p.aggregate_tok_s for p in points],
            y=[p.per_request_tok_s for p in points],
            mode="markers+text",
            text=[f"c={p.concurrency}<br>${p.usd_per_million_output}/1M" for p in points],
            textposition="top center",
            name="operating points",
        )
    )
    figure.add_trace(
        go.Scatter(
            x=[p.aggregate_tok_s for p in frontier],
            y=[p.per_request_tok_s for p in frontier],
            mode="lines",
            name="Pareto frontier",
        )
    )
    figure.update_layout(
        title=title,
        xaxis_title="aggregate output tokens/s (the deployment)",
        yaxis_title="per-request output tokens/s (one user)",
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.write_html(str(path), include_plotlyjs=True)
    return path


def write_json(points: list[OperatingPoint], path: Path, **meta) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**meta, "points": [asdict(p) for p in points]}, indent=2))
    return path
