"""The gateway's own HTTP protocol (serving/gateway_http.py) at its edges, over raw sockets: the
real gateway app served as `serve_in_thread` serves it, a stub vLLM replica
(tests/serving_control/stub_vllm.py), events in a MemorySink.

- The proxy routes take the protocol's own cycle (`ProxyCycle`), every other route (and another
  method on a proxy path) uvicorn's ASGI cycle and the FastAPI app.
- Keep-alive: several requests on one connection, pipelined ones answered in order; HTTP/1.0 and
  `Connection: close` close it after the answer; the keep-alive timeout closes an idle connection,
  not a busy one.
- A body in several TCP segments (headers alone first, then the body in pieces), a chunked request
  body, `Expect: 100-continue`.
- A malformed request gets uvicorn's clear 400 and the connection closes; a malformed body the
  gateway's OpenAI error.
- A stream: SSE with chunked framing; a client gone mid-stream still yields its one event.
- `infermeter serve gateway` hands uvicorn this protocol (so the kill -9 test,
  tests/serving/test_gateway_crash.py, runs through it).
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from infermeter.settings import Settings
from serving import gateway_http
from serving.gateway import create_app, serve_in_thread
from serving.gateway_contracts import MemorySink
from serving.upstreams import parse_upstreams
from tests.serving_control.stub_vllm import StubLoop

ADMIN_TOKEN = "gateway-http-test-admin-token"
AUTH = f"Authorization: Bearer {ADMIN_TOKEN}\r\nX-Infermeter-Customer-Id: cust-http\r\n"
BODY = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 3}).encode()


class Served:
    def __init__(self, tmp_path, url: str) -> None:
        self.sink = MemorySink()
        settings = Settings(
            INFERMETER_HOME=tmp_path / "home", INFERMETER_GATEWAY_ID="http-test", INFERMETER_ADMIN_TOKEN=ADMIN_TOKEN,
        )  # fmt: skip
        config = parse_upstreams({"models": [{"name": "m", "deployment_id": "dep-m",
                                              "replicas": [{"id": "A", "url": url}]}]})  # fmt: skip
        self.app = create_app(settings, upstreams=config, sink=self.sink)
        self.served = serve_in_thread(self.app)
        self.port = int(self.served.url.rsplit(":", 1)[1])

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def events(self, count: int, timeout_s: float = 5.0) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while len(self.sink.events) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        assert len(self.sink.events) == count, [e["data"]["status"] for e in self.sink.events]
        return list(self.sink.events)


@pytest.fixture
def replica():
    with StubLoop() as loop:
        yield loop.replica("a", prompt_tokens=7, completion_tokens=3)


@pytest.fixture
def gateway(tmp_path, replica, monkeypatch):
    cycles: list[str] = []

    class CountedCycle(gateway_http.ProxyCycle):
        __slots__ = ()

        def __init__(self, protocol, gateway, kind, keep_alive) -> None:
            super().__init__(protocol, gateway, kind, keep_alive)
            cycles.append(kind)

    monkeypatch.setattr(gateway_http, "ProxyCycle", CountedCycle)
    served = Served(tmp_path, replica.url)
    served.cycles = cycles
    yield served
    served.served.stop()


def post(path: str = "/v1/completions", body: bytes = BODY, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: gw\r\n{AUTH}Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body  # fmt: skip


class Reader:
    """Reads HTTP/1.1 responses off a socket, one at a time (content-length or chunked bodies)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buffer += data
        return bool(data)

    def _until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            assert self._fill(), f"connection closed before {marker!r}: {self.buffer!r}"
        head, self.buffer = self.buffer.split(marker, 1)
        return head

    def _exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            assert self._fill(), "connection closed mid-body"
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def response(self) -> tuple[int, dict[str, str], bytes]:
        lines = self._until(b"\r\n\r\n").decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, value = line.split(":", 1)
            assert name.lower() not in headers, f"header {name} twice"
            headers[name.lower()] = value.strip()
        if "content-length" in headers:
            return status, headers, self._exactly(int(headers["content-length"]))
        assert headers.get("transfer-encoding") == "chunked", headers
        body = b""
        while True:
            size = int(self._until(b"\r\n"), 16)
            if size == 0:
                self._exactly(2)
                return status, headers, body
            body += self._exactly(size)
            assert self._exactly(2) == b"\r\n"

    def closed(self) -> bool:
        return not self.buffer and not self._fill()


