"""The gateway's HTTP/1.1 protocol: uvicorn's httptools protocol, with the two proxy routes served
without uvicorn's ASGI request cycle.

`gateway_protocol(app)` is the protocol class `infermeter serve gateway` and `serve_in_thread` give
uvicorn (`uvicorn.Config(http=...)`). It is uvicorn's `HttpToolsProtocol` (connections, parsing,
keep-alive and its timeout, pipelining, `Expect: 100-continue`, malformed requests answered 400,
graceful shutdown, the server's `date` and `server` headers) except at two points (the keep-alive
timer is armed once a connection, not once a request: `GatewayProtocolBase`) and at one more: a `POST` to
`/v1/chat/completions` or `/v1/completions` gets a `ProxyCycle` instead of uvicorn's
`RequestResponseCycle`, and its task calls `GatewayApp.serve_proxy` straight away. Everything
else (other routes, other methods, lifespan, an absolute or percent-encoded request target, a
concurrency limit, an app wrapped by uvicorn's middleware) takes uvicorn's path unchanged.

`ProxyCycle` stands where uvicorn's cycle stands, with the attributes the protocol's callbacks use
(`body`, `more_body`, `message_event`, `disconnected`, `response_complete`, `keep_alive`,
`run_asgi`), and the same ASGI `receive`; its `send` writes what uvicorn's writes, in fewer
writes and checks: the status line and headers go out with the first body bytes (a whole
non-streamed answer in one write(2) instead of two), from headers the gateway built itself (header
values are still checked for control characters; names are the gateway's constants). The proxy
routes write no uvicorn access-log line (`infermeter serve gateway` runs with the access log off).

The protocol reaches into uvicorn's (its callbacks and attributes, `_start_asgi_task`): uvicorn's
version is pinned in pyproject.toml, and tests/serving_control/test_gateway_http.py exercises the edges.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HEADER_VALUE_RE, STATUS_LINE, HttpToolsProtocol

log = logging.getLogger("uvicorn.error")

PROXY_ROUTES = {b"/v1/chat/completions": "chat", b"/v1/completions": "completion"}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_CLOSE = b"connection: close\r\n"
_CHUNKED = b"transfer-encoding: chunked\r\n"
_LAST_CHUNK = b"0\r\n\r\n"


def _nothing() -> None:
    pass


class _Wakeup:
    """asyncio.Event for one waiter: set by the parser's callbacks, awaited by `receive`."""

    __slots__ = ("is_set", "loop", "waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.is_set = False
        self.loop = loop
        self.waiter: asyncio.Future | None = None

    def set(self) -> None:
        self.is_set = True
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def wait_and_clear(self) -> None:
        if not self.is_set:
            self.waiter = waiter = self.loop.create_future()
            await waiter
        self.is_set = False


class ProxyCycle:
    """One request of a proxy route on a `gateway_protocol` connection (see the module's doc)."""

    __slots__ = (
        "body", "default_headers", "disconnected", "expected_content_length", "flow", "gateway", "head",
        "keep_alive", "kind", "message_event", "more_body", "chunked", "on_response", "response_complete",
        "response_started", "scope", "transport", "waiting_for_100_continue",
    )  # fmt: skip

    def __init__(self, protocol: HttpToolsProtocol, gateway: Any, kind: str, keep_alive: bool) -> None:
        self.scope = protocol.scope
        self.transport = protocol.transport
        self.flow = protocol.flow
        self.default_headers = protocol.server_state.default_headers
        self.on_response = protocol.on_response_complete
        self.message_event = _Wakeup(protocol.loop)
        self.gateway = gateway
        self.kind = kind
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = protocol.expect_100_continue
        self.disconnected = False
        self.body = bytearray()
        self.more_body = True
        self.response_started = False
        self.response_complete = False
        self.chunked = False
        self.expected_content_length = 0
        self.head: list[bytes] | None = None  # the status line and headers, written with the first body bytes

    async def run_asgi(self, _app: Any) -> None:
        """What uvicorn's cycle does around the app, around `GatewayApp.serve_proxy`."""
        try:
            await self.gateway.serve_proxy(self.scope, self.receive, self.send, self.kind)
        except BaseException as exc:
            log.error("Exception in ASGI application\n", exc_info=exc)
            if not self.response_started:
                await self.send_500_response()
            else:
                self.transport.close()
        else:
            if not self.response_started and not self.disconnected:
                log.error("ASGI callable returned without starting response.")
                await self.send_500_response()
            elif not self.response_complete and not self.disconnected:
                log.error("ASGI callable returned without completing response.")
                self.transport.close()
        finally:
            self.on_response = _nothing

    async def send_500_response(self) -> None:
        await self.send({
            "type": "http.response.start", "status": 500,
            "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"21"),
                        (b"connection", b"close")],
        })  # fmt: skip
        await self.send({"type": "http.response.body", "body": b"Internal Server Error", "more_body": False})

    async def receive(self) -> dict:
        """uvicorn's: the body as it has arrived, then `http.disconnect` once the client is gone or
        the response complete."""
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(_CONTINUE)
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            self.flow.resume_reading()
            await self.message_event.wait_and_clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        message = {"type": "http.request", "body": bytes(self.body), "more_body": self.more_body}
        self.body = bytearray()
        return message

    async def send(self, message: dict) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if not self.response_started:
            if message["type"] != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got '{message['type']}'.")
            self.response_started = True
            self.waiting_for_100_continue = False
            status = message["status"]
            head = [STATUS_LINE[status]]
            for name, value in self.default_headers:
                head += (name, b": ", value, b"\r\n")
            has_close = False
            length = None
            for name, value in message.get("headers", ()):
                if HEADER_VALUE_RE.search(value):
                    raise RuntimeError("Invalid HTTP header value.")
                name = name.lower()
                if name == b"content-length":
                    if length is None and not self.chunked:
                        length = int(value)
                elif name == b"transfer-encoding" and value.lower() == b"chunked":
                    if length is None:
                        self.chunked = True
                elif name == b"connection" and b"close" in [t.strip() for t in value.lower().split(b",")]:
                    self.keep_alive = False
                    has_close = True
                head += (name, b": ", value, b"\r\n")
            if not self.keep_alive and not has_close:
                head.append(_CLOSE)
            if length is not None:
                self.expected_content_length = length
            elif not self.chunked and status not in (204, 304):
                self.chunked = True
                head.append(_CHUNKED)
            head.append(b"\r\n")
            self.head = head
            return
        if self.response_complete:
            raise RuntimeError(f"Unexpected ASGI message '{message['type']}' sent, after response already completed.")
        if message["type"] != "http.response.body":
            raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{message['type']}'.")
        body = message.get("body", b"")
        more_body = message.get("more_body", False)
        out = self.head
        if out is None:
            out = []
        else:
            self.head = None
        if self.chunked:
            if body:
                out += (b"%x\r\n" % len(body), body, b"\r\n")
            if not more_body:
                out.append(_LAST_CHUNK)
        else:
            if len(body) > self.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length -= len(body)
            out.append(body)
        self.transport.write(b"".join(out))
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()


