"""Prefix-aware routing against round robin on 2 real vLLM replicas: multi-turn conversations
hit the KV cache far more often when each conversation sticks to one replica."""

from __future__ import annotations

import uuid

import httpx

from serving.replay import block_text, reset_prefix_caches
from serving.tinymodel import SERVED_NAME
from serving.upstreams import parse_upstreams

CONVERSATIONS = 7  # odd, so that round robin does not send every turn of one conversation to one replica
TURNS = 4


def _conversation_prompt(conversation: int, turn: int) -> str:
    system = "".join(block_text(10_000 + conversation * 100 + n) for n in range(6))
    turns = "".join(block_text(20_000 + conversation * 100 + n) for n in range(2 * turn))
    return system + turns


def _run(policy: str, urls: list[str], pipeline, customer) -> tuple[int, int, dict[str, int]]:
    from serving.gateway import build_gateway, serve_in_thread

    reset_prefix_caches(urls)
    config = parse_upstreams(
        {
            "models": [
                {
                    "name": SERVED_NAME,
                    "deployment_id": "routing-test",
                    "routing": policy,
                    "replicas": [{"id": f"rt-{n}", "url": url} for n, url in enumerate(urls)],
                }
            ]
        }
    )
    settings = pipeline.settings.model_copy(update={"gateway_id": f"routing-{policy}-{uuid.uuid4().hex[:6]}"})
    served = serve_in_thread(build_gateway(settings, upstreams=config))
    cached = prompt = 0
    replicas: dict[str, int] = {}
    try:
        with httpx.Client(
            base_url=served.url, headers={"Authorization": f"Bearer {customer.token}"}, timeout=60
        ) as http:
            for turn in range(1, TURNS + 1):
                for conversation in range(CONVERSATIONS):
                    body = {
                        "model": SERVED_NAME, "prompt": _conversation_prompt(conversation, turn), "max_tokens": 1,
                        "temperature": 0, "ignore_eos": True,
                    }  # fmt: skip
                    response = http.post("/v1/completions", json=body)
                    assert response.status_code == 200, response.text
                    usage = response.json()["usage"]
                    cached += usage["prompt_tokens_details"]["cached_tokens"]
                    prompt += usage["prompt_tokens"]
    finally:
        served.stop()
    events = pipeline.request_events(customer.customer_id, CONVERSATIONS * TURNS)
    for event in events:
        replicas[event["data"]["replica_id"]] = replicas.get(event["data"]["replica_id"], 0) + 1
    assert sum(event["data"]["cached_input_tokens"] for event in events) == cached  # metered == served
    return cached, prompt, replicas


def test_prefix_routing_beats_round_robin_on_cache_hits(vllm, second_vllm, pipeline, key_store):
    from tests.serving.conftest import new_customer

    urls = [vllm.url, second_vllm.url]
    prefix_cached, prompt, prefix_split = _run("prefix", urls, pipeline, new_customer(key_store))
    rr_cached, rr_prompt, rr_split = _run("round_robin", urls, pipeline, new_customer(key_store))
    print(
        f"prefix: {prefix_cached}/{prompt} cached {prefix_split}; round robin: {rr_cached}/{rr_prompt} {rr_split}"
    )
    assert prompt == rr_prompt
    assert set(prefix_split) == set(rr_split) == {"rt-0", "rt-1"}  # both policies use both replicas
    # Every later turn of a conversation reuses all of its earlier blocks under prefix routing.
    ideal = sum((6 + 2 * (turn - 1)) * 32 for turn in range(2, TURNS + 1)) * CONVERSATIONS
    assert prefix_cached >= ideal
    assert prefix_cached > rr_cached * 1.3
