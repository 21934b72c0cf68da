"""Gateway failover against stub vLLM replicas (tests/serving_control/stub_vllm.py): the real
gateway app (serving.gateway.create_app, uvicorn in a thread, the pooled upstream client), events
in a MemorySink.

- A try that fails before the client got a byte (5xx, 429, refused, reset, silent, a stream that
  dies before its first chunk) goes to the other replica: one event, upstream_attempts=2, the
  serving replica's tokens only; infermeter_failover_total counts the failed try.
- The breaker: the failed replica is skipped during its cool-down, then probed by one request;
  a good probe closes it, a bad one opens it again.
- A stream that already sent bytes is never retried: SSE error, `error` event with its tokens.
- Fallback models: the event, the response's `model` and a rated line carry the served model.
- Bad upstream files (unknown fallback, loops) are refused at start.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from decimal import Decimal

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infermeter.settings import Settings
from pricing.book import price_book_from_data
from pricing.rating import rate
from pricing.usage import Usage, UsageKey
from serving import metrics
from serving.gateway import create_app, serve_in_thread
from serving.gateway_contracts import MemorySink
from serving.routing import prefix_key, rank_replicas
from serving.upstreams import UpstreamConfigError, load_upstreams, parse_upstreams
from tests.serving_control.stub_vllm import StubLoop

ADMIN_TOKEN = "failover-test-admin-token"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}", "X-Infermeter-Customer-Id": "cust-failover"}


@pytest.fixture
def stubs():
    with StubLoop() as loop:
        yield loop


def counter(name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


class Gateway:
    """A gateway on the given models (name -> entry) with a MemorySink, served in a thread."""

    def __init__(self, tmp_path, models: list[dict], **settings: object) -> None:
        self.sink = MemorySink()
        self.settings = Settings(
            INFERMETER_HOME=tmp_path / "home",
            INFERMETER_GATEWAY_ID="failover-test",
            INFERMETER_ADMIN_TOKEN=ADMIN_TOKEN,
            **{
                "INFERMETER_UPSTREAM_TIMEOUT_S": 5.0,
                "INFERMETER_UPSTREAM_CONNECT_TIMEOUT_S": 2.0,
                **settings,
            },
        )
        self.config = parse_upstreams({"models": models})
        self.served = serve_in_thread(create_app(self.settings, upstreams=self.config, sink=self.sink))
        self.http = httpx.Client(base_url=self.served.url, headers=ADMIN, timeout=30)

    def close(self) -> None:
        self.http.close()
        self.served.stop()

    def replica(self, model: str, replica_id: str):
        return next(r for r in self.config.route(model).replicas if r.replica_id == replica_id)

    def events(self, count: int, timeout_s: float = 5.0) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while len(self.sink.events) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # a straggler would show up here
        assert len(self.sink.events) == count, [e["data"]["status"] for e in self.sink.events]
        return list(self.sink.events)


@pytest.fixture
def gateways(tmp_path):
    made: list[Gateway] = []

    def make(models: list[dict], **settings: object) -> Gateway:
        gateway = Gateway(tmp_path, models, **settings)
        made.append(gateway)
        return gateway

    yield make
    for gateway in made:
        gateway.close()


def prompt_preferring(replica_ids: list[str], first: str) -> str:
    """A prompt whose prefix ranks replica `first` first (prefix routing is deterministic)."""
    from serving.upstreams import Replica

    replicas = [Replica(replica_id=r, url="http://x") for r in replica_ids]
    for n in range(1000):
        prompt = f"Tell the harbor story number {n}."
        if rank_replicas(prefix_key({"prompt": prompt}), replicas)[0].replica_id == first:
            return prompt
    raise AssertionError("no prompt prefers " + first)


def two_replicas(a_url: str, b_url: str, **extra: object) -> list[dict]:
    return [{"name": "m", "deployment_id": "dep-m", "routing": "prefix",
             "replicas": [{"id": "A", "url": a_url}, {"id": "B", "url": b_url}], **extra}]  # fmt: skip


def read_sse(response: httpx.Response) -> list[dict]:
    out = []
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


# --- a try that fails before the first byte: served by the other replica ------------------------

FAILURES = [
    # (case, A's mode or "refused", stream, metric reason, settings)
    ("500", "status:500", False, "http_5xx", {}),
    ("503 stream", "status:503", True, "http_5xx", {}),
    ("429", "status:429", False, "http_429", {}),
    ("connect refused", "refused", False, "connect", {}),
    ("connect refused stream", "refused", True, "connect", {}),
    ("reset", "reset", False, "reset", {}),
    ("reset stream", "reset", True, "reset", {}),
    ("silent", "hang", False, "timeout", {"INFERMETER_UPSTREAM_TIMEOUT_S": 0.5}),
    ("silent stream", "hang", True, "timeout", {"INFERMETER_UPSTREAM_TIMEOUT_S": 0.5}),
    ("stream dies before its first chunk", "empty_stream", True, "reset", {}),
]


@pytest.mark.parametrize(
    ("case", "mode", "stream", "reason", "settings"), FAILURES, ids=[f[0] for f in FAILURES]
)
def test_a_failed_try_is_served_by_the_other_replica(stubs, gateways, case, mode, stream, reason, settings):
    a = stubs.replica("a", mode="ok" if mode == "refused" else mode, prompt_tokens=11, completion_tokens=3)
    b = stubs.replica("b", prompt_tokens=22, completion_tokens=5)
    a_url = a.url
    if mode == "refused":
        stubs.run(a.stop())  # nothing listens there any more
    gateway = gateways(two_replicas(a_url, b.url), **settings)
    prompt = prompt_preferring(["A", "B"], "A")
    before = counter("infermeter_failover_total", model="m", reason=reason)
    body = {"model": "m", "prompt": prompt, "max_tokens": 5, "stream": stream}
    if stream:
        with gateway.http.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            chunks = read_sse(response)
        assert "".join(c["choices"][0]["text"] for c in chunks if c.get("choices")) == "x" * 5  # B's stream
        assert all("error" not in c for c in chunks)
    else:
        response = gateway.http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["prompt_tokens"] == 22  # B's answer
        assert response.json()["model"] == "m"
    [event] = gateway.events(1)
    data = event["data"]
    assert data["status"] == "ok"
    assert (data["replica_id"], data["upstream_attempts"]) == ("B", 2)
    assert (data["input_tokens"], data["output_tokens"]) == (22, 5)  # B's tokens only
    assert "fallback_from" not in data["tags"]
    assert b.received == 1
    assert a.received == (0 if mode == "refused" else 1)
    assert counter("infermeter_failover_total", model="m", reason=reason) - before == 1
    assert gateway.replica("m", "A").breaker() == "open"


def test_no_failure_no_retry_and_one_attempt(stubs, gateways):
    a = stubs.replica("a")
    b = stubs.replica("b")
    gateway = gateways(two_replicas(a.url, b.url))
    response = gateway.http.post(
        "/v1/completions", json={"model": "m", "prompt": prompt_preferring(["A", "B"], "A")}
    )
    assert response.status_code == 200
    [event] = gateway.events(1)
    assert (event["data"]["replica_id"], event["data"]["upstream_attempts"]) == ("A", 1)
    assert (a.received, b.received) == (1, 0)


def test_every_try_failing_returns_the_last_error_and_one_event(stubs, gateways):
    a = stubs.replica("a", mode="status:500")
    b = stubs.replica("b", mode="status:503")
    gateway = gateways(two_replicas(a.url, b.url))
    response = gateway.http.post(
        "/v1/completions", json={"model": "m", "prompt": prompt_preferring(["A", "B"], "A")}
    )
    assert response.status_code == 503  # vLLM's own status, the last try's
    assert response.json()["error"]["message"] == "stub b says 503"
    [event] = gateway.events(1)
    data = event["data"]
    assert (data["status"], data["replica_id"], data["upstream_attempts"]) == ("error", "B", 2)
    assert data["tags"]["error"] == "upstream_503"
    assert (data["input_tokens"], data["output_tokens"]) == (0, 0)
    assert (a.received, b.received) == (1, 1)


def test_attempts_bound_the_tries(stubs, gateways):
    replicas = [stubs.replica(n, mode="status:500") for n in "abc"]
    models = [{"name": "m", "deployment_id": "dep-m",
               "replicas": [{"id": r.name.upper(), "url": r.url} for r in replicas]}]  # fmt: skip
    three = gateways(models, INFERMETER_FAILOVER_ATTEMPTS=3)
    assert three.http.post("/v1/completions", json={"model": "m", "prompt": "p"}).status_code == 500
    [event] = three.events(1)
    assert event["data"]["upstream_attempts"] == 3
    assert [r.received for r in replicas] == [1, 1, 1]  # never the same replica twice

    fresh = [stubs.replica(n, mode="status:500") for n in "def"]
    models = [{"name": "m", "deployment_id": "dep-m",
               "replicas": [{"id": r.name.upper(), "url": r.url} for r in fresh]}]  # fmt: skip
    one = gateways(models, INFERMETER_FAILOVER_ATTEMPTS=1)  # no failover at all
    assert one.http.post("/v1/completions", json={"model": "m", "prompt": "p"}).status_code == 500
    [event] = one.events(1)
    assert event["data"]["upstream_attempts"] == 1
    assert sum(r.received for r in fresh) == 1


def test_a_client_error_is_passed_through_without_retry(stubs, gateways):
    a = stubs.replica("a", mode="status:400")
    b = stubs.replica("b")
    gateway = gateways(two_replicas(a.url, b.url))
    response = gateway.http.post(
        "/v1/completions", json={"model": "m", "prompt": prompt_preferring(["A", "B"], "A")}
    )
    assert response.status_code == 400
    [event] = gateway.events(1)
    assert (event["data"]["status"], event["data"]["upstream_attempts"]) == ("error", 1)
    assert b.received == 0
    assert gateway.replica("m", "A").breaker() == "closed"  # it answered: it is up


def test_no_retry_starts_after_the_clients_deadline(stubs, gateways):
    a = stubs.replica("a", mode="hang")
    b = stubs.replica("b")
    gateway = gateways(two_replicas(a.url, b.url), INFERMETER_UPSTREAM_TIMEOUT_S=0.6)
    body = {"model": "m", "prompt": prompt_preferring(["A", "B"], "A")}
    response = gateway.http.post("/v1/completions", json=body, headers={"X-Infermeter-Timeout-S": "0.5"})
    assert response.status_code == 504
    [event] = gateway.events(1)
    assert (event["data"]["status"], event["data"]["upstream_attempts"]) == ("error", 1)
    assert b.received == 0

    # With time left, the retry goes out (and is itself bounded by what is left).
    gateway.replica("m", "A").down_until = 0.0
    response = gateway.http.post("/v1/completions", json=body, headers={"X-Infermeter-Timeout-S": "5"})
    assert response.status_code == 200
    assert gateway.events(2)[1]["data"]["upstream_attempts"] == 2


# --- the breaker --------------------------------------------------------------------------------


def test_breaker_skips_a_failed_replica_then_probes_it_after_the_cool_down(stubs, gateways):
    a = stubs.replica("a", mode="status:500", prompt_tokens=11)
    b = stubs.replica("b", prompt_tokens=22)
    gateway = gateways(two_replicas(a.url, b.url), INFERMETER_BREAKER_COOLDOWN_S=1.0)
    replica_a = gateway.replica("m", "A")
    body = {"model": "m", "prompt": prompt_preferring(["A", "B"], "A")}
    opened = counter("infermeter_breaker_opened_total", model="m", replica="A")
    posted = 0

    def post() -> dict:
        nonlocal posted
        assert gateway.http.post("/v1/completions", json=body).status_code == 200
        posted += 1
        return gateway.events(posted)[-1]["data"]

    first = post()  # A fails, B serves; A's breaker opens
    assert (first["replica_id"], first["upstream_attempts"], a.received) == ("B", 2, 1)
    assert replica_a.breaker() == "open"
    assert counter("infermeter_breaker_opened_total", model="m", replica="A") - opened == 1
    for _ in range(3):  # open: skipped, B serves at the first try
        skipped = post()
        assert (skipped["replica_id"], skipped["upstream_attempts"]) == ("B", 1)
    assert a.received == 1

    time.sleep(1.05)  # cool-down over: half-open
    assert replica_a.breaker() == "half_open"
    probe = post()  # still failing: the probe fails over to B and A opens again
    assert (probe["replica_id"], probe["upstream_attempts"], a.received) == ("B", 2, 2)
    assert replica_a.breaker() == "open"
    assert post()["upstream_attempts"] == 1 and a.received == 2  # skipped again

    a.mode = "ok"  # A is back
    time.sleep(1.05)
    back = post()  # the probe succeeds: A serves and its breaker closes
    assert (back["replica_id"], back["upstream_attempts"], back["input_tokens"]) == ("A", 1, 11)
    assert replica_a.breaker() == "closed"
    assert post()["replica_id"] == "A"
    # a re-open of an open breaker is not a new outage
    assert counter("infermeter_breaker_opened_total", model="m", replica="A") - opened == 1


def test_prefix_routing_falls_back_to_the_next_replica_of_the_ring(stubs, gateways):
    stub = {n: stubs.replica(n.lower()) for n in "ABC"}
    models = [{"name": "m", "deployment_id": "dep-m", "routing": "prefix",
               "replicas": [{"id": n, "url": s.url} for n, s in stub.items()]}]  # fmt: skip
    gateway = gateways(models)
    prompt = prompt_preferring(["A", "B", "C"], "A")
    ring = [
        r.replica_id
        for r in rank_replicas(prefix_key({"prompt": prompt}), gateway.config.route("m").replicas)
    ]
    assert ring[0] == "A"
    stub["A"].mode = "status:500"
    for _ in range(4):
        assert gateway.http.post("/v1/completions", json={"model": "m", "prompt": prompt}).status_code == 200
    events = gateway.events(4)
    assert {e["data"]["replica_id"] for e in events} == {ring[1]}  # sticky on the next of the ring
    assert [e["data"]["upstream_attempts"] for e in events] == [2, 1, 1, 1]


# --- a stream that already sent bytes -----------------------------------------------------------


def test_a_stream_broken_after_its_first_bytes_is_not_retried(stubs, gateways):
    a = stubs.replica("a", mode="break_stream", prompt_tokens=11, completion_tokens=6)
    b = stubs.replica("b", prompt_tokens=22)
    gateway = gateways(two_replicas(a.url, b.url))
    body = {"model": "m", "prompt": prompt_preferring(["A", "B"], "A"), "stream": True}
    with gateway.http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        chunks = read_sse(response)
    assert [c["choices"][0]["text"] for c in chunks if c.get("choices")] == ["x", "x"]
    assert chunks[-1]["error"]["code"] == "upstream_error"
    [event] = gateway.events(1)
    data = event["data"]
    assert (data["status"], data["replica_id"], data["upstream_attempts"]) == ("error", "A", 1)
    assert (data["input_tokens"], data["output_tokens"]) == (11, 2)  # what it produced
    assert data["tags"] == {"error": "upstream_broken", "usage_source": "partial"}
    assert b.received == 0


# --- fallback models ----------------------------------------------------------------------------

BOOK = {
    "id": "two-models", "name": "two models", "currency": "USD",
    "charges": [
        {"meter": "uncached_input_tokens", "model": "big", "price": {"type": "unit", "amount": "10.00", "per": 1000000}},
        {"meter": "output_tokens", "model": "big", "price": {"type": "unit", "amount": "30.00", "per": 1000000}},
        {"meter": "uncached_input_tokens", "model": "small", "price": {"type": "unit", "amount": "1.00", "per": 1000000}},
        {"meter": "output_tokens", "model": "small", "price": {"type": "unit", "amount": "2.00", "per": 1000000}},
    ],
}  # fmt: skip


def fallback_models(big_url: str, small_url: str) -> list[dict]:
    return [
        {"name": "big", "deployment_id": "dep-big", "fallback": "small", "replicas": [{"id": "big-0", "url": big_url}]},
        {"name": "small", "deployment_id": "dep-small", "upstream_model": "small-vllm",
         "replicas": [{"id": "small-0", "url": small_url}]},
    ]  # fmt: skip


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_fallback_model_serves_and_is_what_is_metered_and_priced(stubs, gateways, stream):
    big = stubs.replica("big", mode="status:503", served_model="big")
    small = stubs.replica("small", served_model="small-vllm", prompt_tokens=400_000, completion_tokens=7)
    gateway = gateways(fallback_models(big.url, small.url))
    body = {"model": "big", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    if stream:
        with gateway.http.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            models = {chunk["model"] for chunk in read_sse(response)}
    else:
        response = gateway.http.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        models = {response.json()["model"]}
    assert models == {"small"}  # the client sees the model that served it, under its gateway name
    assert small.bodies[-1]["model"] == "small-vllm"  # sent under the fallback's own upstream name
    [event] = gateway.events(1)
    data = event["data"]
    assert (data["status"], data["model"], data["deployment_id"], data["replica_id"]) == (
        "ok",
        "small",
        "dep-small",
        "small-0",
    )
    assert data["upstream_attempts"] == 2
    assert data["tags"]["fallback_from"] == "big"
    assert (data["input_tokens"], data["output_tokens"]) == (400_000, 7)

    # Priced at the served model, never at the one asked for.
    start = datetime(2026, 1, 1, tzinfo=UTC)
    usage = Usage.build("cust-failover", start, start.replace(month=2), [
        (UsageKey("uncached_input_tokens", data["model"], data["deployment_id"]),
         data["input_tokens"] - data["cached_input_tokens"]),
        (UsageKey("output_tokens", data["model"], data["deployment_id"]), data["output_tokens"]),
    ])  # fmt: skip
    rating = rate(price_book_from_data(BOOK), usage)
    assert {line.group for line in rating.lines} == {"small"}
    assert rating.total == Decimal("0.40")  # 400k x $1/M + 7 x $2/M (big would be $4.00)


def test_a_model_whose_replicas_are_all_open_goes_straight_to_its_fallback(stubs, gateways):
    big = stubs.replica("big", mode="status:500")
    small = stubs.replica("small", served_model="small-vllm")
    gateway = gateways(fallback_models(big.url, small.url))
    for _ in range(3):
        assert gateway.http.post("/v1/completions", json={"model": "big", "prompt": "p"}).status_code == 200
    events = gateway.events(3)
    assert [e["data"]["upstream_attempts"] for e in events] == [2, 1, 1]
    assert {e["data"]["model"] for e in events} == {"small"}
    assert big.received == 1


# --- bad upstream files -------------------------------------------------------------------------


def _model(name: str, fallback: str | None = None) -> dict:
    entry = {
        "name": name,
        "deployment_id": f"dep-{name}",
        "replicas": [{"id": f"{name}-0", "url": "http://127.0.0.1:1"}],
    }
    if fallback is not None:
        entry["fallback"] = fallback
    return entry


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ([_model("a", "nope")], "model 'a' falls back to 'nope', which is not in this file (a)"),
        ([_model("a", "a")], "model 'a' names itself as its fallback"),
        ([_model("a", "b"), _model("b", "a")], "fallback loop: a -> b -> a"),
        ([_model("a", "b"), _model("b", "c"), _model("c", "b")], "fallback loop: b -> c -> b"),
        ([{**_model("a"), "fallback": 3}], "models[0].fallback must be the name of another model"),
        ([{**_model("a"), "down_for_s": "soon"}], "models[0].down_for_s must be a number of seconds"),
    ],
    ids=["unknown", "itself", "loop", "loop further down", "not a name", "bad cool-down"],
)
def test_bad_upstream_files_are_refused_at_start(tmp_path, models, message):
    path = tmp_path / "upstreams.yaml"
    path.write_text(json.dumps({"models": models}))  # JSON is YAML
    with pytest.raises(UpstreamConfigError) as caught:
        load_upstreams(path)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)
    settings = Settings(INFERMETER_HOME=tmp_path / "home", INFERMETER_UPSTREAMS=path)
    with pytest.raises(UpstreamConfigError):
        create_app(settings)  # the gateway does not start on it


def test_a_fallback_chain_is_fine_and_cool_downs_default_to_the_setting(tmp_path):
    path = tmp_path / "upstreams.yaml"
    models = [_model("a", "b"), _model("b", "c"), {**_model("c"), "down_for_s": 1.5}]
    path.write_text(json.dumps({"models": models}))
    settings = Settings(
        INFERMETER_HOME=tmp_path / "home", INFERMETER_UPSTREAMS=path, INFERMETER_BREAKER_COOLDOWN_S=9
    )
    config = create_app(settings).gateway.upstreams
    assert [r.name for r in config.route("a").chain()] == ["a", "b", "c"]
    assert [config.route(n).cooldown_s for n in "abc"] == [9.0, 9.0, 1.5]
