"""Data residency against stub vLLM replicas (loopback servers, tests/serving_control/stub_vllm.py),
the residency store, its CLI and admin API, and the bad-input checks at start.

Replicas: A eu-west, B eu-central, C us-east (model `m`); the stubs count what reached each, so
"never served outside its regions" is checked where the requests land. The gateway's residency
cache is primed by hand here (no database); tests/serving/test_residency_replicas.py runs the whole
thing on real vLLM replicas with the key store priming it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg
import pytest
from fastapi.testclient import TestClient

from infermeter.settings import Settings
from infermeter.stack.postgres import to_libpq_url
from pricing.anatomy import request_cause
from serving.gateway import create_app
from serving.residency import ResidencyCache, ResidencyError, clear_residency, get_residency, set_residency
from serving.upstreams import UpstreamConfigError, load_upstreams, parse_upstreams
from tests.serving_control import test_failover
from tests.serving_control.test_failover import ADMIN, counter, prompt_preferring

stubs = test_failover.stubs  # the stub replicas' event loop and the gateway factory (fixtures)
gateways = test_failover.gateways

REGIONS = "eu-west,eu-central,us-east"
EU = frozenset({"eu-west", "eu-central"})


def three_regions(a, b, c, routing: str = "prefix", **extra) -> list[dict]:
    return [{"name": "m", "deployment_id": "dep-m", "routing": routing, **extra, "replicas": [
        {"id": "A", "url": a.url, "region": "eu-west"},
        {"id": "B", "url": b.url, "region": "eu-central"},
        {"id": "C", "url": c.url, "region": "us-east"},
    ]}]  # fmt: skip


def restricted_gateway(gateways, models, residencies: dict[str, frozenset | None], **settings):
    gateway = gateways(models, INFERMETER_REGIONS=REGIONS, **settings)
    cache = ResidencyCache(None, ttl_s=3600)
    for customer, regions in residencies.items():
        cache.prime(customer, regions)
    gateway.served.state.residency = cache
    return gateway


def post(gateway, customer: str, prompt: str, **body):
    return gateway.http.post(
        "/v1/completions",
        json={"model": "m", "prompt": prompt, "max_tokens": 3, **body},
        headers={**ADMIN, "X-Infermeter-Customer-Id": customer},
    )


# --- routing: only the customer's regions, first try, failover and fallback --------------------------


def test_a_restricted_customer_is_served_only_in_its_regions_and_others_everywhere(stubs, gateways):
    a, b, c = stubs.replica("a"), stubs.replica("b"), stubs.replica("c")
    gateway = restricted_gateway(gateways, three_regions(a, b, c), {"cust-eu": EU, "cust-any": None})
    prompts = [f"Tell the harbor story number {n}." for n in range(30)]
    for prompt in prompts:
        assert post(gateway, "cust-eu", prompt).status_code == 200
    assert c.received == 0 and a.received + b.received == 30 and a.received and b.received
    for prompt in prompts:
        assert post(gateway, "cust-any", prompt).status_code == 200
    assert c.received > 0  # the unrestricted customer still uses every replica
    events = gateway.events(60)
    eu = [e["data"] for e in events if e["subject"] == "cust-eu"]
    assert {(d["replica_id"], d["region"]) for d in eu} <= {("A", "eu-west"), ("B", "eu-central")}
    assert all(d["status"] == "ok" and d["upstream_attempts"] == 1 for d in eu)
    anyone = [e["data"] for e in events if e["subject"] == "cust-any"]
    assert {d["region"] for d in anyone} == {"eu-west", "eu-central", "us-east"}


def test_prefix_routing_picks_among_the_allowed_replicas_and_stays_sticky(stubs, gateways):
    a, b, c = stubs.replica("a"), stubs.replica("b"), stubs.replica("c")
    gateway = restricted_gateway(gateways, three_regions(a, b, c), {"cust-eu": EU})
    prompt = prompt_preferring(["A", "B", "C"], "C")  # unrestricted, this prefix lands on C
    for _ in range(6):
        assert post(gateway, "cust-eu", prompt).status_code == 200
    served = {e["data"]["replica_id"] for e in gateway.events(6)}
    assert len(served) == 1 and served <= {"A", "B"} and c.received == 0


def test_failover_stays_inside_the_regions(stubs, gateways):
    a = stubs.replica("a", mode="status:503")
    b, c = stubs.replica("b"), stubs.replica("c")
    gateway = restricted_gateway(gateways, three_regions(a, b, c), {"cust-eu": EU}, INFERMETER_FAILOVER_ATTEMPTS=3)
    prompt = prompt_preferring(["A", "B", "C"], "A")
    response = post(gateway, "cust-eu", prompt)
    assert response.status_code == 200
    (event,) = gateway.events(1)
    assert (event["data"]["replica_id"], event["data"]["region"], event["data"]["upstream_attempts"]) == (
        "B", "eu-central", 2)
    assert (a.received, b.received, c.received) == (1, 1, 0)


def test_when_no_replica_in_its_regions_is_up_the_request_is_rejected_not_sent_elsewhere(stubs, gateways):
    a = stubs.replica("a", mode="status:503")
    b, c = stubs.replica("b"), stubs.replica("c")
    gateway = restricted_gateway(
        gateways, three_regions(a, b, c), {"cust-west": frozenset({"eu-west"}), "cust-any": None},
        INFERMETER_FAILOVER_ATTEMPTS=3, INFERMETER_BREAKER_COOLDOWN_S=60,
    )  # fmt: skip
    before = counter("infermeter_gateway_rejections_total", reason="residency")
    first = post(gateway, "cust-west", "Where is the ledger?")  # tried on A (503), nothing else allowed
    assert first.status_code == 503
    error = first.json()["error"]
    assert error["code"] == "residency_unavailable" and error["type"] == "api_error"
    assert "eu-west" in error["message"] and "not sent to another region" in error["message"]
    second = post(gateway, "cust-west", "Where is the ledger?")  # A's breaker is open: not even tried
    assert second.status_code == 503 and second.json()["error"]["code"] == "residency_unavailable"
    assert post(gateway, "cust-any", "Where is the ledger?").status_code == 200  # others are served
    assert (a.received, b.received + c.received) == (1, 1)
    events = gateway.events(3)
    rejected = [e["data"] for e in events if e["subject"] == "cust-west"]
    assert [(d["status"], d["tags"], d["upstream_attempts"]) for d in rejected] == [
        ("rejected", {"reason": "residency"}, 1), ("rejected", {"reason": "residency"}, 0)]
    assert rejected[0]["region"] == "eu-west" and "region" not in rejected[1]  # the replica tried, if any
    assert all(d["input_tokens"] == d["output_tokens"] == 0 for d in rejected)
    assert {e["data"]["request_id"] for e in events} == {
        r.headers["x-request-id"] for r in (first, second)} | {events[2]["data"]["request_id"]}
    assert counter("infermeter_gateway_rejections_total", reason="residency") == before + 2
    # the anatomy of cost counts a residency rejection under routing, a budget's under capacity
    assert request_cause("rejected", reason="residency") == "routing"
    assert request_cause("rejected", reason="budget_exceeded") == "capacity"


def test_a_model_with_no_replica_in_the_regions_is_rejected_without_a_try(stubs, gateways):
    c = stubs.replica("c")
    models = [{"name": "m", "deployment_id": "dep-m", "region": "us-east", "replicas": [{"id": "C", "url": c.url}]}]
    gateway = restricted_gateway(gateways, models, {"cust-eu": EU})
    response = post(gateway, "cust-eu", "hello", stream=True)
    assert response.status_code == 503 and response.json()["error"]["code"] == "residency_unavailable"
    (event,) = gateway.events(1)
    assert (event["data"]["status"], event["data"]["upstream_attempts"], c.received) == ("rejected", 0, 0)


def test_fallback_models_are_held_to_the_regions_too(stubs, gateways):
    a = stubs.replica("a", mode="status:503")
    us = stubs.replica("us", served_model="m2")
    eu = stubs.replica("eu", served_model="m2")
    models = [
        {"name": "m", "deployment_id": "dep-m", "fallback": "m2", "replicas": [
            {"id": "A", "url": a.url, "region": "eu-west"}]},
        {"name": "m2", "deployment_id": "dep-m2", "routing": "round_robin", "replicas": [
            {"id": "M2-us", "url": us.url, "region": "us-east"}, {"id": "M2-eu", "url": eu.url, "region": "eu-west"}]},
    ]  # fmt: skip
    gateway = restricted_gateway(gateways, models, {"cust-west": frozenset({"eu-west"})},
                                 INFERMETER_FAILOVER_ATTEMPTS=3, INFERMETER_BREAKER_COOLDOWN_S=60)
    for n in range(4):
        response = post(gateway, "cust-west", f"story {n}")
        assert response.status_code == 200 and response.json()["model"] == "m2"
    assert us.received == 0 and eu.received == 4
    events = gateway.events(4)
    assert {(e["data"]["model"], e["data"]["replica_id"], e["data"]["region"]) for e in events} == {
        ("m2", "M2-eu", "eu-west")}
    assert all(e["data"]["tags"]["fallback_from"] == "m" for e in events)


def test_unrestricted_routing_is_unchanged_when_every_replica_is_in_the_regions(stubs, gateways):
    a, b = stubs.replica("a"), stubs.replica("b")
    models = [{"name": "m", "deployment_id": "dep-m", "region": "eu-west",
               "replicas": [{"id": "A", "url": a.url}, {"id": "B", "url": b.url}]}]
    gateway = restricted_gateway(gateways, models, {"cust-eu": EU})
    assert gateway.served.state.residency is not None
    assert post(gateway, "cust-eu", "hello").status_code == 200
    (event,) = gateway.events(1)
    assert event["data"]["region"] == "eu-west"  # inherited from the model entry


# --- bad input at start ------------------------------------------------------------------------------


def _entry(name: str, fallback: str | None = None, **extra) -> dict:
    entry = {"name": name, "deployment_id": f"dep-{name}", **extra,
             "replicas": [{"id": f"{name}-0", "url": "http://127.0.0.1:1", **extra.pop("replica", {})}]}
    entry.pop("replica", None)
    if fallback is not None:
        entry["fallback"] = fallback
    return entry


@pytest.mark.parametrize(
    ("models", "regions", "message"),
    [
        ([_entry("a", region="mars")], REGIONS,
         "replica 'a-0' of model 'a': unknown region 'mars' (known regions: eu-central, eu-west, us-east)"),
        ([_entry("a", replica={"region": "ap-south"})], REGIONS, "unknown region 'ap-south'"),
        ([_entry("a", region="eu-west")], "", "unknown region 'eu-west' (known regions: none: INFERMETER_REGIONS is empty)"),
        ([_entry("a", region="EU West")], REGIONS, "models[0].region must be a region name"),
        ([_entry("a", "nope")], REGIONS, "model 'a' falls back to 'nope', which is not in this file (a)"),
        ([_entry("a", "b"), _entry("b", "a")], REGIONS, "fallback loop: a -> b -> a"),
    ],
    ids=["unknown region", "unknown replica region", "no regions declared", "not a region name",
         "unknown fallback model", "fallback loop"],
)
def test_bad_upstream_files_stop_the_gateway_at_start(tmp_path, models, regions, message):
    path = tmp_path / "upstreams.yaml"
    path.write_text(json.dumps({"models": models}))
    settings = Settings(INFERMETER_HOME=tmp_path / "home", INFERMETER_UPSTREAMS=path, INFERMETER_REGIONS=regions)
    with pytest.raises(UpstreamConfigError) as caught:
        create_app(settings)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)
    # also when the config was parsed elsewhere and handed to the gateway
    if "unknown region" in message:
        config = load_upstreams(path)
        with pytest.raises(UpstreamConfigError, match="unknown region"):
            create_app(settings, upstreams=config)


def test_serve_gateway_prints_one_line_for_an_unknown_region(tmp_path):
    path = tmp_path / "upstreams.yaml"
    path.write_text(json.dumps({"models": [_entry("a", region="mars")]}))
    out = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "gateway", "--upstreams", str(path)],
        env={**os.environ, "INFERMETER_HOME": str(tmp_path / "home"), "INFERMETER_REGIONS": REGIONS,
             "KAFKA_BOOTSTRAP": "127.0.0.1:1", "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    text = " ".join((out.stdout + out.stderr).split())
    assert out.returncode != 0 and "unknown region 'mars'" in text and "Traceback" not in text, text


def test_regions_on_the_file_parse():
    config = parse_upstreams(
        {"models": [{"name": "m", "deployment_id": "d", "region": "eu-west", "replicas": [
            {"id": "r0", "url": "http://x"}, {"id": "r1", "url": "http://y", "region": "us-east"},
            ]}, {"name": "n", "deployment_id": "e", "replicas": [{"id": "r2", "url": "http://z"}]}]},
        known_regions=REGIONS.split(","),
    )  # fmt: skip
    assert [(r.replica_id, r.region) for m in config.models.values() for r in m.replicas] == [
        ("r0", "eu-west"), ("r1", "us-east"), ("r2", None)]


# --- the store, its CLI and its admin API ------------------------------------------------------------


def test_the_store_checks_regions_and_writes_nothing_on_bad_input(db_url):
    from infermeter.db import get_engine

    engine = get_engine(db_url)
    known = REGIONS.split(",")
    assert set_residency(engine, "cust-1", "eu-west, eu-central,eu-west", known=known) == ("eu-central", "eu-west")
    assert get_residency(engine, "cust-1") == ("eu-central", "eu-west")
    for bad in ("eu-west,mars", "", "Eu-West"):
        with pytest.raises(ResidencyError):
            set_residency(engine, "cust-2", bad, known=known)
        with pytest.raises(ResidencyError):
            set_residency(engine, "cust-1", bad, known=known)
    assert get_residency(engine, "cust-2") is None and get_residency(engine, "cust-1") == ("eu-central", "eu-west")
    assert clear_residency(engine, "cust-1") and not clear_residency(engine, "cust-1")
    assert get_residency(engine, "cust-1") is None


def test_the_key_lookup_primes_the_gateway_cache(db_url):
    import asyncio

    from infermeter.db import get_engine
    from serving.keys import KeyStore

    engine = get_engine(db_url)
    settings = Settings(DATABASE_URL=db_url, INFERMETER_REGIONS=REGIONS)
    store = KeyStore(engine, settings)
    cache = store.residency = ResidencyCache(None, ttl_s=60)  # no engine: only the key lookup can fill it
    _, restricted = store.create("cust-eu")
    _, free = store.create("cust-free")
    set_residency(engine, "cust-eu", "eu-west", known=REGIONS.split(","))
    store.authenticate_sync(restricted)
    store.authenticate_sync(free)
    assert cache.cached("cust-eu") == frozenset({"eu-west"})
    assert asyncio.run(cache.regions("cust-free")) is None and "cust-free" in cache._regions


def _cli(db_url: str, tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "customers", "residency", *args],
        env={**os.environ, "DATABASE_URL": db_url, "INFERMETER_HOME": str(tmp_path / "home"),
             "INFERMETER_REGIONS": REGIONS},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_customers_residency_cli(db_url, tmp_path):
    set_ = _cli(db_url, tmp_path, "cust-7", "--regions", "eu-west,eu-central", "--json")
    assert set_.returncode == 0, set_.stderr
    assert json.loads(set_.stdout)["regions"] == ["eu-central", "eu-west"]
    shown = _cli(db_url, tmp_path, "cust-7")
    assert shown.returncode == 0 and "served only in eu-central, eu-west" in shown.stdout
    for args, message in [
        (("cust-7", "--regions", "eu-west,mars"), "unknown region 'mars' (known regions: eu-central, eu-west, us-east)"),
        (("cust-8", "--regions", "moon base"), "'moon base' is not a region name"),
        (("cust-8", "--regions", ","), "name at least one region"),
        (("cust-8", "--regions", "eu-west", "--clear"), "give --regions or --clear, not both"),
    ]:
        bad = _cli(db_url, tmp_path, *args)
        text = " ".join(bad.stderr.split())
        assert bad.returncode == 2 and message in text and "Traceback" not in text, bad.stderr
    with psycopg.connect(to_libpq_url(db_url)) as conn:  # nothing written by the bad ones
        assert conn.execute("SELECT customer_id, regions FROM customer_residency").fetchall() == [
            ("cust-7", ["eu-central", "eu-west"])]
    cleared = _cli(db_url, tmp_path, "cust-7", "--clear", "--json")
    assert cleared.returncode == 0 and json.loads(cleared.stdout)["regions"] is None
    assert "not restricted" in _cli(db_url, tmp_path, "cust-7").stdout


def test_the_admin_api(db_url):
    from app.api import create_app as create_api
    from infermeter.db import get_engine
    from serving.keys import KeyStore

    settings = Settings(DATABASE_URL=db_url, INFERMETER_ADMIN_TOKEN="adm", INFERMETER_PRODUCER_TOKEN="prod",
                        INFERMETER_REGIONS=REGIONS)
    _, customer_key = KeyStore(get_engine(db_url), settings=settings).create("cust-9")
    admin = {"Authorization": "Bearer adm"}
    path = "/v1/customers/cust-9/residency"
    with TestClient(create_api(settings, db_url, None)) as client:
        assert client.get(path).status_code == 401
        for token in ("prod", customer_key):
            denied = client.put(path, json={"regions": ["eu-west"]}, headers={"Authorization": f"Bearer {token}"})
            assert denied.status_code == 403
        assert client.get(path, headers=admin).json() == {
            "customer_id": "cust-9", "regions": None, "known_regions": ["eu-central", "eu-west", "us-east"]}
        put = client.put(path, json={"regions": ["us-east", "eu-west"]}, headers=admin)
        assert put.status_code == 200 and put.json()["regions"] == ["eu-west", "us-east"]
        bad = client.put(path, json={"regions": ["eu-west", "mars"]}, headers=admin)
        assert bad.status_code == 400 and "unknown region 'mars'" in bad.text
        for body in ({"regions": "eu-west"}, {}, [1]):
            assert client.put(path, json=body, headers=admin).status_code == 400
        assert client.get(path, headers=admin).json()["regions"] == ["eu-west", "us-east"]  # unchanged
        assert client.put(path, json={"regions": None}, headers=admin).json()["regions"] is None
        assert client.get(path, headers=admin).json()["regions"] is None


# --- the replica agent's region ----------------------------------------------------------------------


def test_the_replica_agent_puts_its_region_on_every_interval(tmp_path):
    from datetime import UTC, datetime, timedelta

    from serving.replica_agent import ReplicaAgent

    agent = ReplicaAgent("http://127.0.0.1:1", "dep-a", "cpu", 1, None, replica_id="r0", region="eu-west")
    start = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    agent.interval_start = start
    event = agent.close_interval(start + timedelta(seconds=10))
    assert event["data"]["region"] == "eu-west"
    out = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "replica-agent", "--vllm", "http://127.0.0.1:1", "--deployment",
         "d", "--gpu-type", "cpu", "--gpu-count", "1", "--region", "mars"],
        env={**os.environ, "INFERMETER_HOME": str(tmp_path / "home"), "INFERMETER_REGIONS": REGIONS,
             "KAFKA_BOOTSTRAP": "127.0.0.1:1"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    text = " ".join(out.stderr.split())
    assert out.returncode == 2 and "--region: unknown region 'mars'" in text and "Traceback" not in text