def test_requests_on_one_keep_alive_connection_and_pipelined(gateway, replica):
    with gateway.connect() as sock:
        reader = Reader(sock)
        for n in range(3):
            sock.sendall(post(body=json.dumps({"model": "m", "prompt": f"p{n}", "max_tokens": 3}).encode()))
            status, headers, body = reader.response()
            assert status == 200, body
            assert json.loads(body)["usage"]["completion_tokens"] == 3
            assert headers["content-type"] == "application/json"
            assert headers["x-request-id"].startswith("cmpl-")
            assert "date" in headers and headers["server"] == "uvicorn"
            assert "connection" not in headers
        # three pipelined in one segment: answered in order, on the same connection
        sock.sendall(b"".join(post(body=json.dumps({"model": "m", "prompt": f"q{n}"}).encode()) for n in range(3)))
        ids = [reader.response()[1]["x-request-id"] for _ in range(3)]
        sock.sendall(post("/v1/chat/completions", json.dumps({"model": "m", "messages": [
            {"role": "user", "content": "hi"}]}).encode()))  # fmt: skip
        status, headers, body = reader.response()
        assert status == 200 and headers["x-request-id"].startswith("chatcmpl-")
    events = gateway.events(7)
    assert [e["data"]["status"] for e in events] == ["ok"] * 7
    assert {e["data"]["request_id"] for e in events} >= set(ids)
    assert [body["prompt"] for body in replica.bodies[3:6]] == ["q0", "q1", "q2"]
    assert gateway.cycles == ["completion"] * 6 + ["chat"]


