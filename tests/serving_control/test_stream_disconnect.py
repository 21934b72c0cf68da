"""A client that leaves a stream while the rest of it is already in the gateway's hands is seen
leaving: the real gateway app (its lifespan run by uvicorn in a thread) in front of a stub replica
(tests/serving_control/stub_vllm.py, mode "burst": the first chunk, then the others and [DONE] in one
write), events in a MemorySink.

The request is driven through the app's ASGI interface inside the gateway's own event loop, with the
two halves of a server connection as uvicorn has them: `receive` answers `http.disconnect` once the
client has gone, and `send` then returns quietly (nothing raises in the relay). The client goes right
after the first chunk of the burst, i.e. while the rest of the stream is buffered in the gateway: a
gateway that is late for the CPU (a burst from vLLM, a busy process) is in exactly this state. The
relay must stop and meter the stream `cancelled` / `client_disconnected` with the tokens it passed
on, not relay every chunk into a closed connection and call it `ok`.
"""

from __future__ import annotations

import asyncio
import json

from tests.serving_control.test_failover import ADMIN, gateways, stubs  # noqa: F401 - fixtures

TOKENS = 300  # ~45 kB of SSE: one read from the stub


async def _leave_after(app, body: dict, chunks: int) -> list[bytes]:
    """POST /v1/completions through `app`; the client leaves after `chunks` body chunks (None: stays)."""
    payload = json.dumps(body).encode()
    headers = [(k.lower().encode(), v.encode()) for k, v in {**ADMIN, "content-type": "application/json"}.items()]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "headers": headers, "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}  # fmt: skip
    gone = asyncio.Event()
    asked = False
    received: list[bytes] = []

    async def receive() -> dict:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if gone.is_set():
            return  # uvicorn: once the client is gone, send returns quietly
        if message["type"] == "http.response.body" and message.get("body"):
            received.append(message["body"])
            if len(received) == chunks:
                gone.set()

    await app(scope, receive, send)
    return received


def test_a_client_gone_while_the_rest_of_the_stream_is_buffered_is_metered_cancelled(stubs, gateways):  # noqa: F811
    replica = stubs.replica("a", mode="burst", prompt_tokens=11, completion_tokens=TOKENS)
    gateway = gateways([{"name": "m", "deployment_id": "dep-m", "replicas": [{"id": "A", "url": replica.url}]}])
    [server] = gateway.served.server.servers
    body = {"model": "m", "prompt": "Tell the long story.", "stream": True}

    async def scenario() -> list[bytes]:
        async def release_after_first() -> None:  # the burst comes once the first chunk is out
            while replica.received == 0:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.05)
            stubs.loop.call_soon_threadsafe(replica.release.set)

        releaser = asyncio.create_task(release_after_first())
        try:
            return await _leave_after(gateway.served.app, body, chunks=2)
        finally:
            await releaser

    received = asyncio.run_coroutine_threadsafe(scenario(), server.get_loop()).result(30)
    assert len(received) == 2
    [event] = gateway.events(1)
    data = event["data"]
    assert (data["status"], data["tags"]["reason"]) == ("cancelled", "client_disconnected")
    assert 2 <= data["output_tokens"] < TOKENS / 2
    assert data["tags"]["usage_source"] == "partial"


def test_the_same_burst_read_to_its_end_is_ok(stubs, gateways):  # noqa: F811
    replica = stubs.replica("a", mode="burst", prompt_tokens=11, completion_tokens=TOKENS)
    gateway = gateways([{"name": "m", "deployment_id": "dep-m", "replicas": [{"id": "A", "url": replica.url}]}])
    stubs.loop.call_soon_threadsafe(replica.release.set)
    body = {"model": "m", "prompt": "Tell the long story.", "stream": True}
    with gateway.http.stream("POST", "/v1/completions", json=body) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert len(lines) == TOKENS + 1 and lines[-1] == "data: [DONE]"
    [event] = gateway.events(1)
    assert (event["data"]["status"], event["data"]["output_tokens"]) == ("ok", TOKENS)
