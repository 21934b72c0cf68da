"""The gateway's upstream client against scripted loopback HTTP servers: keep-alive, streams,
replicas that close idle connections, break mid-answer, hang, or speak bad HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from infermeter.stack.ports import free_port
from serving.upstream_http import UpstreamBroken, UpstreamConnectError, UpstreamPool

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int, int], Awaitable[bool]]


class Replica:
    """A loopback HTTP/1.1 server: `handler(reader, writer, connection_no, request_no)` answers one
    request read from the connection (headers and body already consumed) and says whether to keep
    the connection open. Counts connections and the requests it answered."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.answered = 0
        self.bodies: list[bytes] = []
        self.port = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Replica:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        connection_no = self.connections
        request_no = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                self.bodies.append(await reader.readexactly(length))
                request_no += 1
                keep = await self.handler(reader, writer, connection_no, request_no)
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def answer(self, writer: asyncio.StreamWriter, body: bytes, status: str = "200 OK") -> None:
        self.answered += 1
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )


def run(coro):
    return asyncio.run(coro)


def pool(**overrides) -> UpstreamPool:
    return UpstreamPool(**{"connect_timeout_s": 2.0, "read_timeout_s": 5.0, **overrides})


def test_keep_alive_reuses_one_connection_and_returns_exact_bodies():
    async def scenario():
        async def handler(_r, writer, _c, request_no):
            replica.answer(writer, b'{"n": %d}' % request_no)
            return True

        async with Replica(handler) as replica:
            client = pool()
            for n in (1, 2, 3):
                response = await client.request("POST", replica.url + "/v1/completions", b'{"q": %d}' % n)
                assert response.status == 200
                assert response.header("Content-Type") == "application/json"
                assert await response.read() == b'{"n": %d}' % n
                response.release()
            assert replica.connections == 1
            assert replica.bodies == [b'{"q": 1}', b'{"q": 2}', b'{"q": 3}']
            await client.close()

    run(scenario())


def test_chunked_stream_lines_arrive_as_sent():
    async def scenario():
        go_on = asyncio.Event()

        async def handler(_r, writer, _c, _n):
            replica.answered += 1
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            for piece in (b"data: one\n\n", b"data: t", b"wo\n\ndata: [DONE]\n\n"):
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
                if piece == b"data: one\n\n":
                    await go_on.wait()  # the rest only once the client has the first line
            writer.write(b"0\r\n\r\n")
            return True

        async with Replica(handler) as replica:
            client = pool()
            response = await client.request("POST", replica.url + "/v1/completions", b"{}")
            lines = []
            async for line in response.lines():
                lines.append(line)
                go_on.set()
            assert lines == [b"data: one\n", b"\n", b"data: two\n", b"\n", b"data: [DONE]\n", b"\n"]
            response.release()
            again = await client.request("POST", replica.url + "/v1/completions", b"{}")
            assert [line async for line in again.lines()][-2] == b"data: [DONE]\n"
            again.release()
            assert replica.connections == 1
            await client.close()

    run(scenario())


def test_a_large_stream_read_slowly_arrives_whole():
    async def scenario():
        line = b"data: " + b"x" * 1000 + b"\n"

        async def handler(_r, writer, _c, _n):
            replica.answered += 1
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for _ in range(3000):  # ~3 MB, far above the pause threshold
                writer.write(b"%x\r\n%s\r\n" % (len(line), line))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            return True

        async with Replica(handler) as replica:
            client = pool()
            response = await client.request("POST", replica.url + "/v1/x", b"{}")
            count = 0
            async for got in response.lines():
                assert got == line
                count += 1
                if count % 500 == 0:
                    await asyncio.sleep(0.05)  # a slow client: the replica must be paused, not buffered
                    assert len(response._buffer) < 1024 * 1024
            assert count == 3000
            response.release()
            await client.close()

    run(scenario())


