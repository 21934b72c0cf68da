"""The metering HTTP API: ingestion and queries, and tenant isolation on every customer-facing endpoint."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine

from app.api import create_app
from metering.ingest import wait_for_receipt  # noqa: F401 - documents the path the consumer takes
from serving.keys import KeyStore
from tests.metering.conftest import meter, request_event, retention_clock, task_event, usage_event

pytestmark = pytest.mark.waits  # each test meters its events first: a consumer-group join (tests/conftest.py)
BASE = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
WINDOW = {"from": "2026-11-02T00:00:00Z", "to": "2026-11-03T00:00:00Z"}


@pytest.fixture
def api(settings):
    from metering.kafka import ensure_topics

    ensure_topics(settings.kafka_bootstrap, settings)
    store = KeyStore(create_engine(settings.database_url), settings=settings)
    _, key_a = store.create("cust-a")
    _, key_b = store.create("cust-b")
    meter(settings, [
        request_event(1, customer="cust-a", at=BASE, task_id="task-a1"),
        request_event(2, customer="cust-b", at=BASE, task_id="task-b1", output=99),
        task_event("task-b1", "cust-b", "succeeded", BASE + timedelta(minutes=1)),
    ])
    with TestClient(create_app(settings, settings.database_url, settings.kafka_bootstrap)) as client:
        yield client, {"a": key_a, "b": key_b, "admin": settings.admin_token, "producer": settings.producer_token}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_customers_see_only_their_own_usage(api):
    client, keys = api
    own = client.get("/v1/usage", params=WINDOW, headers=auth(keys["a"]))
    assert own.status_code == 200
    assert [(r["customer_id"], r["output_tokens"]) for r in own.json()["rows"]] == [("cust-a", 10)]
    everyone = client.get("/v1/usage", params={**WINDOW, "group_by": "model,hour"}, headers=auth(keys["admin"]))
    assert sorted(r["customer_id"] for r in everyone.json()["rows"]) == ["cust-a", "cust-b"]
    assert everyone.json()["rows"][0]["hour"] == "2026-11-02T10:00:00Z"


def test_usage_by_project(api, settings):
    client, keys = api
    meter(settings, [request_event(3, customer="cust-a", at=BASE, output=7, project="web")])
    rows = client.get("/v1/usage", params={**WINDOW, "group_by": "project"}, headers=auth(keys["a"])).json()["rows"]
    assert [(r["project"], r["requests"], r["output_tokens"]) for r in rows] == [("web", 1, 7), (None, 1, 10)]
    web = client.get("/v1/usage", params={**WINDOW, "project": "web"}, headers=auth(keys["a"])).json()["rows"]
    assert [(r["customer_id"], r["output_tokens"]) for r in web] == [("cust-a", 7)]
    none = client.get("/v1/usage", params={**WINDOW, "project": ""}, headers=auth(keys["a"])).json()["rows"]
    assert [(r["customer_id"], r["output_tokens"]) for r in none] == [("cust-a", 10)]
    refused = client.get("/v1/usage", params={**WINDOW, "group_by": "region", "project": "web"}, headers=auth(keys["a"]))
    assert refused.status_code == 400 and "region" in refused.json()["error"]["message"]


@pytest.mark.parametrize(
    "method, path, params",
    [
        ("GET", "/v1/usage", {**WINDOW, "customer_id": "cust-b"}),
        ("GET", "/v1/tasks", {"customer_id": "cust-b"}),
        ("GET", "/v1/tasks/task-b1", {}),
        ("GET", "/v1/tasks/task-b1", {"customer_id": "cust-b"}),
        ("GET", "/v1/pricing/shadow", {"customer_id": "cust-b"}),
    ],
)
def test_another_customers_data_answers_404_and_shows_nothing(api, method, path, params):
    client, keys = api
    response = client.request(method, path, params=params, headers=auth(keys["a"]))
    assert response.status_code == 404
    assert "cust-b" not in response.text and "task-b1" not in response.text and "99" not in response.text
    assert response.json()["error"]["code"] == "not_found"


def test_the_owner_and_the_admin_do_see_it(api):
    client, keys = api
    assert client.get("/v1/tasks/task-b1", headers=auth(keys["b"])).json()["outcome"] == "succeeded"
    admin = client.get("/v1/tasks/task-b1", params={"customer_id": "cust-b"}, headers=auth(keys["admin"]))
    assert admin.json()["attempts"] == 1


def test_credentials_are_checked(api):
    client, keys = api
    assert client.get("/v1/usage", params=WINDOW).status_code == 401
    assert client.get("/v1/usage", params=WINDOW, headers=auth("im_live_0000000000000000_nope")).status_code == 401
    assert client.get("/v1/usage", params=WINDOW, headers=auth(keys["producer"])).status_code == 403
    assert client.get("/v1/dead-letters", headers=auth(keys["a"])).status_code == 403
    assert client.get("/v1/dead-letters", headers=auth(keys["admin"])).status_code == 200


def test_events_endpoint_single_batch_and_errors(api, settings):
    client, keys = api
    one = request_event(10, customer="cust-a", at=BASE)
    ok = client.post("/v1/events", content=one, headers={**auth(keys["producer"]),
                                                         "Content-Type": "application/cloudevents+json"})
    assert ok.status_code == 202 and ok.json() == {"published": 1, "rejected": []}
    batch = b"[" + b",".join([usage_event(11, "cust-a", "tool_calls", "3", BASE, source="//customer/cust-a"),
                               usage_event(12, "cust-b", "tool_calls", "3", BASE, source="//customer/cust-b"),
                               usage_event(13, "cust-a", "Not A Meter", "3", BASE, source="//customer/cust-a")]) + b"]"
    mixed = client.post("/v1/events", content=batch, headers={**auth(keys["a"]),
                                                               "Content-Type": "application/cloudevents-batch+json"})
    assert mixed.status_code == 202
    body = mixed.json()
    assert body["published"] == 1
    assert [(r["index"], r["reason"]) for r in body["rejected"]] == [(1, "forbidden"), (2, "invalid_data")]
    bad = client.post("/v1/events", content=b"{nope", headers={**auth(keys["a"]),
                                                               "Content-Type": "application/cloudevents+json"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    wrong_type = client.post("/v1/events", content=one, headers={**auth(keys["a"]), "Content-Type": "text/plain"})
    assert wrong_type.status_code == 415
    bad_window = client.get("/v1/usage", params={"from": "yesterday", "to": "2026-11-03"}, headers=auth(keys["a"]))
    assert bad_window.status_code == 400 and "ISO 8601" in bad_window.json()["error"]["message"]


def test_a_customer_key_cannot_report_requests_or_gpu_time(api, settings):
    """Request and replica events are measured by the platform: a customer key posting them is refused
    (403) and nothing reaches metering; its own usage and task outcomes are accepted."""
    from metering.contract import encode_event, replica_event

    client, keys = api
    replica = encode_event(replica_event(
        source="//customer/replica", replica_id="r-x", deployment_id="d-x", customer_id="cust-a",
        gpu_type="H100", gpu_count=1, interval_start=BASE, interval_end=BASE + timedelta(minutes=1),
        busy_seconds="60", prompt_tokens=1, generation_tokens=1,
    ))
    published = []
    real = client.app.state.publisher.publish
    client.app.state.publisher.publish = lambda items, **kw: published.append(items) or real(items, **kw)
    for body in (request_event(40, customer="cust-a", at=BASE), replica,
                 b"[" + request_event(41, customer="cust-a", at=BASE) + b"," + replica + b"]"):
        refused = client.post("/v1/events", content=body,
                              headers={**auth(keys["a"]), "Content-Type": "application/cloudevents+json"
                                       if not body.startswith(b"[") else "application/cloudevents-batch+json"})
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "forbidden"
        assert "producer credentials" in refused.json()["error"]["message"]
    assert published == []
    allowed = client.post("/v1/events", content=b"[" + b",".join([
        usage_event(42, "cust-a", "tool_calls", "2", BASE, source="//customer/cust-a"),
        task_event("task-a1", "cust-a", "failed", BASE, source="//customer/cust-a"),
    ]) + b"]", headers={**auth(keys["a"]), "Content-Type": "application/cloudevents-batch+json"})
    assert allowed.status_code == 202 and allowed.json()["published"] == 2
    for token in (keys["producer"], keys["admin"]):  # producers (the gateway, the replica agent) may
        ok = client.post("/v1/events", content=replica,
                         headers={**auth(token), "Content-Type": "application/cloudevents+json"})
        assert ok.status_code == 202, ok.text


def test_a_customer_key_cannot_report_an_outcome_under_a_producers_source(api, settings):
    """A price book may trust a verifier's or the gateway's outcomes: a customer key posting an
    outcome (or usage) under any source but its own `//customer/<id>` is refused (403, reason
    `forbidden_source`) and nothing reaches the bus; producer credentials keep their own sources."""
    import time

    import psycopg

    from metering.consumer import MeteringConsumer, run_in_thread
    from metering.event_lookups import recorded_event_keys
    from tests.metering.conftest import dsn

    client, keys = api
    published = []
    real = client.app.state.publisher.publish
    client.app.state.publisher.publish = lambda items, **kw: published.append(items) or real(items, **kw)
    cloudevent = {"Content-Type": "application/cloudevents+json"}
    for source in ("//verifier/checks", "infermeter://gateway/gw-1", "//customer/cust-b", "//customer/cust-a/x"):
        spoof = client.post("/v1/events", content=task_event("task-a1", "cust-a", "failed", BASE, source=source),
                            headers={**auth(keys["a"]), **cloudevent})
        assert spoof.status_code == 403, spoof.text
        assert spoof.json()["error"]["code"] == "forbidden"
        assert "//customer/cust-a" in spoof.json()["error"]["message"]
    mixed = client.post("/v1/events", headers={**auth(keys["a"]), "Content-Type": "application/cloudevents-batch+json"},
                        content=b"[" + task_event("task-a1", "cust-a", "failed", BASE, source="//verifier/checks")
                        + b"," + usage_event(50, "cust-a", "tool_calls", "1", BASE, source="//customer/cust-a") + b"]")
    assert mixed.status_code == 202
    assert [(r["index"], r["reason"]) for r in mixed.json()["rejected"]] == [(0, "forbidden_source")]
    assert [len(items) for items in published] == [1]  # only the usage event with the customer's own source
    verifier = client.post("/v1/events", content=task_event("task-a1", "cust-a", "succeeded", BASE,
                                                            source="//verifier/checks"),
                           headers={**auth(keys["producer"]), **cloudevent})
    assert verifier.status_code == 202 and verifier.json() == {"published": 1, "rejected": []}
    # metering consumes what the API published: the usage event and the verifier's outcome
    consumer = MeteringConsumer(settings, settings.database_url, settings.kafka_bootstrap, retention_clock=retention_clock)
    thread = run_in_thread(consumer)
    try:
        with psycopg.connect(dsn(settings), autocommit=True) as conn:
            wanted = [("//customer/cust-a", "u-50"), ("//verifier/checks", "task-a1/outcome/succeeded")]
            until = time.monotonic() + 120
            while time.monotonic() < until and recorded_event_keys(conn, wanted) != set(wanted):
                time.sleep(0.2)
            reports = conn.execute("SELECT source, outcome FROM task_outcome_reports WHERE customer_id = 'cust-a' "
                                   "ORDER BY source").fetchall()
    finally:
        consumer.stop()
        thread.join(30)
    assert reports == [("//verifier/checks", "succeeded")]
