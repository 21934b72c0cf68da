"""Failover on real vLLM replicas: a replica killed with SIGKILL in the middle of a replay of
non-streamed requests. The session's `vllm` is the survivor; the victim is this module's own
replica (booted in parallel with the session's), so no other test loses its server.

Checked at the end of the real pipeline (spool -> Kafka -> metering -> Postgres):
- every request succeeds (a non-streamed request has sent the client nothing until vLLM answered,
  so every request the victim was holding, or was about to get, is served by the survivor);
- every request yields exactly one event (ids = the X-Request-Id the client got);
- the survivor's own /metrics counters grew by exactly the tokens metered on it; the victim's
  /metrics died with it, so the tokens metered on it are checked against the usage vLLM put in
  each of its responses;
- the dead replica is skipped: only the requests the kill caught (at most the ones in flight)
  were tried on it, each then served by the survivor (upstream_attempts=2).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from serving.tinymodel import SERVED_NAME
from serving.upstreams import parse_upstreams
from tests.serving.conftest import _start, new_customer, vllm_counter

REQUESTS = 48
CONCURRENCY = 4
KILL_AFTER = 12  # responses received before the victim is killed
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def victim(tmp_path_factory, vllm_python, tiny_model, request):
    # a short folder name: vLLM's IPC socket paths below it must fit in 107 bytes
    server = _start(vllm_python, tiny_model, tmp_path_factory.mktemp("vv"))
    try:
        request.getfixturevalue("vllm")  # the session's replica boots meanwhile
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_a_replica_killed_mid_replay_is_failed_over(vllm, victim, pipeline, key_store):
    from serving.gateway import build_gateway, serve_in_thread

    customer = new_customer(key_store)
    config = parse_upstreams(
        {
            "models": [
                {
                    "name": SERVED_NAME,
                    "deployment_id": "failover-test",
                    "routing": "round_robin",  # both replicas serve from the first requests on
                    "replicas": [{"id": "survivor", "url": vllm.url}, {"id": "victim", "url": victim.url}],
                }
            ]
        }
    )
    settings = pipeline.settings.model_copy(
        update={
            "gateway_id": f"failover-{uuid.uuid4().hex[:6]}",
            "failover_attempts": 2,
            "breaker_cooldown_s": 120.0,  # no probe of the dead replica during the test
        }
    )
    served = serve_in_thread(build_gateway(settings, upstreams=config))
    survivor_before = {
        name: vllm_counter(vllm, name)
        for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")
    }
    done = 0
    done_lock = threading.Lock()
    local = threading.local()

    def one(n: int) -> tuple[int, str, dict, float]:
        http = getattr(local, "http", None)
        if http is None:
            http = local.http = httpx.Client(
                base_url=served.url, headers={"Authorization": f"Bearer {customer.token}"}, timeout=120
            )
        body = {
            "model": SERVED_NAME, "prompt": f"Request {n} asks the harbor master about ledger {n * 7}.",
            "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
        }  # fmt: skip
        started = time.monotonic()
        response = http.post("/v1/completions", json=body)
        nonlocal done
        with done_lock:
            done += 1
        usage = response.json().get("usage") if response.status_code == 200 else None
        return response.status_code, response.headers.get("x-request-id", ""), usage or {}, started, time.monotonic()

    try:
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            futures = [pool.submit(one, n) for n in range(REQUESTS)]
            deadline = time.monotonic() + 60
            while done < KILL_AFTER and time.monotonic() < deadline:
                time.sleep(0.005)
            os.killpg(victim.process.pid, signal.SIGKILL)  # the API server and its engine, no goodbye
            results = [future.result() for future in futures]
    finally:
        served.stop()
    victim.process.wait(10)

    # Every request succeeded.
    assert [status for status, *_ in results] == [200] * REQUESTS
    request_ids = {request_id for _, request_id, *_ in results}
    assert len(request_ids) == REQUESTS

    # Exactly one event per client request.
    events = pipeline.request_events(customer.customer_id, REQUESTS, timeout_s=60)
    pipeline.settle(1.0)
    events = pipeline.request_events(customer.customer_id, REQUESTS)
    assert len(events) == REQUESTS
    by_id = {event["data"]["request_id"]: event["data"] for event in events}
    assert set(by_id) == request_ids
    assert all(data["status"] == "ok" for data in by_id.values())

    # Metered == what the serving replica counted (the survivor's /metrics; the victim's died).
    on_survivor = [d for d in by_id.values() if d["replica_id"] == "survivor"]
    on_victim = [d for d in by_id.values() if d["replica_id"] == "victim"]
    assert on_victim, "the victim served nothing before it was killed"
    prompt_delta = (
        vllm_counter(vllm, "vllm:prompt_tokens_total") - survivor_before["vllm:prompt_tokens_total"]
    )
    output_delta = (
        vllm_counter(vllm, "vllm:generation_tokens_total") - survivor_before["vllm:generation_tokens_total"]
    )
    assert sum(d["input_tokens"] for d in on_survivor) == prompt_delta
    assert sum(d["output_tokens"] for d in on_survivor) == output_delta
    usage_by_id = {request_id: usage for _, request_id, usage, *_ in results}
    for data in by_id.values():  # every event carries exactly what vLLM reported to the client
        usage = usage_by_id[data["request_id"]]
        assert (data["input_tokens"], data["output_tokens"]) == (
            usage["prompt_tokens"],
            usage["completion_tokens"],
        )
        assert data["output_tokens"] == MAX_TOKENS

    # The dead replica was skipped: only requests the kill caught were tried on it, once each.
    retried = [d for d in by_id.values() if d["upstream_attempts"] == 2]
    assert 1 <= len(retried) <= CONCURRENCY, [d["upstream_attempts"] for d in by_id.values()]
    assert all(d["replica_id"] == "survivor" for d in retried)
    assert all(d["upstream_attempts"] in (1, 2) for d in by_id.values())
    # Once the gateway has seen the victim fail (every retried request had a failed try on it before it
    # finished), the breaker is open: a request started after that goes straight to the survivor. (Not
    # a fixed delay after the kill: how soon the reset reaches the gateway depends on the machine's load.)
    finished_at = {request_id: finished for _, request_id, _, _, finished in results}
    seen_failing = max(finished_at[d["request_id"]] for d in retried)
    started_after = [by_id[request_id] for _, request_id, _, started, _ in results if started > seen_failing]
    assert started_after, "no request started after the gateway saw the victim fail"
    assert all((d["replica_id"], d["upstream_attempts"]) == ("survivor", 1) for d in started_after), started_after
    print(
        f"victim served {len(on_victim)}, survivor {len(on_survivor)} ({len(retried)} after a failed try);"
        f" survivor counted {prompt_delta:.0f} prompt / {output_delta:.0f} output tokens"
    )
