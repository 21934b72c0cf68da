"""The gateway against a real vLLM CPU server, checked at the end of the real pipeline
(emitter spool -> Kafka -> metering consumer -> Postgres)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from datetime import datetime

import aiohttp
import httpx
import openai
import pytest

from tests.serving.conftest import new_customer, upstream_config, vllm_access_count, vllm_counter

MODEL = "tiny-llama"
FIXED = {"temperature": 0, "extra_body": {"ignore_eos": True}}
LONG_PREFIX = " ".join(
    f"Clause {n} of the shared contract says the ledger balances every hour." for n in range(40)
)


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _assert_timings(data: dict) -> None:
    started, finished = _when(data["started_at"]), _when(data["finished_at"])
    assert started <= finished
    if data["first_token_at"] is not None:
        assert started <= _when(data["first_token_at"]) <= finished


def test_chat_non_streaming_usage_matches_vllm(client, customer, pipeline):
    response = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count the lanterns near the river."}],
        max_tokens=7,
        **FIXED,
    )
    assert response.choices[0].message.content is not None
    assert response.usage.completion_tokens == 7

    [event] = pipeline.request_events(customer.customer_id, 1)
    data = event["data"]
    assert event["subject"] == customer.customer_id
    assert event["id"] == data["request_id"]
    assert data["status"] == "ok"
    assert data["input_tokens"] == response.usage.prompt_tokens
    assert data["output_tokens"] == response.usage.completion_tokens == 7
    assert data["cached_input_tokens"] == response.usage.prompt_tokens_details.cached_tokens
    assert (data["model"], data["deployment_id"], data["replica_id"]) == (MODEL, "tiny-cpu", "tiny-cpu-0")
    assert data["api_key_id"] == customer.key_id
    assert "project" not in data  # the key has no project: the "no project" bucket
    assert data["task_id"] is None and data["attempt"] == 1
    _assert_timings(data)
    [(requests, input_tokens, output_tokens)] = pipeline.rows(
        "SELECT sum(requests_ok), sum(input_tokens), sum(output_tokens) FROM request_rollup_hourly"
        " WHERE customer_id = %s",
        (customer.customer_id,),
    )
    assert (requests, input_tokens, output_tokens) == (1, response.usage.prompt_tokens, 7)


def test_completions_streaming_with_usage_requested(client, customer, pipeline):
    stream = client.completions.create(
        model=MODEL, prompt="The harbor keeps a ledger", max_tokens=9, stream=True,
        stream_options={"include_usage": True}, **FIXED,
    )  # fmt: skip
    chunks = list(stream)
    usage_chunks = [chunk for chunk in chunks if chunk.usage is not None]
    # Exactly what OpenAI promises: usage only on the final, choice-less chunk.
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1] and not chunks[-1].choices
    usage = usage_chunks[0].usage
    assert usage.completion_tokens == 9

    [event] = pipeline.request_events(customer.customer_id, 1)
    data = event["data"]
    assert data["status"] == "ok"
    assert (data["input_tokens"], data["output_tokens"]) == (usage.prompt_tokens, usage.completion_tokens)
    assert data["cached_input_tokens"] == usage.prompt_tokens_details.cached_tokens
    assert data["first_token_at"] is not None
    _assert_timings(data)


def test_chat_streaming_without_usage_is_still_metered(client, customer, pipeline):
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Sing about the warehouse."}], max_tokens=6, stream=True,
        **FIXED,
    )  # fmt: skip
    chunks = list(stream)
    assert all(chunk.usage is None for chunk in chunks), "usage leaked to a client that did not ask for it"
    assert all(chunk.choices for chunk in chunks), "the usage-only chunk leaked"
    text_chunks = sum(1 for chunk in chunks if chunk.choices[0].delta.content)

    [event] = pipeline.request_events(customer.customer_id, 1)
    data = event["data"]
    assert data["status"] == "ok"
    assert data["output_tokens"] == 6
    assert text_chunks <= 6
    assert data["input_tokens"] > 0
    assert data["tags"]["usage_source"] == "upstream"


def test_a_keys_project_is_carried_by_its_requests_event(gateway, key_store, pipeline):
    customer_id = f"cust-{uuid.uuid4().hex[:10]}"
    key_id, token = key_store.create(customer_id, project_id="search")
    with contextlib.closing(openai.OpenAI(base_url=gateway.url + "/v1", api_key=token, max_retries=0)) as client:
        client.completions.create(model=MODEL, prompt="Ask the pilot", max_tokens=2, **FIXED)
    [event] = pipeline.request_events(customer_id, 1)
    assert (event["data"]["api_key_id"], event["data"]["project"]) == (key_id, "search")


def test_continuous_usage_passes_through_when_asked(gateway, customer):
    body = {
        "model": MODEL, "prompt": "Ask the pilot", "max_tokens": 4, "stream": True, "temperature": 0,
        "ignore_eos": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }  # fmt: skip
    with httpx.stream(
        "POST", gateway.url + "/v1/completions", json=body, headers=_auth(customer), timeout=60
    ) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: {")]
    # every chunk carries usage, the text chunks too (not only the final usage chunk). How many text
    # chunks the 4 tokens come in is vLLM's: behind a busy client it merges tokens into one chunk.
    usages = [json.loads(line.removeprefix("data: ")).get("usage") for line in lines]
    assert len(usages) >= 2 and all(usages), lines
    assert [u["completion_tokens"] for u in usages] == sorted(u["completion_tokens"] for u in usages)
    assert usages[-1]["completion_tokens"] == 4


def test_repeated_long_prefix_is_metered_as_cached(client, customer, pipeline, vllm):
    cached_before = vllm_counter(vllm, "vllm:prompt_tokens_cached_total")
    usages = []
    for question in ("Who signs the invoice?", "Who settles the budget?"):
        response = client.completions.create(
            model=MODEL, prompt=LONG_PREFIX + " " + question, max_tokens=3, **FIXED
        )
        usages.append(response.usage)
    assert usages[1].prompt_tokens_details.cached_tokens > 0

    events = pipeline.request_events(customer.customer_id, 2)
    by_input = sorted(event["data"]["cached_input_tokens"] for event in events)
    assert by_input == sorted(u.prompt_tokens_details.cached_tokens for u in usages)
    assert max(by_input) >= 32 * 5  # whole 32-token blocks of the shared ~500-token prefix
    cached_after = vllm_counter(vllm, "vllm:prompt_tokens_cached_total")
    assert cached_after - cached_before == sum(by_input)  # nothing else runs against vLLM meanwhile


def _auth(customer) -> dict[str, str]:
    return {"Authorization": f"Bearer {customer.token}"}


def test_client_disconnect_mid_stream_meters_the_tokens_generated(gateway, customer, pipeline, vllm):
    body = {
        "model": MODEL, "prompt": "Tell the long story of the harbor", "max_tokens": 1900, "stream": True,
        "temperature": 0, "ignore_eos": True,
    }  # fmt: skip

    async def read_some_then_leave() -> int:
        seen = 0
        async with aiohttp.ClientSession() as session:
            async with session.post(
                gateway.url + "/v1/completions", json=body, headers=_auth(customer)
            ) as response:
                assert response.status == 200
                async for line in response.content:
                    if line.startswith(b"data: {"):
                        seen += 1
                        if seen == 20:
                            break
            # leaving the block closes the connection mid-stream
        return seen

    # On a starved machine vLLM can stream all 1,900 tokens to the gateway before the gateway's
    # event loop runs again and sees the client gone: that request is then `ok`, whole, and billed
    # whole (vLLM generated every token). The test asks for one cancelled request in 3 tries, and
    # checks every try's one event against what vLLM generated.
    cancelled = None
    for attempt in range(1, 4):
        generated_before = vllm_counter(vllm, "vllm:generation_tokens_total")
        seen = asyncio.run(read_some_then_leave())
        data = pipeline.request_events(customer.customer_id, attempt)[-1]["data"]
        # vLLM aborted the request (or finished it): nothing runs
        _wait_for(lambda: vllm_counter(vllm, "vllm:num_requests_running") == 0)
        generated = vllm_counter(vllm, "vllm:generation_tokens_total") - generated_before
        if data["status"] == "ok":
            assert data["output_tokens"] == generated == 1900
            continue
        cancelled = data
        assert data["status"] == "cancelled"
        assert data["tags"]["reason"] == "client_disconnected"
        assert seen <= data["output_tokens"] < 1900
        assert data["input_tokens"] > 0  # known from the first chunk's continuous usage
        # The event counts what vLLM had streamed to the gateway when the client left. The engine may
        # run ahead of its own HTTP stream before it sees the abort (a few tokens when idle, hundreds
        # on a loaded machine); those never reached anyone and are not billed.
        assert data["output_tokens"] <= generated <= 1900
        break
    assert cancelled is not None, "in 3 tries vLLM always finished before the gateway saw the client leave"
    pipeline.settle()
    assert len(pipeline.request_events(customer.customer_id, attempt)) == attempt  # one event per request


def _wait_for(condition, timeout_s: float = 20.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_upstream_down_is_a_clear_503_and_an_error_event(client, customer, pipeline):
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="offline-model", messages=[{"role": "user", "content": "hello"}])
    assert caught.value.status_code in (502, 503)
    error = caught.value.body
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "upstream_unavailable"
    assert "offline-0" in error["message"]

    [event] = pipeline.request_events(customer.customer_id, 1)
    data = event["data"]
    assert (data["status"], data["model"], data["replica_id"]) == ("error", "offline-model", "offline-0")
    assert (data["input_tokens"], data["output_tokens"]) == (0, 0)


BAD_BODIES = [
    (b"{not json", 400),
    (b"[1, 2]", 400),
    (b'{"messages": [{"role": "user", "content": "hi"}]}', 400),
    (b'{"model": "tiny-llama"}', 400),
    (b'{"model": "tiny-llama", "messages": "hi"}', 400),
    (b'{"model": "tiny-llama", "messages": [{"role": "wizard", "content": "hi"}]}', 400),
    (b'{"model": "tiny-llama", "messages": [{"role": "user", "content": 5}]}', 400),
    (b'{"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "x"}', 400),
    (b'{"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}', 400),
    (b'{"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}', 400),
    (b'{"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}', 400),
    (b'{"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}', 404),
]


def test_bad_bodies_get_openai_errors_and_never_reach_vllm(gateway, customer, pipeline, vllm):
    reached_before = vllm_access_count(vllm)
    with httpx.Client(base_url=gateway.url, headers=_auth(customer), timeout=30) as http:
        for raw, status in BAD_BODIES:
            response = http.post(
                "/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"}
            )
            assert response.status_code == status, raw
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}, raw
        response = http.post("/v1/completions", json={"model": MODEL, "prompt": 7})
        assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"
        # a good request right after goes through: the counter below does move when vLLM is reached
        assert (
            http.post("/v1/completions", json={"model": MODEL, "prompt": "ok", "max_tokens": 1}).status_code
            == 200
        )
    assert vllm_access_count(vllm) == reached_before + 1
    pipeline.request_events(customer.customer_id, 1)
    pipeline.settle()
    assert len(pipeline.request_events(customer.customer_id, 1)) == 1  # bad bodies are not metered


def test_invalid_and_revoked_keys_get_401(gateway, key_store, pipeline):
    with pytest.raises(openai.AuthenticationError) as caught:
        openai.OpenAI(
            base_url=gateway.url + "/v1", api_key="im_live_0000000000000000_" + "x" * 43
        ).models.list()
    assert caught.value.body["type"] == "authentication_error"
    someone = new_customer(key_store)
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=someone.token, max_retries=0)
    assert [model.id for model in client.models.list()] == [MODEL, "offline-model"]
    key_store.revoke(someone.key_id)  # another process's key store: the gateway learns within its cache TTL
    _wait_for(
        lambda: _status(gateway, someone.token) == 401, timeout_s=float(pipeline.settings.key_cache_ttl_s) + 5
    )


def _status(gateway, token: str) -> int:
    return httpx.get(gateway.url + "/v1/models", headers={"Authorization": f"Bearer {token}"}).status_code


def test_tasks_are_tagged_and_outcomes_reported_only_by_their_customer(
    client, customer, pipeline, key_store, gateway
):
    for attempt in (1, 2):
        client.completions.create(
            model=MODEL, prompt="Verify the report", max_tokens=2,
            extra_headers={"X-Infermeter-Task-Id": "task-42", "X-Infermeter-Attempt": str(attempt)}, **FIXED,
        )  # fmt: skip
    events = pipeline.request_events(customer.customer_id, 2)
    assert sorted((e["data"]["task_id"], e["data"]["attempt"]) for e in events) == [
        ("task-42", 1),
        ("task-42", 2),
    ]

    other = new_customer(key_store)
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        # another customer can neither report on this task nor learn that it exists
        denied = http.post("/v1/tasks/task-42/outcome", json={"outcome": "failed"}, headers=_auth(other))
        unknown = http.post(
            "/v1/tasks/no-such-task/outcome", json={"outcome": "failed"}, headers=_auth(other)
        )
        assert denied.status_code == unknown.status_code == 404
        assert denied.json()["error"]["message"].replace("task-42", "X") == unknown.json()["error"][
            "message"
        ].replace("no-such-task", "X")
        bad = http.post("/v1/tasks/task-42/outcome", json={"outcome": "great"}, headers=_auth(customer))
        assert bad.status_code == 400
        # another gateway process never saw the task: ownership then comes from metering's task_attempts
        gateway.state.recent_tasks.clear()
        ok = http.post(
            "/v1/tasks/task-42/outcome",
            json={"outcome": "succeeded", "finished_at": "2026-11-02T10:00:00Z"},
            headers=_auth(customer),
        )
        assert ok.status_code == 202, ok.text
        # a producer credential (a verifier behind the gateway) reports under the gateway's own source
        verified = http.post(
            "/v1/tasks/task-42/outcome",
            json={"outcome": "failed", "finished_at": "2026-11-02T09:00:00Z", "customer_id": customer.customer_id},
            headers={"Authorization": f"Bearer {pipeline.settings.producer_token}"},
        )
        assert verified.status_code == 202, verified.text

    events = pipeline.events(customer.customer_id, "infermeter.task.v1", 2)
    # a customer's own report carries its own source, never the gateway's (which a book may trust)
    assert sorted((e["source"], e["data"]["outcome"]) for e in events) == [
        (f"//customer/{customer.customer_id}", "succeeded"),
        (gateway.state.source, "failed"),
    ]
    assert gateway.state.source.startswith("infermeter://gateway/")
    assert pipeline.rows(
        "SELECT outcome FROM task_outcomes WHERE customer_id = %s AND task_id = %s",
        (customer.customer_id, "task-42"),
    ) == [("succeeded",)]
    assert pipeline.rows(
        "SELECT source FROM task_outcome_reports WHERE customer_id = %s AND task_id = %s ORDER BY source",
        (customer.customer_id, "task-42"),
    ) == [(f"//customer/{customer.customer_id}",), (gateway.state.source,)]
    assert pipeline.rows("SELECT count(*) FROM raw_events WHERE customer_id = %s", (other.customer_id,)) == [
        (0,)
    ]


def test_tool_usage_events(gateway, customer, pipeline):
    with httpx.Client(base_url=gateway.url, headers=_auth(customer), timeout=30) as http:
        response = http.post(
            "/v1/events", json={"meter": "tool_calls", "quantity": "3", "task_id": "t-1", "id": "u-1"}
        )
        assert response.status_code == 202, response.text
        again = http.post(
            "/v1/events", json={"meter": "tool_calls", "quantity": "3", "task_id": "t-1", "id": "u-1"}
        )
        assert again.status_code == 202  # a retry with the same id is deduplicated by metering
        assert http.post("/v1/events", json={"meter": "Bad Meter!", "quantity": "1"}).status_code == 400
        spoof = http.post(
            "/v1/events", json={"meter": "tool_calls", "quantity": "1", "customer_id": "someone-else"}
        )
        assert spoof.status_code == 403
    [event] = pipeline.events(customer.customer_id, "infermeter.usage.v1", 1)
    assert event["data"]["meter"] == "tool_calls" and event["data"]["quantity"] == "3"
    assert event["source"] == f"//customer/{customer.customer_id}"
    pipeline.settle()
    assert len(pipeline.events(customer.customer_id, "infermeter.usage.v1", 1)) == 1


def test_rate_limited_request_is_rejected_and_metered(client, customer, pipeline):
    from infermeter.db import get_engine
    from serving.budgets import set_budget

    set_budget(get_engine(pipeline.database_url), customer.customer_id, rpm=1)
    client.completions.create(model=MODEL, prompt="first", max_tokens=1, **FIXED)
    with pytest.raises(openai.RateLimitError) as caught:
        client.completions.create(model=MODEL, prompt="second", max_tokens=1, **FIXED)
    assert caught.value.body["code"] and caught.value.response.headers.get("retry-after")
    events = pipeline.request_events(customer.customer_id, 2)
    assert sorted(event["data"]["status"] for event in events) == ["ok", "rejected"]
    [rejected] = [event["data"] for event in events if event["data"]["status"] == "rejected"]
    assert rejected["tags"]["reason"] == "rate_limit_requests"
    assert (rejected["input_tokens"], rejected["output_tokens"], rejected["replica_id"]) == (0, 0, None)


def test_wrong_keys_make_their_address_wait_and_no_other(pipeline, key_store):
    """INFERMETER_AUTH_FAILURES_ALLOWED=2: two wrong keys from one address are answered 401 as they are;
    the third is still 401 and starts a 1 s wait, during which that address gets 429 with Retry-After
    whatever key it sends (a right one too), while the same right key from another address is served.
    After the wait the address is served again."""
    from serving.gateway import build_gateway, serve_in_thread

    settings = pipeline.settings.model_copy(update={"auth_failures_allowed": 2, "auth_backoff_max_s": 300,
                                                    "gateway_id": "backoff-gateway"})  # its own spool
    running = serve_in_thread(build_gateway(settings, upstreams=upstream_config("http://127.0.0.1:9")))
    someone = new_customer(key_store)
    wrong = "im_live_0000000000000000_" + "x" * 43
    try:
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.1")) as here, \
                httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2")) as elsewhere:
            def get(client: httpx.Client, token: str) -> httpx.Response:
                return client.get(running.url + "/v1/models", headers={"Authorization": f"Bearer {token}"})

            assert [get(here, wrong).status_code for _ in range(3)] == [401, 401, 401]
            refused = get(here, someone.token)
            assert refused.status_code == 429
            assert refused.headers["Retry-After"] == "1"
            assert refused.json()["error"]["code"] == "too_many_failed_authentications"
            assert get(elsewhere, someone.token).status_code == 200
            time.sleep(1.05)  # the wait itself is the behaviour under test: 1 s after the first failure beyond
            assert get(here, someone.token).status_code == 200
    finally:
        running.stop()
