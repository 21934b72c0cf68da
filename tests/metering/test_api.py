"""The metering HTTP API: ingestion and queries, and tenant isolation on every customer-facing endpoint."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine

from app.api import create_app
from metering.ingest import wait_for_receipt  # noqa: F401 - documents the path the consumer takes
from serving.keys import KeyStore
from tests.metering.conftest import meter, request_event, task_event

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
    batch = b"[" + b",".join([request_event(11, customer="cust-a"), request_event(12, customer="cust-b"),
                               request_event(13, customer="cust-a", cached=500)]) + b"]"
    mixed = client.post("/v1/events", content=batch, headers={**auth(keys["a"]),
                                                               "Content-Type": "application/cloudevents-batch+json"})
    assert mixed.status_code == 202
    body = mixed.json()
    assert body["published"] == 1
    assert [(r["index"], r["reason"]) for r in body["rejected"]] == [(1, "forbidden"), (2, "cached_exceeds_input")]
    bad = client.post("/v1/events", content=b"{nope", headers={**auth(keys["a"]),
                                                               "Content-Type": "application/cloudevents+json"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    wrong_type = client.post("/v1/events", content=one, headers={**auth(keys["a"]), "Content-Type": "text/plain"})
    assert wrong_type.status_code == 415
    bad_window = client.get("/v1/usage", params={"from": "yesterday", "to": "2026-11-03"}, headers=auth(keys["a"]))
    assert bad_window.status_code == 400 and "ISO 8601" in bad_window.json()["error"]["message"]
