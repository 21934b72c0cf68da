"""The gateway's prefix memory (serving/prefix_memory.py): which replica served a prompt prefix
recently, the `prefix_seen` / `prefix_seen_replica` of request events. The memory alone (seen, not
seen, another replica, forgotten by size and by age), then two requests with one prefix through the
real gateway and vLLM, checked in metering's raw events."""

from __future__ import annotations

import uuid

import pytest

from infermeter.settings import Settings
from serving.prefix_memory import DEFAULT_MAX_AGE_S, DEFAULT_MAX_ENTRIES, PrefixMemory

SHARED = "You are the harbor's bookkeeper. " * 10  # > 256 characters: the whole key


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def chat(text: str) -> dict:
    return {"model": "m", "messages": [{"role": "system", "content": SHARED}, {"role": "user", "content": text}]}


def test_first_request_is_not_seen_the_next_one_names_its_replica():
    memory = PrefixMemory(clock=Clock())
    assert memory.observe("m", chat("first question"), "r0", served=True) is None
    assert memory.observe("m", chat("second question"), "r0", served=True) == "r0"  # same first 256 chars
    assert memory.observe("m", {"model": "m", "prompt": "another prompt"}, "r0", served=True) is None


def test_another_replica_is_named_and_becomes_the_latest():
    memory = PrefixMemory(clock=Clock())
    memory.observe("m", chat("a"), "r0", served=True)
    assert memory.observe("m", chat("b"), "r1", served=True) == "r0"  # served elsewhere before: residency
    assert memory.observe("m", chat("c"), "r1", served=True) == "r1"


def test_models_are_kept_apart_and_unserved_requests_are_not_remembered():
    memory = PrefixMemory(clock=Clock())
    memory.observe("m", chat("a"), "r0", served=True)
    assert memory.observe("other-model", chat("a"), "x0", served=True) is None
    # a request whose prompt never reached an engine (every try failed) is answered but not recorded
    assert memory.observe("m2", chat("a"), "y0", served=False) is None
    assert memory.observe("m2", chat("a"), "y0", served=True) is None
    assert memory.observe("m", chat("z"), None, served=False) == "r0"
    assert len(memory) == 3  # m, other-model, m2


def test_the_least_recently_served_is_forgotten_past_max_entries():
    memory = PrefixMemory(max_entries=3, clock=Clock())
    for n in range(3):
        memory.observe("m", {"prompt": f"prefix {n}"}, "r0", served=True)
    memory.observe("m", {"prompt": "prefix 0"}, "r0", served=True)  # 0 is now the most recent
    memory.observe("m", {"prompt": "prefix 3"}, "r0", served=True)  # forgets 1, the least recent
    assert len(memory) == 3
    assert memory.observe("m", {"prompt": "prefix 1"}, "r0", served=False) is None
    assert [memory.observe("m", {"prompt": f"prefix {n}"}, "r0", served=False) for n in (0, 2, 3)] == ["r0"] * 3


def test_a_prefix_older_than_max_age_is_forgotten():
    clock = Clock()
    memory = PrefixMemory(max_age_s=60, clock=clock)
    memory.observe("m", {"prompt": "old"}, "r0", served=True)
    clock.now += 30
    memory.observe("m", {"prompt": "young"}, "r1", served=True)
    clock.now += 30  # "old" is exactly 60 s old: still remembered
    assert memory.observe("m", {"prompt": "old"}, "r0", served=False) == "r0"
    clock.now += 0.001
    assert memory.observe("m", {"prompt": "old"}, "r0", served=False) is None
    assert memory.observe("m", {"prompt": "young"}, "r1", served=False) == "r1"
    assert len(memory) == 1
    clock.now += 31
    assert memory.observe("m", {"prompt": "young"}, "r1", served=True) is None  # forgotten, then served anew
    assert memory.observe("m", {"prompt": "young"}, "r1", served=False) == "r1"


def test_settings_give_the_bounds_and_zero_turns_it_off():
    from serving.gateway_context import GatewayState

    settings = Settings()
    assert (settings.prefix_memory_entries, settings.prefix_memory_max_age_s) == (DEFAULT_MAX_ENTRIES, DEFAULT_MAX_AGE_S)
    tuned = Settings(INFERMETER_PREFIX_MEMORY_ENTRIES=7, INFERMETER_PREFIX_MEMORY_MAX_AGE_S=5)
    memory = PrefixMemory.from_settings(tuned)
    assert (memory.max_entries, memory.max_age_s) == (7, 5.0)
    off = GatewayState(settings=Settings(INFERMETER_PREFIX_MEMORY_ENTRIES=0), upstreams=None, sink=None,
                       authenticator=None, admission=None, engine=None, source="s")
    assert off.prefix_memory is None
    with pytest.raises(ValueError):
        PrefixMemory(max_entries=0)


def test_two_requests_with_one_prefix_through_the_gateway(client, customer, pipeline):
    """prefix_seen false, then true with the replica that served the first (the session's one vLLM)."""
    prefix = f"Case {uuid.uuid4().hex}: " + "the ledger closes every hour and balances to the cent. " * 8
    ids = []
    for question in ("Who signs?", "Who pays?"):
        raw = client.completions.with_raw_response.create(
            model="tiny-llama", prompt=prefix + question, max_tokens=2, temperature=0
        )
        ids.append(raw.headers["x-request-id"])
    events = pipeline.request_events(customer.customer_id, 2)
    by_id = {event["data"]["request_id"]: event["data"] for event in events}
    first, second = (by_id[request_id] for request_id in ids)
    assert first["prefix_seen"] is False and "prefix_seen_replica" not in first
    assert (second["prefix_seen"], second["prefix_seen_replica"]) == (True, "tiny-cpu-0")
    assert second["replica_id"] == "tiny-cpu-0"
    assert second["cached_input_tokens"] > 0  # and vLLM did reuse it


def test_the_request_event_carries_the_claim_and_decodes_it():
    from datetime import UTC, datetime

    from metering.contract import decode_event, encode_event, request_event

    now = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)

    def event(**extra):
        return request_event(
            source="//gateway/t", request_id="req-1", customer_id="c", model="m", deployment_id="d",
            replica_id="r1", status="ok", input_tokens=10, cached_input_tokens=0, output_tokens=2, started_at=now,
            finished_at=now, **extra,
        )  # fmt: skip

    seen = event(prefix_seen=True, prefix_seen_replica="r0")
    assert (seen["data"]["prefix_seen"], seen["data"]["prefix_seen_replica"]) == (True, "r0")
    decoded = decode_event(encode_event(seen), now=now).data
    assert (decoded.prefix_seen, decoded.prefix_seen_replica) == (True, "r0")
    not_seen = event(prefix_seen=False)
    assert not_seen["data"]["prefix_seen"] is False and "prefix_seen_replica" not in not_seen["data"]
    assert decode_event(encode_event(not_seen), now=now).data.prefix_seen is False
    unknown = event()  # a producer that does not record it: absent, decoded as None
    assert "prefix_seen" not in unknown["data"]
    assert decode_event(encode_event(unknown), now=now).data.prefix_seen is None
