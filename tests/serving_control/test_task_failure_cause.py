"""`POST /v1/tasks/{task_id}/outcome` with the optional `failure_cause` (the cost anatomy's failure
attribution): carried on the task event when valid, a clear 400 (and no event) otherwise."""

from __future__ import annotations

import asyncio

import httpx

from infermeter.settings import Settings
from serving.gateway import create_app
from serving.gateway_contracts import MemorySink
from serving.upstreams import parse_upstreams


def test_failure_cause_is_carried_or_refused(tmp_path):
    settings = Settings(INFERMETER_HOME=tmp_path, INFERMETER_ADMIN_TOKEN="admin-secret",
                        INFERMETER_PRODUCER_TOKEN="producer-secret")
    sink = MemorySink()
    upstreams = parse_upstreams({"models": [{"name": "m", "deployment_id": "d", "replicas": [{"id": "r0", "url": "http://127.0.0.1:9"}]}]})
    app = create_app(settings, upstreams=upstreams, sink=sink)
    app.gateway.recent_tasks[("cust-1", "t1")] = True  # the task was seen with this customer
    headers = {"Authorization": "Bearer admin-secret", "X-Infermeter-Customer-Id": "cust-1"}

    async def post(body: dict) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            return await client.post("/v1/tasks/t1/outcome", headers=headers, json=body)

    bad = asyncio.run(post({"outcome": "failed", "failure_cause": "gremlins"}))
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "failure_cause"
    assert "verifier" in bad.json()["error"]["message"] and sink.events == []
    assert asyncio.run(post({"outcome": "failed", "failure_cause": "verifier"})).status_code == 202
    assert asyncio.run(post({"outcome": "succeeded", "id": "again"})).status_code == 202
    first, second = (event["data"] for event in sink.events)
    assert (first["outcome"], first["failure_cause"]) == ("failed", "verifier")
    assert second["outcome"] == "succeeded" and second.get("failure_cause") is None
