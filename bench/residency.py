"""Data residency's cost on the gateway's hot path: the routing step with and without it, in one run.

    python -m bench.residency [--calls 200000] [--replicas 3] [--json FILE]

In-process (no network), on one event loop, the way serving/proxy.py runs them per request:
- `plain`: `pick_replica(route, body, healthy_only=True)`, the routing step before residency;
- `unrestricted`: `await ResidencyCache.excluded(customer, route)` (cached: a customer without a
  restriction) then the same pick: what every request pays with residency on;
- `restricted`: the cached lookup, then `pick_allowed` among the replicas of the customer's regions
  (prefix routing over the allowed ones).
Prompts differ per call (so the prefix hash is real work). Prints µs per call and each variant's
extra cost over `plain`, as a share of the gateway's 0.5 ms added-latency target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from serving.residency import ResidencyCache, pick_allowed
from serving.routing import pick_replica
from serving.upstreams import parse_upstreams

TARGET_ADDED_S = 0.0005


def _config(replicas: int):
    regions = ["eu-west", "eu-central", "us-east"]
    return parse_upstreams({"models": [{"name": "m", "deployment_id": "d", "routing": "prefix", "replicas": [
        {"id": f"r{n}", "url": f"http://127.0.0.1:{9000 + n}", "region": regions[n % 3]} for n in range(replicas)
    ]}]})  # fmt: skip


async def _run(calls: int, replicas: int) -> dict[str, float]:
    route = _config(replicas).route("m")
    cache = ResidencyCache(None, ttl_s=3600)
    cache.prime("free", None)
    cache.prime("eu", ["eu-west", "eu-central"])
    bodies = [{"model": "m", "prompt": f"Request {n} asks the harbor master about ledger {n * 7}."} for n in range(1024)]

    async def plain(n: int) -> None:
        pick_replica(route, bodies[n & 1023], healthy_only=True)

    async def unrestricted(n: int) -> None:
        excluded = await cache.excluded("free", route)
        assert excluded is None
        pick_replica(route, bodies[n & 1023], healthy_only=True)

    async def restricted(n: int) -> None:
        excluded = await cache.excluded("eu", route)
        pick_allowed(route, bodies[n & 1023], excluded)

    results: dict[str, list[float]] = {"plain": [], "unrestricted": [], "restricted": []}
    variants = {"plain": plain, "unrestricted": unrestricted, "restricted": restricted}
    block = max(1, calls // 20)
    for _ in range(20):  # alternating blocks: every variant sees the same minutes of this shared machine
        for name, step in variants.items():
            started = time.perf_counter()
            for n in range(block):
                await step(n)
            results[name].append((time.perf_counter() - started) / block)
    return {name: sorted(times)[len(times) // 2] for name, times in results.items()}  # median block


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--json", dest="json_file")
    args = parser.parse_args()
    per_call = asyncio.run(_run(args.calls, args.replicas))
    base = per_call["plain"]
    print(f"routing step, {args.replicas} replicas, {args.calls:,} calls per variant (median of 20 blocks):")
    for name, seconds in per_call.items():
        extra = seconds - base
        print(f"  {name:13s} {seconds * 1e6:7.2f} µs/call  x{seconds / base:5.2f} of plain  "
              f"extra {extra * 1e6:+6.2f} µs = {extra / TARGET_ADDED_S:+.2%} of the 0.5 ms target")
    if args.json_file:
        with open(args.json_file, "w") as out:
            json.dump({"replicas": args.replicas, "calls": args.calls, "seconds_per_call": per_call}, out, indent=2)


if __name__ == "__main__":
    main()
