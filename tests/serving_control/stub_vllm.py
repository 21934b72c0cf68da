"""Stub vLLM replicas for the gateway's failover tests: loopback HTTP/1.1 servers that answer the
OpenAI completions / chat completions routes like vLLM does (JSON with `usage`, or an SSE stream
with continuous usage, chunked), or fail the way replicas fail.

    with StubLoop() as loop:
        a = loop.replica("a", mode="status:503")   # ok | status:<code> | reset | hang | break_stream | empty_stream | burst
        b = loop.replica("b", prompt_tokens=22, completion_tokens=5)
        a.url, a.received, a.bodies; a.mode = "ok"  # change behaviour between requests

Each stub reports its own served model name (`served_model`) and fixed token counts, so a test can
tell from an event or a response which replica served it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
from collections.abc import Coroutine
from typing import Any


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()  # compact, like vLLM (and orjson)


class StubReplica:
    def __init__(
        self,
        name: str,
        *,
        mode: str = "ok",
        served_model: str = "m",
        prompt_tokens: int = 11,
        completion_tokens: int = 3,
        cached_tokens: int = 0,
    ) -> None:
        self.name = name
        self.mode = mode
        self.served_model = served_model
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.cached_tokens = cached_tokens
        self.received = 0
        self.bodies: list[dict] = []
        self.release: asyncio.Event | None = None  # mode "burst": the rest of the stream goes once it is set
        self.server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.release = asyncio.Event()
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()

    # --- one connection --------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = json.loads(await reader.readexactly(length) or b"{}")
                self.received += 1
                self.bodies.append(body)
                if not await self._answer(body, reader, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            if not writer.transport.is_closing():
                writer.close()

    async def _answer(self, body: dict, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        mode = self.mode
        if mode.startswith("status:"):
            status = int(mode.split(":", 1)[1])
            payload = _dumps(
                {"error": {"message": f"stub {self.name} says {status}", "type": "x", "code": status}}
            )
            writer.write(
                f"HTTP/1.1 {status} Stub\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
            return True
        if mode == "reset":  # RST: the connection dies before any byte of an answer
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        if mode == "hang":  # connected, read the request, never answers
            await reader.read()
            return False
        if body.get("stream"):
            return await self._stream(body, writer, mode)
        usage = self._usage(self.completion_tokens, final=True)
        payload = _dumps(
            {
                "id": f"cmpl-{self.name}",
                "object": "chat.completion" if "messages" in body else "text_completion",
                "created": 0,
                "model": self.served_model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * self.completion_tokens},
                             "finish_reason": "length"}],
                "usage": usage,
            }
        )  # fmt: skip
        writer.write(
            f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        await writer.drain()
        return True

    def _usage(self, completion: int, *, final: bool) -> dict:
        usage = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }
        if final:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return usage

    async def _stream(self, body: dict, writer: asyncio.StreamWriter, mode: str) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        await writer.drain()
        if mode == "empty_stream":  # 200 and headers, then the replica dies before its first chunk
            await asyncio.sleep(0.05)
            writer.transport.abort()
            return False

        held: list[bytes] | None = None  # mode "burst": after the first chunk, the rest in one write

        async def event(data: bytes) -> None:
            piece = b"data: " + data + b"\n\n"
            framed = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
            if held is not None:
                held.append(framed)
                return
            writer.write(framed)
            await writer.drain()

        chat = "messages" in body
        for n in range(1, self.completion_tokens + 1):
            choice = {"index": 0, "delta": {"content": "x"}} if chat else {"index": 0, "text": "x"}
            chunk = {"id": f"cmpl-{self.name}", "object": "chunk", "created": 0, "model": self.served_model,
                     "choices": [{**choice, "finish_reason": None}], "usage": self._usage(n, final=False)}  # fmt: skip
            await event(_dumps(chunk))
            if mode == "burst" and n == 1:
                held = []
            if mode == "break_stream" and n == 2:  # two tokens out, then the replica dies
                await asyncio.sleep(0.05)
                writer.transport.abort()
                return False
        final = {"id": f"cmpl-{self.name}", "object": "chunk", "created": 0, "model": self.served_model,
                 "choices": [], "usage": self._usage(self.completion_tokens, final=True)}  # fmt: skip
        await event(_dumps(final))
        await event(b"[DONE]")
        if held is not None:
            assert self.release is not None
            await self.release.wait()
            writer.write(b"".join(held))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


class StubLoop:
    """An event loop in a thread that runs the stub replicas (the gateway runs in its own)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="stub-vllm", daemon=True)
        self.replicas: list[StubReplica] = []

    def __enter__(self) -> StubLoop:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        for replica in self.replicas:
            self.run(replica.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def run(self, coro: Coroutine) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def replica(self, name: str, **options: Any) -> StubReplica:
        replica = StubReplica(name, **options)
        self.run(replica.start())
        self.replicas.append(replica)
        return replica