def test_the_keep_alive_timeout_closes_an_idle_connection_only(gateway, monkeypatch):
    """One timer a connection (GatewayProtocolBase): a connection busy for longer than the timeout,
    with gaps shorter than it, stays open; idle for the timeout after its last answer, it closes."""
    timeout_s = 0.6
    init = gateway_http.GatewayProtocolBase.__init__

    def with_short_timeout(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        self.timeout_keep_alive = timeout_s

    monkeypatch.setattr(gateway_http.GatewayProtocolBase, "__init__", with_short_timeout)
    with gateway.connect() as sock:
        reader = Reader(sock)
        started = time.monotonic()
        while time.monotonic() - started < 3 * timeout_s:  # gaps of a third of the timeout
            sock.sendall(post())
            assert reader.response()[0] == 200
            time.sleep(timeout_s / 3)
        sock.sendall(post())
        assert reader.response()[0] == 200
        answered = time.monotonic()
        time.sleep(timeout_s / 2)
        sock.settimeout(0.05)
        with pytest.raises(TimeoutError):  # still open half a timeout after its last answer
            sock.recv(1)
        sock.settimeout(5)
        assert reader.closed()
        assert time.monotonic() - answered >= timeout_s - 0.05


def test_http_1_0_and_connection_close_close_after_the_answer(gateway):
    for request in (post().replace(b"HTTP/1.1", b"HTTP/1.0", 1), post(extra="Connection: close\r\n")):
        with gateway.connect() as sock:
            sock.sendall(request)
            reader = Reader(sock)
            status, headers, _body = reader.response()
            assert status == 200
            assert headers["connection"] == "close"
            assert reader.closed()
    assert len(gateway.cycles) == 2
    gateway.events(2)


def test_a_body_in_several_segments_chunked_and_after_100_continue(gateway, replica):
    with gateway.connect() as sock:
        reader = Reader(sock)
        request = post(body=json.dumps({"model": "m", "prompt": "segments " * 50}).encode())
        head, body = request.split(b"\r\n\r\n", 1)
        sock.sendall(head + b"\r\n\r\n")  # the headers alone: the proxy's task starts, waits for the body
        for start in range(0, len(body), 97):
            time.sleep(0.02)
            sock.sendall(body[start : start + 97])
        status, _headers, answer = reader.response()
        assert status == 200, answer
        assert replica.bodies[-1]["prompt"] == "segments " * 50

        chunked = json.dumps({"model": "m", "prompt": "chunked"}).encode()
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: gw\r\n{AUTH}Transfer-Encoding: chunked\r\n\r\n".encode())
        for piece in (chunked[:10], chunked[10:]):
            time.sleep(0.02)
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        sock.sendall(b"0\r\n\r\n")
        status, _headers, answer = reader.response()
        assert status == 200, answer
        assert replica.bodies[-1]["prompt"] == "chunked"

        sock.sendall(post(extra="Expect: 100-continue\r\n").split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n")
        assert reader._until(b"\r\n\r\n") == b"HTTP/1.1 100 Continue"
        sock.sendall(BODY)
        status, _headers, answer = reader.response()
        assert status == 200, answer
    assert gateway.cycles == ["completion"] * 3
    assert [e["data"]["status"] for e in gateway.events(3)] == ["ok"] * 3


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: nine\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost gw\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
    ids=["bad content-length", "header without colon", "bad chunk size"],
)
def test_a_malformed_request_gets_a_clear_400_and_the_connection_closes(gateway, request_bytes):
    with gateway.connect() as sock:
        sock.sendall(request_bytes)
        reader = Reader(sock)
        status, headers, body = reader.response()
        assert (status, body) == (400, b"Invalid HTTP request received.")
        assert headers["connection"] == "close"
        assert reader.closed()
    assert gateway.sink.events == []


def test_a_malformed_body_gets_the_gateways_openai_error(gateway):
    with gateway.connect() as sock:
        sock.sendall(post(body=b"{not json"))
        status, _headers, body = Reader(sock).response()
    assert status == 400
    assert json.loads(body)["error"]["code"] == "invalid_request"
    assert gateway.cycles == ["completion"]
    assert gateway.sink.events == []  # not an inference request: not metered


def test_other_routes_are_served_by_the_app(gateway):
    with gateway.connect() as sock:
        reader = Reader(sock)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")
        assert reader.response()[::2] == (200, b'{"status":"ok"}')
        sock.sendall(f"GET /v1/models HTTP/1.1\r\nHost: gw\r\n{AUTH}\r\n".encode())
        status, _headers, body = reader.response()
        assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["m"]
        sock.sendall(f"GET /v1/completions HTTP/1.1\r\nHost: gw\r\n{AUTH}\r\n".encode())
        status, _headers, body = reader.response()
        assert status == 405 and json.loads(body)["error"]["code"] == "method_not_allowed"
        sock.sendall(post("/v1/completionsX"))
        assert reader.response()[0] == 404
        sock.sendall(post("/v1/completions?trace=1"))  # a query string: still the proxy route
        assert reader.response()[0] == 200
    assert gateway.cycles == ["completion"]
    gateway.events(1)


def _stream_body(max_tokens: int) -> bytes:
    return json.dumps({"model": "m", "prompt": "s", "max_tokens": max_tokens, "stream": True}).encode()


def test_a_stream_is_relayed_chunked_and_metered(gateway, replica):
    with gateway.connect() as sock:
        sock.sendall(post(body=_stream_body(3)))
        status, headers, body = Reader(sock).response()
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    lines = [line for line in body.split(b"\n\n") if line]
    assert lines[-1] == b"data: [DONE]"
    assert all(line.startswith(b"data: ") for line in lines)
    (event,) = gateway.events(1)
    assert event["data"]["status"] == "ok" and event["data"]["output_tokens"] == 3
    assert gateway.cycles == ["completion"]


def test_a_client_gone_mid_stream_still_yields_its_event(gateway, replica):
    replica.mode = "burst"  # the first chunk, then the rest only once released: the client leaves before
    with gateway.connect() as sock:
        sock.sendall(post(body=_stream_body(8)))
        reader = Reader(sock)
        reader._until(b"\r\n\r\n")
        reader._until(b"\n\n")  # the first SSE event
    (event,) = gateway.events(1)
    assert event["data"]["status"] == "cancelled"
    assert event["data"]["tags"]["reason"] == "client_disconnected"


def test_serve_gateway_hands_uvicorn_the_gateways_protocol(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    import serving.cli
    import serving.gateway

    built = {}

    def build(settings, upstreams):
        built["app"] = create_app(settings, upstreams=upstreams)
        return built["app"]

    served = {}
    monkeypatch.setattr(serving.gateway, "build_gateway", build)
    monkeypatch.setattr(serving.cli, "serve_http", lambda app, **config: served.update(app=app, **config))
    monkeypatch.setenv("INFERMETER_HOME", str(tmp_path))
    result = CliRunner().invoke(serving.cli.serve_app, ["gateway", "--upstream", "http://127.0.0.1:9", "--model", "m"])
    assert result.exit_code == 0, result.output
    assert served["app"] is built["app"]
    assert issubclass(served["http"], gateway_http.GatewayProtocolBase)
    assert served["http"].gateway is built["app"]