def test_a_large_body_read_whole_is_not_paused():
    async def scenario():
        body = b"y" * (3 * 1024 * 1024)

        async def handler(_r, writer, _c, _n):
            replica.answer(writer, body)
            await writer.drain()
            return True

        async with Replica(handler) as replica:
            client = pool(read_timeout_s=5.0)
            response = await client.request("POST", replica.url + "/v1/x", b"{}")
            await asyncio.sleep(0.2)  # the body piles up unread first
            assert await response.read() == body
            response.release()
            assert client.idle_connections() == 1
            await client.close()

    run(scenario())


def test_a_connection_the_replica_closed_while_idle_is_not_used():
    async def scenario():
        async def handler(_r, writer, _c, _n):
            replica.answer(writer, b"{}")
            return False  # answers, then closes (as uvicorn does after its keep-alive timeout)

        async with Replica(handler) as replica:
            client = pool()
            for _ in range(3):
                response = await client.request("POST", replica.url + "/v1/x", b"{}")
                assert await response.read() == b"{}"
                response.release()
                await asyncio.sleep(0.05)
            assert replica.connections == 3
            assert replica.answered == 3
            await client.close()

    run(scenario())


def test_a_close_crossing_the_request_sends_it_once_more_on_a_fresh_connection():
    async def scenario():
        async def handler(_r, writer, connection_no, request_no):
            if connection_no == 1 and request_no == 2:
                return False  # closes without answering: the request was not processed
            replica.answer(writer, b'{"c": %d}' % connection_no)
            return True

        async with Replica(handler) as replica:
            client = pool()
            first = await client.request("POST", replica.url + "/v1/x", b"{}")
            assert await first.read() == b'{"c": 1}'
            first.release()
            second = await client.request("POST", replica.url + "/v1/x", b"{}")
            assert await second.read() == b'{"c": 2}'
            second.release()
            assert replica.answered == 2
            assert replica.connections == 2
            await client.close()

    run(scenario())


def test_a_replica_breaking_mid_answer_is_broken_not_retried():
    async def scenario():
        async def handler(_r, writer, _c, _n):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
            await writer.drain()
            return False

        async with Replica(handler) as replica:
            client = pool()
            response = await client.request("POST", replica.url + "/v1/x", b"{}")
            with pytest.raises(UpstreamBroken, match="mid-response"):
                await response.read()
            response.release()
            assert client.idle_connections() == 0
            assert len(replica.bodies) == 1  # sent once
            await client.close()

    run(scenario())


def test_refused_hanging_and_malformed_replicas():
    async def scenario():
        client = pool(connect_timeout_s=1.0, read_timeout_s=0.3)
        with pytest.raises(UpstreamConnectError, match="cannot connect"):
            await client.request("POST", f"http://127.0.0.1:{free_port()}/v1/x", b"{}")

        async def hang(_r, _w, _c, _n):
            await asyncio.sleep(5)
            return False

        async with Replica(hang) as replica:
            with pytest.raises(TimeoutError):
                await client.request("POST", replica.url + "/v1/x", b"{}")

        async def garbage(_r, writer, _c, _n):
            writer.write(b"SMTP ready\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.5)
            return False

        async with Replica(garbage) as replica:
            with pytest.raises(UpstreamBroken, match="malformed"):
                await client.request("POST", replica.url + "/v1/x", b"{}")
        with pytest.raises(UpstreamConnectError, match="not an http"):
            await client.request("POST", "ftp://example.invalid/x", b"{}")
        await client.close()

    run(scenario())


def test_a_response_released_before_its_body_was_read_drops_the_connection():
    async def scenario():
        async def handler(_r, writer, _c, _n):
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
            await writer.drain()
            await asyncio.sleep(0.3)
            return False

        async with Replica(handler) as replica:
            client = pool()
            response = await client.request("POST", replica.url + "/v1/x", b"{}")
            response.close()
            assert client.idle_connections() == 0
            await client.close()

    run(scenario())