class GatewayProtocolBase(HttpToolsProtocol):
    """uvicorn's httptools protocol, the proxy routes dispatched at the end of their headers.

    Its keep-alive timeout is uvicorn's (an idle connection is closed `timeout_keep_alive` seconds
    after its last response), with one timer a connection instead of one a request: uvicorn arms a
    timer at every response and cancels it at the next request's first bytes; here a response
    notes when the connection went idle, and the timer, armed when none is, closes the connection
    if it is still idle since then, else waits again for the rest of the timeout (once every
    `timeout_keep_alive` seconds on a busy connection)."""

    gateway: Any = None  # the GatewayApp (set by `gateway_protocol`)
    _idle_since: float | None = None  # loop time of the last response with nothing after it; None: busy

    def _unset_keepalive_if_required(self) -> None:
        self._idle_since = None  # new bytes: busy (a timer that fires meanwhile finds it so)

    def on_response_complete(self) -> None:
        # uvicorn's, but the keep-alive timer armed only when none is
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._idle_since = None
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self._keep_alive_due)

    def _keep_alive_due(self) -> None:
        self.timeout_keep_alive_task = None
        since = self._idle_since
        if since is None:  # busy: its response arms the timer again
            return
        remaining = since + self.timeout_keep_alive - self.loop.time()
        if remaining > 0:
            self.timeout_keep_alive_task = self.loop.call_later(remaining, self._keep_alive_due)
        else:
            self.timeout_keep_alive_handler()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        timer = self.timeout_keep_alive_task
        if timer is not None:
            self.timeout_keep_alive_task = None
            timer.cancel()

    def on_headers_complete(self) -> None:
        parser = self.parser
        kind = None
        if parser.get_method() == b"POST" and self.app is self.gateway and self.limit_concurrency is None:
            url = self.url
            query = url.find(b"?")
            kind = PROXY_ROUTES.get(url if query < 0 else url[:query])
        if kind is None or parser.should_upgrade():
            super().on_headers_complete()
            return
        # the scope as uvicorn completes it (what the proxy reads of it: headers, client)
        scope = self.scope
        path = url if query < 0 else url[:query]
        scope["method"] = "POST"
        scope["path"] = path.decode("ascii")
        scope["raw_path"] = path
        scope["query_string"] = b"" if query < 0 else url[query + 1 :]
        http_version = parser.get_http_version()
        if http_version != "1.1":
            scope["http_version"] = http_version
        existing = self.cycle
        self.cycle = cycle = ProxyCycle(
            self, self.gateway, kind, keep_alive=http_version != "1.0" and parser.should_keep_alive()
        )
        if existing is None or existing.response_complete:
            self._start_asgi_task(cycle, self.app)
        else:  # pipelined behind a request still being answered: uvicorn's queue
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, self.app))


def gateway_protocol(app: Any) -> type[HttpToolsProtocol]:
    """The protocol class for uvicorn serving `app` (a GatewayApp): `uvicorn.Config(app, http=...)`."""
    return type("GatewayProtocol", (GatewayProtocolBase,), {"gateway": app})


__all__ = ["PROXY_ROUTES", "GatewayProtocolBase", "ProxyCycle", "gateway_protocol"]
