"""Pareto sweep (against the session's vLLM) and prefix routing (pure)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from serving.pareto import OperatingPoint, cost_per_million, mark_frontier, sweep, write_json, write_plot
from serving.routing import pick_replica, prefix_key, rank_replicas
from serving.upstreams import parse_upstreams


def test_cost_per_million_is_exact_decimal():
    # $2/h on one GPU at 1000 tok/s: 2 / 3600 / 1000 * 1e6 = 0.5556 $/1M
    assert cost_per_million(Decimal("2.00"), 1, 1000.0) == Decimal("0.5556")
    assert cost_per_million(Decimal("2.00"), 2, 1000.0) == Decimal("1.1111")


def test_frontier_keeps_only_undominated_points():
    def point(c, aggregate, per_request):
        return OperatingPoint(c, 1, 0, 1, 1.0, aggregate, per_request, 0.1, "1")

    points = [point(1, 100, 50), point(2, 180, 45), point(4, 170, 30), point(8, 300, 20)]
    mark_frontier(points)
    assert [p.on_frontier for p in points] == [True, True, False, True]


def test_pareto_sweep_against_vllm(vllm, tmp_path):
    points = sweep(
        vllm.url, model="tiny-llama", levels=[1, 4], duration_s=1.5, max_tokens=16, prompt_tokens=32,
        gpu_hour_price=Decimal("2.00"),
    )  # fmt: skip
    assert [p.concurrency for p in points] == [1, 4]
    # ignore_eos: every request streams exactly max_tokens, all of them counted
    assert all(p.requests > 0 and p.errors == 0 and p.output_tokens == 16 * p.requests for p in points)
    for p in points:  # what each point says follows from what it measured (whether batching paid is
        # the machine's business, not a test's: on 2 busy cores c=4 can lose to c=1)
        assert p.aggregate_tok_s == pytest.approx(p.output_tokens / p.seconds, rel=1e-2)
        assert Decimal(p.usd_per_million_output) == pytest.approx(
            cost_per_million(Decimal("2.00"), 1, p.aggregate_tok_s), rel=Decimal("1e-2")
        )
        assert 0 < p.ttft_p50_s < p.seconds and p.per_request_tok_s > 0
    cheaper = min(points, key=lambda p: Decimal(p.usd_per_million_output))
    assert cheaper.aggregate_tok_s == max(p.aggregate_tok_s for p in points)  # cost follows throughput
    assert cheaper.on_frontier  # the highest throughput is never dominated
    assert write_plot(points, tmp_path / "p.html", title="t").stat().st_size > 10_000
    assert write_json(points, tmp_path / "p.json").exists()


def _route(policy: str):
    return parse_upstreams(
        {
            "models": [
                {
                    "name": "m",
                    "deployment_id": "d",
                    "routing": policy,
                    "replicas": [{"id": f"r{n}", "url": f"http://127.0.0.1:{9000 + n}"} for n in range(3)],
                }
            ]
        }
    ).route("m")


def test_prefix_routing_is_sticky_spreads_and_falls_back_under_load():
    route = _route("prefix")
    conversation = "system: you are a ledger\\nuser: " + "tell me about the harbor " * 20
    body = {"prompt": conversation}
    first = pick_replica(route, body)
    assert all(pick_replica(route, {"prompt": conversation + f" turn {n}"}) is first for n in range(10))
    chosen = {pick_replica(route, {"prompt": f"document {n} " * 40}).replica_id for n in range(60)}
    assert chosen == {"r0", "r1", "r2"}  # different prefixes spread over every replica
    first.in_flight = 10  # overloaded: the next replica in this prefix's rank order takes it
    fallback = pick_replica(route, body)
    assert fallback is not first
    assert fallback is rank_replicas(prefix_key(body), route.replicas)[1]
    first.down_until = float("inf")
    first.in_flight = 0
    assert pick_replica(route, body) is not first  # a down replica is skipped


def test_round_robin_cycles():
    route = _route("round_robin")
    assert [pick_replica(route, {"prompt": "x"}).replica_id for _ in range(6)] == [
        "r1",
        "r2",
        "r0",
        "r1",
        "r2",
        "r0",
    ]
