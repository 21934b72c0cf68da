"""The gateway's HTTP/1.1 client for its upstream replicas: keep-alive pool, httptools parsing.

    pool = UpstreamPool(connect_timeout_s=5, read_timeout_s=600)
    response = await pool.request("POST", "http://10.0.0.7:8000/v1/chat/completions", body)
    response.status, response.header("content-type")
    data = await response.read()            # the whole body (chunked transfer decoded)
    await response.first_data()             # or: wait for its first piece (a stream's first chunk)
    async for line in response.lines(): ... # or line by line as it arrives (SSE)
    async for lines in response.line_batches(): ...  # or every complete line in at once (a burst: one list)
    response.release()                      # back to the pool once the body is read
    response.close()                        # drop the connection (vLLM aborts the request)
    await pool.close()

Why not aiohttp's client (the gateway used it before): its request path (ClientRequest, connector,
tracing, cookie jar, ClientResponse) cost several times this module's per request
(docs/benchmarks.md, "Gateway overhead"), and the gateway needs none of what that buys: it only
ever sends a JSON body to a known replica and reads a JSON body or an SSE stream back. The HTTP parsing is httptools (llhttp,
the parser uvicorn serves with), chunked transfer decoding included; this module only pools
connections, writes requests and hands the body over.

Errors:
- `UpstreamConnectError`: the replica could not be connected to (refused, unreachable, no answer
  within `connect_timeout_s`). Nothing was sent: the caller may try another replica.
- `UpstreamBroken`: the connection failed or the replica answered malformed HTTP after the request
  went out.
- `TimeoutError`: no data for `read_timeout_s` (the response, or the next piece of a stream).
A pooled connection that the replica closed while idle (uvicorn closes idle keep-alive connections
after 5 s) is detected before use, or, if the close crosses the request, the request is sent once
more on a fresh connection: the replica closed it without reading the request, so nothing ran twice.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools

# Streams: stop reading from the replica while this much is buffered and not yet taken by the client.
_HIGH_WATER = 256 * 1024
_LOW_WATER = 64 * 1024


class UpstreamError(Exception):
    """Any failure talking to an upstream replica."""


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


async def _within(waiter: asyncio.Future, timeout_s: float) -> None:
    """Wait for `waiter`, TimeoutError after `timeout_s`: one timer handle, cheaper on every read
    of a stream than `asyncio.timeout` (a context object, the current task, a reschedule)."""
    timer = waiter.get_loop().call_later(timeout_s, _expire, waiter)
    try:
        await waiter
    finally:
        timer.cancel()


class UpstreamConnectError(UpstreamError):
    """The replica could not be connected to; the request was not sent."""


class UpstreamBroken(UpstreamError):
    """The connection failed, or the answer was not valid HTTP, after the request was sent."""


class _StaleConnection(UpstreamError):
    """A reused connection closed before any byte of the answer: safe to send again."""


class UpstreamResponse:
    """One response; its body arrives in the background and is read with `read` or `lines`."""

    def __init__(self, connection: _Connection, read_timeout_s: float) -> None:
        self._connection = connection
        self._read_timeout_s = read_timeout_s
        self._headers: list[tuple[bytes, bytes]] = []
        self._buffer = bytearray()
        self._waiter: asyncio.Future | None = None
        self._paused = False
        self._whole = False  # read(): the body is wanted in one piece, never pause the replica
        self.status = 0
        self.complete = False
        self.received_any = False
        self.error: UpstreamError | None = None
        self.keep_alive = False

    def header(self, name: str) -> str | None:
        wanted = name.lower().encode()
        for key, value in self._headers:
            if key.lower() == wanted:
                return value.decode("latin-1")
        return None

    # --- reading (the caller's side) -----------------------------------------------------------

    async def read(self) -> bytes:
        self._whole = True
        if self._paused:
            self._paused = False
            self._connection.resume_reading()
        while not self.complete:
            await self._wait()
        data = bytes(self._buffer)
        self._buffer.clear()
        return data

    async def first_data(self) -> None:
        """Wait until the first piece of the body is in (or the body is complete, e.g. empty):
        raises like `read` when the replica fails or stays silent first. Nothing is consumed."""
        while not self._buffer and not self.complete:
            await self._wait()

    async def lines(self) -> AsyncIterator[bytes]:
        """The body line by line, each with its b"\\n" (a last unterminated line as it is)."""
        async for batch in self.line_batches():
            for line in batch:
                yield line

    async def line_batches(self) -> AsyncIterator[list[bytes]]:
        """The body as lists of lines: each list holds every complete line buffered when it was taken
        (what the replica sent in a burst), each line with its b"\\n"; a last unterminated line
        comes alone, as it is."""
        start = 0
        while True:
            end = self._buffer.rfind(b"\n", start)
            if end >= 0:
                pieces = bytes(self._buffer[: end + 1]).split(b"\n")
                del self._buffer[: end + 1]
                start = 0
                self._maybe_resume()
                yield [piece + b"\n" for piece in pieces[:-1]]
                continue
            if self.complete:
                if self._buffer:
                    line = bytes(self._buffer)
                    self._buffer.clear()
                    yield [line]
                return
            start = len(self._buffer)
            await self._wait()

    async def _wait(self) -> None:
        if self.error is not None:
            raise self.error
        self._maybe_resume()
        self._waiter = self._connection.loop.create_future()
        try:
            await _within(self._waiter, self._read_timeout_s)
        finally:
            self._waiter = None
        if self.error is not None:
            raise self.error

    def _maybe_resume(self) -> None:
        if self._paused and len(self._buffer) <= _LOW_WATER:
            self._paused = False
            self._connection.resume_reading()

    def release(self) -> None:
        """Done with this response: its connection goes back to the pool if it can be reused."""
        self._connection.finish(reusable=self.complete and self.keep_alive and self.error is None)

    def close(self) -> None:
        """Drop the connection now (the replica sees the client go and aborts the request)."""
        self._connection.finish(reusable=False)

    # --- fed by the connection -------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _feed(self, data: bytes) -> None:
        self._buffer += data
        if not self._paused and not self._whole and len(self._buffer) > _HIGH_WATER:
            self._paused = True
            self._connection.pause_reading()
        self._wake()

    def _fail(self, error: UpstreamError) -> None:
        if self.error is None and not self.complete:
            self.error = error
        self._wake()


class _Connection(asyncio.Protocol):
    """One keep-alive connection to a replica; serves one request at a time."""

    def __init__(self, pool: UpstreamPool, key: tuple, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.key = key
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: UpstreamResponse | None = None
        self.headers_ready: asyncio.Future | None = None
        self.closed = False
        self.reused = False
        self.idle_since = 0.0

    # --- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:  # bytes nobody asked for: this connection cannot be trusted any more
            self._drop()
            return
        response.received_any = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._broken(UpstreamBroken(f"the replica sent malformed HTTP: {exc}"))
            self._drop()

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._forget(self)
        response = self.response
        if response is not None and not response.complete:
            if self.reused and not response.received_any:
                self._broken(_StaleConnection("the pooled connection was closed by the replica"))
            else:
                reason = f": {exc}" if exc else ""
                self._broken(UpstreamBroken(f"the replica closed the connection mid-response{reason}"))

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    # --- httptools callbacks -------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.response._headers.append((name, value))

    def on_headers_complete(self) -> None:
        response = self.response
        response.status = self.parser.get_status_code()
        response.keep_alive = self.parser.should_keep_alive()
        if self.headers_ready is not None and not self.headers_ready.done():
            self.headers_ready.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.response._feed(body)

    def on_message_complete(self) -> None:
        response = self.response
        response.complete = True
        response._wake()
        if self.headers_ready is not None and not self.headers_ready.done():
            self.headers_ready.set_result(None)

    # --- used by the pool and the response ---------------------------------------------------

    def _broken(self, error: UpstreamError) -> None:
        if self.headers_ready is not None and not self.headers_ready.done():
            self.headers_ready.set_exception(error)
        if self.response is not None:
            self.response._fail(error)

    def _drop(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def finish(self, *, reusable: bool) -> None:
        if self.response is None:
            return
        self.response = None
        self.headers_ready = None
        if reusable and not self.closed:  # its parser is at a message's end: it reads the next one
            self.pool._park(self)
        else:
            self._drop()


class UpstreamPool:
    """Keep-alive connections per replica (host, port, scheme); no limit on their number."""

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        idle_timeout_s: float = 60.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self._ssl_context = ssl_context
        self._idle: dict[tuple, collections.deque[_Connection]] = {}
        self._all: set[_Connection] = set()
        self._targets: dict[str, tuple] = {}
        self._heads: dict[tuple[str, str, str], tuple[tuple, bytes]] = {}

    async def request(
        self,
        method: str,
        url: str,
        body: bytes = b"",
        *,
        content_type: str = "application/json",
        read_timeout_s: float | None = None,
    ) -> UpstreamResponse:
        """Send the request; returns once the status line and headers are in.

        One coroutine: a pooled connection is taken without awaiting, and the wait for the
        headers is one timer handle (`_within`'s, inline)."""
        key, head = self._head(method, url, content_type)
        raw = b"%s%d\r\n\r\n%s" % (head, len(body), body)
        timeout = self.read_timeout_s if read_timeout_s is None else read_timeout_s
        for _attempt in range(2):
            connection = self._idle_connection(key)
            if connection is None:
                connection = await self._connect(key)
            try:
                response = UpstreamResponse(connection, timeout)
                connection.response = response
                loop = connection.loop
                connection.headers_ready = ready = loop.create_future()
                connection.transport.write(raw)
                timer = loop.call_later(timeout, _expire, ready)
                try:
                    await ready
                finally:
                    timer.cancel()
                return response
            except _StaleConnection:
                connection.finish(reusable=False)
                continue  # the replica closed it while idle; a fresh connection gets the request
            except BaseException:
                connection.finish(reusable=False)
                raise
        raise UpstreamBroken("the replica closed two connections in a row before answering")

    def _head(self, method: str, url: str, content_type: str) -> tuple[tuple, bytes]:
        """(pool key, the request's head up to its Content-Length value) for this URL."""
        known = self._heads.get((method, url, content_type))
        if known is None:
            key, host_header, target = self._target(url)
            head = f"{method} {target} HTTP/1.1\r\nHost: {host_header}\r\nContent-Type: {content_type}\r\n"
            known = key, (head + "Content-Length: ").encode("latin-1")
            if len(self._heads) < 10_000:  # a few replicas x a few paths in practice
                self._heads[method, url, content_type] = known
        return known

    def _target(self, url: str) -> tuple[tuple, str, str]:
        known = self._targets.get(url)
        if known is None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise UpstreamConnectError(f"not an http(s) URL: {url}")
            port = parts.port or (443 if parts.scheme == "https" else 80)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            host_header = parts.netloc.rpartition("@")[2]  # never send URL credentials as the Host
            known = ((parts.scheme, parts.hostname, port), host_header, target)
            if len(self._targets) < 10_000:  # a few replicas x a few paths in practice
                self._targets[url] = known
        return known

    def _idle_connection(self, key: tuple) -> _Connection | None:
        """A pooled connection to `key` still usable, or None."""
        idle = self._idle.get(key)
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if connection.closed or connection.transport.is_closing():
                continue
            if now - connection.idle_since > self.idle_timeout_s:
                connection._drop()
                continue
            connection.reused = True
            return connection
        return None

    async def _connect(self, key: tuple) -> _Connection:
        scheme, host, port = key
        ssl_context = None
        if scheme == "https":
            ssl_context = self._ssl_context or ssl.create_default_context()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _transport, connection = await loop.create_connection(
                    lambda: _Connection(self, key, loop), host, port, ssl=ssl_context
                )
        except TimeoutError:
            raise UpstreamConnectError(
                f"no connection to {host}:{port} within {self.connect_timeout_s:g} s"
            ) from None
        except OSError as exc:
            raise UpstreamConnectError(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from None
        self._all.add(connection)
        return connection

    def _park(self, connection: _Connection) -> None:
        connection.idle_since = time.monotonic()
        self._idle.setdefault(connection.key, collections.deque()).append(connection)

    def _forget(self, connection: _Connection) -> None:
        self._all.discard(connection)
        idle = self._idle.get(connection.key)
        if idle:
            with contextlib.suppress(ValueError):
                idle.remove(connection)

    def idle_connections(self) -> int:
        return sum(1 for queue in self._idle.values() for c in queue if not c.closed)

    async def close(self) -> None:
        for connection in list(self._all):
            connection._drop()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports run their connection_lost


__all__ = ["UpstreamBroken", "UpstreamConnectError", "UpstreamError", "UpstreamPool", "UpstreamResponse"]
