"""Data residency on real vLLM replicas: a customer restricted to eu-west is never served outside it,
checked from each replica's own access log, including when eu-west's only replica is killed
(SIGKILL): then 503 and a `rejected`/`residency` event, while an unrestricted customer is served by
the other region. The eu-west replica is this module's own (booted in parallel with the session's,
which plays us-east), so no other test loses its server.

Everything is real: the key store (whose lookup primes the gateway's residency cache), the
residency row written by `set_residency`, the emitter, Kafka, the metering consumer, PostgreSQL.
"""

from __future__ import annotations

import os
import signal
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
import pytest

from infermeter.db import get_engine
from infermeter.stack.postgres import to_libpq_url
from metering import queries
from serving.residency import set_residency
from serving.tinymodel import SERVED_NAME
from serving.upstreams import parse_upstreams
from tests.serving.conftest import _start, new_customer, vllm_access_count, vllm_counter

MAX_TOKENS = 8


@pytest.fixture(scope="module")
def eu_replica(tmp_path_factory, vllm_python, tiny_model, request):
    server = _start(vllm_python, tiny_model, tmp_path_factory.mktemp("eu"))  # short: IPC paths must fit
    try:
        request.getfixturevalue("vllm")  # the session's replica (us-east here) boots meanwhile
        server.wait_ready()
        yield server
    finally:
        server.stop()


def _client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120)


def _completion(http: httpx.Client, n: int, **extra) -> httpx.Response:
    body = {"model": SERVED_NAME, "prompt": f"Residency request {n} asks the harbor master about ledger {n * 13}.",
            "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, **extra}
    return http.post("/v1/completions", json=body)


def test_a_restricted_customer_is_never_served_outside_its_region(vllm, eu_replica, pipeline, key_store):
    from serving.gateway import build_gateway, serve_in_thread

    us_replica = vllm
    restricted, anyone = new_customer(key_store), new_customer(key_store)
    set_residency(get_engine(pipeline.database_url), restricted.customer_id, ["eu-west"],
                  known=["eu-west", "us-east"])
    config = parse_upstreams({"models": [{
        "name": SERVED_NAME, "deployment_id": "residency-test", "routing": "prefix",
        "replicas": [{"id": "eu-0", "url": eu_replica.url, "region": "eu-west"},
                     {"id": "us-0", "url": us_replica.url, "region": "us-east"}],
    }]})  # fmt: skip
    settings = pipeline.settings.model_copy(update={
        "gateway_id": f"residency-{uuid.uuid4().hex[:6]}", "regions": "eu-west,us-east",
        "failover_attempts": 2, "breaker_cooldown_s": 120.0,  # no probe of the dead replica during the test
    })  # fmt: skip
    served = serve_in_thread(build_gateway(settings, upstreams=config))
    started = datetime.now(UTC)
    eu_log, us_log = vllm_access_count(eu_replica), vllm_access_count(us_replica)
    eu_prompt = vllm_counter(eu_replica, "vllm:prompt_tokens_total")
    try:
        with _client(served.url, restricted.token) as mine, _client(served.url, anyone.token) as theirs:
            # 1. both replicas up: the restricted customer's requests reach eu-west only
            ok = [_completion(mine, n) for n in range(12)]
            ok.append(_completion(mine, 12, stream=True, stream_options={"include_usage": True}))
            assert [r.status_code for r in ok] == [200] * 13
            assert (vllm_access_count(eu_replica) - eu_log, vllm_access_count(us_replica) - us_log) == (13, 0)
            eu_prompt_delta = vllm_counter(eu_replica, "vllm:prompt_tokens_total") - eu_prompt
            # ... while the unrestricted customer's land on both (prefix routing over both regions)
            free = [_completion(theirs, n) for n in range(100, 116)]
            assert [r.status_code for r in free] == [200] * 16
            eu_log, us_log = vllm_access_count(eu_replica), vllm_access_count(us_replica)

            # 2. eu-west's only replica dies: refused, never sent to us-east
            os.killpg(eu_replica.process.pid, signal.SIGKILL)
            eu_replica.process.wait(10)
            refused = [_completion(mine, n) for n in range(200, 204)]
            refused.append(_completion(mine, 204, stream=True))
            assert [r.status_code for r in refused] == [503] * 5
            for response in refused:
                error = response.json()["error"]
                assert error["code"] == "residency_unavailable" and "eu-west" in error["message"], error
            assert vllm_access_count(us_replica) == us_log  # nothing of theirs reached us-east
            after = [_completion(theirs, n) for n in range(300, 306)]
            assert [r.status_code for r in after] == [200] * 6
            assert vllm_access_count(us_replica) == us_log + 6
    finally:
        served.stop()

    # One event per client request, where metering stored it.
    mine_events = pipeline.request_events(restricted.customer_id, 18, timeout_s=60)
    pipeline.settle(1.0)
    mine_events = [e["data"] for e in pipeline.request_events(restricted.customer_id, 18)]
    assert len(mine_events) == 18
    assert {d["request_id"] for d in mine_events} == {r.headers["x-request-id"] for r in ok + refused}
    served_ok = [d for d in mine_events if d["status"] == "ok"]
    assert len(served_ok) == 13 and {(d["replica_id"], d["region"]) for d in served_ok} == {("eu-0", "eu-west")}
    assert sum(d["input_tokens"] for d in served_ok) == eu_prompt_delta  # eu-west's own counter
    rejected = [d for d in mine_events if d["status"] == "rejected"]
    assert len(rejected) == 5 and all(d["tags"] == {"reason": "residency"} for d in rejected)
    assert sorted(d["upstream_attempts"] for d in rejected) == [0, 0, 0, 0, 1]  # the first found it dead
    assert all(d["input_tokens"] == d["output_tokens"] == 0 for d in rejected)

    theirs_events = [e["data"] for e in pipeline.request_events(anyone.customer_id, 22)]
    assert len(theirs_events) == 22 and all(d["status"] == "ok" for d in theirs_events)
    assert {d["region"] for d in theirs_events} == {"eu-west", "us-east"}
    by_id = {d["request_id"]: d for d in theirs_events}
    assert {by_id[r.headers["x-request-id"]]["replica_id"] for r in after} == {"us-0"}

    # The rollups carry the region: usage grouped by region, as `infermeter usage --group-by region` reads it.
    window = queries.Window(started - timedelta(hours=2), datetime.now(UTC) + timedelta(minutes=1))
    with psycopg.connect(to_libpq_url(pipeline.database_url)) as conn:
        rows = queries.usage(conn, window, customer_id=restricted.customer_id, group_by=["region"])
    assert [(r["region"], r["requests"]) for r in rows] == [("eu-west", 14), (None, 4)]
    assert rows[0]["input_tokens"] == eu_prompt_delta
